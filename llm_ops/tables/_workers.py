"""What the processes sending one table's chunks share (a cluster's workers: see
:mod:`llm_ops.ray`): one rate budget they lease from, and the work directory their answers
wait in for the one process that writes the cache."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from .._cache import Cache
from .._journal import JournalWriter
from .._limits import SharedQuota

__all__ = ["SharedQuota", "WorkerStore"]


class WorkerStore(Cache):
    """A worker's cache: answers appended to its own journal files in the shared work
    directory, for the driver to merge; the cache file itself is never opened.

    Examples
    --------
    What a chunk task does on a worker, here without Ray: a client of its own, without a
    cache, sends the chunk, and the answers wait in the work directory until the driver
    adopts them into the cache.

    >>> import tempfile
    >>> from pathlib import Path
    >>> import polars as pl
    >>> from llm_ops import Client
    >>> from llm_ops.tables import Table, WorkerStore, send_chunk
    >>> from llm_ops.testing import LocalEndpoint
    >>> work = tempfile.TemporaryDirectory()
    >>> reviews, out = Path(work.name, "reviews.parquet"), Path(work.name, "out.parquet")
    >>> pl.DataFrame({"text": ["Runs small", "Lovely fabric"]}).write_parquet(reviews)
    >>> cache = Path(work.name, "cache.duckdb")
    >>> with LocalEndpoint() as endpoint, Client(endpoint=endpoint.base_url, cache=cache) as c:
    ...     table = Table(c, reviews, out, prompt="Summarize: {text}", model="sim")
    ...     chunk = table.plan().chunks[0]
    ...     store = WorkerStore(table.answers_dir, flush_every=32, flush_seconds=2.0)
    ...     with Client(endpoint=endpoint.base_url, cache=False) as worker:
    ...         taken = send_chunk(worker, table.job, store, chunk)
    ...     journalled = len(list(table.answers_dir.glob("*.jsonl")))
    ...     hits_before = table.estimate().cache_hits
    ...     table.cache.adopt(table.answers_dir, wait=2.0)  # on the driver
    ...     hits_after = table.estimate().cache_hits
    >>> taken.sent, journalled, hits_before, hits_after
    (2, 1, 0, 2)
    >>> work.cleanup()
    """

    def __init__(
        self,
        directory: Path,
        *,
        flush_every: int,
        flush_seconds: float,
        max_age: timedelta | None = None,
    ):
        # max_age: the driver's cache's, so that a worker's answers to requests whose cached
        # answer was too old are refreshes, which replace it when the driver merges them
        super().__init__(
            directory / "never-opened.duckdb",
            flush_every=flush_every,
            flush_seconds=flush_seconds,
            max_age=max_age,
        )
        self.journal = directory

    def prepare(self) -> None:
        self.journal.mkdir(parents=True, exist_ok=True)

    def writer(self) -> JournalWriter:
        return JournalWriter(self.journal, merge=_left_to_the_driver, merge_every=self.flush_every)


def _left_to_the_driver(files: Any, wait: float) -> str | None:
    """A worker's journal files stay where they are: the driver merges them."""
    return None
