"""The journal in SQL: the queries that read a table's journal files (alone, or with the table
itself), and the check that warns of lines a crash cut short.

A job writes its rows to the journal first (see :mod:`llm_ops._journal`, whose format this only
reads); lookups read it together with the file, so an answer is a cache hit as soon as it is
journalled. A journal line cut short (a crash, a full disk) reads as nulls and is skipped with
a warning: every line that lacks what its table requires is.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path

import duckdb

from .._journal import WHOLE, finished
from ._connection import DUCKDB_CONFIG, Place, sql_string
from ._migrations import COLUMNS, REQUIRED

_log = logging.getLogger("llm_ops")

# Journal files of finished writers (path, size) this process has checked for broken lines,
# or wrote whole itself.
_CHECKED = WHOLE


def _lock_of(journal_file: Path) -> Path:
    """The lock its writer holds while it lives: ``<writer>.lock`` beside the file."""
    return journal_file.with_name(journal_file.name.split(".", 1)[0] + ".lock")


def _read_journal(table: str, files: Sequence[Path], *, filename: bool = False) -> str:
    spec = ", ".join(
        f"{sql_string(name)}: {sql_string(kind)}" for name, kind in COLUMNS[table].items()
    )
    paths = ", ".join(sql_string(str(f)) for f in files)
    return (
        f"read_json([{paths}], format='newline_delimited', columns={{{spec}}}, "
        f"ignore_errors=true{', filename=true' if filename else ''})"
    )


def _valid(table: str) -> str:
    return " AND ".join(f"{name} IS NOT NULL" for name in REQUIRED[table])


def check_lines(table: str, files: Sequence[Path]) -> None:
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


def journal_files(place: Place, table: str) -> list[Path]:
    """The journal files of ``table``; those of finished writers are checked for broken lines
    (once each)."""
    if not place.journal.is_dir():
        return []
    files = sorted(place.journal.glob(f"*.{table}.jsonl"))
    unchecked = []
    for file in files:
        with contextlib.suppress(OSError):  # merged and removed meanwhile
            if (file, file.stat().st_size) not in _CHECKED:
                unchecked.append(file)
    if unchecked:  # a live writer's last line may be half-written: only finished ones
        gone = {lock for lock in {_lock_of(file) for file in unchecked} if finished(lock)}
        check_lines(table, [file for file in unchecked if _lock_of(file) in gone])
    return files


def journal_sql(table: str, columns: Sequence[str], files: Sequence[Path]) -> str:
    """A query over the lines of the journal ``files`` of ``table`` that hold what it requires."""
    # ignore_errors: a line cut short by a crash (or being appended to right now) reads
    # as nulls, and is skipped with every line that lacks what its table requires
    return f"SELECT {', '.join(columns)} FROM {_read_journal(table, files)} WHERE {_valid(table)}"


def table_sql(
    place: Place, table: str, columns: Sequence[str], files: Sequence[Path] | None = None
) -> str:
    """A query over ``table`` and what the journal holds for it (``files``, listed now if not
    given)."""
    listed = ", ".join(columns)
    files = journal_files(place, table) if files is None else files
    if not place.path.exists():
        return journal_sql(table, columns, files)
    if not files:
        return f"SELECT {listed} FROM {table}"
    return f"SELECT {listed} FROM {table} UNION ALL {journal_sql(table, columns, files)}"
