"""The simulator's continuous-batching model: decode steps over a batch of at most ``slots``
sequences, the rest waiting in a FIFO queue, as vLLM, TGI, llama.cpp and ``transformers serve``
schedule their work.

One scheduler task runs the steps; a request is a future it resolves when the request's last
step is done. A sleep per request would cost a timer per answer and could not make the step's
duration depend on the batch it runs, which is what gives a real server its knee: more
sequences in a step make each step slower but the batch's throughput higher, until the slots
are full and more requests only wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

_QUEUED, _ACTIVE, _DONE, _GONE = range(4)


class StepCosts(Protocol):
    """What the scheduler reads of the simulator's config, afresh at every step."""

    slots: int | None
    step_base: float | None
    step_per_sequence: float
    step_per_queued: float


class Durations:
    """Durations in seconds, counted in log-spaced bins 1% wide.

    Percentiles come out within 1% in constant memory, however long the server runs (a list of
    every duration would grow by the million on a long benchmark).
    """

    FLOOR = 1e-6
    _LOG_WIDTH = math.log(1.01)

    def __init__(self) -> None:
        self._bins: Counter[int] = Counter()
        self.count = 0
        self.total = 0.0
        self.longest = 0.0

    def record(self, seconds: float) -> None:
        """Count one duration."""
        self._bins[int(math.log(max(seconds, self.FLOOR) / self.FLOOR) / self._LOG_WIDTH)] += 1
        self.count += 1
        self.total += seconds
        self.longest = max(self.longest, seconds)

    def quantile(self, share: float) -> float:
        """The duration ``share`` of those counted do not exceed (nearest rank); 0 when empty."""
        if not self.count:
            return 0.0
        rank, seen = max(1, math.ceil(share * self.count)), 0
        for index in sorted(self._bins):
            seen += self._bins[index]
            if seen >= rank:
                middle = self.FLOOR * math.exp((index + 0.5) * self._LOG_WIDTH)
                return min(self.longest, middle)
        return self.longest

    def summary(self) -> dict[str, float]:
        """Count, mean, p50, p95, p99 and max, in seconds."""
        return {
            "count": self.count,
            "mean": self.total / self.count if self.count else 0.0,
            "p50": self.quantile(0.50),
            "p95": self.quantile(0.95),
            "p99": self.quantile(0.99),
            "max": self.longest,
        }


class _Sequence:
    """One request in the queue or the batch."""

    __slots__ = ("admitted", "arrived", "done", "state", "tokens")

    def __init__(self, tokens: int, arrived: float, done: asyncio.Future[None]):
        self.tokens = tokens
        self.arrived = arrived
        self.admitted = 0.0
        self.done = done
        self.state = _QUEUED


class DecodeBatch:
    """A continuous-batching server's scheduler, and what it saw since the last reset.

    At most ``slots`` sequences are active; the rest wait in a FIFO queue. Each step takes
    ``step_base + step_per_sequence * active + step_per_queued * queued`` seconds and gives every
    active sequence one token. A waiting request joins the batch at the next step boundary when
    a slot is free, and leaves it after as many steps as its tokens. A request whose client gave
    up leaves the queue or the batch at once, as vLLM and llama.cpp drop a cancelled task.

    Parameters
    ----------
    config
        Returns the simulator's config; read at every step, so a reconfigured server changes
        pace without losing the requests it holds.
    """

    def __init__(self, config: Callable[[], StepCosts]):
        self._config = config
        self._queue: deque[_Sequence] = deque()
        self._queued = 0  # live entries of _queue: a cancelled one stays until it is popped
        self._active = 0
        self._finishing: dict[int, list[_Sequence]] = {}
        self._step = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.reset()

    def reset(self) -> None:
        """Zero what was seen; the requests queued or decoding carry on."""
        self.steps = 0
        self.max_active = self._active
        self.max_queued = self._queued
        self.queue_seconds = Durations()
        self.decode_seconds = Durations()

    def stats(self) -> dict[str, Any]:
        return {
            "active": self._active,
            "queued": self._queued,
            "max_active": self.max_active,
            "max_queued": self.max_queued,
            "decode_steps": self.steps,
            "queue_seconds": self.queue_seconds.summary(),
            "decode_seconds": self.decode_seconds.summary(),
        }

    async def decode(self, tokens: int) -> None:
        """Queue a request needing ``tokens`` steps and return when its last step is done."""
        loop = asyncio.get_running_loop()
        sequence = _Sequence(max(1, tokens), loop.time(), loop.create_future())
        self._queue.append(sequence)
        self._queued += 1
        self.max_queued = max(self.max_queued, self._queued)
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run())
        assert self._wake is not None
        self._wake.set()
        try:
            await sequence.done
        except asyncio.CancelledError:
            self._leave(sequence)
            raise

    @contextlib.asynccontextmanager
    async def holding(self, slots: asyncio.Semaphore) -> AsyncIterator[None]:
        """Hold one of ``slots`` (the model without steps: a slot per request for its whole
        latency), counted as the batch counts its sequences."""
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        self._queued += 1
        self.max_queued = max(self.max_queued, self._queued)
        try:
            await slots.acquire()
        finally:
            self._queued -= 1
        admitted = loop.time()
        self._active += 1
        self.max_active = max(self.max_active, self._active)
        try:
            yield
        finally:
            self._active -= 1
            slots.release()
        self.queue_seconds.record(admitted - arrived)
        self.decode_seconds.record(loop.time() - admitted)

    def close(self) -> None:
        """Stop the scheduler (the server is shutting down)."""
        if self._task is not None:
            self._task.cancel()

    def _leave(self, sequence: _Sequence) -> None:
        if sequence.state == _QUEUED:
            self._queued -= 1
        elif sequence.state == _ACTIVE:
            self._active -= 1
        sequence.state = _GONE

    def _admit(self, now: float) -> None:
        slots = self._config().slots or None  # 0, as None: no limit (never an empty batch)
        while self._queue and (slots is None or self._active < slots):
            sequence = self._queue.popleft()
            if sequence.state != _QUEUED:
                continue
            sequence.state, sequence.admitted = _ACTIVE, now
            self._queued -= 1
            self._active += 1
            self._finishing.setdefault(self._step + sequence.tokens, []).append(sequence)
            self.queue_seconds.record(now - sequence.arrived)
        self.max_active = max(self.max_active, self._active)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        end = loop.time()
        while True:
            self._admit(loop.time())
            if not self._active:
                self._finishing.clear()  # only cancelled sequences can be left there
                if not self._queued:
                    self._wake.clear()
                    await self._wake.wait()
                    end = loop.time()
                continue
            config = self._config()
            seconds = (
                (config.step_base or 0.0)
                + config.step_per_sequence * self._active
                + config.step_per_queued * self._queued
            )
            # A step starts when the last one ended, not when the loop got round to it: the
            # event loop's lag (answering hundreds of requests between steps) would otherwise
            # slow every step and the server would fall short of its modelled rate. A lag
            # longer than a step is not made up: the server was stalled.
            now = loop.time()
            end = max(end, now - seconds) + seconds
            await asyncio.sleep(end - now)
            self._step += 1
            self.steps += 1
            finished = loop.time()
            for sequence in self._finishing.pop(self._step, ()):
                if sequence.state != _ACTIVE:
                    continue
                sequence.state = _DONE
                self._active -= 1
                self.decode_seconds.record(finished - sequence.admitted)
                if not sequence.done.done():
                    sequence.done.set_result(None)
