"""Opening the cache file: where it is, how DuckDB opens it, and what an error opening it means.

DuckDB lets one process hold a file open for writing and locks every other process out, readers
included, and a reader that holds the file locks writers out. So connections are short and
retried while another process holds the file; a damaged file or a full disk is told apart from
a lock and stops at once with one :class:`~llm_ops.CacheError` that says what to do, since
waiting does not help there.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import duckdb

from .._journal import is_out_of_space, out_of_space
from ..exceptions import CacheError, CacheLockedError
from ._maintenance import writing
from ._migrations import LATEST_VERSION, migrate, schema_version

CACHE_ENV = "LLM_OPS_CACHE"
DUCKDB_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    # Extensions cannot be downloaded here (and should not be, silently, anywhere).
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    # Files this library creates must open in the DuckDB 1.x tools analysts have (the CLI,
    # DBeaver); files already written in a newer format still open, and `vacuum` rewrites them.
    "storage_compatibility_version": "v1.0.0",
}

# For files made by ATTACH on a connection that may not carry DUCKDB_CONFIG.
NEW_FILE = f"(STORAGE_VERSION '{DUCKDB_CONFIG['storage_compatibility_version']}')"


class Place(Protocol):
    """Where a cache lives: its file, its journal folder, and how long to wait for the file
    (a :class:`~llm_ops.Cache` is one)."""

    path: Path
    journal: Path
    lock_timeout: float


# Connections of this process are taken one at a time: DuckDB shares one database instance per
# file within a process, and a thread opening it while another thread's close tears it down
# gets a half-initialised connection.
_IN_PROCESS = threading.RLock()
# Files (path, inode) this process has brought up to date: checking on every write costs ms.
_MIGRATED: set[tuple[Path, int]] = set()


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
    # DuckDB's one message for a file another process holds ("Could not set lock on file
    # ...: Conflicting lock is held in ..."); anything else is no lock, and waiting for the
    # file does not help (not just "lock": DuckDB's word for a corrupt block is "block")
    return "could not set lock" in str(exc).lower()


def one_line(exc: BaseException) -> str:
    """DuckDB's message without the advice it adds on further lines (which names its own
    settings, not ours), nor its last full stop: it is quoted inside our sentences."""
    return str(exc).strip().split("\n", 1)[0].strip().removesuffix(".")


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
    detail = one_line(exc).removeprefix("IO Error: ")
    return (
        f"the cache {path} cannot be read: it is damaged or not a DuckDB file ({detail}), and "
        "no answer is taken from it. Move it aside (with its .wal file, if any) and rerun: a new "
        "cache is made, the answers its journal holds are merged in, and only what is missing "
        "is sent; or put back a copy made with llm-ops cache snapshot"
    )


def fatal_error(path: Path, exc: BaseException) -> CacheError | None:
    """The error to stop on when ``exc`` means the file is damaged or its disk is full:
    waiting for the file does not help then."""
    if _is_damage(exc, path):
        return CacheError(_damaged(path, exc))
    if _is_full(exc):
        return CacheError(out_of_space(path))
    return None


def sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def prepare(place: Place) -> None:
    """Make sure the cache can be used before anything is paid for: create its folder and the
    database, migrate it, check that the file and the journal can be written. Raises
    :class:`CacheError` naming the path and what to do."""
    hint = (
        f"choose a writable location with cache=... or {CACHE_ENV}, or pass cache=False "
        "to run without a cache"
    )
    try:
        place.journal.mkdir(parents=True, exist_ok=True)
        probe = place.journal / f".probe-{uuid.uuid4().hex}"
        try:
            probe.write_bytes(b"{}\n")  # not empty: a full disk takes an empty file
        finally:
            probe.unlink(missing_ok=True)
    except OSError as exc:
        if is_out_of_space(exc):
            raise CacheError(out_of_space(place.path)) from exc
        raise CacheError(
            f"cannot use the cache {place.path}: {exc.strerror or exc} "
            f"({exc.filename or place.journal}); {hint}"
        ) from exc
    if place.path.exists() and not os.access(place.path, os.R_OK | os.W_OK):
        raise CacheError(
            f"cannot use the cache {place.path}: the file is not readable and "
            f"writable by this user; {hint}"
        )
    if not _up_to_date(place):
        with connect(place, read_only=False):
            pass  # creates and migrates


def _create(path: Path) -> None:
    """Make the cache file whole beside ``path`` and link it into place, so that no other
    process (a reader, the DuckDB CLI) ever opens it half made: DuckDB creates a file before
    it writes the header, and a reader in between is told the file is not a database."""
    draft = path.with_name(f".{path.name}.new-{uuid.uuid4().hex}")
    try:
        with duckdb.connect(str(draft), config=DUCKDB_CONFIG) as con:
            migrate(con)
        with contextlib.suppress(FileExistsError):  # another process made it first
            os.link(draft, path)
    except (OSError, duckdb.Error):
        pass  # no hard links here, say: the file is created in place, as before
    finally:
        draft.unlink(missing_ok=True)
        draft.with_name(draft.name + ".wal").unlink(missing_ok=True)


def _up_to_date(place: Place) -> bool:
    if not place.path.exists():
        return False
    identity = (place.path, place.path.stat().st_ino)
    if identity in _MIGRATED:
        return True
    with connect(place, read_only=True) as con:
        current = schema_version(con)
    if current > LATEST_VERSION:
        raise CacheError(
            f"the cache {place.path} has schema version {current}, newer than "
            f"this llm-ops knows ({LATEST_VERSION}); upgrade llm-ops"
        )
    if current == LATEST_VERSION:
        _MIGRATED.add(identity)
    return current == LATEST_VERSION


def open_retrying(path: Path, *, read_only: bool, wait: float) -> duckdb.DuckDBPyConnection:
    """A connection to the file at ``path``, retried for up to ``wait`` seconds while another
    process holds it; close it when done. A writer finding no file makes it (whole)."""
    if not read_only and not path.exists():
        _create(path)
    deadline = time.monotonic() + wait
    delay = 0.01
    while True:
        try:
            return _open(path, read_only=read_only)
        except duckdb.Error as exc:
            if not _is_lock_error(exc):
                fatal = fatal_error(path, exc)
                if fatal is not None:
                    raise fatal from exc
                raise CacheError(
                    f"cannot open the cache {path}: {one_line(exc)}; fix that, or point this "
                    f"job at another file with cache=... or {CACHE_ENV}"
                ) from exc
            if time.monotonic() >= deadline:
                raise CacheLockedError(
                    f"the cache {path} is held by another process (DuckDB allows one "
                    f"writer and locks out everyone else while it writes); waited "
                    f"{wait:.0f}s. Close the other connection, read it through "
                    f"llm_ops.open_cache or a snapshot (llm-ops cache snapshot), or point "
                    f"this job at another file with cache=... or {CACHE_ENV}."
                ) from exc
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 0.5)


@contextmanager
def connect(
    place: Place, *, read_only: bool = True, wait: float | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived connection, migrated when writable, retried while the file is held (up
    to ``wait`` seconds, else the place's ``lock_timeout``). A writable one also keeps the
    file from being rewritten while it is open (see :mod:`._maintenance`)."""
    wait = place.lock_timeout if wait is None else wait
    if read_only:
        with _connected(place, read_only=True, wait=wait) as con:
            yield con
        return
    place.path.parent.mkdir(parents=True, exist_ok=True)
    # before _IN_PROCESS: a rewrite in another thread takes that lock after this one
    with writing(place, wait=wait) as left, _connected(place, read_only=False, wait=left) as con:
        yield con


@contextmanager
def _connected(
    place: Place, *, read_only: bool, wait: float
) -> Iterator[duckdb.DuckDBPyConnection]:
    path = place.path
    with _IN_PROCESS:
        con = open_retrying(path, read_only=read_only, wait=wait)
        try:
            identity = (path, path.stat().st_ino)  # DuckDB created the file
            if not read_only and identity not in _MIGRATED:
                migrate(con)
                _MIGRATED.add(identity)
            yield con
        except duckdb.Error as exc:
            raise fatal_error(path, exc) or CacheError(f"cache {path}: {one_line(exc)}") from exc
        finally:
            try:
                con.close()
            except duckdb.Error as exc:  # say, a checkpoint on a full disk
                raise fatal_error(path, exc) or CacheError(
                    f"cache {path}: {one_line(exc)}"
                ) from exc


@contextmanager
def reader(place: Place) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only connection to the cache, or an in-memory one where there is no cache file
    (only a journal: a cluster worker's answers)."""
    if place.path.exists():
        with connect(place) as con:
            yield con
    else:
        with duckdb.connect(config=DUCKDB_CONFIG) as con:
            yield con


@contextmanager
def attached(place: Place, con: duckdb.DuckDBPyConnection, *, alias: str) -> Iterator[None]:
    """The cache attached read-only to another connection as ``alias``, for the block."""
    path = place.path
    deadline = time.monotonic() + place.lock_timeout
    while True:
        try:
            con.execute(f"ATTACH {sql_string(str(path))} AS {alias} (READ_ONLY)")
            break
        except duckdb.Error as exc:
            if not _is_lock_error(exc) or time.monotonic() >= deadline:
                fatal = fatal_error(path, exc)
                if fatal is not None:
                    raise fatal from exc
                raise CacheError(f"cannot attach the cache {path}: {one_line(exc)}") from exc
            time.sleep(0.05)
    try:
        yield
    except duckdb.Error as exc:  # a query over the attached file read a damaged block
        fatal = fatal_error(path, exc) if _is_damage(exc, path) else None
        if fatal is None:
            raise
        raise fatal from exc
    finally:
        con.execute(f"DETACH {alias}")
