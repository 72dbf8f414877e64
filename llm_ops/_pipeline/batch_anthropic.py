"""Anthropic's Message Batches API as a :class:`~llm_ops._pipeline.batch_service.BatchService`.

``POST {batch_path}/batches`` (under the dialect's ``batch_path``, its Messages path) takes
``{"requests": [{"custom_id", "params"}]}`` (``params``: the dialect's Messages body),
``GET .../batches/{id}`` says how it does (``processing_status`` ``in_progress`` /
``canceling`` / ``ended``, ``request_counts``),
``GET .../batches/{id}/results`` gives JSON lines in any order, each
``{"custom_id", "result": {"type": "succeeded" | "errored" | "canceled" | "expired", ...}}``,
and ``POST .../batches/{id}/cancel`` cancels it. At most 100,000 requests or 256 MB a
batch.

Spoken over the engine's own HTTP (aiohttp, with the dialect's headers, its key and API
version among them; the endpoint's TLS and proxy), not the ``anthropic`` SDK: the API is
four JSON calls, the engine already holds a connection set up as the user asked, and the SDK
would be one more dependency and HTTP stack to configure alike for them.

Each line, sent and read back, is spelled by the dialect (its ``batch_line`` and
``batch_result``, :mod:`llm_ops._dialects.anthropic`: a request key as a ``custom_id``, a result's
type onto an answer, an error, or a request not answered and so submitted again); this module
speaks the batch as a whole. The API keeps no input to read back, so a part's
canonical requests are kept in a local file (:class:`~llm_ops._pipeline.batch_service.
LocalInputs`). A batch carries no metadata: one whose create answer was lost is looked for
among the newest batches by its request count and creation time, past those the cache records
already (:meth:`AnthropicBatches.find`); a wrong guess costs no wrong answer, since answers are
matched by key, only lines submitted again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from .._dialects import BatchResult, Dialect
from .._engine.engine import Engine
from .batch_service import (
    ENVELOPE_BYTES,
    BatchPart,
    BatchView,
    KeptRequests,
    LocalInputs,
)

REQUESTS_PER_BATCH = 100_000
BYTES_PER_BATCH = 256_000_000 - ENVELOPE_BYTES
RESULTS_MAX_BYTES = 2**33  # a results file is read whole: bounded, far above 100,000 answers
CLOCK_SLACK_SECONDS = 300.0  # the provider's clock and ours may differ this much


class AnthropicBatches(KeptRequests):
    """Anthropic's Message Batches API, for an endpoint of the Anthropic dialect."""

    requests_per_batch = REQUESTS_PER_BATCH
    bytes_per_batch = BYTES_PER_BATCH
    what = "the Message Batches API"

    def __init__(self, engine: Engine, dialect: Dialect, inputs: LocalInputs):
        super().__init__(engine, dialect, inputs)
        # the batches live under the path the dialect's lines name (its Messages path)
        self.path = dialect.batch_path.strip("/") + "/batches"

    # -- lines ---------------------------------------------------------------------------------

    def _request(self, line: Mapping[str, Any]) -> dict[str, Any]:
        """The request a kept line sends, as the dialect spells a batch's line."""
        key, canonical = self.read_line(line)
        return self.dialect.batch_line(key, self.dialect.completion_body(canonical))

    # -- calls ---------------------------------------------------------------------------------

    async def create(self, part: BatchPart) -> str:
        assert part.input_file_id is not None
        content = await asyncio.to_thread(LocalInputs.read, part.input_file_id)
        lines = [json.loads(line) for line in content.splitlines() if line.strip()]
        body = json.dumps(
            {"requests": [self._request(line) for line in lines]}, ensure_ascii=False
        ).encode()
        batch = await self.http.create(self.path, body)
        return str(batch["id"])

    async def find(self, part: BatchPart, taken: frozenset[str]) -> str | None:
        """The batch made for ``part`` when it can be told: of the newest batches, the one
        holding as many requests as the part, made after its lines were kept (give or take
        the clocks' difference), that no other part recorded claims. ``None`` when none or
        several are."""
        if part.input_file_id is None:
            return None
        try:
            kept = Path(part.input_file_id).stat().st_mtime - CLOCK_SLACK_SECONDS
        except OSError:
            return None
        listing = await self.http.call("GET", f"{self.path}?limit=100")
        candidates = [
            str(batch["id"])
            for batch in listing.get("data") or []
            if batch.get("id") not in taken
            and sum((batch.get("request_counts") or {}).values()) == part.requests
            and _timestamp(batch.get("created_at")) >= kept
        ]
        return candidates[0] if len(candidates) == 1 else None

    async def poll(self, batch_id: str) -> BatchView:
        return _view(await self.http.call("GET", f"{self.path}/{batch_id}"))

    async def cancel(self, batch_id: str) -> BatchView:
        return _view(await self.http.call("POST", f"{self.path}/{batch_id}/cancel", b""))

    async def results(self, part: BatchPart) -> AsyncGenerator[list[BatchResult], None]:
        # Always under the endpoint's own base URL, whatever results_url names: the key is
        # sent with it, and must go nowhere else.
        content = await self.http.read(f"{self.path}/{part.batch_id}/results", RESULTS_MAX_BYTES)
        page: list[BatchResult] = []
        for line in content.splitlines():
            if line.strip():
                page.append(self._result(line))
            if len(page) >= 1024:
                yield page
                page = []
        if page:
            yield page

    # -- reading -------------------------------------------------------------------------------

    def _result(self, raw: bytes) -> BatchResult:
        """One line of the results, as the dialect reads it (``canceled`` and ``expired``:
        not answered, so submitted again); a line that is no JSON object names no request."""
        try:
            line = json.loads(raw)
        except ValueError:
            return BatchResult(None)
        return self.dialect.batch_result(line) if isinstance(line, dict) else BatchResult(None)


def _view(batch: Mapping[str, Any]) -> BatchView:
    counts = batch.get("request_counts") or {}
    status = batch.get("processing_status")
    if status == "ended":
        if batch.get("cancel_initiated_at"):
            state = "cancelled"
        elif counts.get("expired"):
            state = "expired"
        else:
            state = "completed"
    else:
        state = {"in_progress": "in_progress", "canceling": "cancelling"}.get(
            str(status), "in_progress"
        )
    return BatchView(
        state=state,
        completed=int(counts.get("succeeded") or 0),
        failed=int(counts.get("errored") or 0),
        output_file_id=batch.get("results_url"),
    )


def _timestamp(text: object) -> float:
    """An RFC 3339 time as seconds since the epoch (0 when it is none)."""
    if not isinstance(text, str):
        return 0.0
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
