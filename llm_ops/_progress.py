"""Live progress of a running job: snapshots for callbacks and a one-line terminal display."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TextIO

from ._concurrency import Concurrency
from ._outcome import Counters


class Flow(Protocol):
    """What progress reads of the engine: its concurrency right now."""

    @property
    def concurrency(self) -> Concurrency: ...


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
    concurrency, concurrency_why
        The limit on requests in flight right now, and why it is there (see
        :attr:`llm_ops.RunReport.concurrency_why`).
    elapsed
        Seconds since the dispatch started.
    phase
        ``"sending"`` the requests, or ``"embedding"`` (``llm_embed``, and the misses the
        semantic cache compares before anything is sent; its rows are those misses' rows).
    chunk, chunks
        With a table job sent in chunks (:meth:`llm_ops.tables.Table.run`), the chunk being
        sent and how many there are; every other count is then the whole job's.
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
    concurrency_why: str = ""
    chunk: int | None = None
    chunks: int | None = None

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
        chunk = "" if self.chunks is None else f"chunk {self.chunk}/{self.chunks} · "
        return (
            f"llm-ops {phase}{chunk}rows {self.rows_done:,}/{self.rows:,} · {rate:,.0f} req/s · "
            f"{tokens:,.0f} tok/s · 429s {self.rate_limited:,} · retries {self.retries:,} · "
            f"concurrency {self.concurrency}"
            + (f" ({self.concurrency_why})" if self.concurrency_why else "")
            + f" · ETA {eta}"
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
        engine: Flow,
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
            concurrency=self.engine.concurrency.limit,
            concurrency_why=self.engine.concurrency.why,
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


class ChunkedProgress:
    """One progress line for a job sent chunk by chunk: each chunk's snapshots are counted on
    from the chunks before it and timed from the first, so the line (and its ETA) covers the
    whole job instead of starting over with every chunk.

    ``chunks`` holds each chunk's requests and rows; ``rows`` are the job's rows, those
    outside every chunk (cache hits, skipped) done from the start. Call :meth:`chunk_done`
    with each chunk's counters as it finishes, and :meth:`close` at the end.
    """

    def __init__(self, callback: ProgressCallback, *, rows: int, chunks: Sequence[tuple[int, int]]):
        self.callback = callback
        self.rows = rows
        self.chunks = list(chunks)
        self.requests = sum(requests for requests, _ in self.chunks)
        self.done = 0
        self.rows_done = rows - sum(chunk_rows for _, chunk_rows in self.chunks)
        self.requests_done = 0
        self.spent = Counters()
        self.started = time.monotonic()

    def __call__(self, progress: Progress) -> None:
        # Embedding batches are not the job's requests: only the rows move while they run.
        sending = progress.phase != "embedding"
        spent = self.spent
        self.callback(
            Progress(
                rows=self.rows,
                rows_done=self.rows_done + progress.rows_done,
                requests=self.requests,
                requests_done=self.requests_done + (progress.requests_done if sending else 0),
                sent=spent.sent + progress.sent,
                retries=spent.retries + progress.retries,
                rate_limited=spent.rate_limited + progress.rate_limited,
                timeouts=spent.timeouts + progress.timeouts,
                prompt_tokens=spent.prompt_tokens + progress.prompt_tokens,
                completion_tokens=spent.completion_tokens + progress.completion_tokens,
                concurrency=progress.concurrency,
                concurrency_why=progress.concurrency_why,
                elapsed=time.monotonic() - self.started,
                phase=progress.phase,
                chunk=min(self.done + 1, len(self.chunks)),
                chunks=len(self.chunks),
            )
        )

    def chunk_done(self, counters: Counters) -> None:
        """The next chunk finished, having taken ``counters``: its rows and requests are final."""
        requests, rows = self.chunks[self.done]
        self.done += 1
        self.requests_done += requests
        self.rows_done += rows
        self.spent.add(counters)

    def close(self) -> None:
        if isinstance(self.callback, TerminalDisplay):
            self.callback.close()


def resolve_progress(progress: bool | ProgressCallback | None) -> ProgressCallback | None:
    """``None``: a terminal display when stderr is a TTY; ``True``/``False`` force it."""
    if callable(progress):
        return progress
    if progress is None:
        progress = sys.stderr.isatty()
    return TerminalDisplay() if progress else None
