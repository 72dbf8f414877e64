"""Live progress of a running job: snapshots for callbacks and a one-line terminal display."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from ._engine import Counters, Engine


@dataclass(frozen=True)
class Progress:
    """A snapshot of a running job, passed to a ``progress=`` callback about twice a second.

    Attributes
    ----------
    rows, rows_done
        Rows in the job, and rows with a final status (cached and skipped rows count at once).
    requests, requests_done
        Distinct requests to send, and those settled.
    sent, retries, rate_limited, timeouts
        HTTP attempts so far, retries among them, 429 answers and timeouts.
    prompt_tokens, completion_tokens
        Tokens billed so far.
    concurrency
        The adaptive concurrency limit right now.
    elapsed
        Seconds since the dispatch started.
    phase
        ``"sending"`` the requests, or ``"embedding"`` (``llm_embed``, and the misses the
        semantic cache compares before anything is sent; its rows are those misses' rows).
    """

    rows: int
    rows_done: int
    requests: int
    requests_done: int
    sent: int
    retries: int
    rate_limited: int
    timeouts: int
    prompt_tokens: int
    completion_tokens: int
    concurrency: int
    elapsed: float
    phase: str = "sending"

    @property
    def eta(self) -> float | None:
        """Seconds left at the rate so far, or ``None`` before anything finished."""
        if not self.requests_done or self.elapsed <= 0:
            return None
        return (self.requests - self.requests_done) * self.elapsed / self.requests_done

    def line(self) -> str:
        """One line for a terminal."""
        rate = self.requests_done / self.elapsed if self.elapsed > 0 else 0.0
        tokens = (self.prompt_tokens + self.completion_tokens) / self.elapsed if self.elapsed else 0
        eta = f"{self.eta:.0f}s" if self.eta is not None else "?"
        phase = "" if self.phase == "sending" else f"{self.phase} · "
        return (
            f"llm-ops {phase}rows {self.rows_done:,}/{self.rows:,} · {rate:,.0f} req/s · "
            f"{tokens:,.0f} tok/s · 429s {self.rate_limited:,} · retries {self.retries:,} · "
            f"concurrency {self.concurrency} · ETA {eta}"
        )


ProgressCallback = Callable[[Progress], None]


class Tracker:
    """Counts rows as outcomes arrive and publishes :class:`Progress` while a job runs."""

    def __init__(
        self,
        *,
        rows: int,
        rows_settled: int,
        requests: int,
        counters: Counters,
        engine: Engine,
        phase: str = "sending",
    ):
        self.rows = rows
        self.phase = phase
        self.rows_done = rows_settled
        self.requests = requests
        self.counters = counters
        self.engine = engine
        self.started = time.monotonic()

    def snapshot(self) -> Progress:
        counters = self.counters
        return Progress(
            rows=self.rows,
            rows_done=self.rows_done,
            requests=self.requests,
            requests_done=counters.done,
            sent=counters.sent,
            retries=counters.retries,
            rate_limited=counters.rate_limited,
            timeouts=counters.timeouts,
            prompt_tokens=counters.prompt_tokens,
            completion_tokens=counters.completion_tokens,
            concurrency=self.engine.concurrency.current,
            elapsed=time.monotonic() - self.started,
            phase=self.phase,
        )

    async def publish(self, callback: ProgressCallback, interval: float = 0.5) -> None:
        """Call ``callback`` every ``interval`` seconds until cancelled, and once at the end."""
        try:
            while True:
                await asyncio.sleep(interval)
                callback(self.snapshot())
        finally:
            callback(self.snapshot())


class TerminalDisplay:
    """Redraws one status line in place on a terminal."""

    def __init__(self, stream: TextIO = sys.stderr):
        self.stream = stream
        self._width = 0

    def __call__(self, progress: Progress) -> None:
        text = progress.line()
        self.stream.write("\r" + text.ljust(self._width))
        self._width = len(text)
        self.stream.flush()

    def close(self) -> None:
        """End the line so later output starts on its own."""
        if self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0


def resolve_progress(progress: bool | ProgressCallback | None) -> ProgressCallback | None:
    """``None``: a terminal display when stderr is a TTY; ``True``/``False`` force it."""
    if callable(progress):
        return progress
    if progress is None:
        progress = sys.stderr.isatty()
    return TerminalDisplay() if progress else None
