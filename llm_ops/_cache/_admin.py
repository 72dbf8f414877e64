"""What people do with a cache (``llm-ops cache ...``): snapshot it, count and export its
answers, prune and vacuum it, restore an export into it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Literal

import duckdb
import pyarrow as pa

from ..exceptions import CacheError, ConfigError
from ._connection import DUCKDB_CONFIG, NEW_FILE, Place, attached, connect, sql_string
from ._journal_sql import journal_files, journal_sql
from ._maintenance import rewriting
from ._migrations import COLUMNS, stored
from ._writes import insert_new, merge_orphans, replace_older


def snapshot(place: Place, target: str | os.PathLike[str]) -> Path:
    """Copy the cache, with what the journal holds, into a new file ``target``: a copy
    to query (or open in another tool) for as long as you like, while jobs go on writing
    the original."""
    out = Path(target)
    if out.exists():
        raise CacheError(f"{out} exists already; choose a new file for the snapshot")
    if not place.path.exists():
        raise CacheError(f"there is no cache at {place.path} yet; run a job first")
    out.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(CacheError):
        merge_orphans(place, wait=2.0)
    with duckdb.connect(config=DUCKDB_CONFIG) as con, attached(place, con, alias="src"):
        con.execute(f"ATTACH {sql_string(str(out))} AS snapshot {NEW_FILE}")
        con.execute("COPY FROM DATABASE src TO snapshot")
        for table in ("llm_cache", "llm_embeddings"):  # answers still in the journal
            files = journal_files(place, table)
            if files:
                names = stored(table)
                rows = journal_sql(table, list(COLUMNS[table]), files)
                if table == "llm_cache":  # a refresh still in the journal replaces as merging
                    rows = replace_older(con, rows, schema="snapshot.")
                con.execute(insert_new(table, names, rows, schema="snapshot."))
        con.execute("DETACH snapshot")
    return out


def stats(place: Place) -> tuple[pa.Table, int]:
    """Answers, tokens and the newest answer per model, and how many runs are recorded."""
    with connect(place) as con:
        per_model = con.sql(
            "SELECT model, count(*) AS answers, sum(prompt_tokens) AS tokens_in, "
            "sum(completion_tokens) AS tokens_out, max(created_at) AS newest "
            "FROM llm_cache GROUP BY model ORDER BY answers DESC"
        ).to_arrow_table()
        runs = int(con.sql("SELECT count(*) FROM llm_runs").fetchall()[0][0])
    return per_model, runs


def export(place: Place, *, model: str | None = None) -> pa.Table:
    """Cached answers (of ``model``, or all), oldest first."""
    where, params = _answer_filter(model=model)
    with connect(place) as con:
        return con.sql(
            f"SELECT * FROM llm_cache WHERE {where} ORDER BY created_at", params=params
        ).to_arrow_table()


def prune(
    place: Place,
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
    with connect(place, read_only=dry_run) as con:
        count = int(
            con.execute(f"SELECT count(*) FROM llm_cache WHERE {where}", params).fetchall()[0][0]
        )
        if not dry_run:
            con.execute(f"DELETE FROM llm_cache WHERE {where}", params).fetchall()
    return count


def vacuum(place: Place, *, wait: float | None = None) -> tuple[int, int]:
    """Rewrite the file to reclaim the space of deleted rows; sizes before and after.

    Safe while jobs run: no one writes the file from the copy to the rename, so no answer
    merged meanwhile is lost. A job's merges wait for the vacuum, or leave their answers in
    the journal for the next merge. The vacuum does not start while a job merges into the
    file, but raises :class:`~llm_ops.CacheLockedError` naming the job, unless ``wait``:
    seconds to wait for the merges to pause.
    """
    if wait is not None and (
        isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < 1e6
    ):
        raise ConfigError(f"wait must be 0 or more seconds, got {wait!r}")
    with rewriting(place, wait=wait, doing="vacuum"):
        before = place.path.stat().st_size
        fresh = place.path.with_name(place.path.name + ".vacuum")
        fresh.unlink(missing_ok=True)
        with connect(place, read_only=False) as con:
            name = con.execute("SELECT current_database()").fetchall()[0][0]
            con.execute(f"ATTACH {sql_string(str(fresh))} AS fresh {NEW_FILE}")
            con.execute(f"COPY FROM DATABASE {name} TO fresh")
            con.execute("DETACH fresh")
        wal = place.path.with_name(place.path.name + ".wal")
        if wal.exists():  # the last connection to close removes it: another is open
            fresh.unlink(missing_ok=True)
            raise CacheError(
                f"cannot vacuum {place.path}: another connection of this process has it open "
                f"(its write-ahead log {wal.name} is there), and would go on writing the file "
                "the vacuum replaces; close it (say, the one open_cache gave) and vacuum again"
            )
        fresh.replace(place.path)
        return before, place.path.stat().st_size


def insert(
    place: Place,
    table: Literal["llm_cache", "llm_embeddings", "llm_semantic_index"],
    rows: pa.Table,
) -> None:
    """Insert ``rows`` (an Arrow table with some of the table's columns), say to restore an
    export; a key already present keeps its row."""
    if table not in ("llm_cache", "llm_embeddings", "llm_semantic_index"):
        raise ConfigError(
            f"insert takes llm_cache, llm_embeddings or llm_semantic_index, got {table!r}"
        )
    with connect(place, read_only=False) as con:
        con.register("new_rows", rows)
        con.execute(insert_new(table, rows.column_names, "SELECT * FROM new_rows"))
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
