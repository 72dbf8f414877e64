"""The cache database: a DuckDB file holding ``llm_cache``, ``llm_runs`` and friends.

Location: the ``cache=`` argument, else the ``LLM_OPS_CACHE`` environment variable, else
``$XDG_CACHE_HOME/llm-ops/cache.duckdb`` (``~/.cache/llm-ops/cache.duckdb``).

DuckDB lets one process hold a file open for writing and locks every other process out, readers
included, and a reader that holds the file locks writers out. So an answer is never written
straight into the file: every row a job writes is first appended to the journal (see
:mod:`llm_ops._journal`), which survives a crash of the process, and merged from there into the
file whenever it is free. A lock can delay that merge, never lose an answer or stop a job:
lookups read the journal too, a job's end waits a while (``merge_wait``) for a reader to let go,
and journal files left behind (by a crash, or by a reader that held the file past that) are
merged on the next open or by ``llm-ops cache merge``. Merging is idempotent: a key already
present keeps its first row. A journal line cut short (a crash, a full disk) is skipped with a
warning; a full disk or a damaged file stops the job with one :class:`CacheError` that says what
to do, since waiting does not help there.

The schema only changes through the numbered migrations in :data:`MIGRATIONS`; the versions
applied are recorded in ``llm_ops_migrations``. All SQL on these tables lives in this module.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import duckdb
import pyarrow as pa

from ._journal import WHOLE, JournalWriter, finished, held, is_out_of_space, out_of_space
from .exceptions import CacheError, CacheLockedError, ConfigError

_log = logging.getLogger("llm_ops")

CACHE_ENV = "LLM_OPS_CACHE"
LIST_ATTEMPTS = 10
"""Lookups list the journal, then read it: a file merged (or, on a cluster, moved into the
cache's journal) in between is listed again, this many times at most."""
MERGE_WAIT = 30.0
"""Seconds the end of a job waits, by default, for a reader holding the cache file to let go,
so that its answers are in the file (not only in the journal) when it returns."""
FLUSH_EVERY = 8192
"""Answers per merge from the journal into the file, at most: answers are durable in the
journal already, and each merge costs 40-130 ms of CPU, which at 1,024 per merge was a fifth
of a request's CPU at high concurrency; ``flush_seconds`` still bounds how stale the file is."""
DUCKDB_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    # Extensions cannot be downloaded here (and should not be, silently, anywhere).
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    # Files this library creates must open in the DuckDB 1.x tools analysts have (the CLI,
    # DBeaver); files already written in a newer format still open, and `vacuum` rewrites them.
    "storage_compatibility_version": "v1.0.0",
}

# For files made by ATTACH on a connection that may not carry DUCKDB_CONFIG.
_NEW_FILE = f"(STORAGE_VERSION '{DUCKDB_CONFIG['storage_compatibility_version']}')"

MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "create llm_cache",
        """
        CREATE TABLE llm_cache (
            key VARCHAR PRIMARY KEY,       -- "v1:" + sha256 of the canonical request JSON
            model VARCHAR NOT NULL,
            endpoint VARCHAR NOT NULL,     -- normalised base URL, never credentials
            request JSON NOT NULL,         -- the canonical request that was hashed
            status VARCHAR NOT NULL,       -- ok | truncated
            response_text VARCHAR,
            response_json JSON,            -- parsed structured output, when one was asked for
            finish_reason VARCHAR,
            prompt_tokens INTEGER,
            completion_tokens INTEGER,
            latency_ms DOUBLE,
            attempts INTEGER,
            created_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
        )
        """,
    ),
    (
        2,
        "create llm_runs",
        """
        CREATE TABLE llm_runs (
            run_id VARCHAR PRIMARY KEY,
            started_at TIMESTAMPTZ NOT NULL,
            finished_at TIMESTAMPTZ NOT NULL,
            model VARCHAR NOT NULL,
            endpoint VARCHAR NOT NULL,
            rows BIGINT NOT NULL,
            distinct_requests BIGINT NOT NULL,
            cache_hits BIGINT NOT NULL,
            requests_sent BIGINT NOT NULL,
            retries BIGINT NOT NULL,
            statuses MAP(VARCHAR, BIGINT) NOT NULL,
            prompt_tokens BIGINT NOT NULL,
            completion_tokens BIGINT NOT NULL,
            wall_seconds DOUBLE NOT NULL,
            outcome VARCHAR NOT NULL,      -- completed | aborted
            error VARCHAR
        )
        """,
    ),
    (
        3,
        "create llm_embeddings",
        """
        CREATE TABLE llm_embeddings (
            key VARCHAR PRIMARY KEY,       -- "v1:" + sha256 of the canonical embedding request
            model VARCHAR NOT NULL,
            endpoint VARCHAR NOT NULL,
            request JSON NOT NULL,         -- {"endpoint", "input", "model", "dimensions"?}
            dimensions INTEGER NOT NULL,
            embedding FLOAT[] NOT NULL,
            prompt_tokens INTEGER,         -- the batch's usage, shared out by input length
            latency_ms DOUBLE,             -- of the batch request that carried this input
            created_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
        )
        """,
    ),
    (
        4,
        "add cost to llm_runs",
        """
        ALTER TABLE llm_runs ADD COLUMN cost DOUBLE;         -- dollars; NULL when unknown
        ALTER TABLE llm_runs ADD COLUMN cost_saved DOUBLE;   -- by cache, dedupe and packing
        ALTER TABLE llm_runs ADD COLUMN budget_stop VARCHAR  -- why a budget stopped sending
        """,
    ),
    (
        5,
        "add savings per lever and usage per model to llm_runs",
        """
        ALTER TABLE llm_runs ADD COLUMN savings          -- lever -> what it saved
            MAP(VARCHAR, STRUCT(requests BIGINT, cost DOUBLE));
        ALTER TABLE llm_runs ADD COLUMN models           -- model -> its share of the job
            MAP(VARCHAR, STRUCT(rows BIGINT, requests BIGINT, prompt_tokens BIGINT,
                                completion_tokens BIGINT, cost DOUBLE))
        """,
    ),
    (
        6,
        "create llm_semantic_index",
        """
        CREATE TABLE llm_semantic_index (
            key VARCHAR PRIMARY KEY,       -- the llm_cache answer that may be reused
            scope VARCHAR NOT NULL,        -- tagged hash of the request minus the user prompt
            embedding_key VARCHAR NOT NULL, -- the llm_embeddings vector of the user prompt
            created_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
        )
        """,
    ),
    (
        7,
        "create llm_batches and llm_batch_requests; add mode to llm_runs",
        """
        CREATE TABLE llm_batches (
            key VARCHAR PRIMARY KEY,       -- job_id:part:state; a row per state a part reached
            job_id VARCHAR NOT NULL,       -- one submission, carried by its batches' metadata
            part INTEGER NOT NULL,         -- which file of the submission
            state VARCHAR NOT NULL,        -- preparing | uploaded | submitted | the provider's
                                           -- statuses (validating ... cancelled) | collected
            endpoint VARCHAR NOT NULL,
            model VARCHAR NOT NULL,
            requests INTEGER NOT NULL,     -- lines in the part's file
            input_file_id VARCHAR,
            batch_id VARCHAR,
            output_file_id VARCHAR,
            error_file_id VARCHAR,
            recorded_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
        );
        CREATE TABLE llm_batch_requests (
            key VARCHAR PRIMARY KEY,       -- job_id:part:request_key
            job_id VARCHAR NOT NULL,
            part INTEGER NOT NULL,
            request_key VARCHAR NOT NULL   -- the llm_cache key, the line's custom_id
        );
        ALTER TABLE llm_runs ADD COLUMN mode VARCHAR  -- live | batch
        """,
    ),
    (
        8,
        "add cached_tokens to llm_cache and llm_runs",
        """
        -- of prompt_tokens, those the server read from its prefix cache (usage.
        -- prompt_tokens_details.cached_tokens), billed at the cached-input price;
        -- NULL for answers and runs recorded before
        ALTER TABLE llm_cache ADD COLUMN cached_tokens INTEGER;
        ALTER TABLE llm_runs ADD COLUMN cached_tokens BIGINT
        """,
    ),
)


_CACHE_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("model", pa.string()),
        ("endpoint", pa.string()),
        ("request", pa.string()),
        ("status", pa.string()),
        ("response_text", pa.string()),
        ("response_json", pa.string()),
        ("finish_reason", pa.string()),
        ("prompt_tokens", pa.int32()),
        ("completion_tokens", pa.int32()),
        ("latency_ms", pa.float64()),
        ("attempts", pa.int32()),
    ]
)
_EMBEDDING_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("model", pa.string()),
        ("endpoint", pa.string()),
        ("request", pa.string()),
        ("dimensions", pa.int32()),
        ("embedding", pa.list_(pa.float32())),
        ("prompt_tokens", pa.int32()),
        ("latency_ms", pa.float64()),
    ]
)

# Column types of each table's journal lines, as DuckDB's read_json wants them.
_COLUMNS: dict[str, dict[str, str]] = {
    "llm_cache": {
        "key": "VARCHAR",
        "model": "VARCHAR",
        "endpoint": "VARCHAR",
        "request": "VARCHAR",
        "status": "VARCHAR",
        "response_text": "VARCHAR",
        "response_json": "VARCHAR",
        "finish_reason": "VARCHAR",
        "prompt_tokens": "INTEGER",
        "completion_tokens": "INTEGER",
        "latency_ms": "DOUBLE",
        "attempts": "INTEGER",
        "cached_tokens": "INTEGER",
    },
    "llm_embeddings": {
        "key": "VARCHAR",
        "model": "VARCHAR",
        "endpoint": "VARCHAR",
        "request": "VARCHAR",
        "dimensions": "INTEGER",
        "embedding": "FLOAT[]",
        "prompt_tokens": "INTEGER",
        "latency_ms": "DOUBLE",
    },
    "llm_semantic_index": {"key": "VARCHAR", "scope": "VARCHAR", "embedding_key": "VARCHAR"},
    "llm_batches": {
        "key": "VARCHAR",
        "job_id": "VARCHAR",
        "part": "INTEGER",
        "state": "VARCHAR",
        "endpoint": "VARCHAR",
        "model": "VARCHAR",
        "requests": "INTEGER",
        "input_file_id": "VARCHAR",
        "batch_id": "VARCHAR",
        "output_file_id": "VARCHAR",
        "error_file_id": "VARCHAR",
    },
    "llm_batch_requests": {
        "key": "VARCHAR",
        "job_id": "VARCHAR",
        "part": "INTEGER",
        "request_key": "VARCHAR",
    },
    "llm_runs": {
        "run_id": "VARCHAR",
        "started_at": "TIMESTAMPTZ",
        "finished_at": "TIMESTAMPTZ",
        "model": "VARCHAR",
        "endpoint": "VARCHAR",
        "rows": "BIGINT",
        "distinct_requests": "BIGINT",
        "cache_hits": "BIGINT",
        "requests_sent": "BIGINT",
        "retries": "BIGINT",
        "statuses": "MAP(VARCHAR, BIGINT)",
        "prompt_tokens": "BIGINT",
        "completion_tokens": "BIGINT",
        "wall_seconds": "DOUBLE",
        "outcome": "VARCHAR",
        "error": "VARCHAR",
        "cost": "DOUBLE",
        "cost_saved": "DOUBLE",
        "budget_stop": "VARCHAR",
        "savings": "MAP(VARCHAR, STRUCT(requests BIGINT, cost DOUBLE))",
        "models": "MAP(VARCHAR, STRUCT(rows BIGINT, requests BIGINT, prompt_tokens BIGINT, "
        "completion_tokens BIGINT, cost DOUBLE))",
        "mode": "VARCHAR",
        "cached_tokens": "BIGINT",
    },
}
# The columns a journal line must hold (NOT NULL in its table): a line without them is one a
# crash or a full disk cut short, or garbage, and is skipped; merging it would fail the merge.
_REQUIRED: dict[str, tuple[str, ...]] = {
    "llm_cache": ("key", "model", "endpoint", "request", "status"),
    "llm_embeddings": ("key", "model", "endpoint", "request", "dimensions", "embedding"),
    "llm_semantic_index": ("key", "scope", "embedding_key"),
    "llm_batches": ("key", "job_id", "part", "state", "endpoint", "model", "requests"),
    "llm_batch_requests": ("key", "job_id", "part", "request_key"),
    "llm_runs": (
        "run_id",
        "started_at",
        "finished_at",
        "model",
        "endpoint",
        "rows",
        "distinct_requests",
        "cache_hits",
        "requests_sent",
        "retries",
        "statuses",
        "prompt_tokens",
        "completion_tokens",
        "wall_seconds",
        "outcome",
    ),
}
_ANSWERS = ("llm_cache", "llm_embeddings")  # the tables whose journal rows are answers
_JSON = {"llm_cache": ("request", "response_json"), "llm_embeddings": ("request",)}
_KEYS = {
    "llm_cache": "key",
    "llm_embeddings": "key",
    "llm_semantic_index": "key",
    "llm_runs": "run_id",
    "llm_batches": "key",
    "llm_batch_requests": "key",
}
# The order in which a batch part goes through its states (the provider's and ours).
_BATCH_STATES = (
    "preparing",
    "uploaded",
    "submitted",
    "validating",
    "in_progress",
    "finalizing",
    "cancelling",
    "completed",
    "failed",
    "expired",
    "cancelled",
    "collected",
)


def default_cache_path() -> Path:
    """The per-user default cache file, used when neither ``cache=`` nor the env var is set."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llm-ops" / "cache.duckdb"


def resolve_cache_path(cache: str | os.PathLike[str] | bool | None) -> Path | None:
    """``cache=`` argument → path, or ``None`` when caching is off."""
    if cache is False:
        return None
    if cache is None or cache is True:
        env = os.environ.get(CACHE_ENV)
        return Path(env).expanduser() if env else default_cache_path()
    return Path(os.fspath(cache)).expanduser()


def _open(path: Path, *, read_only: bool) -> duckdb.DuckDBPyConnection:
    try:
        return duckdb.connect(str(path), read_only=read_only, config=DUCKDB_CONFIG)
    except duckdb.ConnectionException as exc:
        # This process already has the file open (say, the SQL functions were registered on a
        # connection to the cache itself); DuckDB then insists on that connection's settings.
        if "different configuration" not in str(exc):
            raise
    try:
        return duckdb.connect(str(path), read_only=read_only)
    except duckdb.ConnectionException as exc:
        # ... and it is open for writing there: reading through the same instance is fine.
        if not read_only or "different configuration" not in str(exc):
            raise
        return duckdb.connect(str(path))


def _is_lock_error(exc: duckdb.Error) -> bool:
    # not just "lock": DuckDB's word for a corrupt block is "block"
    text = str(exc).lower()
    return "could not set lock" in text or "conflicting lock" in text


_DAMAGE = (
    "corrupt database file",
    "corrupt wal file",
    "could not read enough bytes",
    "not a valid duckdb database file",
    "failure while replaying wal",
)


def _is_damage(exc: BaseException, path: Path) -> bool:
    text = str(exc)
    named = re.search(r'file "([^"]+)"', text)
    if named and not os.path.abspath(named.group(1)).startswith(os.path.abspath(path)):
        return False  # another file's damage (say, a job's own work database)
    return any(sign in text.lower() for sign in _DAMAGE)


def _is_full(exc: BaseException) -> bool:
    return "no space left on device" in str(exc).lower() or "disk quota exceeded" in str(exc)


def _damaged(path: Path, exc: BaseException) -> str:
    detail = str(exc).split("\n", 1)[0].removeprefix("IO Error: ")
    return (
        f"the cache {path} cannot be read: it is damaged or not a DuckDB file ({detail}), and "
        "no answer is taken from it. Move it aside (with its .wal file, if any) and rerun: a new "
        "cache is made, the answers its journal holds are merged in, and only what is missing "
        "is sent; or put back a copy made with llm-ops cache snapshot"
    )


def _fatal(path: Path, exc: BaseException) -> CacheError | None:
    """The error to stop on when ``exc`` means the file is damaged or its disk is full:
    waiting for the file does not help then."""
    if _is_damage(exc, path):
        return CacheError(_damaged(path, exc))
    if _is_full(exc):
        return CacheError(out_of_space(path))
    return None


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _lock_of(journal_file: Path) -> Path:
    """The lock its writer holds while it lives: ``<writer>.lock`` beside the file."""
    return journal_file.with_name(journal_file.name.split(".", 1)[0] + ".lock")


def _read_journal(table: str, files: Sequence[Path], *, filename: bool = False) -> str:
    spec = ", ".join(
        f"{_sql_string(name)}: {_sql_string(kind)}" for name, kind in _COLUMNS[table].items()
    )
    paths = ", ".join(_sql_string(str(f)) for f in files)
    return (
        f"read_json([{paths}], format='newline_delimited', columns={{{spec}}}, "
        f"ignore_errors=true{', filename=true' if filename else ''})"
    )


def _valid(table: str) -> str:
    return " AND ".join(f"{name} IS NOT NULL" for name in _REQUIRED[table])


def _check_lines(table: str, files: Sequence[Path]) -> None:
    """Warn, once per file, of lines in journal files of finished writers that cannot be read
    (a crash or a full disk cuts the last line short; a damaged disk leaves garbage): they are
    skipped, and the answers they held are sent again; every other line is kept."""
    sizes = {}
    for file in files:
        with contextlib.suppress(OSError):
            sizes[file] = file.stat().st_size
    sizes = {file: size for file, size in sizes.items() if (file, size) not in _CHECKED}
    if not sizes:
        return
    query = (
        f"SELECT filename, count(*) FILTER (WHERE NOT ({_valid(table)})), "
        f"count(*) FILTER (WHERE {_valid(table)}) "
        f"FROM {_read_journal(table, list(sizes), filename=True)} GROUP BY filename"
    )
    try:
        with duckdb.connect(config=DUCKDB_CONFIG) as con:
            counts = con.sql(query).fetchall()
    except duckdb.Error:
        return  # a file merged and removed meanwhile: its merge checked it
    for name, bad, good in counts:
        if bad:
            _log.warning(
                "llm-ops: skipped %d unreadable line(s) of the journal file %s and kept its %d "
                "other(s); a crash or a full disk leaves such a line, and a rerun sends again "
                "what it held",
                bad,
                name,
                good,
            )
    _CHECKED.update(sizes.items())


# Connections of this process are taken one at a time: DuckDB shares one database instance per
# file within a process, and a thread opening it while another thread's close tears it down
# gets a half-initialised connection.
_IN_PROCESS = threading.RLock()
# Files (path, inode) this process has brought up to date: checking on every write costs ms.
_MIGRATED: set[tuple[Path, int]] = set()
# Journal files of finished writers (path, size) this process has checked for broken lines,
# or wrote whole itself.
_CHECKED = WHOLE
_CLOSE_FIRST = 0.5  # seconds :meth:`Cache.settle` tries before it says it waits for a reader
_WRITERS_AT_ONCE = 256  # finished writers merged in one transaction (each holds a lock open)


def _is_answers(file: Path) -> bool:
    return file.name.rsplit(".", 2)[-2] in _ANSWERS


def _lines(files: Iterator[Path] | Sequence[Path]) -> int:
    """Lines in ``files`` (those gone meanwhile count none)."""
    count = 0
    for file in files:
        with contextlib.suppress(OSError), open(file, "rb") as f:
            while chunk := f.read(1 << 20):
                count += chunk.count(b"\n")
    return count


@dataclass
class Merged:
    """What a merge of the journal did.

    Attributes
    ----------
    rows
        Rows taken into each table (keys already there are not counted).
    files
        Journal files merged, and deleted.
    waiting
        Answers (``llm_cache`` and ``llm_embeddings`` rows) still in journal files of
        finished jobs, because the cache file stayed held.
    running
        Journal files of jobs still running, which merge their own.
    reason
        Why some could not be merged, or ``None``.
    held
        Whether that is because another process holds the file (waiting may help).
    """

    rows: dict[str, int] = field(default_factory=dict)
    files: int = 0
    waiting: int = 0
    running: int = 0
    reason: str | None = None
    held: bool = False


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Apply the migrations not yet recorded; returns the schema version."""
    con.execute(
        "CREATE TABLE IF NOT EXISTS llm_ops_migrations ("
        "version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
        "applied_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp)"
    )
    current = _schema_version(con)
    pending = [migration for migration in MIGRATIONS if migration[0] > current]
    if not pending:
        return current
    # One transaction for all of them: a new file is created in one commit, and a failure
    # leaves the file at the version it had, never in between.
    con.execute("BEGIN TRANSACTION")
    try:
        for version, name, sql in pending:
            con.execute(sql)
            con.execute(
                "INSERT INTO llm_ops_migrations (version, name) VALUES (?, ?)", [version, name]
            )
        con.execute("COMMIT")
    except duckdb.Error:
        con.execute("ROLLBACK")
        raise
    return pending[-1][0]


def _schema_version(con: duckdb.DuckDBPyConnection) -> int:
    # fetchall, not fetchone: DuckDB keeps a partly fetched result open on the connection
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'llm_ops_migrations'"
    ).fetchall()[0][0]
    if not exists:
        return 0
    return int(
        con.execute("SELECT coalesce(max(version), 0) FROM llm_ops_migrations").fetchall()[0][0]
    )


LATEST_VERSION = MIGRATIONS[-1][0]


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
        hint = (
            f"choose a writable location with cache=... or {CACHE_ENV}, or pass cache=False "
            "to run without a cache"
        )
        try:
            self.journal.mkdir(parents=True, exist_ok=True)
            probe = self.journal / f".probe-{uuid.uuid4().hex}"
            try:
                probe.write_bytes(b"{}\n")  # not empty: a full disk takes an empty file
            finally:
                probe.unlink(missing_ok=True)
        except OSError as exc:
            if is_out_of_space(exc):
                raise CacheError(out_of_space(self.path)) from exc
            raise CacheError(
                f"cannot use the cache {self.path}: {exc.strerror or exc} "
                f"({exc.filename or self.journal}); {hint}"
            ) from exc
        if self.path.exists() and not os.access(self.path, os.R_OK | os.W_OK):
            raise CacheError(
                f"cannot use the cache {self.path}: the file is not readable and "
                f"writable by this user; {hint}"
            )
        if not self._up_to_date():
            with self.connect(read_only=False):
                pass  # creates and migrates
        self.merge_orphans(wait=0.5)

    def _up_to_date(self) -> bool:
        if not self.path.exists():
            return False
        identity = (self.path, self.path.stat().st_ino)
        if identity in _MIGRATED:
            return True
        with self.connect(read_only=True) as con:
            current = _schema_version(con)
        if current > LATEST_VERSION:
            raise CacheError(
                f"the cache {self.path} has schema version {current}, newer than "
                f"this llm-ops knows ({LATEST_VERSION}); upgrade llm-ops"
            )
        if current == LATEST_VERSION:
            _MIGRATED.add(identity)
        return current == LATEST_VERSION

    def _open_retrying(self, *, read_only: bool, wait: float) -> duckdb.DuckDBPyConnection:
        deadline = time.monotonic() + wait
        delay = 0.01
        while True:
            try:
                return _open(self.path, read_only=read_only)
            except duckdb.Error as exc:
                if not _is_lock_error(exc):
                    fatal = _fatal(self.path, exc)
                    if fatal is not None:
                        raise fatal from exc
                    raise CacheError(f"cannot open the cache {self.path}: {exc}") from exc
                if time.monotonic() >= deadline:
                    raise CacheLockedError(
                        f"the cache {self.path} is held by another process (DuckDB allows one "
                        f"writer and locks out everyone else while it writes); waited "
                        f"{wait:.0f}s. Close the other connection, read it through "
                        f"llm_ops.open_cache or a snapshot (llm-ops cache snapshot), or point "
                        f"this job at another file with cache=... or {CACHE_ENV}."
                    ) from exc
                time.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, 0.5)

    @contextmanager
    def connect(
        self, *, read_only: bool = True, wait: float | None = None
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short-lived connection, migrated when writable, retried while the file is held."""
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with _IN_PROCESS:
            con = self._open_retrying(
                read_only=read_only, wait=self.lock_timeout if wait is None else wait
            )
            try:
                identity = (self.path, self.path.stat().st_ino)  # DuckDB created the file
                if not read_only and identity not in _MIGRATED:
                    migrate(con)
                    _MIGRATED.add(identity)
                yield con
            except duckdb.Error as exc:
                raise _fatal(self.path, exc) or CacheError(f"cache {self.path}: {exc}") from exc
            finally:
                try:
                    con.close()
                except duckdb.Error as exc:  # say, a checkpoint on a full disk
                    raise _fatal(self.path, exc) or CacheError(f"cache {self.path}: {exc}") from exc

    @contextmanager
    def attached(self, con: duckdb.DuckDBPyConnection, *, alias: str) -> Iterator[None]:
        """Attach the cache read-only to another connection (say, for a big anti-join),
        briefly; :meth:`answers_sql` then reads it together with the journal."""
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                con.execute(f"ATTACH {_sql_string(str(self.path))} AS {alias} (READ_ONLY)")
                break
            except duckdb.Error as exc:
                if not _is_lock_error(exc) or time.monotonic() >= deadline:
                    fatal = _fatal(self.path, exc)
                    if fatal is not None:
                        raise fatal from exc
                    raise CacheError(f"cannot attach the cache {self.path}: {exc}") from exc
                time.sleep(0.05)
        try:
            yield
        except duckdb.Error as exc:  # a query over the attached file read a damaged block
            fatal = _fatal(self.path, exc) if _is_damage(exc, self.path) else None
            if fatal is None:
                raise
            raise fatal from exc
        finally:
            con.execute(f"DETACH {alias}")

    # -- reading ------------------------------------------------------------------------------

    def _journal_files(self, table: str) -> list[Path]:
        """The journal files of ``table``; those of finished writers are checked for broken
        lines (once each)."""
        if not self.journal.is_dir():
            return []
        files = sorted(self.journal.glob(f"*.{table}.jsonl"))
        unchecked = []
        for file in files:
            with contextlib.suppress(OSError):  # merged and removed meanwhile
                if (file, file.stat().st_size) not in _CHECKED:
                    unchecked.append(file)
        if unchecked:  # a live writer's last line may be half-written: only finished ones
            gone = {lock for lock in {_lock_of(file) for file in unchecked} if finished(lock)}
            _check_lines(table, [file for file in unchecked if _lock_of(file) in gone])
        return files

    def _journal_sql(self, table: str, columns: Sequence[str], files: Sequence[Path]) -> str:
        # ignore_errors: a line cut short by a crash (or being appended to right now) reads
        # as nulls, and is skipped with every line that lacks what its table requires
        return (
            f"SELECT {', '.join(columns)} FROM {_read_journal(table, files)} WHERE {_valid(table)}"
        )

    def answers_sql(self, alias: str, columns: Sequence[str]) -> str:
        """A query over the answers of the attached cache ``alias`` and of the journal, one
        row per key, with ``columns`` of ``llm_cache``."""
        listed = ", ".join(columns)
        files = self._journal_files("llm_cache")
        if not files:
            return f"SELECT {listed} FROM {alias}.llm_cache"
        return (
            f"SELECT DISTINCT ON (key) {listed} FROM ("
            f"SELECT {listed}, 0 AS journal FROM {alias}.llm_cache UNION ALL "
            f"{self._journal_sql('llm_cache', [*columns, '1 AS journal'], files)}) "
            "ORDER BY key, journal"
        )

    def _rows_for_keys(self, table: str, schema: pa.Schema, keys: pa.Table) -> pa.Table:
        columns = list(schema.names)
        for attempt in range(LIST_ATTEMPTS):
            files = self._journal_files(table)
            if not self.path.exists() and not files:
                return schema.empty_table()
            query = self._table_sql(table, columns, files)
            if files:
                query = f"SELECT DISTINCT ON (key) * FROM ({query})"
            try:
                with self._reader() as con:
                    con.register("wanted_keys", keys)
                    found = con.sql(
                        f"SELECT t.* FROM ({query}) t SEMI JOIN wanted_keys w ON t.key = w.key"
                    )
                    rows = found.to_arrow_table()
                    # cast only when needed: it imports pyarrow.compute (~60 ms, once)
                    return rows if rows.schema.equals(schema) else rows.cast(schema)
            except (CacheError, duckdb.IOException) as exc:
                # A journal file merged and removed between listing and reading: list again.
                gone = ("No files found", "needs at least one file")
                if attempt == LIST_ATTEMPTS - 1 or not any(sign in str(exc) for sign in gone):
                    raise
                time.sleep(0.01 * random.uniform(0.5, 1.5))
        raise AssertionError("unreachable")

    @contextmanager
    def _reader(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection to the cache, or an in-memory one where there is no cache
        file (only a journal: a cluster worker's answers)."""
        if self.path.exists():
            with self.connect() as con:
                yield con
        else:
            with duckdb.connect(config=DUCKDB_CONFIG) as con:
                yield con

    def lookup(self, keys: pa.Table) -> pa.Table:
        """Cached answers for the ``key`` column of ``keys`` (journal included), in one join."""
        return self._rows_for_keys("llm_cache", _CACHE_SCHEMA, keys)

    def lookup_embeddings(self, keys: pa.Table) -> pa.Table:
        """Cached vectors for the ``key`` column of ``keys`` (journal included), in one join."""
        return self._rows_for_keys("llm_embeddings", _EMBEDDING_SCHEMA, keys)

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
        if not self.path.exists() or not scopes:
            return
        with self.connect() as con:
            con.register("wanted_scopes", pa.table({"scope": list(scopes)}))
            reader = con.sql(
                "SELECT i.key, i.scope, e.embedding FROM llm_semantic_index i "
                "SEMI JOIN wanted_scopes w ON i.scope = w.scope "
                "JOIN llm_embeddings e ON e.key = i.embedding_key "
                "JOIN llm_cache c ON c.key = i.key "
                "WHERE c.status = 'ok' AND e.model = $model AND e.dimensions = $dimensions",
                params={"model": embedding_model, "dimensions": dimensions},
            ).to_arrow_reader(batch_rows)
            yield from reader
            con.unregister("wanted_scopes")

    # -- writing ------------------------------------------------------------------------------

    def writer(self) -> JournalWriter:
        """A writer for one job: rows go to the journal at once and into the file in batches
        of ``flush_every``."""
        return JournalWriter(self.journal, merge=self.merge_files, merge_every=self.flush_every)

    def _write(
        self, table: str, rows: Sequence[Mapping[str, Any]], *, wait: float | None = 2.0
    ) -> None:
        """Write ``rows`` through a writer of their own: to the journal, then a brief merge
        (none with ``wait=None``); what the file does not take waits for the job's end."""
        if not rows:
            return
        writer = self.writer()
        for row in rows:
            writer.add(table, row)
        writer.close(wait=wait)

    def record_run(self, run: Mapping[str, Any], *, wait: float | None = None) -> int:
        """Append one row to ``llm_runs`` (from a report's fields, those it has columns for),
        at a job's end: with it, what the job's writers left in the journal is merged
        (:meth:`settle`, waiting up to ``wait``, else :attr:`merge_wait`, seconds for a
        reader to let go of the file). Returns the answers still waiting in the journal."""
        self._write("llm_runs", [{name: run.get(name) for name in _COLUMNS["llm_runs"]}], wait=None)
        return self.settle(wait=self.merge_wait if wait is None else wait).waiting

    def index_for_similarity(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Make answers findable by the semantic cache: key, scope, embedding_key."""
        self._write("llm_semantic_index", rows)

    # -- provider batches ---------------------------------------------------------------------

    def record_batch(self, part: Mapping[str, Any], *, keys: Sequence[str] = ()) -> None:
        """Record that a batch part reached ``part["state"]`` (with the provider's ids known
        so far), and, the first time, which request keys it carries. Durable (in the journal)
        when this returns, so it can come before the provider call it announces."""
        row = {name: part.get(name) for name in _COLUMNS["llm_batches"] if name != "key"}
        row["key"] = f"{part['job_id']}:{part['part']}:{part['state']}"
        writer = self.writer()
        writer.add("llm_batches", row)
        for key in keys:
            writer.add(
                "llm_batch_requests",
                {
                    "key": f"{part['job_id']}:{part['part']}:{key}",
                    "job_id": part["job_id"],
                    "part": part["part"],
                    "request_key": key,
                },
            )
        writer.close(wait=0.5)

    def batch_parts(
        self, *, keys: Sequence[str] | None = None, job_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Every batch part that carries one of ``keys`` (or belongs to ``job_id``, or all),
        in its latest state, with the ids recorded along the way; oldest first."""
        if not self.path.exists() and not self._journal_files("llm_batches"):
            return []
        events = self._table_sql("llm_batches", list(_COLUMNS["llm_batches"]))
        requests = self._table_sql("llm_batch_requests", ["job_id", "part", "request_key"])
        ranks = " ".join(f"WHEN '{state}' THEN {rank}" for rank, state in enumerate(_BATCH_STATES))
        where = "TRUE"
        if keys is not None:
            where = (
                f"(job_id, part) IN (SELECT job_id, part FROM ({requests}) r "
                "SEMI JOIN wanted_keys w ON r.request_key = w.key)"
            )
        elif job_id is not None:
            where = "job_id = $job_id"
        query = (
            f"SELECT job_id, part, arg_max(state, CASE state {ranks} END) AS state, "
            "any_value(endpoint) AS endpoint, any_value(model) AS model, "
            "max(requests) AS requests, max(input_file_id) AS input_file_id, "
            "max(batch_id) AS batch_id, max(output_file_id) AS output_file_id, "
            "max(error_file_id) AS error_file_id "
            f"FROM ({events}) WHERE {where} GROUP BY job_id, part ORDER BY job_id, part"
        )
        with self.connect() as con:
            con.register(
                "wanted_keys",
                pa.table({"key": list(keys or [])}, schema=pa.schema([("key", pa.string())])),
            )
            params = {"job_id": job_id} if keys is None and job_id is not None else None
            parts: list[dict[str, Any]] = con.sql(query, params=params).to_arrow_table().to_pylist()
        return parts

    def batch_keys(self, job_id: str, part: int) -> list[str]:
        """The request keys a batch part carries."""
        requests = self._table_sql("llm_batch_requests", ["job_id", "part", "request_key"])
        with self.connect() as con:
            rows = con.sql(
                f"SELECT DISTINCT request_key FROM ({requests}) "
                "WHERE job_id = $job_id AND part = $part",
                params={"job_id": job_id, "part": part},
            ).fetchall()
        return [row[0] for row in rows]

    def _table_sql(
        self, table: str, columns: Sequence[str], files: Sequence[Path] | None = None
    ) -> str:
        """A query over ``table`` and what the journal holds for it (``files``, listed
        now if not given)."""
        listed = ", ".join(columns)
        files = self._journal_files(table) if files is None else files
        if not self.path.exists():
            return self._journal_sql(table, columns, files)
        if not files:
            return f"SELECT {listed} FROM {table}"
        return f"SELECT {listed} FROM {table} UNION ALL {self._journal_sql(table, columns, files)}"

    def merge_files(self, files: Sequence[Path], wait: float) -> str | None:
        """Insert journal ``files`` into their tables and delete them; why not (nothing is
        deleted then) when the file stays locked for ``wait`` seconds or cannot be written.
        Raises :class:`CacheError` when waiting cannot help: the file is damaged, or its disk
        is full (the files stay then too)."""
        merged = self._merge(files, wait)
        return merged.reason if isinstance(merged, Merged) else None

    def _merge(self, files: Sequence[Path], wait: float) -> dict[str, int] | Merged:
        """Rows inserted per table, or a :class:`Merged` saying why none were."""
        by_table: dict[str, list[Path]] = {}
        for file in files:
            by_table.setdefault(file.name.rsplit(".", 2)[-2], []).append(file)
        try:
            with self.connect(read_only=False, wait=wait) as con:
                try:
                    rows = self._insert(con, by_table, strict=False)
                except duckdb.ConversionException:
                    # a line whose JSON value is garbage would fail every merge for ever
                    con.execute("ROLLBACK")
                    rows = self._insert(con, by_table, strict=True)
        except CacheError as exc:
            if not isinstance(exc, CacheLockedError) and _fatal(self.path, exc.__cause__ or exc):
                raise
            return Merged(reason=str(exc), held=isinstance(exc, CacheLockedError))
        for file in files:
            file.unlink(missing_ok=True)
        return rows

    def _insert(
        self, con: duckdb.DuckDBPyConnection, by_table: Mapping[str, list[Path]], *, strict: bool
    ) -> dict[str, int]:
        """Insert the lines of journal files into their tables, in one transaction; rows
        inserted per table. ``strict`` also skips (with a warning) lines whose JSON values
        are not valid JSON: a cost every merge need not pay."""
        rows: dict[str, int] = {}
        con.execute("BEGIN TRANSACTION")
        for table, paths in by_table.items():
            present = [p for p in paths if p.exists()]
            if not present:
                continue
            names = list(_COLUMNS[table])
            lines = self._journal_sql(table, names, present)
            if strict and _JSON.get(table):
                valid = " AND ".join(f"({c} IS NULL OR json_valid({c}))" for c in _JSON[table])
                skipped = con.execute(f"SELECT count(*) FROM ({lines}) WHERE NOT ({valid})")
                count = int(skipped.fetchall()[0][0])
                if count:
                    _log.warning(
                        "llm-ops: skipped %d line(s) of the journal file(s) %s whose %s is not "
                        "valid JSON; a rerun sends again what they held",
                        count,
                        ", ".join(map(str, present)),
                        " or ".join(_JSON[table]),
                    )
                lines = f"SELECT * FROM ({lines}) WHERE {valid}"
            inserted = con.execute(
                f"INSERT INTO {table} ({', '.join(names)}) {lines} ON CONFLICT DO NOTHING"
            ).fetchall()
            rows[table] = rows.get(table, 0) + int(inserted[0][0])
        con.execute("COMMIT")
        return rows

    def merge_orphans(self, *, wait: float, directory: Path | None = None) -> int:
        """Merge the journal files of writers that are gone (crashed, or ended while the file
        was held), in the cache's journal or in ``directory`` (where a cluster's workers
        write theirs); returns how many files were merged."""
        return self._merge_finished(wait=wait, directory=directory).files

    def _merge_finished(self, *, wait: float, directory: Path | None = None) -> Merged:
        """:meth:`merge_orphans`, in one transaction per :data:`_WRITERS_AT_ONCE` writers,
        all within ``wait`` seconds."""
        folder = self.journal if directory is None else directory
        done = Merged()
        if not folder.is_dir():
            return done
        deadline = time.monotonic() + wait
        by_writer: dict[str, list[Path]] = {}
        for file in sorted(folder.glob("*.jsonl")):
            by_writer.setdefault(file.name.split(".", 1)[0], []).append(file)
        writers = list(by_writer)
        for start in range(0, len(writers), _WRITERS_AT_ONCE):
            with contextlib.ExitStack() as stack:
                locks, files = [], []
                for writer_id in writers[start : start + _WRITERS_AT_ONCE]:
                    lock = folder / f"{writer_id}.lock"
                    mine = by_writer[writer_id]
                    if not stack.enter_context(held(lock, blocking=False)):
                        done.running += len(mine)  # a live job: it merges its own files
                        continue
                    locks.append(lock)
                    files += mine
                if not files:
                    continue
                for table in {f.name.rsplit(".", 2)[-2] for f in files}:
                    _check_lines(table, [f for f in files if f.name.endswith(f".{table}.jsonl")])
                merged = self._merge(files, max(0.0, deadline - time.monotonic()))
                if isinstance(merged, Merged):  # held: count what waits, and stop trying
                    done.reason, done.held = merged.reason, merged.held
                    done.waiting += _lines(f for f in files if _is_answers(f))
                    done.waiting += _lines(
                        f
                        for writer_id in writers[start + _WRITERS_AT_ONCE :]
                        if finished(folder / f"{writer_id}.lock")
                        for f in by_writer[writer_id]
                        if _is_answers(f)
                    )
                    return done
                for table, count in merged.items():
                    done.rows[table] = done.rows.get(table, 0) + count
                done.files += len(files)
                for lock in locks:
                    lock.unlink(missing_ok=True)
        return done

    def settle(self, *, wait: float, warn: bool = True) -> Merged:
        """Merge what finished writers left in the journal (a job's end: its answers and its
        run). When the file is held and answers wait, say so and wait up to ``wait`` seconds
        for it; what is left after that (a warning says so, unless ``warn=False``) is merged
        by any later job or open, or by ``llm-ops cache merge``, and is read by lookups until
        then."""
        merged = self._merge_finished(wait=min(wait, _CLOSE_FIRST))
        if merged.held and merged.waiting and wait > _CLOSE_FIRST:
            _log.warning(
                "llm-ops: waiting up to %.0f s for a reader of %s to let go of it, to merge "
                "the %d answer(s) waiting in its journal %s",
                wait,
                self.path,
                merged.waiting,
                self.journal,
            )
            rest = self._merge_finished(wait=wait - _CLOSE_FIRST)
            for table, count in merged.rows.items():
                rest.rows[table] = rest.rows.get(table, 0) + count
            rest.files += merged.files
            merged = rest
        if merged.waiting and warn:
            _log.warning(
                "llm-ops: %d answer(s) wait in the journal %s, not yet in %s, which %s. They "
                "are cache hits already; `llm-ops cache merge --cache %s` (or any llm-ops job) "
                "merges them into the file once it is free",
                merged.waiting,
                self.journal,
                self.path,
                "another process holds" if merged.held else f"refused them ({merged.reason})",
                self.path,
            )
        return merged

    def adopt(self, directory: Path, *, wait: float) -> None:
        """Take the journal files that finished writers left in ``directory`` (a cluster's
        workers, which may not open the cache) into this cache's journal, and merge them:
        until they are merged, lookups read them there like any other journal file."""
        if not directory.is_dir():
            return
        self.journal.mkdir(parents=True, exist_ok=True)
        for writer_id in sorted({f.name.split(".", 1)[0] for f in directory.glob("*.jsonl")}):
            with held(directory / f"{writer_id}.lock", blocking=False) as free:
                if free:
                    for file in sorted(directory.glob(f"{writer_id}.*.jsonl")):
                        shutil.move(file, self.journal / file.name)
        self.merge_orphans(wait=wait)

    # -- reading for people -------------------------------------------------------------------

    def snapshot(self, target: str | os.PathLike[str]) -> Path:
        """Copy the cache, with what the journal holds, into a new file ``target``: a copy
        to query (or open in another tool) for as long as you like, while jobs go on writing
        the original."""
        out = Path(target)
        if out.exists():
            raise CacheError(f"{out} exists already; choose a new file for the snapshot")
        if not self.path.exists():
            raise CacheError(f"there is no cache at {self.path} yet; run a job first")
        out.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(CacheError):
            self.merge_orphans(wait=2.0)
        with duckdb.connect(config=DUCKDB_CONFIG) as con, self.attached(con, alias="src"):
            con.execute(f"ATTACH {_sql_string(str(out))} AS snapshot {_NEW_FILE}")
            con.execute("COPY FROM DATABASE src TO snapshot")
            for table in ("llm_cache", "llm_embeddings"):  # answers still in the journal
                files = self._journal_files(table)
                if files:
                    names = list(_COLUMNS[table])
                    con.execute(
                        f"INSERT INTO snapshot.{table} ({', '.join(names)}) "
                        f"{self._journal_sql(table, names, files)} "
                        "ON CONFLICT DO NOTHING"
                    )
            con.execute("DETACH snapshot")
        return out

    def stats(self) -> tuple[pa.Table, int]:
        """Answers, tokens and the newest answer per model, and how many runs are recorded."""
        with self.connect() as con:
            per_model = con.sql(
                "SELECT model, count(*) AS answers, sum(prompt_tokens) AS tokens_in, "
                "sum(completion_tokens) AS tokens_out, max(created_at) AS newest "
                "FROM llm_cache GROUP BY model ORDER BY answers DESC"
            ).to_arrow_table()
            runs = int(con.sql("SELECT count(*) FROM llm_runs").fetchall()[0][0])
        return per_model, runs

    def export(self, *, model: str | None = None) -> pa.Table:
        """Cached answers (of ``model``, or all), oldest first."""
        where, params = _answer_filter(model=model)
        with self.connect() as con:
            return con.sql(
                f"SELECT * FROM llm_cache WHERE {where} ORDER BY created_at", params=params
            ).to_arrow_table()

    def prune(
        self,
        *,
        model: str | None = None,
        older_than_days: float | None = None,
        status: str | None = None,
        dry_run: bool = False,
    ) -> int:
        """Delete cached answers matching every filter given; returns how many (would) go."""
        where, params = _answer_filter(model=model, older_than_days=older_than_days, status=status)
        if where == "TRUE":
            raise ConfigError("prune needs at least one of model, older than, status")
        with self.connect(read_only=dry_run) as con:
            count = int(
                con.execute(f"SELECT count(*) FROM llm_cache WHERE {where}", params).fetchall()[0][
                    0
                ]
            )
            if not dry_run:
                con.execute(f"DELETE FROM llm_cache WHERE {where}", params).fetchall()
        return count

    def vacuum(self) -> tuple[int, int]:
        """Rewrite the file to reclaim the space of deleted rows; sizes before and after."""
        before = self.path.stat().st_size
        fresh = self.path.with_name(self.path.name + ".vacuum")
        fresh.unlink(missing_ok=True)
        with self.connect(read_only=False) as con:
            name = con.execute("SELECT current_database()").fetchall()[0][0]
            con.execute(f"ATTACH {_sql_string(str(fresh))} AS fresh {_NEW_FILE}")
            con.execute(f"COPY FROM DATABASE {name} TO fresh")
            con.execute("DETACH fresh")
        fresh.replace(self.path)
        return before, self.path.stat().st_size

    def insert(
        self, table: Literal["llm_cache", "llm_embeddings", "llm_semantic_index"], rows: pa.Table
    ) -> None:
        """Insert ``rows`` (an Arrow table with some of the table's columns), say to restore an
        export; a key already present keeps its row."""
        if table not in ("llm_cache", "llm_embeddings", "llm_semantic_index"):
            raise ConfigError(
                f"insert takes llm_cache, llm_embeddings or llm_semantic_index, got {table!r}"
            )
        names = ", ".join(rows.column_names)
        with self.connect(read_only=False) as con:
            con.register("new_rows", rows)
            con.execute(
                f"INSERT INTO {table} ({names}) SELECT {names} FROM new_rows ON CONFLICT DO NOTHING"
            )
            con.unregister("new_rows")


def _answer_filter(
    *, model: str | None = None, older_than_days: float | None = None, status: str | None = None
) -> tuple[str, list[Any]]:
    clauses: list[str] = ["TRUE"]
    params: list[Any] = []
    if model:
        clauses.append("model = ?")
        params.append(model)
    if older_than_days is not None:
        clauses.append("created_at < now() - to_days(CAST(? AS INTEGER))")
        params.append(older_than_days)
    if status:
        clauses.append("status = ?")
        params.append(status)
    return " AND ".join(clauses), params


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
    con = store._open_retrying(read_only=read_only, wait=lock_timeout)
    if not read_only:
        migrate(con)
    return con
