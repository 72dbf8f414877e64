""":class:`Cache`, the one face of the cache database to every stage, and :func:`open_cache`
for people's own queries. Each method says what it does and hands the work to the module that
does it: opening (:mod:`._connection`), reading (:mod:`._reads`), writing and merging
(:mod:`._writes`), the semantic cache's search (:mod:`._nearest`), and what people do with
a cache (:mod:`._admin`)."""

from __future__ import annotations

import contextlib
import os
import reprlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa

from .. import _dialects
from .._in_place import in_place
from .._journal import JournalWriter
from ..exceptions import CacheError, ConfigError
from . import _admin, _connection, _nearest, _reads, _writes
from ._connection import CACHE_ENV, resolve_cache_path
from ._migrations import migrate

MERGE_WAIT = 30.0
"""Seconds the end of a job waits, by default, for a reader holding the cache file to let go,
so that its answers are in the file (not only in the journal) when it returns."""
FLUSH_EVERY = 8192
"""Answers per merge from the journal into the file, at most: answers are durable in the
journal already, and each merge costs 40-130 ms of CPU, which at 1,024 per merge was a fifth
of a request's CPU at high concurrency; ``flush_seconds`` still bounds how stale the file is."""


def _seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e6:
        raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")


MAX_AGE_LIMIT = timedelta(days=365_000)
"""The longest ``max_age``, about 1,000 years: the oldest answer it reuses (now less it) must
be a date that Python and DuckDB hold, and no cached answer is older. For any age, give none."""


def parse_duration(text: str) -> timedelta:
    """A duration as the command line and the flow spell it: ``1d``, ``6h``, ``30m``, ``45s``
    or a number of seconds, of at most :data:`MAX_AGE_LIMIT`.

    >>> parse_duration("6h"), parse_duration("90")
    (datetime.timedelta(seconds=21600), datetime.timedelta(seconds=90))
    """
    seconds = _dialects.parse_duration(text.lower()) if isinstance(text, str) else None
    if seconds is None or not seconds > 0:  # not a duration, or nan
        raise ConfigError(
            f"a duration is a positive number with s, m, h or d (1d, 6h, 30m, 45s) or a "
            f"number of seconds, got {text!r}"
        )
    return _within_limit(seconds, text)


def max_age_of(value: object) -> timedelta | None:
    """``max_age``: a positive :class:`~datetime.timedelta`, number of seconds or duration
    (see :func:`parse_duration`) of at most :data:`MAX_AGE_LIMIT`, or ``None`` for answers of
    any age."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, timedelta):
        if value <= timedelta(0):
            raise ConfigError(f"max_age must be a positive duration, got {value!r}")
        return _within_limit(value.total_seconds(), value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(
            f"max_age must be a timedelta or a positive number of seconds, got {value!r}"
        )
    return _within_limit(value, value)


def _within_limit(seconds: float, given: object) -> timedelta:
    """``seconds`` as a timedelta, or a :class:`ConfigError` beyond :data:`MAX_AGE_LIMIT`
    (infinity included: a timedelta of it, or now less it, would be an ``OverflowError``)."""
    if not seconds <= MAX_AGE_LIMIT.total_seconds():
        raise ConfigError(
            f"max_age must be at most {MAX_AGE_LIMIT.days:,} days (about 1,000 years), got "
            f"{reprlib.repr(given)}; for answers of any age, give no max_age"
        )
    return timedelta(seconds=seconds)


@in_place
class Cache:
    """One cache database file and its journal, the face every stage talks to.

    Connections are short: opened for one lookup or one merge and closed at once, retried
    while another process holds the file (up to ``lock_timeout`` seconds for reads). Each
    method is a function of the module of its kind, which takes the cache as its first
    argument: :mod:`._connection` opens the file, :mod:`._reads` reads it with the journal,
    :mod:`._writes` writes through the journal and merges it, :mod:`._nearest` finds the
    nearest cached answers by embedding, :mod:`._admin` holds what
    people do with a cache.

    Given as ``cache=`` to a call or a :class:`~llm_ops.Client`, it says how the file is
    written besides where it is:

    Parameters
    ----------
    path
        The DuckDB file; made with its folder when missing.
    flush_every, flush_seconds
        Answers go to the journal at once (at most 32 behind), so a killed job keeps what it
        paid for, and are merged into the DuckDB file once this many are pending or this many
        seconds passed.
    merge_wait
        Seconds the end of a job waits for a reader holding the file to let go of it (30 by
        default; 0: no wait), so its answers are in the file when the job returns; what is
        left waits in the journal (``report.journal_pending``), still cache hits, until
        ``llm-ops cache merge`` or any later job.
    lock_timeout
        Seconds a read waits for another process holding the file.
    max_age
        How old a cached answer may be and still be reused (a :class:`~datetime.timedelta`,
        seconds, or ``"6h"``, ``"1d"``, up to :data:`MAX_AGE_LIMIT`; ``None``, the default: any
        age). An older one is a miss: its request is sent again and the new answer becomes the
        one later jobs reuse, while the old one moves to ``llm_cache_history``, never deleted
        by this setting.

    Examples
    --------
    >>> from llm_ops import Cache
    >>> Cache("answers.duckdb", merge_wait=0)
    Cache('answers.duckdb')
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        flush_every: int = FLUSH_EVERY,
        flush_seconds: float = 2.0,
        lock_timeout: float = 30.0,
        merge_wait: float = MERGE_WAIT,
        max_age: timedelta | float | str | None = None,
    ):
        if not isinstance(path, str | os.PathLike):
            raise ConfigError(f"a cache's path must be a file path, got {path!r}")
        if isinstance(flush_every, bool) or not isinstance(flush_every, int) or flush_every < 1:
            raise ConfigError(f"flush_every must be a positive integer, got {flush_every!r}")
        _seconds("flush_seconds", flush_seconds)
        _seconds("lock_timeout", lock_timeout)
        if merge_wait != 0:  # 0: do not wait for a reader
            _seconds("merge_wait", merge_wait)
        self.path = Path(path).expanduser()
        self.journal = self.path.with_name(self.path.name + ".journal")
        self.flush_every = flush_every
        self.flush_seconds = flush_seconds
        self.lock_timeout = lock_timeout
        self.merge_wait = merge_wait
        self.max_age = max_age_of(max_age)

    def __repr__(self) -> str:
        return f"Cache({str(self.path)!r})"

    def prepare(self) -> None:
        """Make sure the cache can be used before anything is paid for (see
        :func:`._connection.prepare`), and merge what dead or finished jobs left in the
        journal; a lock held elsewhere only delays that merge."""
        _connection.prepare(self)
        self.merge_orphans(wait=0.5)

    connect = _connection.connect
    attached = _connection.attached

    def lookup(self, keys: pa.Table, *, any_age: bool = False, reasoning: bool = False) -> pa.Table:
        """Cached answers for the ``key`` column of ``keys`` (journal included), the newest
        of each key, none older than :attr:`max_age` unless ``any_age``; their thinking only
        if ``reasoning`` (see :func:`._reads.lookup`)."""
        return _reads.lookup(self, keys, since=self._since(any_age), reasoning=reasoning)

    lookup_embeddings = _reads.lookup_embeddings

    def answers_view(
        self,
        con: duckdb.DuckDBPyConnection,
        *,
        name: str,
        columns: Sequence[str],
        any_age: bool = False,
    ) -> contextlib.AbstractContextManager[None]:
        """For the block, ``name`` on ``con`` is a view of the cached answers (see
        :func:`._reads.answers_view`), none older than :attr:`max_age` unless ``any_age``."""
        return _reads.answers_view(
            self, con, name=name, columns=columns, since=self._since(any_age)
        )

    def _since(self, any_age: bool) -> datetime | None:
        """The oldest answer reused: now less :attr:`max_age` (``None``: any)."""
        if self.max_age is None or any_age:
            return None
        return datetime.now(UTC) - self.max_age

    similar_candidates = _reads.similar_candidates

    def nearest(self, queries: pl.DataFrame, *, embedding_model: str) -> pl.DataFrame:
        """The most similar cached answer of each query (see :func:`._nearest.nearest`),
        none older than :attr:`max_age`."""
        return _nearest.nearest(
            self, queries, embedding_model=embedding_model, since=self._since(False)
        )

    batch_parts = _reads.batch_parts
    learned_concurrency = _reads.learned_concurrency
    batch_keys = _reads.batch_keys

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

    merge_files = _writes.merge_files
    merge_orphans = _writes.merge_orphans
    settle = _writes.settle
    adopt = _writes.adopt

    snapshot = _admin.snapshot
    stats = _admin.stats
    export = _admin.export
    prune = _admin.prune
    vacuum = _admin.vacuum
    insert = _admin.insert


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


def cache_of(cache: str | os.PathLike[str] | bool | Cache | None) -> Cache | None:
    """``cache=``: a :class:`Cache` as given, a path standing for one with the default
    settings, ``None``/``True`` for ``LLM_OPS_CACHE`` or the default file, ``False`` for
    none."""
    if isinstance(cache, Cache):
        return cache
    if not isinstance(cache, str | os.PathLike | bool | None):
        raise ConfigError(
            "cache takes a file path, a Cache(path, ...), None for the default file or False "
            f"for none, got {type(cache).__name__}"
        )
    path = resolve_cache_path(cache)
    return None if path is None else Cache(path)
