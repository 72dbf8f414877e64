"""The journal: where a job's rows wait, safe from a crash, until the cache file is free.

Each :class:`JournalWriter` appends one job's rows to its own JSON-lines files in the folder
next to the cache (``cache.duckdb.journal/``), in batches of at most :data:`JOURNAL_BATCH`, and
holds an exclusive lock (:mod:`llm_ops._locks`) on its ``<writer>.lock`` file while it lives.
Its files are merged into the DuckDB file by :meth:`~llm_ops.Cache.merge_files` (the cache
owns the SQL); files of a writer whose lock is free belong to a finished or dead process and
may be merged by anyone (:meth:`~llm_ops.Cache.merge_orphans`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from ._locks import LockFile, held_by_another
from .exceptions import CacheError

_log = logging.getLogger("llm_ops")

Merge = Callable[[Sequence[Path], float], str | None]
"""Merge journal files into the database, waiting up to so many seconds for it; returns why
it could not (the files then stay), or ``None`` once they are merged and deleted."""

WHOLE: set[tuple[Path, int]] = set()
"""Journal files (path, size) known to hold only whole lines: sealed by a writer of this
process, or checked (see :func:`llm_ops._cache.Cache.merge_orphans`)."""

JOURNAL_BATCH = 32
"""Rows buffered in memory before they are appended to the journal: with ``concurrency`` C, a
killed job loses at most C + 32 answers it had received."""

LINE_MOST = 2**32 - 1
"""The longest journal line a merge can read back. DuckDB reads each line as one JSON object
of at most ``maximum_object_size`` bytes, a UINTEGER, and holds no string longer than this
either. Nothing else bounds a line below it: the prompt has no bound of its own, and the
answer only ``max_response_bytes`` (2**31 at most). So a request whose line might be longer
is not sent (:func:`unkeepable`), and a longer line is never written
(:meth:`JournalWriter.add`): one would fail every merge and every lookup of the cache."""

LINE_FIELDS = 64 * 2**10
"""Room in a line for what is neither the request nor the answer: key, model, endpoint,
status, usage, and the names of the fields."""

VALUE_MOST = 2**31 - 1
"""The longest request a lookup reads back: DuckDB hands a row over as Arrow strings, whose
offsets are 32-bit, and fails the whole lookup on a longer one."""


def unkeepable(request_json: str, answer_bytes: int) -> str | None:
    """Why the answer to ``request_json`` could not be cached: its line in the journal, with
    ``answer_bytes`` of answer, might be longer than :data:`LINE_MOST`, or the request longer
    than :data:`VALUE_MOST`; ``None`` when it can be."""
    # Half a line at most is kept for the answer: max_response_bytes at its maximum (set so
    # as not to limit answers) with a schema would leave no room for any request. An answer
    # past that next to a request past the rest is not cached (JournalWriter.add says so).
    answer_bytes = min(answer_bytes, LINE_MOST // 2)
    room = LINE_MOST - LINE_FIELDS - answer_bytes
    # JSON spells a character in 6 bytes at most (\u001f), and UTF-8 in 4: ordinary requests
    # are not measured
    if 6 * len(request_json) + 2 <= min(room, VALUE_MOST):
        return None
    stored = len(request_json.encode())
    if stored > VALUE_MOST:
        return (
            f"not sent: its request takes {stored:,} bytes, more than the {VALUE_MOST:,} a "
            "lookup of the cache can read back, so its answer could not be cached; shorten the "
            "prompt, or run it with cache=False"
        )
    line = len(orjson.dumps(request_json))
    if line <= room:
        return None
    return (
        f"not sent: its request takes {line:,} bytes in the cache's journal, and with an "
        f"answer of up to {answer_bytes:,} bytes (max_response_bytes) its line there could be "
        f"longer than the {LINE_MOST:,} bytes DuckDB reads, so its answer could not be cached; "
        "shorten the prompt, lower max_response_bytes, or run it with cache=False"
    )


def is_out_of_space(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def out_of_space(where: Path) -> str:
    """What to say when the disk of the cache (or of its journal) is full."""
    return (
        f"no space left on the disk of {where}: the answers received until now are kept in the "
        "cache's journal (a rerun does not send them again); free some space, or point cache= "
        "(or LLM_OPS_CACHE) at another disk, and rerun: only what is missing is sent"
    )


def finished(lock: Path) -> bool:
    """Whether the writer of ``lock`` is gone (a crashed or finished job): no one holds it."""
    try:
        return not held_by_another(lock)
    except OSError:
        return False  # cannot tell: keep its files for a merge that can


_WRITER_LOCK = re.compile(r"^(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{12}\.lock$")


def live_writers(directory: Path) -> list[str]:
    """The processes whose journal writers are alive in ``directory`` (jobs running, or
    about to merge), each as ``"process PID on HOST"``."""
    found: list[str] = []
    with contextlib.suppress(OSError):
        for lock in sorted(directory.glob("*.lock")):
            name = _WRITER_LOCK.match(lock.name)
            if name is None or finished(lock):
                continue
            who = f"process {name['pid']} on {name['host']}"
            if who not in found:
                found.append(who)
    return found


@contextmanager
def held(path: Path, *, blocking: bool) -> Iterator[bool]:
    """An exclusive lock on ``path`` for the block; yields whether it was taken."""
    try:
        lock = LockFile(path)
    except OSError:
        yield False
        return
    with lock:
        try:
            taken = lock.take(blocking=blocking)
        except Exception:  # portalocker's LockException, or the system's error: not taken
            taken = False
        yield taken


def _json_default(value: Any) -> Any:
    raise TypeError(f"cannot journal a {type(value).__name__}")


def _append(file: Any, data: bytes) -> None:
    """Append ``data`` whole, or not at all: a write cut short (a full disk) is taken back, so
    no half-written line is left for the next write to run into."""
    start = file.seek(0, os.SEEK_END)  # not tell(): a truncation leaves it past the end
    view = memoryview(data)
    try:
        while view:
            view = view[file.write(view) :]
    except OSError:
        with contextlib.suppress(OSError):
            file.truncate(start)
        raise


class JournalWriter:
    """Appends one job's rows to its own journal files and merges them into the database.

    :meth:`add` is called from the job's event loop; :meth:`merge` may run in a worker
    thread. Rows reach the journal file once :data:`JOURNAL_BATCH` (or ``merge_every``, if
    fewer) are buffered, or on :meth:`write`, so a crash loses at most that many. Closed
    ("sealed") files are merged in the order written; a merge that cannot get the file leaves
    them for the next one.
    """

    def __init__(self, directory: Path, *, merge: Merge, merge_every: int):
        self.directory = directory
        self._merge_files = merge
        self.merge_every = merge_every
        self.batch = min(JOURNAL_BATCH, merge_every)
        host = socket.gethostname().replace(".", "_")  # dots separate the parts of file names
        self.id = f"{host}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._lock = threading.Lock()
        self._merging = threading.Lock()
        self._buffer: dict[str, list[bytes]] = {}
        self._files: dict[str, Any] = {}  # table -> open file of the current segment
        self._segment = 0
        self._sealed: list[Path] = []
        self.unmerged = 0  # rows added since the last successful merge began
        directory.mkdir(parents=True, exist_ok=True)
        self._alive: LockFile | None = LockFile(directory / f"{self.id}.lock")
        self.last_error: str | None = None
        self._alive.take()

    def answer(self, row: Mapping[str, Any]) -> None:
        """An ``llm_cache`` row: an answer to keep."""
        self.append_row("llm_cache", row)

    def vector(self, row: Mapping[str, Any]) -> None:
        """An ``llm_embeddings`` row."""
        self.append_row("llm_embeddings", row)

    def append_row(self, table: str, row: Mapping[str, Any]) -> None:
        """Buffer ``row`` as a journal line of ``table``, written once the buffer is full."""
        line = orjson.dumps(row, default=_json_default)  # datetimes as ISO 8601
        if len(line) > LINE_MOST:
            # No merge could read it back, and every merge and lookup would fail on it.
            # Requests that might make such a line are not sent: this one outgrew its room.
            _log.warning(
                "llm-ops: not caching the %s row of key %s: it takes %d bytes, more than the "
                "%d a journal line can hold; the answer is in this job's result, and a "
                "rerun sends its request again",
                table,
                row.get("key", row.get("run_id")),
                len(line),
                LINE_MOST,
            )
            return
        with self._lock:
            buffer = self._buffer.setdefault(table, [])
            buffer.append(line)
            self.unmerged += 1
            if len(buffer) >= self.batch:
                self._write(table)

    def write(self) -> None:
        """Append everything buffered to the journal files."""
        with self._lock:
            for table in list(self._buffer):
                self._write(table)

    def _write(self, table: str) -> None:
        lines = self._buffer.get(table)
        if not lines:
            return
        try:
            file = self._files.get(table)
            if file is None:
                path = self.directory / f"{self.id}.{self._segment:06d}.{table}.jsonl"
                # unbuffered: each batch goes to the OS at once, and survives this process
                file = self._files[table] = open(path, "ab", buffering=0)  # noqa: SIM115
            _append(file, b"\n".join(lines) + b"\n")
        except OSError as exc:
            if is_out_of_space(exc):
                raise CacheError(out_of_space(self.directory)) from exc
            raise CacheError(
                f"cannot write the cache's journal {self.directory}: {exc.strerror or exc}"
            ) from exc
        lines.clear()

    def _seal(self) -> list[Path]:
        with self._lock:
            whole = False
            try:
                for table in list(self._buffer):
                    self._write(table)
                whole = True
            finally:  # what was written is sealed even when the rest cannot be
                for file in self._files.values():
                    file.close()
                    path = Path(file.name)
                    self._sealed.append(path)
                    if whole:  # every line of it written in full: no merge needs to check it
                        with contextlib.suppress(OSError):
                            WHOLE.add((path, path.stat().st_size))
                self._files.clear()
                self._segment += 1
                self.unmerged = 0
            return list(self._sealed)

    def merge(self, *, wait: float) -> bool:
        """Seal the current files and merge every sealed one; ``True`` when all are merged."""
        with self._merging:
            files = self._seal()
            if not files:
                return True
            self.last_error = self._merge_files(files, wait)
            if self.last_error is not None:
                return False
            with self._lock:
                self._sealed = [f for f in self._sealed if f not in files]
            return True

    def close(self, *, wait: float | None) -> bool:
        """Merge what is left, waiting up to ``wait`` seconds for the file (``None``: leave it
        to the job's end); ``False`` when some is not merged: it stays in the journal, is read
        by lookups, and is merged by the job's end (:meth:`~llm_ops.Cache.settle`) or the
        next open."""
        merged = False
        try:
            if wait is None:
                self._seal()
            else:
                merged = self.merge(wait=wait)
        finally:
            if self._alive is not None:
                self._alive.close()  # from now on, anyone may merge what is left
                self._alive = None
                if merged:
                    with contextlib.suppress(OSError):
                        (self.directory / f"{self.id}.lock").unlink(missing_ok=True)
        return merged
