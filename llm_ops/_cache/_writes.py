"""Writing the cache: rows go to the journal at once (durable there), and are merged from it
into the file whenever the file is free.

A lock can delay a merge, never lose an answer or stop a job: a job's end waits a while
(``merge_wait``) for a reader to let go, and journal files left behind (by a crash, or by a
reader that held the file past that) are merged on the next open or by ``llm-ops cache merge``.
Merging is idempotent: a key already present keeps its row, unless the journal holds a newer
refresh of it (an answer sent by a job with a ``max_age``, see :class:`~._store.Cache`,
because the cached one was too old); that one replaces it in ``llm_cache``, and the row
replaced moves to ``llm_cache_history``. So ``llm_cache`` keeps one row per key, the one jobs
reuse, and every reader of it stays as it was. A journal file merged twice adds nothing: its
answers are no newer than themselves.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from .._journal import JournalWriter, finished, held
from ..exceptions import CacheError, CacheLockedError
from ._connection import Place, connect, fatal_error
from ._journal_sql import check_lines, journal_sql
from ._migrations import ANSWERS, COLUMNS, JSON_COLUMNS, KEYS, stored

_log = logging.getLogger("llm_ops")

_CLOSE_FIRST = 0.5  # seconds :func:`settle` tries before it says it waits for a reader
_WRITERS_AT_ONCE = 256  # finished writers merged in one transaction (each holds a lock open)


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


def write_rows(
    writer: JournalWriter,
    table: str,
    rows: Sequence[Mapping[str, Any]],
    *,
    wait: float | None = 2.0,
) -> None:
    """Write ``rows`` through ``writer`` (one of their own): to the journal, then a brief merge
    (none with ``wait=None``); what the file does not take waits for the job's end."""
    if not rows:
        return
    for row in rows:
        writer.append_row(table, row)
    writer.close(wait=wait)


def run_row(run: Mapping[str, Any]) -> dict[str, Any]:
    """The ``llm_runs`` row of a report's fields (those it has columns for)."""
    return {name: run.get(name) for name in COLUMNS["llm_runs"]}


def write_batch(writer: JournalWriter, part: Mapping[str, Any], keys: Sequence[str]) -> None:
    """Journal (durably, when this returns) that a batch part reached ``part["state"]``, and
    which request ``keys`` it carries."""
    row = {name: part.get(name) for name in COLUMNS["llm_batches"] if name != "key"}
    row["key"] = f"{part['job_id']}:{part['part']}:{part['state']}"
    writer.append_row("llm_batches", row)
    for key in keys:
        writer.append_row(
            "llm_batch_requests",
            {
                "key": f"{part['job_id']}:{part['part']}:{key}",
                "job_id": part["job_id"],
                "part": part["part"],
                "request_key": key,
            },
        )
    writer.close(wait=0.5)


def merge_files(place: Place, files: Sequence[Path], wait: float) -> str | None:
    """Insert journal ``files`` into their tables and delete them; why not (nothing is
    deleted then) when the file stays locked for ``wait`` seconds or cannot be written.
    Raises :class:`CacheError` when waiting cannot help: the file is damaged, or its disk
    is full (the files stay then too)."""
    merged = _merge(place, files, wait)
    return merged.reason if isinstance(merged, Merged) else None


def _merge(place: Place, files: Sequence[Path], wait: float) -> dict[str, int] | Merged:
    """Rows inserted per table, or a :class:`Merged` saying why none were."""
    by_table: dict[str, list[Path]] = {}
    for file in files:
        by_table.setdefault(file.name.rsplit(".", 2)[-2], []).append(file)
    try:
        with connect(place, read_only=False, wait=wait) as con:
            try:
                rows = _insert(con, by_table, strict=False)
            except duckdb.ConversionException:
                # a line whose JSON value is garbage would fail every merge for ever
                con.execute("ROLLBACK")
                rows = _insert(con, by_table, strict=True)
    except CacheError as exc:
        if not isinstance(exc, CacheLockedError) and fatal_error(place.path, exc.__cause__ or exc):
            raise
        return Merged(reason=str(exc), held=isinstance(exc, CacheLockedError))
    for file in files:
        file.unlink(missing_ok=True)
    return rows


def _insert(
    con: duckdb.DuckDBPyConnection, by_table: Mapping[str, list[Path]], *, strict: bool
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
        names = stored(table)
        lines = journal_sql(table, list(COLUMNS[table]), present)
        if strict and JSON_COLUMNS.get(table):
            valid = " AND ".join(f"({c} IS NULL OR json_valid({c}))" for c in JSON_COLUMNS[table])
            skipped = con.execute(f"SELECT count(*) FROM ({lines}) WHERE NOT ({valid})")
            count = int(skipped.fetchall()[0][0])
            if count:
                _log.warning(
                    "llm-ops: skipped %d line(s) of the journal file(s) %s whose %s is not "
                    "valid JSON; a rerun sends again what they held",
                    count,
                    ", ".join(map(str, present)),
                    " or ".join(JSON_COLUMNS[table]),
                )
            lines = f"SELECT * FROM ({lines}) WHERE {valid}"
        if table == "llm_cache":
            lines = replace_older(con, lines)
        inserted = con.execute(insert_new(table, names, lines)).fetchall()
        rows[table] = rows.get(table, 0) + int(inserted[0][0])
    con.execute("COMMIT")
    return rows


def replace_older(con: duckdb.DuckDBPyConnection, lines: str, *, schema: str = "") -> str:
    """Of the answers in ``lines``, the one to keep per key: a refresh (sent by a job with a
    ``max_age``), the newest, else any. The answers of ``llm_cache`` a newer refresh
    replaces move to ``llm_cache_history``, and so do the journal's own answers to a key a
    refresh replaces. Returns the query of the answers to insert. ``schema``: of an attached
    database, say ``"snapshot."``."""
    listed = ", ".join(stored("llm_cache"))
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE merging AS SELECT *, "
        "row_number() OVER (PARTITION BY key ORDER BY refresh IS TRUE DESC, created_at DESC) "
        "AS rank, bool_or(refresh IS TRUE) OVER (PARTITION BY key) AS refreshed "
        f"FROM ({lines})"
    )
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE replaced AS SELECT old.key FROM {schema}llm_cache old "
        "JOIN merging new ON old.key = new.key "
        "WHERE new.rank = 1 AND new.refresh AND new.created_at > old.created_at"
    )
    con.execute(
        f"INSERT INTO {schema}llm_cache_history ({listed}) SELECT {listed} "
        f"FROM {schema}llm_cache WHERE key IN (SELECT key FROM replaced)"
    )
    con.execute(f"DELETE FROM {schema}llm_cache WHERE key IN (SELECT key FROM replaced)")
    con.execute(
        f"INSERT INTO {schema}llm_cache_history ({listed}) SELECT {listed} FROM merging "
        "WHERE rank > 1 AND refreshed"
    )
    return f"SELECT {listed} FROM merging WHERE rank = 1"


def insert_new(table: str, names: Sequence[str], rows: str, *, schema: str = "") -> str:
    """SQL that inserts the rows of the query ``rows`` (columns ``names``) whose key
    (:data:`~._migrations.KEYS`) ``table`` lacks, one row per key: a key already present keeps
    its row. ``schema``: of an attached database, say ``"snapshot."``."""
    key, listed, target = KEYS[table], ", ".join(names), f"{schema}{table}"
    return (
        f"INSERT INTO {target} ({listed}) SELECT {listed} FROM ({rows}) AS new "
        f"WHERE NOT EXISTS (SELECT 1 FROM {target} AS old WHERE old.{key} = new.{key}) "
        f"QUALIFY row_number() OVER (PARTITION BY new.{key}) = 1"
    )


def merge_orphans(place: Place, *, wait: float, directory: Path | None = None) -> int:
    """Merge the journal files of writers that are gone (crashed, or ended while the file
    was held), in the cache's journal or in ``directory`` (where a cluster's workers
    write theirs); returns how many files were merged."""
    return merge_finished(place, wait=wait, directory=directory).files


def merge_finished(place: Place, *, wait: float, directory: Path | None = None) -> Merged:
    """:meth:`merge_orphans`, in one transaction per :data:`_WRITERS_AT_ONCE` writers,
    all within ``wait`` seconds."""
    folder = place.journal if directory is None else directory
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
                check_lines(table, [f for f in files if f.name.endswith(f".{table}.jsonl")])
            merged = _merge(place, files, max(0.0, deadline - time.monotonic()))
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


def settle(place: Place, *, wait: float, warn: bool = True) -> Merged:
    """Merge what finished writers left in the journal (a job's end: its answers and its
    run). When the file is held and answers wait, say so and wait up to ``wait`` seconds
    for it; what is left after that (a warning says so, unless ``warn=False``) is merged
    by any later job or open, or by ``llm-ops cache merge``, and is read by lookups until
    then."""
    merged = merge_finished(place, wait=min(wait, _CLOSE_FIRST))
    if merged.held and merged.waiting and wait > _CLOSE_FIRST:
        _log.warning(
            "llm-ops: waiting up to %.0f s for a reader of %s to let go of it, to merge "
            "the %d answer(s) waiting in its journal %s",
            wait,
            place.path,
            merged.waiting,
            place.journal,
        )
        rest = merge_finished(place, wait=wait - _CLOSE_FIRST)
        for table, count in merged.rows.items():
            rest.rows[table] = rest.rows.get(table, 0) + count
        rest.files += merged.files
        merged = rest
    if merged.waiting and warn and merged.held:
        _log.warning(
            "llm-ops: %d answer(s) wait in the journal %s, not yet in %s, which another "
            "process holds. They are cache hits already; `llm-ops cache merge --cache %s` "
            "(or any llm-ops job) merges them into the file once it is free",
            merged.waiting,
            place.journal,
            place.path,
            place.path,
        )
    elif merged.waiting and warn:
        _log.warning(
            "llm-ops: %d answer(s) wait in the journal %s, not yet in %s: merging them "
            "failed (%s). They are cache hits already; once that is fixed, `llm-ops cache "
            "merge --cache %s` (or any llm-ops job) merges them into the file",
            merged.waiting,
            place.journal,
            place.path,
            merged.reason,
            place.path,
        )
    return merged


def adopt(place: Place, directory: Path, *, wait: float) -> None:
    """Take the journal files that finished writers left in ``directory`` (a cluster's
    workers, which may not open the cache) into this cache's journal, and merge them:
    until they are merged, lookups read them there like any other journal file."""
    if not directory.is_dir():
        return
    place.journal.mkdir(parents=True, exist_ok=True)
    for writer_id in sorted({f.name.split(".", 1)[0] for f in directory.glob("*.jsonl")}):
        with held(directory / f"{writer_id}.lock", blocking=False) as free:
            if free:
                for file in sorted(directory.glob(f"{writer_id}.*.jsonl")):
                    shutil.move(file, place.journal / file.name)
    merge_orphans(place, wait=wait)


def _is_answers(file: Path) -> bool:
    return file.name.rsplit(".", 2)[-2] in ANSWERS


def _lines(files: Iterator[Path] | Sequence[Path]) -> int:
    """Lines in ``files`` (those gone meanwhile count none)."""
    count = 0
    for file in files:
        with contextlib.suppress(OSError), open(file, "rb") as f:
            while chunk := f.read(1 << 20):
                count += chunk.count(b"\n")
    return count
