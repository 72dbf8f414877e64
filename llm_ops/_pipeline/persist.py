"""Persist: a dispatch's answers written through to the cache as they arrive.

Rows go to the cache's journal at once (see :mod:`llm_ops._cache`), so a crash loses at most
the answers in flight plus :data:`~llm_ops._journal.JOURNAL_BATCH`; they are merged into the
DuckDB file in the background, ``flush_every`` rows or ``flush_seconds`` at a time, and no
worker ever waits for the file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from .._cache import Cache
from .._claims import Claims
from .._journal import unkeepable
from .._options import Job
from .._outcome import STOPS, Outcome, Request
from .._progress import ProgressCallback, TerminalDisplay, Tracker
from .._status import CACHEABLE
from .._telemetry import span
from .backend import Backend

MERGE_WAIT = 1.0  # seconds a background merge waits for the file before trying later
CLOSE_WAIT = 0.5  # at the end of a dispatch; what the file does not take then waits for the
# job's end, which waits longer (Cache.settle, merge_wait) for all of the job's writers at once


class CacheSink:
    """The cache writer of one dispatch, driven from its event loop.

    Its flush timer waits ``flush_seconds`` between merges through ``sleep``:
    :func:`asyncio.sleep`, or a test's, which moves a fake clock.
    """

    def __init__(
        self,
        cache: Cache,
        *,
        merge_at_close: bool = True,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.writer = cache.writer()
        self.merge_at_close = merge_at_close
        self._sleep = sleep
        self.merge_every = cache.flush_every
        self.merge_seconds = cache.flush_seconds
        # under a max_age, what is sent is missing or too old: a refresh (see _cache._writes)
        self.refresh = {"refresh": True} if cache.max_age is not None else {}
        self._merge: asyncio.Future[bool] | None = None

    def answer(self, row: Mapping[str, Any]) -> None:
        self.writer.answer({**row, **self.refresh})
        self._maybe_merge()

    def vector(self, row: Mapping[str, Any]) -> None:
        self.writer.vector(row)
        self._maybe_merge()

    def _maybe_merge(self) -> None:
        if self.writer.unmerged >= self.merge_every:
            self._start_merge()

    def _start_merge(self) -> None:
        if self._merge is None or self._merge.done():
            if self._merge is not None:
                self._merge.result()  # surface a failed merge
            self._merge = asyncio.ensure_future(
                asyncio.to_thread(self.writer.merge, wait=MERGE_WAIT)
            )

    async def merge_periodically(self) -> None:
        """Bound how long an answer waits when answers trickle in; cancel to stop."""
        while True:
            await self._sleep(self.merge_seconds)
            self.writer.write()
            if self.writer.unmerged:
                self._start_merge()

    async def close(self) -> None:
        """Wait for the merge under way, then merge the rest (or leave it in the journal)."""
        try:
            if self._merge is not None:
                await self._merge
        finally:
            wait = CLOSE_WAIT if self.merge_at_close else None  # None: sealed for the job's end
            await asyncio.to_thread(self.writer.close, wait=wait)


class AnswerSink:
    """Collects a dispatch's outcomes and writes its cacheable answers through to the cache;
    with ``claim``, it claims each request before it is sent (see :mod:`llm_ops._claims`)."""

    def __init__(self, job: Job, backend: Backend, *, claim: bool = False):
        self.model = job.spec.model
        self.endpoint = job.spec.endpoint
        self.outcomes: list[Outcome] = []
        self.cache = (
            None
            if backend.cache is None
            else CacheSink(backend.cache, merge_at_close=not backend.settles)
        )
        self.claims = (
            Claims(backend.cache.journal, self.cache.writer.id)
            if claim and self.cache is not None and backend.cache is not None
            else None
        )
        # What an answer may add to its journal line: its text, at most the body that carried
        # it, and with a schema its normalised JSON too, about as long.
        self.answer_bytes = backend.engine.limits.max_response_bytes * (
            2 if job.spec.schema is not None else 1
        )

    def unkeepable(self, request: Request) -> str | None:
        """Why the answer to ``request`` could not be cached (see
        :data:`~llm_ops._journal.LINE_MOST`): then it is not sent, since it would be paid for
        and lost; ``None`` when it can be, or when there is no cache."""
        if self.cache is None:
            return None
        return unkeepable(request.request_json, self.answer_bytes)

    def keep(self, request: Request, outcome: Outcome) -> None:
        """Keep ``outcome`` for the dispatch's result, and a cacheable answer in the cache."""
        self.outcomes.append(outcome)
        if self.cache is None or outcome.status not in CACHEABLE:
            return
        self.cache.answer(
            {
                "key": outcome.key,
                "model": self.model,
                "endpoint": self.endpoint,
                "request": request.request_json,
                "status": outcome.status,
                "response_text": outcome.text,
                "response_json": outcome.json,
                "reasoning_text": outcome.reasoning,
                # the cache's column keeps its name (users query it); the dialect says
                # which of the endpoint's fields filled it
                "finish_reason": outcome.stop_reason,
                # unknown usage (tokens the endpoint reported that cannot be right): NULL
                "prompt_tokens": outcome.prompt_tokens if outcome.usage_known else None,
                "completion_tokens": outcome.completion_tokens if outcome.usage_known else None,
                "cached_tokens": outcome.cached_tokens if outcome.usage_known else None,
                "reasoning_tokens": outcome.reasoning_tokens if outcome.usage_known else None,
                "cache_write_tokens": outcome.cache_write_tokens if outcome.usage_known else None,
                "latency_ms": outcome.latency_ms,
                "attempts": outcome.attempts,
                "created_at": datetime.now(UTC),
            }
        )


class Sender(Protocol):
    """What sends a dispatch's requests: a live
    :class:`~llm_ops._engine.dispatcher.Dispatcher`, or a
    :class:`~llm_ops._pipeline.batch.BatchRunner`."""

    async def run(
        self, requests: Iterable[Request], on_outcome: Callable[[Request, Outcome], Awaitable[None]]
    ) -> None: ...


async def dispatch_durably(
    dispatcher: Sender,
    requests: Iterable[Request],
    on_outcome: Callable[[Request, Outcome], Awaitable[None]],
    *,
    cache_writer: CacheSink | None,
    tracker: Tracker,
    progress: ProgressCallback | None,
) -> BaseException | None:
    """Run ``dispatcher`` over ``requests`` while ``cache_writer`` merges answers into the cache
    and ``progress`` gets snapshots; returns why it stopped early (one of
    :data:`~llm_ops._outcome.STOPS`: refused, SIGTERM, Ctrl-C), if it did. Whatever happens,
    every answer received is made durable before this returns."""
    helpers = (
        [] if cache_writer is None else [asyncio.create_task(cache_writer.merge_periodically())]
    )
    if progress is not None:
        helpers.append(asyncio.create_task(tracker.publish(progress)))
    stopped: BaseException | None = None
    try:
        await dispatcher.run(requests, on_outcome)
    except STOPS as exc:
        stopped = exc  # the caller reports; what was paid for is kept below
    finally:
        for helper in helpers:
            helper.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        if isinstance(progress, TerminalDisplay):
            progress.close()
        if cache_writer is not None:
            with span("llm_ops.persist"):
                await cache_writer.close()
    return stopped
