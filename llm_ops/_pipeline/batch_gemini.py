"""Gemini's batch mode as a :class:`~llm_ops._pipeline.batch_service.BatchService`.

``POST models/{model}:batchGenerateContent`` (the dialect's ``batch_path``) takes
``{"batch": {"display_name", "input_config": {"requests": {"requests": [{"request",
"metadata": {"key"}}]}}}}`` (``request``: the dialect's completion body) and gives back an
operation named ``batches/{id}``; ``GET batches/{id}`` says how it does
(``metadata.state``: ``BATCH_STATE_PENDING``, ``_RUNNING``, ``_SUCCEEDED``, ``_FAILED``,
``_CANCELLED``, ``_EXPIRED``; ``batchStats``) and, once done, holds the answers
(``response.inlinedResponses``, each a ``response`` or an ``error`` with the request's
``metadata``, in any order); ``POST batches/{id}:cancel`` cancels it; ``GET batches`` lists
them, by which a batch whose create answer was lost is found by its display name
(``llm-ops {job}-{part}``).

Requests go inline up to 20 MB a batch; a larger batch (up to 2 GB) goes as a JSONL file
(``{"key", "request"}`` a line) through the Files API's resumable upload
(``POST /upload/v1beta/files``), named by ``input_config.file_name``, and its answers come back
as a file too (``response.responsesFile``, read at ``/download/v1beta/{file}:download``).
Each request and answer is spelled by the dialect (its ``batch_inline``, ``batch_line`` and
``batch_result``, :mod:`llm_ops._dialects.gemini`); this module speaks the batch as a whole.
Spoken over the engine's own HTTP (the key among the dialect's headers), for the
reasons :mod:`llm_ops._pipeline.batch_anthropic` gives; the requests are kept in a local file
beside the cache as well, since the API gives neither form back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Literal
from urllib.parse import quote

from yarl import URL

from .._dialects import BatchResult, Dialect, path_of
from .._dialects.gemini import GeminiDialect
from .._engine.boundary import TransportError
from .._engine.engine import Engine
from ..exceptions import ConfigError, JobAbortedError
from .batch_service import (
    ATTEMPTS,
    CONTROL_MAX_BYTES,
    ENVELOPE_BYTES,
    BatchPart,
    BatchView,
    KeptRequests,
    Line,
    LocalInputs,
    Refused,
    checked,
    may_be_lost,
    wire_bytes,
)

REQUESTS_PER_BATCH = 1_000_000  # no count is documented: the bytes bound a batch
INLINE_BYTES = 20_000_000 - ENVELOPE_BYTES  # inline requests, at most; beyond, a file
BYTES_PER_BATCH = 2_000_000_000  # an input file, at most (the Files API takes 2 GB)
RESULTS_MAX_BYTES = 2**33  # a done batch with its answers (inline, or their file), read whole
LIST_PAGES = 10  # pages of the batch list looked through for a lost create
DISPLAY_PREFIX = "llm-ops "
STATES = {
    "PENDING": "validating",
    "RUNNING": "in_progress",
    "SUCCEEDED": "completed",
    "FAILED": "failed",
    "CANCELLED": "cancelled",
    "EXPIRED": "expired",
}
"""Our state by a batch's, less its ``BATCH_STATE_`` (or the SDK's ``JOB_STATE_``) prefix."""


class GeminiBatches(KeptRequests):
    """Gemini's batch mode (``batchGenerateContent``), for an endpoint of the Gemini dialect."""

    requests_per_batch = REQUESTS_PER_BATCH
    bytes_per_batch = BYTES_PER_BATCH
    what = "Gemini's batch mode"

    def __init__(self, engine: Engine, dialect: Dialect, inputs: LocalInputs):
        if not isinstance(dialect, GeminiDialect):  # its lines are the Gemini dialect's
            raise ConfigError(
                f"Gemini's batch mode speaks the Gemini dialect only, not "
                f"{type(dialect).__name__}: use batch=False"
            )
        super().__init__(engine, dialect, inputs)
        self.dialect: GeminiDialect = dialect

    def _request(self, line: Mapping[str, Any]) -> dict[str, Any]:
        """The inline request a kept line sends, as the dialect spells it."""
        key, canonical = self.read_line(line)
        return self.dialect.batch_inline(key, self.dialect.completion_body(canonical))

    async def create(self, part: BatchPart) -> str:
        assert part.input_file_id is not None
        content = await asyncio.to_thread(LocalInputs.read, part.input_file_id)
        lines = [json.loads(raw) for raw in content.splitlines() if raw.strip()]
        requests = [self._request(line) for line in lines]
        if sum(map(wire_bytes, requests)) <= INLINE_BYTES:
            input_config: dict[str, Any] = {"requests": {"requests": requests}}
        else:
            input_config = {"file_name": await self._upload(part, lines)}
        batch = {"display_name": DISPLAY_PREFIX + part.name, "input_config": input_config}
        body = json.dumps({"batch": batch}, ensure_ascii=False).encode()
        path = path_of(self.dialect.batch_path, part.model.removeprefix("models/"))
        operation = await self.http.create(path, body)
        return _name(operation)

    async def _upload(self, part: BatchPart, lines: list[Line]) -> str:
        """The kept lines' requests as a JSONL file (each line as the dialect spells a
        batch file's) through the Files API's resumable upload (a start, then the bytes); its
        name (``files/...``). An upload whose answer is lost is made again: a file is not
        paid for, and one left over expires within two days."""
        content = b"".join(json.dumps(self._file_line(line)).encode() + b"\n" for line in lines)
        start = json.dumps({"file": {"display_name": DISPLAY_PREFIX + part.name}}).encode()
        for attempt in range(1, ATTEMPTS + 1):
            try:
                answer = await self.http.send_to(
                    "POST",
                    self._root("upload/v1beta/files"),
                    start,
                    CONTROL_MAX_BYTES,
                    headers={
                        "X-Goog-Upload-Protocol": "resumable",
                        "X-Goog-Upload-Command": "start",
                        "X-Goog-Upload-Header-Content-Length": str(len(content)),
                        "X-Goog-Upload-Header-Content-Type": "application/jsonl",
                    },
                )
                checked(answer, self.what)
                where = answer.headers.get("x-goog-upload-url")
                if not where:
                    raise JobAbortedError(f"{self.what}'s file upload gave no upload URL")
                answer = await self.http.send_to(
                    "POST",
                    URL(where, encoded=True),
                    content,
                    CONTROL_MAX_BYTES,
                    headers={
                        "X-Goog-Upload-Command": "upload, finalize",
                        "X-Goog-Upload-Offset": "0",
                    },
                )
                return str(checked(answer, self.what)["file"]["name"])
            except (Refused, TransportError) as exc:
                if not may_be_lost(exc) or attempt == ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _file_line(self, line: Mapping[str, Any]) -> dict[str, Any]:
        """The line of a batch's input file a kept line becomes."""
        key, canonical = self.read_line(line)
        return self.dialect.batch_line(key, self.dialect.completion_body(canonical))

    def _root(self, path: str) -> URL:
        """``path`` under the server's root (the upload and download paths are not under
        ``/v1beta``)."""
        base = URL(self.engine.base_url)
        root = base.path.rstrip("/").removesuffix("/v1beta")
        return base.with_path(f"{root}/{path}", encoded=True).with_query(None)

    async def find(self, part: BatchPart, taken: frozenset[str]) -> str | None:
        wanted = DISPLAY_PREFIX + part.name
        token = ""
        for _ in range(LIST_PAGES):
            listing = await self.http.call("GET", f"batches?pageSize=100{token}")
            for operation in listing.get("operations") or listing.get("batches") or []:
                if _batch(operation).get("displayName") == wanted:
                    return _name(operation)
            next_token = listing.get("nextPageToken")
            if not next_token:
                return None
            token = f"&pageToken={quote(str(next_token))}"
        return None

    async def poll(self, batch_id: str) -> BatchView:
        return _view(await self.http.call("GET", batch_id))

    async def cancel(self, batch_id: str) -> BatchView:
        await self.http.call("POST", f"{batch_id}:cancel", b"{}")
        return await self.poll(batch_id)

    async def results(self, part: BatchPart) -> AsyncGenerator[list[BatchResult], None]:
        assert part.batch_id is not None
        operation = json.loads(await self.http.read(part.batch_id, RESULTS_MAX_BYTES))
        output = operation.get("response") or _batch(operation).get("output") or {}
        file = output.get("responsesFile")
        if file:  # the answers of a batch whose requests were a file: a JSONL file
            download = self._root(f"download/v1beta/{file}:download").with_query(alt="media")
            content = await self.http.read(download, RESULTS_MAX_BYTES)
            inlined: Any = [_json(line) for line in content.splitlines() if line.strip()]
        else:
            inlined = output.get("inlinedResponses") or {}
            if isinstance(inlined, dict):
                inlined = inlined.get("inlinedResponses") or []
        page = [
            self.dialect.batch_result(item) if isinstance(item, dict) else BatchResult(None)
            for item in inlined
        ]
        for start in range(0, len(page), 1024):
            yield page[start : start + 1024]


def _name(operation: Mapping[str, Any]) -> str:
    name = operation.get("name") or _batch(operation).get("name")
    if not isinstance(name, str) or not name.startswith("batches/"):
        raise JobAbortedError(f"Gemini's batch mode answered no batch name: {operation!r:.200}")
    return name


def _batch(operation: Mapping[str, Any]) -> dict[str, Any]:
    """The batch an operation stands for (its ``metadata``), or the batch itself."""
    metadata = operation.get("metadata")
    return metadata if isinstance(metadata, dict) else dict(operation)


def _view(operation: Mapping[str, Any]) -> BatchView:
    batch = _batch(operation)
    state = str(batch.get("state") or "")
    for prefix in ("BATCH_STATE_", "JOB_STATE_"):
        state = state.removeprefix(prefix)
    ours = STATES.get(state, "in_progress")
    stats = batch.get("batchStats") or {}
    failure: tuple[Literal["failed", "rejected"], str] | None = None
    if ours == "failed":
        error = operation.get("error") or {}
        failure = ("failed", str(error.get("message") or "no reason given"))
    return BatchView(
        state=ours,
        completed=int(stats.get("successfulRequestCount") or 0),
        failed=int(stats.get("failedRequestCount") or 0),
        failure=failure,
    )


def _json(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None  # a line that is no answer: counted as one naming no request
