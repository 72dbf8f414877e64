"""Persist: a dispatch's answers written through to the cache as they arrive.

Rows go to the cache's journal at once (see :mod:`llm_ops._cache`), so a crash loses at most
the answers in flight plus :data:`~llm_ops._cache.JOURNAL_BATCH`; they are merged into the
DuckDB file in the background, ``flush_every`` rows or ``flush_seconds`` at a time, and no
worker ever waits for the file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ._cache import Cache

MERGE_WAIT = 1.0  # seconds a background merge waits for the file before trying later
CLOSE_WAIT = 2.0  # at the end; what still cannot be merged stays in the journal


class CacheSink:
    """The cache writer of one dispatch, driven from its event loop."""

    def __init__(self, cache: Cache):
        self.writer = cache.writer()
        self.merge_every = cache.flush_every
        self.merge_seconds = cache.flush_seconds
        self._merge: asyncio.Future[bool] | None = None

    def answer(self, row: Mapping[str, Any]) -> None:
        self.writer.answer(row)
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
            await asyncio.sleep(self.merge_seconds)
            self.writer.write()
            if self.writer.unmerged:
                self._start_merge()

    async def close(self) -> None:
        """Wait for the merge under way, then merge the rest (or leave it in the journal)."""
        try:
            if self._merge is not None:
                await self._merge
        finally:
            await asyncio.to_thread(self.writer.close, wait=CLOSE_WAIT)
