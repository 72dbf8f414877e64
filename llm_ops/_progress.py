"""Live progress of a running job: snapshots for callbacks, and a progress bar.

The bar is ``tqdm.auto``'s: people know it, it draws in place on a terminal and as a widget in
Jupyter, it sizes itself to the window, and it is well kept; llm-ops only says what goes on the
bar (rows done of the job's rows) and after it (req/s, tok/s, 429s, retries, concurrency,
ETA, cost, and a note when the first rows all fail alike). It is drawn only when stderr is a
terminal, unless ``progress=True`` forces it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from tqdm.auto import tqdm  # type: ignore[import-untyped]  # no stubs installed here

from ._concurrency import Concurrency
from ._failures import EARLY_ROWS, early_note, reason
from ._outcome import Counters
from ._pricing import Price, add_costs, cost_or_none
from ._status import FAILED

BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} rows [{elapsed}{postfix}]"
"""tqdm's bar, with the job's own fields (:meth:`Progress.fields`) as its postfix; its ETA is
the requests', since rows the cache answered are done at once."""


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
    cost
        Dollars spent on the answers so far; ``None`` when the model has no price.
    note
        Said when the first :data:`~llm_ops._failures.EARLY_ROWS` rows sent nearly all failed
        the same way (:data:`~llm_ops._failures.EARLY_SHARE` of them), before the job ends:
        ``"18 of the first 20 rows failed: 'HTTP 401: ...'"``.
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
    cost: float | None = None
    note: str | None = None
    failed: int = 0

    @property
    def eta(self) -> float | None:
        """Seconds left at the rate so far, or ``None`` before anything finished."""
        if not self.requests_done or self.elapsed <= 0:
            return None
        return (self.requests - self.requests_done) * self.elapsed / self.requests_done

    @property
    def title(self) -> str:
        """What the bar is of: ``llm-ops``, its phase unless sending, and its chunk."""
        phase = "" if self.phase == "sending" else f" {self.phase}"
        chunk = "" if self.chunks is None else f" chunk {self.chunk}/{self.chunks}"
        return f"llm-ops{phase}{chunk}"

    def fields(self) -> str:
        """The job's fields after the bar: the early note, if any, then rates, 429s, retries,
        concurrency, ETA and cost."""
        rate = self.requests_done / self.elapsed if self.elapsed > 0 else 0.0
        tokens = (self.prompt_tokens + self.completion_tokens) / self.elapsed if self.elapsed else 0
        eta = f"{self.eta:.0f}s" if self.eta is not None else "?"
        why = f" ({self.concurrency_why})" if self.concurrency_why else ""
        return " · ".join(
            [
                *([self.note] if self.note else []),  # first: a narrow terminal cuts the end
                f"{rate:,.0f} req/s",
                f"{tokens:,.0f} tok/s",
                f"429s {self.rate_limited:,}",
                f"retries {self.retries:,}",
                f"concurrency {self.concurrency}{why}",
                f"ETA {eta}",
                "cost unknown" if self.cost is None else f"cost ${self.cost:,.4f}",
            ]
        )


ProgressCallback = Callable[[Progress], None]


def failed_requests(counters: Counters) -> int:
    """The requests of ``counters`` settled with a failed status."""
    return sum(n for status, n in counters.by_status.items() if status in FAILED)


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
        price: Price | None = None,
    ):
        self.rows = rows
        self.phase = phase
        self.rows_done = rows_settled
        self.requests = requests
        self.counters = counters
        self.engine = engine
        self.price = price
        self.started = time.monotonic()
        self.note: str | None = None
        self._first_rows = 0  # of the first EARLY_ROWS rows settled here...
        self._first_failed: list[str] = []  # ...the reasons of those that failed

    def settled(self, rows: int, status: str, error: str | None) -> None:
        """``rows`` rows got their final ``status``; the first ones are looked at for a note."""
        self.rows_done += rows
        if self._first_rows >= EARLY_ROWS:
            return
        counted = min(rows, EARLY_ROWS - self._first_rows)
        self._first_rows += counted
        if status in FAILED:
            self._first_failed += [reason(error)] * counted
        if self._first_rows == EARLY_ROWS:
            self.note = early_note(self._first_failed)

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
            failed=failed_requests(counters),
            prompt_tokens=counters.prompt_tokens,
            completion_tokens=counters.completion_tokens,
            concurrency=self.engine.concurrency.limit,
            concurrency_why=self.engine.concurrency.why,
            elapsed=time.monotonic() - self.started,
            phase=self.phase,
            cost=cost_or_none(
                self.price,
                requests=counters.answered,
                input_tokens=counters.prompt_tokens,
                output_tokens=counters.completion_tokens,
                cached_input_tokens=counters.cached_tokens,
                cache_write_tokens=counters.cache_write_tokens,
            ),
            note=self.note,
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
    """The progress bar (``tqdm.auto``) of one job: made at the first snapshot, closed at the
    end; ``stream`` is where a terminal bar is drawn (default: stderr)."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream
        self._bar: Any = None  # a tqdm bar, once the first snapshot came

    def __call__(self, progress: Progress) -> None:
        if self._bar is None:
            stream = self.stream if self.stream is not None else sys.stderr
            self._bar = tqdm(
                total=progress.rows,
                unit="row",
                file=stream,
                bar_format=BAR_FORMAT,
                mininterval=0,  # snapshots come twice a second already
                **_screen(stream),
            )
        bar = self._bar
        bar.total = progress.rows
        bar.n = progress.rows_done
        bar.set_description_str(progress.title, refresh=False)
        bar.set_postfix_str(progress.fields(), refresh=False)
        bar.refresh()

    def close(self) -> None:
        """End the bar so later output starts on its own line."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _screen(stream: TextIO) -> dict[str, Any]:
    """tqdm's size options for ``stream``: follow a terminal's width; a terminal that reports
    no size (0 x 0, as a bare pseudo-terminal does) would get an empty bar, so it gets 100
    columns; elsewhere (a notebook, a buffer) tqdm decides."""
    try:
        columns, lines = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return {}
    return {"dynamic_ncols": True} if columns and lines else {"ncols": 100, "nrows": 24}


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
        self.spent_cost: float | None = 0.0
        self.chunk_cost: float | None = 0.0  # the chunk being sent, as its last snapshot said
        self.note: str | None = None
        self.started = time.monotonic()

    def __call__(self, progress: Progress) -> None:
        # Embedding batches are not the job's requests: only the rows move while they run.
        sending = progress.phase != "embedding"
        spent = self.spent
        self.chunk_cost = progress.cost
        self.note = self.note or progress.note
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
                failed=failed_requests(spent) + progress.failed,
                prompt_tokens=spent.prompt_tokens + progress.prompt_tokens,
                completion_tokens=spent.completion_tokens + progress.completion_tokens,
                concurrency=progress.concurrency,
                concurrency_why=progress.concurrency_why,
                elapsed=time.monotonic() - self.started,
                phase=progress.phase,
                chunk=min(self.done + 1, len(self.chunks)),
                chunks=len(self.chunks),
                cost=add_costs(self.spent_cost, progress.cost),
                note=self.note,
            )
        )

    def chunk_done(self, counters: Counters) -> None:
        """The next chunk finished, having taken ``counters``: its rows and requests are final."""
        requests, rows = self.chunks[self.done]
        self.done += 1
        self.requests_done += requests
        self.rows_done += rows
        self.spent.add(counters)
        self.spent_cost = add_costs(self.spent_cost, self.chunk_cost)
        self.chunk_cost = 0.0

    def close(self) -> None:
        if isinstance(self.callback, TerminalDisplay):
            self.callback.close()


def resolve_progress(progress: bool | ProgressCallback | None) -> ProgressCallback | None:
    """``None``: the progress bar in a terminal or a Jupyter notebook (off in pipes, logs and
    CI); ``True``/``False`` force it on or off; a callable gets the snapshots instead."""
    if callable(progress):
        return progress
    if progress is None:
        progress = sys.stderr.isatty() or _in_a_notebook()
    return TerminalDisplay() if progress else None


def _in_a_notebook() -> bool:
    """Whether a Jupyter kernel runs this (its stderr is no terminal, but tqdm.auto draws a
    widget there); IPython is only looked up, never imported."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})
