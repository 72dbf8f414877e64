"""The simulator's Files and Batches API, on a clock that runs in seconds, not hours.

``POST /v1/files`` (multipart: ``file``, ``purpose``), ``GET /v1/files/{id}`` and
``GET /v1/files/{id}/content``; ``POST /v1/batches``, ``GET /v1/batches`` (newest first, with
``limit`` and ``after``), ``GET /v1/batches/{id}`` and ``POST /v1/batches/{id}/cancel``.

A batch validates for ``batch_validation_seconds``, works through its lines for
``batch_seconds`` (``request_counts`` grow as it goes), then answers every line as a live
request would be answered (directives included; a non-200 answer goes to the error file) and
is ``completed``. With ``batch_expire_share`` set, the first ``batch_expire_first`` batches
``expired`` instead, having answered only that share of their lines. A cancelled batch keeps
the lines answered so far.

Hostile providers, for the first ``batch_hostile_first`` batches (every batch when ``None``):
``batch_fail`` ends a batch ``failed`` when it has validated, with an ``errors`` list as OpenAI
gives one (naming ``batch_fail_line`` of the input file, if set) and no output;
``batch_duplicate_lines`` writes its first so many answers twice (the second time with a
different text, unless ``batch_duplicate_differ`` is off); ``batch_unknown_lines`` adds answers
for ``custom_id``s it was never sent; ``batch_drop_lines`` leaves its last so many lines out of
both files although the batch says ``completed`` and counts them. For every batch,
``batch_list_status`` answers ``GET /v1/batches`` with that HTTP status (and ``retry-after-ms``,
so clients retry at once), and ``batch_create_stall`` makes ``POST /v1/batches`` never answer,
``"before"`` or ``"after"`` making the batch: the window in which a client that dies cannot know
whether its batch exists.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Answer = Callable[[Any], tuple[int, dict[str, Any]]]
TERMINAL = ("completed", "failed", "expired", "cancelled")


@dataclass
class _Batch:
    id: str
    input_file_id: str
    endpoint: str
    lines: list[dict[str, Any]]
    metadata: dict[str, str] | None
    number: int  # 1 for the first batch made
    created: float = field(default_factory=time.monotonic)
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "validating"
    answered: int = 0  # lines answered so far
    output: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    output_file_id: str | None = None
    error_file_id: str | None = None
    cancelled: bool = False
    errors_object: dict[str, Any] | None = None  # why a failed batch failed


class BatchesApi:
    """Files and batches held in memory; ``answer(body)`` answers one line's request."""

    def __init__(self, answer: Answer, config: Callable[[], Any]):
        self.answer = answer
        self._config = config
        self.files: dict[str, dict[str, Any]] = {}
        self.contents: dict[str, bytes] = {}
        self.batches: dict[str, _Batch] = {}
        self.ids = itertools.count(1)
        self.lines_uploaded = 0
        self.creates = 0  # calls of POST /v1/batches, answered or not
        self.lists = 0  # calls of GET /v1/batches

    ROUTES: tuple[tuple[str, str, str], ...] = (
        ("POST", "/v1/files", "upload"),
        ("GET", "/v1/files/{id}", "file"),
        ("GET", "/v1/files/{id}/content", "content"),
        ("POST", "/v1/batches", "create"),
        ("GET", "/v1/batches", "list"),
        ("GET", "/v1/batches/{id}", "retrieve"),
        ("POST", "/v1/batches/{id}/cancel", "cancel"),
    )
    """(method, path, handler name) of every route."""

    def stats(self) -> dict[str, Any]:
        return {
            "files": len(self.files),
            "batches": len(self.batches),
            "batch_lines": sum(len(b.lines) for b in self.batches.values()),
            "lines_uploaded": self.lines_uploaded,
            "batch_creates": self.creates,
            "batch_lists": self.lists,
        }

    def _store(self, content: bytes, filename: str, purpose: str) -> dict[str, Any]:
        file_id = f"file-sim-{next(self.ids)}"
        self.files[file_id] = {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
        }
        self.contents[file_id] = content
        return self.files[file_id]

    async def upload(self, request: web.Request) -> web.Response:
        form = await request.post()
        upload, purpose = form.get("file"), str(form.get("purpose", ""))
        if not isinstance(upload, web.FileField) or purpose != "batch":
            return _error(400, "multipart 'file' and purpose 'batch' are required")
        content = upload.file.read()
        self.lines_uploaded += sum(1 for line in content.splitlines() if line.strip())
        return web.json_response(self._store(content, upload.filename, purpose))

    async def file(self, request: web.Request) -> web.Response:
        found = self.files.get(request.match_info["id"])
        return web.json_response(found) if found else _error(404, "no such file")

    async def content(self, request: web.Request) -> web.Response:
        found = self.contents.get(request.match_info["id"])
        if found is None:
            return _error(404, "no such file")
        return web.Response(body=found, content_type="application/jsonl")

    async def create(self, request: web.Request) -> web.Response:
        self.creates += 1
        stall = self._config().batch_create_stall
        if stall == "before":
            await asyncio.sleep(3600)
        body = await request.json()
        content = self.contents.get(body.get("input_file_id", ""))
        if content is None:
            return _error(400, "input_file_id names no uploaded file")
        lines = [json.loads(line) for line in content.splitlines() if line.strip()]
        batch = _Batch(
            id=f"batch-sim-{next(self.ids)}",
            input_file_id=body["input_file_id"],
            endpoint=body.get("endpoint", "/v1/chat/completions"),
            lines=lines,
            metadata=body.get("metadata"),
            number=len(self.batches) + 1,
        )
        self.batches[batch.id] = batch
        if stall == "after":
            await asyncio.sleep(3600)
        return web.json_response(self._view(batch))

    async def retrieve(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["id"])
        return web.json_response(self._view(batch)) if batch else _error(404, "no such batch")

    async def list(self, request: web.Request) -> web.Response:
        self.lists += 1
        status = self._config().batch_list_status
        if status is not None:
            response = _error(status, f"simulated: the batch list failed with {status}")
            response.headers["retry-after-ms"] = "10"
            return response
        ordered = sorted(self.batches.values(), key=lambda b: b.created, reverse=True)
        after = request.query.get("after")
        if after is not None:
            ids = [b.id for b in ordered]
            ordered = ordered[ids.index(after) + 1 :] if after in ids else []
        limit = int(request.query.get("limit", 20))
        page = ordered[:limit]
        return web.json_response(
            {
                "object": "list",
                "data": [self._view(b) for b in page],
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
                "has_more": len(ordered) > limit,
            }
        )

    async def cancel(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return _error(404, "no such batch")
        if batch.status not in TERMINAL:
            self._advance(batch)
            batch.cancelled = True
            self._finish(batch, "cancelled")
        return web.json_response(self._view(batch))

    def _advance(self, batch: _Batch) -> None:
        """Bring a batch up to the simulated clock."""
        if batch.status in TERMINAL:
            return
        config = self._config()
        elapsed = time.monotonic() - batch.created
        validation = config.batch_validation_seconds
        if elapsed < validation:
            return
        hostile = self._hostile(batch)
        if hostile and config.batch_fail is not None:
            self._fail(batch, config.batch_fail, config.batch_fail_line)
            return
        batch.status = "in_progress"
        share = min(1.0, (elapsed - validation) / max(config.batch_seconds, 1e-9))
        expire = config.batch_expire_share if batch.number <= config.batch_expire_first else None
        done = int(len(batch.lines) * (share if expire is None else min(share, expire)))
        kept = len(batch.lines) - (config.batch_drop_lines if hostile else 0)
        while batch.answered < done:
            if batch.answered < kept:
                self._answer_line(batch, batch.lines[batch.answered])
            batch.answered += 1
        if share >= 1.0:
            if hostile and expire is None:
                self._misbehave(batch)
            self._finish(batch, "completed" if expire is None else "expired")

    def _hostile(self, batch: _Batch) -> bool:
        first = self._config().batch_hostile_first
        return first is None or batch.number <= first

    def _answer_line(self, batch: _Batch, line: dict[str, Any]) -> None:
        status, body = self.answer(line.get("body"))
        self._write(batch, line.get("custom_id"), status, body)

    def _write(self, batch: _Batch, custom_id: Any, status: int, body: dict[str, Any]) -> None:
        result = {
            "id": f"batch_req_{next(self.ids)}",
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": f"req-{batch.id}", "body": body},
            "error": None,
        }
        (batch.output if status == 200 else batch.errors).append(json.dumps(result))

    def _misbehave(self, batch: _Batch) -> None:
        """Add the duplicate and unknown lines of a hostile provider to a finished batch."""
        config = self._config()
        for line in batch.output[: config.batch_duplicate_lines]:
            result = json.loads(line)
            body = copy.deepcopy(result["response"]["body"])
            if config.batch_duplicate_differ:
                body["choices"][0]["message"]["content"] += " (answered again)"
            self._write(batch, result["custom_id"], 200, body)
        for number in range(config.batch_unknown_lines):
            made_up = hashlib.sha256(f"{batch.id} unknown {number}".encode()).hexdigest()
            self._write(batch, f"v1:{made_up}", 200, _completion("an answer to no request"))

    def _fail(self, batch: _Batch, code: str, line: int | None) -> None:
        batch.errors_object = {
            "object": "list",
            "data": [
                {
                    "code": code,
                    "message": "simulated: the input file was refused",
                    "param": None,
                    "line": line,
                }
            ],
        }
        batch.status = "failed"

    def _finish(self, batch: _Batch, status: str) -> None:
        if batch.output:
            content = ("\n".join(batch.output) + "\n").encode()
            batch.output_file_id = self._store(content, "output.jsonl", "batch_output")["id"]
        if batch.errors:
            content = ("\n".join(batch.errors) + "\n").encode()
            batch.error_file_id = self._store(content, "errors.jsonl", "batch_output")["id"]
        batch.status = status

    def _view(self, batch: _Batch) -> dict[str, Any]:
        self._advance(batch)
        failed = len(batch.errors)
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": batch.endpoint,
            "input_file_id": batch.input_file_id,
            "completion_window": "24h",
            "status": batch.status,
            "output_file_id": batch.output_file_id,
            "error_file_id": batch.error_file_id,
            "created_at": batch.created_at,
            "request_counts": {
                "total": len(batch.lines),
                "completed": batch.answered - failed,
                "failed": failed,
            },
            "metadata": batch.metadata,
            "errors": batch.errors_object,
        }


def _completion(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-sim-unasked",
        "object": "chat.completion",
        "model": "sim",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6},
    }


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None}}
    return web.json_response(body, status=status)
