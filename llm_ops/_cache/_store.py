""":class:`Cache`, the one face of the cache database to every stage, and :func:`open_cache`
for people's own queries. Each method says what it does and hands the work to the module that
does it: opening (:mod:`._connection`), reading (:mod:`._reads`), writing and merging
(:mod:`._writes`), and what people do with a cache (:mod:`._admin`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal

import duckdb
import pyarrow as pa

from .._journal import JournalWriter
from ..exceptions import CacheError
from . import _admin, _connection, _reads, _writes
from ._connection import CACHE_ENV, resolve_cache_path
from ._migrations import migrate
from ._writes import Merged

MERGE_WAIT = 30.0
"""Seconds the end of a job waits, by default, for a reader holding the cache file to let go,
so that its answers are in the file (not only in the journal) when it returns."""
FLUSH_EVERY = 8192
"""Answers per merge from the journal into the file, at most: answers are durable in the
journal already, and each merge costs 40-130 ms of CPU, which at 1,024 per merge was a fifth
of a request's CPU at high concurrency; ``flush_seconds`` still bounds how stale the file is."""


class Cache:
    """One cache database file and its journal; every statement on the cache tables.

    Connections are short: opened for one lookup or one merge and closed at once, retried
    while another process holds the file (up to ``lock_timeout`` seconds for reads).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        flush_every: int = FLUSH_EVERY,
        flush_seconds: float = 2.0,
        lock_timeout: float = 30.0,
        merge_wait: float = MERGE_WAIT,
    ):
        self.path = Path(path)
        self.journal = self.path.with_name(self.path.name + ".journal")
        self.flush_every = flush_every
        self.flush_seconds = flush_seconds
        self.lock_timeout = lock_timeout
        self.merge_wait = merge_wait

    def __repr__(self) -> str:
        return f"Cache({str(self.path)!r})"

    # -- opening ------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Make sure the cache can be used before anything is paid for: create its folder and
        the database, migrate it, check that the file and the journal can be written, and merge
        journal files a dead or finished job left behind. Raises :class:`CacheError` naming
        the path and what to do; a lock held elsewhere only delays the merge."""
        _connection.prepare(self)
        self.merge_orphans(wait=0.5)

    def connect(
        self, *, read_only: bool = True, wait: float | None = None
    ) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        """A short-lived connection, migrated when writable, retried while the file is held."""
        return _connection.connect(self, read_only=read_only, wait=wait)

    def attached(
        self, con: duckdb.DuckDBPyConnection, *, alias: str
    ) -> AbstractContextManager[None]:
        """Attach the cache read-only to another connection as ``alias``, for the block (say,
        for a query of your own over ``alias.llm_cache``)."""
        return _connection.attached(self, con, alias=alias)

    # -- reading ------------------------------------------------------------------------------

    def lookup(self, keys: pa.Table) -> pa.Table:
        """Cached answers for the ``key`` column of ``keys`` (journal included), in one join."""
        return _reads.lookup(self, keys)

    def lookup_embeddings(self, keys: pa.Table) -> pa.Table:
        """Cached vectors for the ``key`` column of ``keys`` (journal included), in one join."""
        return _reads.lookup_embeddings(self, keys)

    def answers_view(
        self, con: duckdb.DuckDBPyConnection, *, name: str, columns: Sequence[str]
    ) -> AbstractContextManager[None]:
        """For the block, ``name`` on ``con`` is a view of the cached answers (the file's and
        the journal's, one row per key) with ``columns`` of ``llm_cache``: for a join of a
        big table of keys against them, inside DuckDB."""
        return _reads.answers_view(self, con, name=name, columns=columns)

    def similar_candidates(
        self,
        scopes: Sequence[str],
        *,
        embedding_model: str,
        dimensions: int,
        batch_rows: int = 65_536,
    ) -> Iterator[pa.RecordBatch]:
        """Cached ``ok`` answers in one of ``scopes`` with a vector from ``embedding_model``,
        as batches of (key, scope, embedding), read a batch at a time."""
        return _reads.similar_candidates(
            self,
            scopes,
            embedding_model=embedding_model,
            dimensions=dimensions,
            batch_rows=batch_rows,
        )

    def batch_parts(
        self, *, keys: Sequence[str] | None = None, job_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Every batch part that carries one of ``keys`` (or belongs to ``job_id``, or all),
        in its latest state, with the ids recorded along the way; oldest first."""
        return _reads.batch_parts(self, keys=keys, job_id=job_id)

    def batch_keys(self, job_id: str, part: int) -> list[str]:
        """The request keys a batch part carries."""
        return _reads.batch_keys(self, job_id, part)

    # -- writing ------------------------------------------------------------------------------

    def writer(self) -> JournalWriter:
        """A writer for one job: rows go to the journal at once and into the file in batches
        of ``flush_every``."""
        return JournalWriter(self.journal, merge=self.merge_files, merge_every=self.flush_every)

    def record_run(self, run: Mapping[str, Any], *, wait: float | None = None) -> int:
        """Append one row to ``llm_runs`` (from a report's fields, those it has columns for),
        at a job's end: with it, what the job's writers left in the journal is merged
        (:meth:`settle`, waiting up to ``wait``, else :attr:`merge_wait`, seconds for a
        reader to let go of the file). Returns the answers still waiting in the journal."""
        _writes.write_rows(self.writer(), "llm_runs", [_writes.run_row(run)], wait=None)
        return self.settle(wait=self.merge_wait if wait is None else wait).waiting

    def index_for_similarity(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Make answers findable by the semantic cache: key, scope, embedding_key."""
        _writes.write_rows(self.writer(), "llm_semantic_index", rows)

    def record_batch(self, part: Mapping[str, Any], *, keys: Sequence[str] = ()) -> None:
        """Record that a batch part reached ``part["state"]`` (with the provider's ids known
        so far), and, the first time, which request keys it carries. Durable (in the journal)
        when this returns, so it can come before the provider call it announces."""
        _writes.write_batch(self.writer(), part, keys)

    def merge_files(self, files: Sequence[Path], wait: float) -> str | None:
        """Insert journal ``files`` into their tables and delete them; why not (nothing is
        deleted then) when the file stays locked for ``wait`` seconds or cannot be written.
        Raises :class:`CacheError` when waiting cannot help: the file is damaged, or its disk
        is full (the files stay then too)."""
        return _writes.merge_files(self, files, wait)

    def merge_orphans(self, *, wait: float, directory: Path | None = None) -> int:
        """Merge the journal files of writers that are gone (crashed, or ended while the file
        was held), in the cache's journal or in ``directory`` (where a cluster's workers
        write theirs); returns how many files were merged."""
        return _writes.merge_orphans(self, wait=wait, directory=directory)

    def settle(self, *, wait: float, warn: bool = True) -> Merged:
        """Merge what finished writers left in the journal (a job's end: its answers and its
        run). When the file is held and answers wait, say so and wait up to ``wait`` seconds
        for it; what is left after that (a warning says so, unless ``warn=False``) is merged
        by any later job or open, or by ``llm-ops cache merge``, and is read by lookups until
        then."""
        return _writes.settle(self, wait=wait, warn=warn)

    def adopt(self, directory: Path, *, wait: float) -> None:
        """Take the journal files that finished writers left in ``directory`` (a cluster's
        workers, which may not open the cache) into this cache's journal, and merge them:
        until they are merged, lookups read them there like any other journal file."""
        _writes.adopt(self, directory, wait=wait)

    # -- for people ---------------------------------------------------------------------------

    def snapshot(self, target: str | os.PathLike[str]) -> Path:
        """Copy the cache, with what the journal holds, into a new file ``target``: a copy
        to query (or open in another tool) for as long as you like, while jobs go on writing
        the original."""
        return _admin.snapshot(self, target)

    def stats(self) -> tuple[pa.Table, int]:
        """Answers, tokens and the newest answer per model, and how many runs are recorded."""
        return _admin.stats(self)

    def export(self, *, model: str | None = None) -> pa.Table:
        """Cached answers (of ``model``, or all), oldest first."""
        return _admin.export(self, model=model)

    def prune(
        self,
        *,
        model: str | None = None,
        older_than_days: float | None = None,
        status: str | None = None,
        dry_run: bool = False,
    ) -> int:
        """Delete cached answers matching every filter given; returns how many (would) go."""
        return _admin.prune(
            self, model=model, older_than_days=older_than_days, status=status, dry_run=dry_run
        )

    def vacuum(self) -> tuple[int, int]:
        """Rewrite the file to reclaim the space of deleted rows; sizes before and after."""
        return _admin.vacuum(self)

    def insert(
        self, table: Literal["llm_cache", "llm_embeddings", "llm_semantic_index"], rows: pa.Table
    ) -> None:
        """Insert ``rows`` (an Arrow table with some of the table's columns), say to restore an
        export; a key already present keeps its row."""
        _admin.insert(self, table, rows)


def open_cache(
    cache: str | os.PathLike[str] | None = None,
    *,
    read_only: bool = True,
    lock_timeout: float = 30.0,
) -> duckdb.DuckDBPyConnection:
    """Open the cache database for your own queries; close it when done.

    Read-only by default. Opening waits (up to ``lock_timeout`` seconds) while a job merges
    answers into the file, instead of failing with DuckDB's raw IO error, and merges what
    finished jobs left in the journal first. While you hold the connection, running jobs keep
    their answers in the journal and merge them once you close it; to hold a copy as long as
    you like, take a snapshot (``llm-ops cache snapshot``).

    Use it as a context manager::

        with open_cache("output/cache.duckdb") as con:
            con.sql("SELECT model, count(*) FROM llm_cache GROUP BY model").show()
    """
    path = resolve_cache_path(cache)
    assert path is not None
    if read_only and not path.exists():
        raise CacheError(
            f"there is no cache at {path} yet; run a job first, or pass the path "
            f"of an existing cache (cache= or {CACHE_ENV})"
        )
    store = Cache(path, lock_timeout=lock_timeout)
    with contextlib.suppress(CacheError):
        store.merge_orphans(wait=min(lock_timeout, 2.0))
    con = _connection.open_retrying(path, read_only=read_only, wait=lock_timeout)
    if not read_only:
        migrate(con)
    return con
