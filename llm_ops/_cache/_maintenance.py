"""Maintenance that rewrites the cache file, against jobs that write it meanwhile.

A rewrite (``vacuum``) copies the file and renames the copy over it. An answer merged into the
old file after the copy was made would be gone with it, and so would its journal file, which
the merge deletes once the answer is in the file. So every writable connection holds
``<cache>.journal/maintenance.lock`` shared while it is open, and a rewrite holds it exclusive
from before its copy until after its rename: a merge waits for the rewrite (or leaves its
files in the journal, where lookups read them, for its next merge), and a rewrite waits for,
or refuses during, a merge. A merge deletes its journal files only after it closed the file
they went into, which any later rewrite copies.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from .._journal import live_writers
from .._locks import LockFile, held_by_another
from ..exceptions import CacheError, CacheLockedError

MAINTENANCE_LOCK = "maintenance.lock"
"""The lock file, in the journal folder, a rewrite takes exclusive and a writer shared."""
WAITING = "maintenance.waiting"
"""The lock file a writer holds shared while it waits for a rewrite to end: the next
rewrite waits for it."""


class _Place(Protocol):
    path: Path
    journal: Path


# Lock files a thread holds exclusive for a rewrite: its own connections take no shared lock
# on them (another open file of the same lock would wait for itself).
_REWRITING = threading.local()


def _rewritten_here(lock: Path) -> bool:
    return lock in getattr(_REWRITING, "locks", set())


def _open_lock(place: _Place) -> LockFile:
    try:
        place.journal.mkdir(parents=True, exist_ok=True)
        return LockFile(place.journal / MAINTENANCE_LOCK)
    except OSError as exc:
        raise CacheError(
            f"cannot write the cache {place.path}: its lock file {place.journal / MAINTENANCE_LOCK}"
            f" cannot be opened ({exc.strerror or exc}); make the folder writable, or point "
            "cache= at another file"
        ) from exc


@contextmanager
def writing(place: _Place, *, wait: float) -> Iterator[float]:
    """For the block, no rewrite of the file can start (a writable connection is open):
    waits up to ``wait`` seconds for one under way, then raises :class:`CacheLockedError`.
    Yields the seconds left of ``wait``."""
    lock_path = place.journal / MAINTENANCE_LOCK
    if _rewritten_here(lock_path):  # the rewrite's own connection
        yield wait
        return
    start = time.monotonic()
    with _open_lock(place) as lock:
        if not lock.take(shared=True, blocking=False):
            # Said while waiting, so that a rewrite waits its turn after this writer: vacuums
            # in a loop would otherwise keep a job from merging at all.
            with LockFile(place.journal / WAITING) as waiting:
                waiting.take(shared=True)
                if not lock.take(shared=True, timeout=wait):
                    raise CacheLockedError(
                        f"the cache {place.path} is being rewritten (llm-ops cache vacuum); "
                        f"waited {wait:.0f}s for it. What a job had to merge stays in its "
                        "journal, read by lookups, and is merged by its next merge or its end"
                    )
        yield max(0.0, wait - (time.monotonic() - start))


@contextmanager
def rewriting(place: _Place, *, wait: float | None, doing: str = "vacuum") -> Iterator[None]:
    """For the block, no one else writes the file, so it may be copied and renamed over:
    waits up to ``wait`` seconds for the writers that have it open (``None``: not at all),
    then raises :class:`CacheLockedError` naming the jobs that write it."""
    lock_path = place.journal / MAINTENANCE_LOCK
    deadline = time.monotonic() + (wait or 0.0)
    with _open_lock(place) as lock:
        delay = 0.005
        # a writer waiting goes first: merging what a job paid for matters more than space
        while held_by_another(place.journal / WAITING) or not lock.take(blocking=False):
            left = deadline - time.monotonic()
            if left <= 0:
                raise CacheLockedError(_busy(place, doing, wait))
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.1)
        locks: set[Path] = getattr(_REWRITING, "locks", None) or set()
        _REWRITING.locks = locks
        locks.add(lock_path)
        try:
            yield
        finally:
            locks.discard(lock_path)


def _busy(place: _Place, doing: str, wait: float | None) -> str:
    writers = live_writers(place.journal)
    who = (
        f"a job ({', '.join(writers)}) is merging answers into it"
        if writers
        else "another connection is writing it (a merge, a prune, or open_cache's)"
    )
    waited = "" if wait is None else f", and went on doing so for the {wait:g}s waited"
    return (
        f"cannot {doing} {place.path} now: {who}{waited}; rewriting the file meanwhile "
        f"would lose what it writes. Let the job finish (or stop it) and {doing} then, or "
        f"pass wait=SECONDS (llm-ops cache {doing} --wait SECONDS) to {doing} between its "
        "merges"
    )
