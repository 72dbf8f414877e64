"""The journal in SQL: the queries that read a table's journal files (alone, or with the table
itself), and the check that warns of lines a crash cut short.

A job writes its rows to the journal first (see :mod:`llm_ops._journal`, whose format this only
reads); lookups read it together with the file, so an answer is a cache hit as soon as it is
journalled. A journal line cut short (a crash, a full disk) reads as nulls and is skipped with
a warning: every line that lacks what its table requires is. A line may be of any length up to
:data:`~llm_ops._journal.LINE_MOST` (a prompt of tens of megabytes makes a line past DuckDB's
default limit): each read tells DuckDB the longest line of the files it reads.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import duckdb

from .._journal import LINE_MOST, WHOLE, finished
from ._connection import DUCKDB_CONFIG, Place, sql_string
from ._migrations import COLUMNS, REQUIRED

_log = logging.getLogger("llm_ops")

# Journal files of finished writers (path, size) this process has checked for broken lines,
# or wrote whole itself.
_CHECKED = WHOLE


DEFAULT_OBJECT_SIZE = 16 * 2**20
"""DuckDB's own ``maximum_object_size``, ample for the lines of ordinary answers."""
_SCAN_BYTES = 2**20
"""Bytes of a journal file read at a time to measure its lines: only a line longer than
:data:`DEFAULT_OBJECT_SIZE` matters, and such a line spans chunks."""
_LONGEST: dict[tuple[Path, int, int], int] = {}
"""The longest line of journal files this process measured, by (path, size, mtime): a file
only grows (or is taken back after a failed write), and each version is read once."""


def longest_line(file: Path) -> int:
    """Bytes of the longest line of ``file`` (its newline included) when that is longer than
    :data:`_SCAN_BYTES`, else at most that; 0 when the file is gone (merged meanwhile)."""
    try:
        with open(file, "rb") as f:
            stat = os.fstat(f.fileno())
            version = (file, stat.st_size, stat.st_mtime_ns)
            if version in _LONGEST:
                return _LONGEST[version]
            # Lines within one chunk are shorter than it: only the runs between the first and
            # the last newline of consecutive chunks are measured, at the speed of memchr.
            longest = run = 0
            while chunk := f.read(_SCAN_BYTES):
                first = chunk.find(b"\n")
                if first < 0:
                    run += len(chunk)
                    continue
                longest = max(longest, run + first + 1)
                run = len(chunk) - chunk.rfind(b"\n") - 1
            longest = max(longest, run)  # a last line without its newline (a crash)
    except OSError:
        return 0
    if len(_LONGEST) > 10_000:  # files merged long ago
        _LONGEST.clear()
    _LONGEST[version] = longest
    return longest


def _object_size(files: Sequence[Path]) -> str:
    """The ``maximum_object_size`` argument that lets DuckDB read every line of ``files``."""
    # DuckDB fails the whole query on a line longer than maximum_object_size (ignore_errors
    # does not skip it), and the journal holds lines of any length up to LINE_MOST: a prompt
    # has no bound of its own. Not LINE_MOST every time: DuckDB sets aside twice the limit
    # from its memory_limit to read with, which a small machine cannot spare for every
    # lookup. The longest line of the files read is enough, and costs nothing for the
    # lines of ordinary answers.
    longest = max((longest_line(file) for file in files), default=0)
    if longest <= DEFAULT_OBJECT_SIZE:
        return ""
    return f", maximum_object_size={min(longest, LINE_MOST)}"


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
        f"ignore_errors=true{', filename=true' if filename else ''}{_object_size(files)})"
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
    # a line written before answers carried their time came just now, as far as anyone knows
    listed = ", ".join(
        "coalesce(created_at, now()) AS created_at"
        if name == "created_at" and name in COLUMNS[table]
        else name
        for name in columns
    )
    return f"SELECT {listed} FROM {_read_journal(table, files)} WHERE {_valid(table)}"


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
