"""OpenAI's Files and Batches API as a :class:`~llm_ops._pipeline.batch_service.BatchService`,
through the ``openai`` SDK (its typed models and pagination are worth their cost on paths that
are not hot; see ARCHITECTURE.md).

A part's lines are one JSONL file uploaded with ``purpose="batch"`` (its lines are the
dialect's ``batch_line``); its batch is created with the part named in its ``metadata``, by
which a batch whose create answer was lost is found again in the provider's list. Results are
the output and error files, streamed a page at a time.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Literal, cast

from .._dialects import BatchResult, Dialect
from .._engine.boundary import ANSWER_MAY_BE_LOST, provider_errors
from .._engine.engine import Engine
from .batch_service import AnswerMayBeLost, BatchPart, BatchView, Line

REQUESTS_PER_BATCH = 50_000
BYTES_PER_BATCH = 200_000_000
LINES_PER_PAGE = 1024  # lines of a file read at a time, on the engine's loop


class OpenAIBatches:
    """OpenAI's Files and Batches API, for an OpenAI-compatible endpoint."""

    requests_per_batch = REQUESTS_PER_BATCH
    bytes_per_batch = BYTES_PER_BATCH
    what = "the Batch API"

    def __init__(self, engine: Engine, dialect: Dialect):
        self.engine = engine
        self.dialect = dialect
        # Control-plane calls are few: let the SDK retry them (its backoff, its Retry-After),
        # except creating a batch, which is not idempotent (see create).
        self.sdk = engine.sdk.with_options(max_retries=4)
        self.sdk_once = engine.sdk.with_options(max_retries=0)

    def line(self, key: str, canonical: Mapping[str, Any]) -> Line:
        return self.dialect.batch_line(key, self.dialect.completion_body(canonical))

    def read_line(self, line: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        # this dialect's body is the canonical request, less its endpoint
        return self.dialect.batch_request(line)

    def sent_bytes(self, line: Mapping[str, Any], kept: bytes) -> int:
        return len(kept)  # the line kept is the line uploaded

    async def upload(self, part: BatchPart, content: bytes) -> str:
        file = await self.sdk.files.create(file=(f"{part.name}.jsonl", content), purpose="batch")
        return file.id

    async def create(self, part: BatchPart) -> str:
        assert part.input_file_id is not None
        try:
            batch = await self.sdk_once.batches.create(
                input_file_id=part.input_file_id,
                endpoint=cast(Any, self.dialect.batch_path),
                completion_window="24h",
                metadata={"llm_ops_job": part.job_id, "llm_ops_part": str(part.part)},
            )
        except ANSWER_MAY_BE_LOST as exc:
            raise AnswerMayBeLost(str(exc)) from exc
        return batch.id

    async def find(self, part: BatchPart, taken: frozenset[str]) -> str | None:
        async for batch in self.sdk.batches.list(limit=100):
            metadata = batch.metadata or {}
            if (metadata.get("llm_ops_job"), metadata.get("llm_ops_part")) == (
                part.job_id,
                str(part.part),
            ):
                return batch.id
        return None

    async def poll(self, batch_id: str) -> BatchView:
        return _view(await self.sdk.batches.retrieve(batch_id))

    async def cancel(self, batch_id: str) -> BatchView:
        return _view(await self.sdk.batches.cancel(batch_id))

    async def discard(self, part: BatchPart) -> None:
        """Nothing: the input file stays at the provider, as it always did."""

    async def results(self, part: BatchPart) -> AsyncGenerator[list[BatchResult], None]:
        for file_id in (part.output_file_id, part.error_file_id):
            if file_id is None:
                continue
            async for page in self._pages(file_id):
                yield [self.dialect.batch_result(_json_object(line)) for line in page]

    def input_lines(self, input_file_id: str) -> AsyncGenerator[list[str], None]:
        return self._pages(input_file_id)

    async def _pages(self, file_id: str) -> AsyncGenerator[list[str], None]:
        """The file's non-blank lines, a page at a time."""
        async with self.sdk.files.with_streaming_response.content(file_id) as response:
            page: list[str] = []
            async for line in response.iter_lines():
                if line.strip():
                    page.append(line)
                if len(page) >= LINES_PER_PAGE:
                    yield page
                    page = []
            if page:
                yield page

    def errors(self) -> Any:
        """The SDK's errors, as one :class:`JobAbortedError` whose message hides the key (see
        :func:`llm_ops._engine.boundary.provider_errors`)."""
        return provider_errors(self.engine.secrets)


def _view(batch: Any) -> BatchView:
    counts = batch.request_counts
    return BatchView(
        state=batch.status,
        completed=counts.completed if counts else 0,
        failed=counts.failed if counts else 0,
        output_file_id=batch.output_file_id,
        error_file_id=batch.error_file_id,
        failure=_batch_failure(batch) if batch.status == "failed" else None,
    )


def _batch_failure(batch: Any) -> tuple[Literal["failed", "rejected"], str]:
    """The status a failed batch gives its rows, and the provider's reason: ``rejected``
    when it named a line of the input file as invalid (a deterministic refusal)."""
    data = getattr(getattr(batch, "errors", None), "data", None) or []
    reasons = []
    for error in data[:3]:
        code, line = getattr(error, "code", None), getattr(error, "line", None)
        reason = str(getattr(error, "message", None) or error)
        reasons.append(
            (f"{code}: " if code else "") + reason + (f" (line {line})" if line is not None else "")
        )
    named_a_line = any(getattr(error, "line", None) is not None for error in data)
    return ("rejected" if named_a_line else "failed"), "; ".join(reasons) or "no reason given"


def _json_object(line: str) -> dict[str, Any]:
    """A line of an output file as a JSON object (``{}`` when it is not one)."""
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
