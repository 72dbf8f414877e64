"""The cache database: a DuckDB file holding ``llm_cache`` and ``llm_runs``.

Location: the ``cache=`` argument, else the ``LLM_OPS_CACHE`` environment variable, else
``$XDG_CACHE_HOME/llm-ops/cache.duckdb`` (``~/.cache/llm-ops/cache.duckdb``).

DuckDB lets one process hold a file open for writing and locks every other process out, readers
included. So connections here are short: opened for one lookup or one batch of writes and closed
at once, and opening retries for a while when another process holds the lock. Between flushes an
analyst can open the file read-only.

The schema only changes through the numbered migrations in :data:`MIGRATIONS`; the versions
applied are recorded in ``llm_ops_migrations``.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from .exceptions import CacheError, CacheLockedError

CACHE_ENV = "LLM_OPS_CACHE"
# Extensions cannot be downloaded here (and should not be, silently, anywhere).
NO_EXTENSION_DOWNLOADS: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}

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
)

_CACHE_SCHEMA = pa.schema(
    [
        ("key", pa.string()), ("model", pa.string()), ("endpoint", pa.string()),
        ("request", pa.string()), ("status", pa.string()), ("response_text", pa.string()),
        ("response_json", pa.string()), ("finish_reason", pa.string()),
        ("prompt_tokens", pa.int32()), ("completion_tokens", pa.int32()),
        ("latency_ms", pa.float64()), ("attempts", pa.int32()),
    ]
)


# Files (path, inode) this process has brought up to date: checking on every flush costs ms.
_MIGRATED: set[tuple[Path, int]] = set()
_IN_PROCESS = threading.RLock()


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
        return duckdb.connect(str(path), read_only=read_only, config=NO_EXTENSION_DOWNLOADS)
    except duckdb.ConnectionException as exc:
        # This process already has the file open (say, the SQL functions were registered on a
        # connection to the cache itself); DuckDB then insists on that connection's settings.
        if "different configuration" not in str(exc):
            raise
        return duckdb.connect(str(path), read_only=read_only)


def _is_lock_error(exc: duckdb.Error) -> bool:
    return "lock" in str(exc).lower()


def open_cache(
    cache: str | os.PathLike[str] | None = None, *, read_only: bool = True,
    lock_timeout: float = 30.0,
) -> duckdb.DuckDBPyConnection:
    """Open the cache database for your own queries; close it when done.

    Read-only by default, so a running job can keep writing between your queries. While a job
    is flushing answers the file is locked for a moment; opening waits for it (up to
    ``lock_timeout`` seconds) instead of failing with DuckDB's raw IO error.

    Use it as a context manager::

        with open_cache("output/cache.duckdb") as con:
            con.sql("SELECT model, count(*) FROM llm_cache GROUP BY model").show()
    """
    path = resolve_cache_path(cache)
    assert path is not None
    if read_only and not path.exists():
        raise CacheError(f"there is no cache at {path} yet; run a job first, or pass the path "
                         f"of an existing cache (cache= or {CACHE_ENV})")
    con = _open_retrying(path, read_only=read_only, lock_timeout=lock_timeout)
    if not read_only:
        migrate(con)
    return con


def _open_retrying(
    path: Path, *, read_only: bool, lock_timeout: float
) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + lock_timeout
    delay = 0.01
    while True:
        try:
            return _open(path, read_only=read_only)
        except duckdb.Error as exc:
            if not _is_lock_error(exc):
                raise CacheError(f"cannot open the cache {path}: {exc}") from exc
            if time.monotonic() >= deadline:
                raise CacheLockedError(
                    f"the cache {path} is held by another process (DuckDB allows one writer and "
                    f"locks out everyone else while it writes); waited {lock_timeout:.0f}s. "
                    "Jobs hold it only while flushing: retry, or close the other connection, or "
                    f"point this job at another file with cache=... or {CACHE_ENV}."
                ) from exc
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 0.5)


@contextmanager
def connect(
    path: Path, *, read_only: bool = False, lock_timeout: float = 30.0
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived connection to the cache file, migrated, retried while another holds it.

    Connections of this process are taken one at a time: DuckDB shares one database instance
    per file within a process, and a thread opening it while another thread's close tears it
    down gets a half-initialised connection.
    """
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    with _IN_PROCESS:
        con = _open_retrying(path, read_only=read_only, lock_timeout=lock_timeout)
        try:
            identity = (path, path.stat().st_ino)  # DuckDB has created the file by now
            if not read_only and identity not in _MIGRATED:
                migrate(con)
                _MIGRATED.add(identity)
            yield con
        except duckdb.Error as exc:
            raise CacheError(f"cache {path}: {exc}") from exc
        finally:
            con.close()


@contextmanager
def attached(
    con: duckdb.DuckDBPyConnection, path: Path, *, alias: str, lock_timeout: float = 30.0
) -> Iterator[None]:
    """Attach the cache read-only to another connection (e.g. for a big anti-join), briefly."""
    deadline = time.monotonic() + lock_timeout
    while True:
        try:
            con.execute(f"ATTACH '{_sql_string(str(path))}' AS {alias} (READ_ONLY)")
            break
        except duckdb.Error as exc:
            if not _is_lock_error(exc) or time.monotonic() >= deadline:
                raise CacheError(f"cannot attach the cache {path}: {exc}") from exc
            time.sleep(0.05)
    try:
        yield
    finally:
        con.execute(f"DETACH {alias}")


def _sql_string(text: str) -> str:
    return text.replace("'", "''")


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Apply the migrations not yet recorded; returns the schema version."""
    con.execute(
        "CREATE TABLE IF NOT EXISTS llm_ops_migrations ("
        "version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
        "applied_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp)"
    )
    # fetchall, not fetchone: DuckDB keeps a partly fetched result open on the connection
    current = int(con.execute("SELECT coalesce(max(version), 0) FROM llm_ops_migrations")
                  .fetchall()[0][0])
    for version, name, sql in MIGRATIONS:
        if version <= current:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(sql)
            con.execute(
                "INSERT INTO llm_ops_migrations (version, name) VALUES (?, ?)", [version, name]
            )
            con.execute("COMMIT")
        except duckdb.Error:
            con.execute("ROLLBACK")
            raise
        current = version
    return current


def lookup(path: Path, keys: pa.Table) -> pa.Table:
    """Cached answers for the ``key`` column of ``keys``: one join, not one query per key."""
    return _rows_for_keys(path, "llm_cache", _CACHE_SCHEMA, keys)


def _rows_for_keys(path: Path, table: str, schema: pa.Schema, keys: pa.Table) -> pa.Table:
    if not path.exists():
        return schema.empty_table()
    columns = ", ".join(f"t.{name}" for name in schema.names)
    with connect(path) as con:
        con.register("wanted_keys", keys)
        result = con.sql(
            f"SELECT {columns} FROM {table} t SEMI JOIN wanted_keys w ON t.key = w.key"
        ).to_arrow_table()
        con.unregister("wanted_keys")
    return result


def write_answers(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert answers; a key already present keeps its first answer."""
    _insert_new(path, "llm_cache", _CACHE_SCHEMA, rows)


def _insert_new(
    path: Path, table: str, schema: pa.Schema, rows: Sequence[Mapping[str, Any]]
) -> None:
    if not rows:
        return
    batch = pa.Table.from_pylist(list(rows), schema=schema)
    names = ", ".join(schema.names)
    with connect(path) as con:
        con.register("new_rows", batch)
        con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM new_rows "
                    "ON CONFLICT DO NOTHING")
        con.unregister("new_rows")


_EMBEDDING_SCHEMA = pa.schema(
    [
        ("key", pa.string()), ("model", pa.string()), ("endpoint", pa.string()),
        ("request", pa.string()), ("dimensions", pa.int32()),
        ("embedding", pa.list_(pa.float32())), ("prompt_tokens", pa.int32()),
        ("latency_ms", pa.float64()),
    ]
)


def lookup_embeddings(path: Path, keys: pa.Table) -> pa.Table:
    """Cached vectors for the ``key`` column of ``keys``, in one join."""
    return _rows_for_keys(path, "llm_embeddings", _EMBEDDING_SCHEMA, keys)


def write_embeddings(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert vectors; a key already present keeps its first vector."""
    _insert_new(path, "llm_embeddings", _EMBEDDING_SCHEMA, rows)


_SEMANTIC_SCHEMA = pa.schema(
    [("key", pa.string()), ("scope", pa.string()), ("embedding_key", pa.string())]
)


def write_semantic_index(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Make cached answers findable by similarity: key, scope and the prompt's vector key."""
    _insert_new(path, "llm_semantic_index", _SEMANTIC_SCHEMA, rows)


def similar_candidates(
    path: Path, scopes: Sequence[str], *, embedding_model: str, dimensions: int,
    batch_rows: int = 65_536,
) -> Iterator[pa.RecordBatch]:
    """Cached ``ok`` answers in one of ``scopes`` with a vector from ``embedding_model``,
    as batches of (key, scope, embedding), read a batch at a time."""
    if not path.exists() or not scopes:
        return
    with connect(path) as con:
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


def record_run(path: Path, run: Mapping[str, Any]) -> None:
    """Append one row to ``llm_runs``."""
    names = list(run)
    with connect(path) as con:
        placeholders = ", ".join("?" for _ in names)
        con.execute(
            f"INSERT INTO llm_runs ({', '.join(names)}) VALUES ({placeholders})",
            [run[name] for name in names],
        )
