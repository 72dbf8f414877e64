"""The simulator's Gemini batch mode, on the OpenAI batch simulator's clock and with its hostile
knobs (:mod:`llm_ops.testing._batches`).

``POST /v1beta/models/{model}:batchGenerateContent`` (``{"batch": {"display_name",
"input_config": {"requests": {"requests": [{"request", "metadata"}]}}}}``, checked as Google
checks it: a display name, at least one request, each with ``contents``; at most 20 MB),
``GET /v1beta/batches`` (newest first, ``pageSize`` and ``pageToken``),
``GET /v1beta/batches/{id}`` (an operation: ``metadata`` is the batch, with its ``state``
``BATCH_STATE_PENDING`` / ``_RUNNING`` / ``_SUCCEEDED`` / ``_FAILED`` / ``_CANCELLED`` /
``_EXPIRED`` and ``batchStats``; once ``done``, ``response.inlinedResponses`` holds the answers,
**shuffled**, each with its request's ``metadata``) and ``POST /v1beta/batches/{id}:cancel``.
A batch's requests may be a file instead (``input_config.file_name``): the Files API's
resumable upload (``POST /upload/v1beta/files``, ``start`` then ``upload, finalize``) takes it,
and the answers are then a file too (``response.responsesFile``, read at
``GET /download/v1beta/files/{id}:download?alt=media``). Requests need ``x-goog-api-key`` (or
``?key=``) when the simulator has a key.

Each request is checked, translated and answered as a live ``generateContent`` call is
(:class:`llm_ops.testing._gemini.GenerateContent`: the same refusals, structured output and
thoughts, the judge, facts and counters). The knobs: ``batch_expire_share`` (the batch ends
``EXPIRED`` with the answers it had), ``batch_fail`` (``FAILED``, with the operation's ``error``),
``batch_duplicate_lines``, ``batch_unknown_lines``, ``batch_drop_lines`` and
``batch_create_stall`` as for OpenAI.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import random
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from ._batches import TERMINAL, Answer, BatchesApi, _Batch
from ._gemini import GeminiApi, GenerateContent, Refusal

INLINE_BYTES = 20_000_000
STATES = {
    "validating": "BATCH_STATE_PENDING",
    "in_progress": "BATCH_STATE_RUNNING",
    "completed": "BATCH_STATE_SUCCEEDED",
    "failed": "BATCH_STATE_FAILED",
    "cancelled": "BATCH_STATE_CANCELLED",
    "expired": "BATCH_STATE_EXPIRED",
}
RPC = {400: (3, "INVALID_ARGUMENT"), 401: (16, "UNAUTHENTICATED"), 403: (7, "PERMISSION_DENIED")}
RPC.update({404: (5, "NOT_FOUND"), 429: (8, "RESOURCE_EXHAUSTED"), 503: (14, "UNAVAILABLE")})
BATCH_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"
OUTPUT_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput"


class GeminiBatchesApi(BatchesApi):
    """Gemini batches held in memory; ``answer(body)`` answers one OpenAI-shaped request."""

    ROUTES: tuple[tuple[str, str, str], ...] = (
        ("POST", "/v1beta/models/{model}:batchGenerateContent", "create"),
        ("GET", "/v1beta/batches", "list"),
        ("GET", "/v1beta/batches/{id}", "retrieve"),
        ("POST", "/v1beta/batches/{id}:cancel", "cancel"),
        ("POST", "/upload/v1beta/files", "upload"),
        ("GET", "/download/v1beta/files/{id}:download", "download"),
    )

    def __init__(self, answer: Answer, config: Any, live: GeminiApi):
        super().__init__(answer, config)
        self.live = live
        self.models: dict[str, str] = {}  # batch id -> its model
        self.names: dict[str, str] = {}  # batch id -> its display name
        self.stored: dict[str, bytes] = {}  # file name -> content (uploads and results)
        self.sessions: dict[str, tuple[str, int]] = {}  # upload id -> display name, length
        self.from_files: set[str] = set()  # batches whose requests were a file
        self.results_files: dict[str, str] = {}  # batch id -> the file of its answers

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "files": len(self.stored)}

    def refused(self, request: web.Request) -> web.Response | None:
        """Google's refusal of a request without the key."""
        key = self._config().api_key
        given = request.headers.get("x-goog-api-key") or request.query.get("key")
        if key is not None and given != key:
            return gemini_error(400, "API key not valid. Please pass a valid API key.")
        return None

    async def upload(self, request: web.Request) -> web.Response:
        """The Files API's resumable upload: a ``start`` (its answer names where the bytes
        go), then the bytes, ``upload, finalize``."""
        command = request.headers.get("X-Goog-Upload-Command", "")
        if command == "start":
            if request.headers.get("X-Goog-Upload-Protocol") != "resumable":
                return gemini_error(400, "X-Goog-Upload-Protocol: resumable is required")
            try:
                name = (await request.json())["file"]["display_name"]
                length = int(request.headers["X-Goog-Upload-Header-Content-Length"])
            except (ValueError, KeyError, TypeError):
                return gemini_error(400, "file.display_name and the content length are required")
            upload_id = f"sim-upload-{next(self.ids)}"
            self.sessions[upload_id] = (name, length)
            where = f"{request.scheme}://{request.host}/upload/v1beta/files?upload_id={upload_id}"
            return web.json_response(
                {}, headers={"X-Goog-Upload-URL": where, "X-Goog-Upload-Status": "active"}
            )
        session = self.sessions.pop(request.query.get("upload_id", ""), None)
        if session is None or command != "upload, finalize":
            return gemini_error(400, "no such upload, or not 'upload, finalize'")
        content = await request.read()
        if len(content) != session[1]:
            return gemini_error(400, f"{len(content)} bytes, not the {session[1]} announced")
        name = f"files/sim-{next(self.ids)}"
        self.stored[name] = content
        file = {"name": name, "displayName": session[0], "mimeType": "application/jsonl"}
        return web.json_response({"file": {**file, "sizeBytes": str(len(content))}})

    async def download(self, request: web.Request) -> web.Response:
        content = self.stored.get("files/" + request.match_info["id"])
        if content is None or request.query.get("alt") != "media":
            return gemini_error(404, "no such file (or not ?alt=media)", 404)
        return web.Response(body=content, content_type="application/octet-stream")

    async def create(self, request: web.Request) -> web.Response:
        self.creates += 1
        stall = self._config().batch_create_stall
        if stall == "before":
            await asyncio.sleep(3600)
        raw = await request.read()
        if len(raw) > INLINE_BYTES:
            return gemini_error(400, "Request payload size exceeds the limit: 20 MB.")
        try:
            batch_asked = json.loads(raw)["batch"]
            name = batch_asked["display_name"]
            input_config = batch_asked["input_config"]
            file_name = input_config.get("file_name")
            if file_name is not None:
                requests = [
                    {"request": line["request"], "metadata": {"key": line.get("key")}}
                    for line in map(json.loads, self.stored[file_name].splitlines())
                ]
            else:
                requests = input_config["requests"]["requests"]
            assert isinstance(requests, list) and requests and isinstance(name, str)
        except (ValueError, KeyError, TypeError, AssertionError):
            return gemini_error(
                400, "batch.display_name and batch.input_config.requests.requests are required"
            )
        for number, item in enumerate(requests):
            if not isinstance(item, dict) or not (item.get("request") or {}).get("contents"):
                return gemini_error(400, f"requests[{number}].request.contents is required")
        self.lines_uploaded += len(requests)
        batch = _Batch(
            id=f"batches/sim-{next(self.ids)}",
            input_file_id="",
            endpoint=":batchGenerateContent",
            lines=requests,
            metadata=None,
            number=len(self.batches) + 1,
        )
        self.batches[batch.id] = batch
        if file_name is not None:
            self.from_files.add(batch.id)
        self.models[batch.id] = f"models/{request.match_info['model']}"
        self.names[batch.id] = name
        if stall == "after":
            await asyncio.sleep(3600)
        return web.json_response(self._view(batch))

    async def retrieve(self, request: web.Request) -> web.Response:
        batch = self.batches.get("batches/" + request.match_info["id"])
        if batch is None:
            return gemini_error(404, "no such batch", 404)
        return web.json_response(self._view(batch))

    async def list(self, request: web.Request) -> web.Response:
        self.lists += 1
        status = self._config().batch_list_status
        if status is not None:
            return gemini_error(status, f"simulated: the list failed ({status})", status)
        ordered = sorted(self.batches.values(), key=lambda b: b.created, reverse=True)
        size = int(request.query.get("pageSize", 20))
        start = int(request.query.get("pageToken") or 0)
        page = ordered[start : start + size]
        listing: dict[str, Any] = {"operations": [self._view(b, full=False) for b in page]}
        if start + size < len(ordered):
            listing["nextPageToken"] = str(start + size)
        return web.json_response(listing)

    async def cancel(self, request: web.Request) -> web.Response:
        batch = self.batches.get("batches/" + request.match_info["id"])
        if batch is None:
            return gemini_error(404, "no such batch", 404)
        if batch.status not in TERMINAL:
            self._advance(batch)
            batch.cancelled = True
            self._finish(batch, "cancelled")
        return web.json_response({})

    # -- the clock's hooks ---------------------------------------------------------------------

    def _answer_line(self, batch: _Batch, line: dict[str, Any]) -> None:
        model = self.models.get(batch.id, "models/sim").removeprefix("models/")
        call = GenerateContent(self.live, model)
        item: dict[str, Any] = {"metadata": line.get("metadata")}
        try:
            status, body = self.answer(call.asked(line.get("request") or {}))
        except Refusal as refusal:
            said = json.loads(refusal.response.body)  # type: ignore[arg-type]
            status, body = refusal.response.status, said
        if status == 200:
            item["response"] = call.answer(body)
        else:
            message = (body.get("error") or {}).get("message") if isinstance(body, dict) else None
            item["error"] = {"code": RPC.get(status, (13, "INTERNAL"))[0], "message": message}
        (batch.output if status == 200 else batch.errors).append(json.dumps(item))

    def _misbehave(self, batch: _Batch) -> None:
        config = self._config()
        for line in batch.output[: config.batch_duplicate_lines]:
            again = json.loads(line)
            response = copy.deepcopy(again["response"])
            if config.batch_duplicate_differ:
                response["candidates"][0]["content"]["parts"][0]["text"] += " (answered again)"
            again["response"] = response
            batch.output.append(json.dumps(again))
        for number in range(config.batch_unknown_lines):
            made_up = hashlib.sha256(f"{batch.id} unknown {number}".encode()).hexdigest()
            item = {"metadata": {"key": f"v1:{made_up}"}, "response": _UNASKED}
            batch.output.append(json.dumps(item))

    def _results_file(self, batch: _Batch, answers: Sequence[dict[str, Any]]) -> str:
        """The name of the file holding a done batch's answers, written once."""
        if batch.id not in self.results_files:
            name = f"files/sim-{next(self.ids)}"
            lines = [json.dumps(_file_line(answer)) + "\n" for answer in answers]
            self.stored[name] = "".join(lines).encode()
            self.results_files[batch.id] = name
        return self.results_files[batch.id]

    def _fail(self, batch: _Batch, code: str, line: int | None) -> None:
        where = f" (request {line})" if line is not None else ""
        batch.errors_object = {"code": 3, "message": f"simulated: {code}{where}"}
        batch.status = "failed"

    def _finish(self, batch: _Batch, status: str) -> None:
        batch.status = status

    def _view(self, batch: _Batch, *, full: bool = True) -> dict[str, Any]:
        self._advance(batch)
        done = batch.status in TERMINAL
        created = datetime.fromtimestamp(batch.created_at, UTC).isoformat()
        metadata = {
            "@type": BATCH_TYPE,
            "name": batch.id,
            "model": self.models.get(batch.id),
            "displayName": self.names.get(batch.id),
            "createTime": created.replace("+00:00", "Z"),
            "state": STATES.get(batch.status, "BATCH_STATE_RUNNING"),
            "batchStats": {
                "requestCount": str(len(batch.lines)),
                "successfulRequestCount": str(len(batch.output)),
                "failedRequestCount": str(len(batch.errors)),
                "pendingRequestCount": str(len(batch.lines) - batch.answered),
            },
        }
        operation: dict[str, Any] = {"name": batch.id, "metadata": metadata, "done": done}
        if batch.status == "failed":
            operation["error"] = batch.errors_object
        elif done and full:
            answers: list[dict[str, Any]] = [
                json.loads(line) for line in batch.output + batch.errors
            ]
            random.Random(batch.id).shuffle(answers)  # matched by metadata, not order
            if batch.id in self.from_files:  # the answers of a file are a file
                operation["response"] = {
                    "@type": OUTPUT_TYPE,
                    "responsesFile": self._results_file(batch, answers),
                }
            else:
                operation["response"] = {
                    "@type": OUTPUT_TYPE,
                    "inlinedResponses": {"inlinedResponses": answers},
                }
        return operation


def _file_line(answer: dict[str, Any]) -> dict[str, Any]:
    """An inline answer as a line of a results file: its key at the top."""
    line = {"key": (answer.get("metadata") or {}).get("key")}
    return {**line, **{k: v for k, v in answer.items() if k != "metadata"}}


_UNASKED = {
    "candidates": [
        {
            "content": {"role": "model", "parts": [{"text": "an answer to no request"}]},
            "finishReason": "STOP",
            "index": 0,
        }
    ],
    "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 5, "totalTokenCount": 6},
    "modelVersion": "sim",
}
"""What a batch's made-up line answers (``batch_unknown_lines``)."""


def gemini_error(status: int, message: str, code: int = 400) -> web.Response:
    names = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 500: "INTERNAL", 503: "UNAVAILABLE"}
    body = {"error": {"code": code, "message": message, "status": names.get(code, "UNKNOWN")}}
    return web.json_response(body, status=status)
