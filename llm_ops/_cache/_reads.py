"""Reading the cache for a job: answers and vectors by key, candidates for the semantic cache,
provider batches, and the answers as a view for a join inside DuckDB. Every read takes what
the journal holds too, so an answer is found as soon as it is journalled.

Answers are read from ``llm_cache`` alone, one row per key: the answers a refresh for age
replaced are in ``llm_cache_history`` (see :mod:`._writes`), so keeping history costs a
lookup nothing. A cache's ``max_age`` reaches a read as ``since``: an answer that came before
it is no answer."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from .._concurrency import AT_THE_CAP
from ..exceptions import CacheError
from ._connection import Place, attached, connect, reader, sql_string
from ._journal_sql import journal_files, journal_sql, table_sql
from ._migrations import CACHE_SCHEMA, COLUMNS, EMBEDDING_SCHEMA, stored

LIST_ATTEMPTS = 10
"""Lookups list the journal, then read it: a file merged (or, on a cluster, moved into the
cache's journal) in between is listed again, this many times at most."""
# The order in which a batch part goes through its states (the provider's and ours).
BATCH_STATES = (
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


UNREAD_UNLESS_ASKED = ("reasoning_text",)
"""Columns of ``llm_cache`` a lookup reads only when asked to: a reasoning model's thinking can
be megabytes an answer, and a job that does not keep it must not load it (it reads as null)."""


def lookup(
    place: Place, keys: pa.Table, *, since: datetime | None = None, reasoning: bool = False
) -> pa.Table:
    """Cached answers for the ``key`` column of ``keys`` (journal included), in one join: the
    newest of each key, and none that came before ``since`` (older ones are misses); their
    thinking (``reasoning_text``) only if ``reasoning``, else null."""
    unread = () if reasoning else UNREAD_UNLESS_ASKED
    return _rows_for_keys(place, "llm_cache", CACHE_SCHEMA, keys, since=since, unread=unread)


def lookup_embeddings(place: Place, keys: pa.Table) -> pa.Table:
    """Cached vectors for the ``key`` column of ``keys`` (journal included), in one join."""
    return _rows_for_keys(place, "llm_embeddings", EMBEDDING_SCHEMA, keys)


def _rows_for_keys(
    place: Place,
    table: str,
    schema: pa.Schema,
    keys: pa.Table,
    *,
    since: datetime | None = None,
    unread: Sequence[str] = (),
) -> pa.Table:
    columns = [name for name in schema.names if name not in unread]
    dated = "created_at" in COLUMNS[table]
    for attempt in range(LIST_ATTEMPTS):
        files = journal_files(place, table)
        if not place.path.exists() and not files:
            return schema.empty_table()
        if dated:
            query = _answers_sql(place, table, [*columns, "created_at"], files)
        else:
            query = table_sql(place, table, columns, files)
        query = f"SELECT t.* FROM ({query}) t SEMI JOIN wanted_keys w ON t.key = w.key"
        if since is not None:
            query += " WHERE t.created_at >= $since"
        if files:  # the file's answer to a key and the journal's
            order = " ORDER BY key, rank, created_at DESC" if dated else ""
            query = f"SELECT DISTINCT ON (key) * FROM ({query}){order}"
        listed = ", ".join(
            f"CAST(NULL AS {COLUMNS[table][name]}) AS {name}" if name in unread else name
            for name in schema.names
        )
        try:
            with reader(place) as con:
                con.register("wanted_keys", keys)
                found = con.sql(
                    f"SELECT {listed} FROM ({query})",
                    params=None if since is None else {"since": since},
                )
                rows = found.to_arrow_table()
                # cast only when needed: it imports pyarrow.compute (~60 ms, once)
                return rows if rows.schema.equals(schema) else rows.cast(schema)
        except (CacheError, duckdb.IOException) as exc:
            # A journal file merged and removed between listing and reading (before the
            # query was planned, or after: "Cannot open file"), or a line appended to one
            # after it was measured and longer than it: list and measure again.
            gone = (
                "No files found",
                "needs at least one file",
                "Cannot open file",
                "maximum_object_size",
            )
            if attempt == LIST_ATTEMPTS - 1 or not any(sign in str(exc) for sign in gone):
                raise
            time.sleep(0.01 * random.uniform(0.5, 1.5))
    raise AssertionError("unreachable")


def similar_candidates(
    place: Place,
    scopes: Sequence[str],
    *,
    embedding_model: str,
    dimensions: int,
    batch_rows: int = 65_536,
    since: datetime | None = None,
) -> Iterator[pa.RecordBatch]:
    """Cached ``ok`` answers in one of ``scopes`` with a vector from ``embedding_model``,
    none that came before ``since``, as batches of (key, scope, embedding), read a batch at
    a time."""
    if not place.path.exists() or not scopes:
        return
    with connect(place) as con:
        con.register("wanted_scopes", pa.table({"scope": list(scopes)}))
        batches = con.sql(
            "SELECT i.key, i.scope, e.embedding FROM llm_semantic_index i "
            "SEMI JOIN wanted_scopes w ON i.scope = w.scope "
            "JOIN llm_embeddings e ON e.key = i.embedding_key "
            "JOIN llm_cache c ON c.key = i.key "
            "WHERE c.status = 'ok' AND e.model = $model AND e.dimensions = $dimensions "
            "AND ($since IS NULL OR c.created_at >= $since)",
            params={"model": embedding_model, "dimensions": dimensions, "since": since},
        ).to_arrow_reader(batch_rows)
        yield from batches
        con.unregister("wanted_scopes")


def learned_concurrency(place: Place, endpoint: str) -> int | None:
    """The concurrency the latest completed job on ``endpoint`` settled on (a cap given to it
    is not something learned), or ``None``."""
    if not place.path.exists() and not journal_files(place, "llm_runs"):
        return None
    columns = ["endpoint", "outcome", "finished_at", "concurrency", "concurrency_why"]
    query = (
        f"SELECT concurrency FROM ({table_sql(place, 'llm_runs', columns)}) "
        "WHERE endpoint = $endpoint AND outcome = 'completed' AND concurrency IS NOT NULL "
        "AND NOT starts_with(concurrency_why, $cap) ORDER BY finished_at DESC LIMIT 1"
    )
    with connect(place) as con:
        found = con.execute(query, {"endpoint": endpoint, "cap": AT_THE_CAP}).fetchall()
    return int(found[0][0]) if found else None


def batch_parts(
    place: Place, *, keys: Sequence[str] | None = None, job_id: str | None = None
) -> list[dict[str, Any]]:
    """Every batch part that carries one of ``keys`` (or belongs to ``job_id``, or all),
    in its latest state, with the ids recorded along the way; oldest first."""
    if not place.path.exists() and not journal_files(place, "llm_batches"):
        return []
    events = table_sql(place, "llm_batches", list(COLUMNS["llm_batches"]))
    requests = table_sql(place, "llm_batch_requests", ["job_id", "part", "request_key"])
    ranks = " ".join(f"WHEN '{state}' THEN {rank}" for rank, state in enumerate(BATCH_STATES))
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
    with connect(place) as con:
        con.register(
            "wanted_keys",
            pa.table({"key": list(keys or [])}, schema=pa.schema([("key", pa.string())])),
        )
        params = {"job_id": job_id} if keys is None and job_id is not None else None
        parts: list[dict[str, Any]] = con.sql(query, params=params).to_arrow_table().to_pylist()
    return parts


def batch_keys(place: Place, job_id: str, part: int) -> list[str]:
    """The request keys a batch part carries."""
    requests = table_sql(place, "llm_batch_requests", ["job_id", "part", "request_key"])
    with connect(place) as con:
        rows = con.sql(
            f"SELECT DISTINCT request_key FROM ({requests}) "
            "WHERE job_id = $job_id AND part = $part",
            params={"job_id": job_id, "part": part},
        ).fetchall()
    return [row[0] for row in rows]


@contextmanager
def answers_view(
    place: Place,
    con: duckdb.DuckDBPyConnection,
    *,
    name: str,
    columns: Sequence[str],
    since: datetime | None = None,
) -> Iterator[None]:
    """For the block, ``name`` on ``con`` is a view of the cached answers with ``columns`` of
    ``llm_cache``, one row per key (see :func:`_answers_sql`), none that came before
    ``since``: for a join of a big table of keys against them, inside DuckDB. The cache is
    attached read-only meanwhile."""
    unknown = [column for column in columns if column not in stored("llm_cache")]
    if unknown or not name.isidentifier():
        raise ValueError(
            f"a view of the answers needs a plain name and columns of llm_cache, not "
            f"{name!r} and {unknown}"
        )
    with attached(place, con, alias=f"{name}_file"):
        files = journal_files(place, "llm_cache")
        inner = list(dict.fromkeys([*columns, "created_at"]))
        query = _answers_sql(place, f"{name}_file.llm_cache", inner, files)
        where = "" if since is None else f" WHERE created_at >= {sql_string(since.isoformat())}"
        order = " ORDER BY key, rank, created_at DESC" if files else ""
        distinct = "DISTINCT ON (key) " if files else ""
        con.execute(
            f"CREATE TEMP VIEW {name} AS SELECT {distinct}{', '.join(columns)} "
            f"FROM ({query}){where}{order}"
        )
        try:
            yield
        finally:
            con.execute(f"DROP VIEW {name}")


def _answers_sql(place: Place, table: str, columns: Sequence[str], files: Sequence[Path]) -> str:
    """The answers of the cache file's ``table`` and of the journal ``files``, with a
    ``rank`` by which the one a key's readers take comes first: a refresh in the journal
    (newer than the file's, which was too old for it), then the file's, then the journal's
    others (the same answer, paid twice by a race), as merging them keeps."""
    listed = ", ".join(columns)
    file_rows = f"SELECT {listed}, 1 AS rank FROM {table}" if place.path.exists() else ""
    if not files:
        return file_rows
    journal = journal_sql(
        "llm_cache", [*columns, "CASE WHEN refresh THEN 0 ELSE 2 END AS rank"], files
    )
    return f"{file_rows} UNION ALL {journal}" if file_rows else journal
