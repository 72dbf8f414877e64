"""SIGTERM stops a job the way Ctrl-C does, but gently.

Prefect cancellation, ``kill``, systemd and Kubernetes stop a process with SIGTERM. While a job
runs (from sync code in the main thread), SIGTERM makes every running dispatcher send nothing
new and let what is in flight be answered; every answer is made durable, the run is recorded
as ``interrupted``, and then the signal is delivered as before the job (by default, the process
ends with it). :func:`stopping_gently` does the same without a signal, for a process that is
told to stop another way (a Ray task cancelled by its driver).
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class Stoppable(Protocol):
    def stop(self) -> None: ...


_running: dict[Stoppable, asyncio.AbstractEventLoop] = {}
_received = threading.Event()
_asked = threading.Event()  # stopping_gently() is under way
_installed = False


def _stop_running() -> None:
    for stoppable, loop in list(_running.items()):
        loop.call_soon_threadsafe(stoppable.stop)


def _on_sigterm(signum: int, frame: Any) -> None:
    _received.set()
    _stop_running()


@contextmanager
def stopped_by_signals(stoppable: Stoppable) -> Iterator[None]:
    """Let SIGTERM stop ``stoppable`` (running in this event loop) while the block runs."""
    _running[stoppable] = asyncio.get_running_loop()
    if _received.is_set() or _asked.is_set():
        stoppable.stop()
    try:
        yield
    finally:
        _running.pop(stoppable, None)


@contextmanager
def graceful_sigterm() -> Iterator[None]:
    """Handle SIGTERM as above for the block, then deliver it to the handler it replaced."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is None:  # set outside Python: the default is the nearest we can restore
        previous = signal.SIG_DFL
    if previous == signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    _installed = True
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _installed = False
        if _received.is_set():
            _received.clear()
            if callable(previous):
                previous(signal.SIGTERM, None)
            else:
                signal.raise_signal(signal.SIGTERM)


@contextmanager
def stopping_gently() -> Iterator[None]:
    """Stop every job of this process as SIGTERM does, and any that starts in the block:
    nothing new is sent, what is in flight is answered and kept. Wait in the block for the
    jobs to end."""
    _asked.set()  # before looking at what runs: a job starting now sees one or the other
    _stop_running()
    try:
        yield
    finally:
        _asked.clear()
