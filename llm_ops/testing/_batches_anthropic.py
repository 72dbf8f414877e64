"""The simulator's Anthropic Message Batches API, on the OpenAI batch simulator's clock and with
its hostile knobs (:mod:`llm_ops.testing._batches`).

``POST /v1/messages/batches`` (``{"requests": [{"custom_id", "params"}]}``, checked as
Anthropic checks it: every ``custom_id`` matching ``^[a-zA-Z0-9_-]{1,64}$`` and unique, every
``params`` with ``model``, ``max_tokens`` and ``messages``, no ``system`` role among them),
``GET /v1/messages/batches`` (newest first, ``limit``), ``GET /v1/messages/batches/{id}``
(``processing_status``, ``request_counts``, ``results_url`` once ended),
``GET /v1/messages/batches/{id}/results`` (JSON lines, **shuffled**: Anthropic promises no
order) and ``POST /v1/messages/batches/{id}/cancel``. Requests need ``x-api-key`` (when the
simulator has a key) and ``anthropic-version``.

Each request's ``params`` is checked, translated and answered as a live ``POST /v1/messages``
is (:mod:`llm_ops.testing._anthropic`): the same refusals, the judge, facts and counters, and
the same prompt cache, so a marked system prompt is written once and read by the other
requests of a batch, and its discounts stack with the batch's as Anthropic's do.
The knobs: ``batch_expire_share`` ends the first batches with their unanswered requests
``expired``; a cancelled batch's are ``canceled``; ``batch_fail`` errors every request
(``invalid_request_error``: Anthropic refuses a bad batch when it is created, or a request
when it is run); ``batch_duplicate_lines``, ``batch_unknown_lines`` and ``batch_drop_lines``
as for OpenAI; ``batch_create_stall`` stalls the create.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import random
import re
import time
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from ._anthropic import AnthropicApi, _as_openai, _checked, _Refusal
from ._batches import TERMINAL, Answer, BatchesApi, _Batch

CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class AnthropicBatchesApi(BatchesApi):
    """Message batches held in memory; ``answer(body)`` answers one OpenAI-shaped request, and
    ``live`` (the simulator's Messages API) checks, translates and writes back each one."""

    ROUTES: tuple[tuple[str, str, str], ...] = (
        ("POST", "/v1/messages/batches", "create"),
        ("GET", "/v1/messages/batches", "list"),
        ("GET", "/v1/messages/batches/{id}", "retrieve"),
        ("GET", "/v1/messages/batches/{id}/results", "results"),
        ("POST", "/v1/messages/batches/{id}/cancel", "cancel"),
    )

    def __init__(self, answer: Answer, config: Any, live: AnthropicApi):
        super().__init__(answer, config)
        self.live = live
        self.origins: dict[str, str] = {}  # batch id -> the scheme and host it was made on

    # -- the API -------------------------------------------------------------------------------

    def refused(self, request: web.Request) -> web.Response | None:
        """Anthropic's refusal of a request without the key or the version header."""
        key = self._config().api_key
        if key is not None and request.headers.get("x-api-key") != key:
            return anthropic_error(401, "authentication_error", "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return anthropic_error(
                400, "invalid_request_error", "anthropic-version: header is required"
            )
        return None

    async def create(self, request: web.Request) -> web.Response:
        self.creates += 1
        stall = self._config().batch_create_stall
        if stall == "before":
            await asyncio.sleep(3600)
        try:
            body = await request.json()
            requests = body["requests"]
            assert isinstance(requests, list) and requests
        except (ValueError, KeyError, TypeError, AssertionError):
            return anthropic_error(400, "invalid_request_error", "requests: a non-empty list")
        problem = _invalid(requests)
        if problem is not None:
            return anthropic_error(400, "invalid_request_error", problem)
        self.lines_uploaded += len(requests)
        batch = _Batch(
            id=f"msgbatch_sim_{next(self.ids)}",
            input_file_id="",
            endpoint="/v1/messages",
            lines=requests,
            metadata=None,
            number=len(self.batches) + 1,
        )
        self.batches[batch.id] = batch
        self.origins[batch.id] = f"{request.scheme}://{request.host}"
        if stall == "after":
            await asyncio.sleep(3600)
        return web.json_response(self._view(batch))

    async def retrieve(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return anthropic_error(404, "not_found_error", "no such message batch")
        return web.json_response(self._view(batch))

    async def list(self, request: web.Request) -> web.Response:
        self.lists += 1
        status = self._config().batch_list_status
        if status is not None:
            return anthropic_error(status, "api_error", f"simulated: the list failed ({status})")
        ordered = sorted(self.batches.values(), key=lambda b: b.created, reverse=True)
        limit = int(request.query.get("limit", 20))
        page = ordered[:limit]
        return web.json_response(
            {
                "data": [self._view(b) for b in page],
                "has_more": len(ordered) > limit,
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
            }
        )

    async def results(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return anthropic_error(404, "not_found_error", "no such message batch")
        self._advance(batch)
        if batch.status not in TERMINAL:
            return anthropic_error(400, "invalid_request_error", "the batch has not ended")
        lines = list(batch.output)
        random.Random(batch.id).shuffle(lines)  # Anthropic promises no order
        content = "".join(line + "\n" for line in lines).encode()
        return web.Response(body=content, content_type="application/binary")

    async def cancel(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return anthropic_error(404, "not_found_error", "no such message batch")
        if batch.status not in TERMINAL:
            self._advance(batch)
            batch.cancelled = True
            self._finish(batch, "cancelled")
        return web.json_response(self._view(batch))

    # -- the clock's hooks ---------------------------------------------------------------------

    def _answer_line(self, batch: _Batch, line: dict[str, Any]) -> None:
        custom_id = line.get("custom_id")
        try:
            asked = _checked(copy.deepcopy(line.get("params") or {}))
        except _Refusal as refusal:
            self._errored(batch, custom_id, refusal.status, str(refusal))
            return
        body = _as_openai(asked, self._config().reasoning_models)
        status, answer = self.answer(body)
        if status != 200:
            message = (
                (answer.get("error") or {}).get("message") if isinstance(answer, dict) else None
            )
            self._errored(batch, custom_id, status, str(message))
            return
        result = {"type": "succeeded", "message": self.live._message(answer, asked, body)}
        batch.output.append(json.dumps({"custom_id": custom_id, "result": result}))

    def _errored(self, batch: _Batch, custom_id: Any, status: int, message: str) -> None:
        kind = ERROR_TYPES.get(status, "api_error")
        error = {"type": "error", "error": {"type": kind, "message": message}}
        result = {"type": "errored", "error": error}
        batch.output.append(json.dumps({"custom_id": custom_id, "result": result}))

    def _misbehave(self, batch: _Batch) -> None:
        config = self._config()
        succeeded = [line for line in batch.output if '"succeeded"' in line]
        for line in succeeded[: config.batch_duplicate_lines]:
            again = json.loads(line)
            message = copy.deepcopy(again["result"]["message"])
            if config.batch_duplicate_differ:
                message["content"][0]["text"] += " (answered again)"
            again["result"]["message"] = message
            batch.output.append(json.dumps(again))
        for number in range(config.batch_unknown_lines):
            made_up = hashlib.sha256(f"{batch.id} unknown {number}".encode()).hexdigest()
            batch.output.append(
                json.dumps(
                    {
                        "custom_id": made_up,
                        "result": {
                            "type": "succeeded",
                            "message": _unasked(),
                        },
                    }
                )
            )

    def _fail(self, batch: _Batch, code: str, line: int | None) -> None:
        """Every request errored: Anthropic has no failed batch, only failed requests."""
        for item in batch.lines:
            error = {"type": "invalid_request_error", "message": f"simulated: {code}"}
            result = {"type": "errored", "error": {"type": "error", "error": error}}
            batch.output.append(json.dumps({"custom_id": item.get("custom_id"), "result": result}))
        batch.answered = len(batch.lines)
        self._finish(batch, "completed")

    def _finish(self, batch: _Batch, status: str) -> None:
        if status in ("expired", "cancelled"):  # every request not run gets a line saying so
            kind = "expired" if status == "expired" else "canceled"
            for item in batch.lines[batch.answered :]:
                result = {"custom_id": item.get("custom_id"), "result": {"type": kind}}
                batch.output.append(json.dumps(result))
        batch.status = status
        batch.ended_at = time.time()  # type: ignore[attr-defined]

    def _view(self, batch: _Batch) -> dict[str, Any]:
        self._advance(batch)
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        seen: set[Any] = set()
        for line in batch.output:
            result = json.loads(line)
            if result["custom_id"] in seen:
                continue
            seen.add(result["custom_id"])
            counts[result["result"]["type"]] = counts.get(result["result"]["type"], 0) + 1
        ended = batch.status in TERMINAL
        if not ended:
            counts["processing"] = len(batch.lines) - batch.answered
        created = datetime.fromtimestamp(batch.created_at, UTC).isoformat()
        origin = self.origins.get(batch.id, "")
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": "ended"
            if ended
            else ("canceling" if batch.cancelled else "in_progress"),
            "request_counts": counts,
            "created_at": created.replace("+00:00", "Z"),
            "ended_at": _iso(getattr(batch, "ended_at", None)) if ended else None,
            "expires_at": None,
            "archived_at": None,
            "cancel_initiated_at": _iso(time.time()) if batch.cancelled else None,
            "results_url": f"{origin}/v1/messages/batches/{batch.id}/results" if ended else None,
        }


def _invalid(requests: list[Any]) -> str | None:
    """What Anthropic would refuse in a batch's requests, or ``None``."""
    seen: set[str] = set()
    for number, item in enumerate(requests):
        name = item.get("custom_id") if isinstance(item, dict) else None
        if not isinstance(name, str) or not CUSTOM_ID.match(name):
            return f"requests.{number}.custom_id: must match ^[a-zA-Z0-9_-]{{1,64}}$"
        if name in seen:
            return f"requests.{number}.custom_id: {name!r} is used twice"
        seen.add(name)
        params = item.get("params")
        if not isinstance(params, dict):
            return f"requests.{number}.params: Field required"
        for field in ("model", "max_tokens", "messages"):
            if field not in params:
                return f"requests.{number}.params.{field}: Field required"
        roles = {m.get("role") for m in params["messages"] if isinstance(m, dict)}
        if not roles <= {"user", "assistant"}:
            return (
                f"requests.{number}.params.messages: roles must be 'user' or 'assistant' "
                "(a system prompt is the top-level 'system')"
            )
    return None


def anthropic_error(status: int, kind: str, message: str) -> web.Response:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return web.json_response(body, status=status)


def _unasked() -> dict[str, Any]:
    return {
        "id": "msg_sim_unasked",
        "type": "message",
        "role": "assistant",
        "model": "sim",
        "content": [{"type": "text", "text": "an answer to no request"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 5},
    }


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")
