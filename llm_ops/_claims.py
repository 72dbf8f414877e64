"""Claims: which job is sending which request, visible to every process sharing a cache.

Two jobs started together on one cache would otherwise both miss the cache and pay for every
request twice. So before a job sends a request it *claims* the key, in an append-only log in
the cache's journal folder (``claims.log``): a line ``<writer id> <key>``, written in blocks
with ``O_APPEND``, so the log gives every claim a place in one order. The first claimer of a
key that is still alive sends it; a later claimer defers the key and, once its own work is
done, waits for the answer to land in the cache (lookups read the journal) or for the owner to
go, and then sends what is left itself.

An owner is alive while its journal writer holds the lock on ``<writer id>.lock`` (see
:mod:`llm_ops._journal`): the kernel releases it when the process dies, however it dies, so a
killed owner never leaves keys that no one sends. A claimer that is gone may have answered
before it went, so a key whose earlier claimers are all gone is looked up once more before it
is sent (see :func:`llm_ops._pipeline.dispatch.dispatch`).

Every participant holds a shared lock on ``claims.lock`` while it may claim; the last to
leave takes it exclusively and removes the log, so it only grows while jobs overlap.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from ._locks import LockFile, held_by_another

T = TypeVar("T")

BLOCK = 64
"""Keys claimed per write: one append and one read of the log per this many requests."""
KEY_CHARS = 32
"""Hex digits of a key kept in the log: 128 bits tell keys apart, and the log stays small."""
ALIVE_SECONDS = 0.5  # how long "this owner is alive" is believed before it is checked again
# Only this process compares these moments (each dispatch keeps its own), so a monotonic clock
# serves; the other processes' liveness is read from their locks, never from a time they wrote.


class Claims:
    """The claims of one dispatch, whose journal writer is ``owner``.

    ``clock`` tells how long an owner seen alive is believed to be (:data:`ALIVE_SECONDS`):
    :func:`time.monotonic`, or a test's fake one, which moves only when the test says so.
    """

    def __init__(self, directory: Path, owner: str, *, clock: Callable[[], float] = time.monotonic):
        self.directory = directory
        self.owner = owner
        self._clock = clock
        self.deferred: list[str] = []  # keys another live owner claimed first
        self._claimers: dict[str, list[str]] = {}  # log key -> owners, in the log's order
        self._alive: dict[str, float] = {owner: float("inf")}  # owner -> alive until
        self._dead: set[str] = set()
        self._gate = LockFile(directory / "claims.lock")
        self._gate.take(shared=True)  # waits while the last one out clears the log
        log = directory / "claims.log"
        self._append = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._read = open(log, "rb")  # noqa: SIM115  (read from for the whole dispatch)
        self._partial = b""

    def take(
        self, items: Iterable[T], key: Callable[[T], str], *, checked: Collection[str] = ()
    ) -> Iterator[T]:
        """The ``items`` this dispatch may send, claimed a block at a time; the others' keys
        go to :attr:`deferred`. A key whose earlier claimers are all gone is deferred too
        (one of them may have answered it), unless it is in ``checked``: looked up since."""
        block: list[T] = []
        for item in items:
            block.append(item)
            if len(block) == BLOCK:
                yield from self._claim(block, key, checked)
                block = []
        if block:
            yield from self._claim(block, key, checked)

    def _claim(
        self, block: list[T], key: Callable[[T], str], checked: Collection[str]
    ) -> Iterator[T]:
        keys = [key(item) for item in block]
        os.write(self._append, b"".join(self._line(k) for k in keys))
        first = self._read_log()  # reads our block too: it is in the log by now
        won = []
        for item, full in zip(block, keys, strict=True):
            if full[-KEY_CHARS:] in first or (full in checked and self._owner(full) == self.owner):
                won.append(item)
            else:  # claimed before us by someone alive, or by someone gone who may have answered
                self.deferred.append(full)
        yield from won

    def held_by_others(self, keys: Iterable[str]) -> set[str]:
        """Those of ``keys`` another live job claimed before this one, as the log says now:
        the others are this dispatch's to send (after a look in the cache)."""
        self._read_log()
        return {full for full in keys if self._owner(full) not in (None, self.owner)}

    def _owner(self, full: str) -> str | None:
        for owner in self._claimers.get(full[-KEY_CHARS:], ()):
            if self._is_alive(owner):
                return owner
        return None

    def _is_alive(self, owner: str) -> bool:
        if owner in self._dead:
            return False
        now = self._clock()
        if self._alive.get(owner, 0.0) > now:
            return True
        if _holds_its_lock(self.directory / f"{owner}.lock"):
            self._alive[owner] = now + ALIVE_SECONDS
            return True
        self._dead.add(owner)  # a writer id is never used again
        return False

    def _line(self, full: str) -> bytes:
        return f"{self.owner} {full[-KEY_CHARS:]}\n".encode()

    def _read_log(self) -> set[str]:
        """Read what was appended since; returns the keys this dispatch claimed first in it.

        Only others' claims are kept (and ours after theirs), so a job alone keeps nothing."""
        data = self._partial + self._read.read()
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an incomplete last line, read again next time
        first: set[str] = set()
        for line in lines:
            owner, _, short = line.decode("utf-8", "replace").partition(" ")
            if len(short) != KEY_CHARS or not owner:
                continue  # torn by a writer killed mid-line
            claimers = self._claimers.get(short)
            if claimers is None:
                if owner == self.owner:
                    first.add(short)
                else:
                    self._claimers[short] = [owner]
            elif owner not in claimers:
                claimers.append(owner)
        return first

    def close(self) -> None:
        """Stop claiming; the last participant out removes the log."""
        self._read.close()
        os.close(self._append)
        try:
            # Released, then taken alone if no one else holds it: Windows cannot turn a shared
            # lock into an exclusive one, and while it is exclusive no one can join.
            self._gate.release()
            if self._gate.take(blocking=False):
                (self.directory / "claims.log").unlink(missing_ok=True)
        except OSError:
            pass  # someone else still claims (or holds the log open): they clear it
        finally:
            self._gate.close()


def _holds_its_lock(lock: Path) -> bool:
    """Whether a live journal writer holds ``lock`` (never creates it)."""
    try:
        return held_by_another(lock)
    except OSError:
        return False  # cannot be opened: no writer of ours made it
