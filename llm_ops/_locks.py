"""File locks that the system releases when their holder dies, on Linux, macOS and Windows.

The journal and the claims tell a live job from a dead one by whether it still holds a lock on a
file of its own: the system releases a lock when its process ends, however it ends, so a killed
job never leaves a lock behind. :mod:`portalocker` gives those locks the same meaning everywhere
(``flock`` on POSIX, ``LockFileEx`` on Windows); it is imported on first use, so that
``import llm_ops`` works on any system, and only opening a cache needs it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import ModuleType, TracebackType


def _portalocker() -> ModuleType:
    import portalocker

    return portalocker


class LockFile:
    """An open lock file. A lock taken on it lasts until :meth:`release`, :meth:`close` or the
    end of the process.

    Raises :class:`OSError` when the file cannot be opened (or, with ``create=False``, does not
    exist).
    """

    def __init__(self, path: Path, *, create: bool = True) -> None:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        self._file = os.fdopen(fd, "r+b", buffering=0)  # Windows locks need a file object

    def take(
        self, *, shared: bool = False, blocking: bool = True, timeout: float | None = None
    ) -> bool:
        """Take the lock (shared or exclusive); without ``blocking``, whether it was free;
        with ``timeout``, whether it came free within so many seconds (0: at once)."""
        if timeout is not None:
            return self._take_within(timeout, shared=shared)
        portalocker = _portalocker()
        flags = portalocker.LockFlags.SHARED if shared else portalocker.LockFlags.EXCLUSIVE
        if not blocking:
            flags |= portalocker.LockFlags.NON_BLOCKING
        try:
            portalocker.lock(self._file, flags)
        except portalocker.exceptions.LockException:
            if blocking:
                raise
            return False
        return True

    def _take_within(self, seconds: float, *, shared: bool) -> bool:
        # Polled, not a blocking call with an alarm: no system gives a lock call a timeout,
        # and a waiter that only polls never makes the holders of a shared lock queue
        # behind it.
        deadline = time.monotonic() + seconds
        delay = 0.005
        while not self.take(shared=shared, blocking=False):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.1)
        return True

    def release(self) -> None:
        _portalocker().unlock(self._file)

    def close(self) -> None:
        """Close the file, which releases any lock taken on it."""
        self._file.close()

    def __enter__(self) -> LockFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def held_by_another(path: Path) -> bool:
    """Whether a live process holds the lock on ``path``; ``False`` when the file is not there
    (never created, or removed by a holder that finished). Never creates it; raises
    :class:`OSError` when it is there but cannot be opened."""
    try:
        lock = LockFile(path, create=False)
    except FileNotFoundError:
        return False
    with lock:
        return not lock.take(blocking=False)
