"""How many requests are in flight: the knee of the endpoint's throughput, found as a job runs.

An inference server answers more requests at once up to a point and no further: a GPU server
batching continuously wants hundreds in flight, an 8-slot llama.cpp about 8. Below that point a
job leaves the server idle; above it, more in flight only waits in the server's queue, until
answers time out. :class:`Concurrency` finds that point (the knee) from what the server gives
back, so that nobody has to guess a number; a ``concurrency=N`` given is a cap it never passes.

Why by hand, and how. Limiters for services (TCP Vegas, Netflix's concurrency-limits Gradient2
and Vegas) read queueing from latency alone, against the latency seen with little in flight.
An LLM server breaks their premise: every decoding step of a larger batch takes longer, so
latency grows with what is in flight long before anything queues, while throughput keeps
growing with it (on a GPU server, 16 times the batch gave 6 times the throughput at 5 times
the latency). No library limiter reads throughput. So we take their measuring (a window of
answers, latency per unit of work) and BBR's probing: raise what is in flight while the
delivery rate rises with it, and past the point where it does not, keep less.

- **Measure** each setting of the limit over a window: it opens at the first answer to a
  request sent at that setting (the earlier ones saw the old one) and closes after
  ``max(MIN_ANSWERS, limit)`` more answers and at least :data:`MIN_WINDOW` seconds. Throughput
  is completion tokens answered per second, so that answers of very different lengths do not
  fool it (requests per second where the endpoint reports no usage); latency is per token.
  A window in which fewer requests were in flight than the limit (a rate limit, a job's last
  requests) says nothing about the limit and is measured again.
- **Climb** as TCP's slow start does, doubling once a round trip: from :data:`START` (or what an
  earlier job on the endpoint settled on, or the cap given), double the limit while throughput
  rises by at least :data:`RISE` of what doubling could give. While it climbs, a setting is
  measured over a round, not a window: from the first request sent at it until as many
  answers came back as the limit (one of them to a request of the round), about one round
  trip. A round is read two ways. From latency, as a window is: steady where answers differ
  in length, but a server that queues looks faster than it is at first, as the requests let
  in first are answered as fast as before and those queued behind them are not back yet. And
  from what was answered over the round's time, which a queue does not fool (the answers
  come no faster) but which reads low while long answers are still out. The limit doubles
  at once where both say throughput rose; otherwise (they disagree, or both read flat, as
  the new requests' new connections may make them) the setting is read over one more round,
  everything in flight now sent at it, and the limit doubles again only where both say so
  (latency read from the answers back first is short where some wait in a queue). Then
  search around the best setting with steps that shrink (x1.41, x1.19):
  up where throughput still rises enough, down where it holds (within :data:`SAG` of the
  proportional loss) while latency has grown: there the extra requests were only queueing.
- **Hold** the best setting, measuring it again; every :data:`PROBE_SECONDS` probe once up and
  (where latency grew) down, as the server may have changed under a long job.
- **Back off** as before: a 429 with ``Retry-After``, or a good share of bare 429s among recent
  answers, halves the limit, and nothing is raised for :data:`CALM` seconds. Timeouts halve it
  only where they are a sign of load: a good share of recent attempts failed while the answers
  slowed (:data:`SLOWED` times their usual latency per token), or nearly every recent request
  timed out. A request that hangs while the others are answered as fast as ever says nothing
  of how many are in flight: it is retried, and the rest go on at the same pace.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

START = 8
"""Where a job starts without a cap given nor a limit learned: no more than a small server
(llama.cpp's 8 slots) answers at once, so nothing queues while the first answers come, and
six doublings from 512."""
DEFAULT_CAP = 1024
"""The most in flight without ``concurrency=``: beyond the knee of any single server seen."""
MIN_ANSWERS = 48
MIN_WINDOW = 0.25  # seconds: a fast server answers 48 requests in a few milliseconds
MIN_ROUND = 0.05
"""Seconds a round of the climb lasts at least: on a server answering in a few milliseconds,
a rate read over less is the event loop's noise."""
MIN_TURNS = 2.0
"""A window lasts at least this many times the answers' mean latency: the answers counted
then are those of a whole turn of what is in flight, long ones as well as short ones."""
RISE = 0.1
"""A higher limit is kept when throughput rose by at least this share of the rise in the
limit (doubling it: 10% more throughput)."""
AGREE = 0.1
"""A round just after a doubling that delivered more than this share less than its latency
says is read once more before the limit doubles (see Climb above)."""
SAG = 0.1
"""A lower limit is kept when throughput fell by at most this share of the cut in the limit
(halving it: 5% less throughput): less in flight, for as much work done."""
INFLATED = 1.5
"""Latency per token at the limit over the least seen, from which the requests in flight may
be queueing, so that a lower limit is worth a probe."""
MIN_STEP = 1.1
PROBE_STEP = 1.25
PROBE_SECONDS = 15.0
CALM = 2.0  # seconds after a decrease in which the limit is not raised
COOLDOWN = 1.0  # seconds between two decreases: one burst of 429s is one decrease
FULL = 0.75  # the share of the limit in flight from which a window measures the limit
FAILING = 0.2
"""The share of recent attempts (the last 64) that timed out or got a bare 429 from which the
endpoint may be overloaded."""
SLOWED = 1.5
"""The latest answers' latency per token over the usual one from which timeouts are read as
load: more in flight made every answer slower, and the slowest ones ran out of time."""
USUAL_ANSWERS = 64  # the usual latency is averaged over about so many answers
LATEST_ANSWERS = 8  # and the latest over about so many
STUCK = 0.9
"""The share of recent requests (the last 32, at least 16) that timed out from which the
endpoint is taken to be stuck under what is in flight, however its few answers came."""
AT_THE_CAP = "the cap, concurrency="
"""How ``why`` begins where the limit is a cap given, not something learned of the endpoint."""


@dataclass(frozen=True)
class Measure:
    """What a window found at one limit."""

    limit: int
    throughput: float  # tokens (or requests) answered per second
    latency: float  # seconds per token (or per request)


class Concurrency:
    """The limit on requests in flight for one engine, and the controller that moves it.

    ``cap``: the most in flight, ``concurrency=`` when ``given`` (the limit then starts there),
    else :data:`DEFAULT_CAP`. Single-event-loop, like the engine.
    """

    def __init__(
        self, cap: int, *, given: bool = False, clock: Callable[[], float] = time.monotonic
    ):
        self.cap = cap
        self.given = given
        self.limit = cap if given else min(cap, START)
        self.in_flight = 0
        self._clock = clock
        self.why = f"{AT_THE_CAP}{cap}" if given else "starting"
        self.history: deque[tuple[int, str]] = deque([(self.limit, self.why)], maxlen=100)
        """The limits set, with why, the last 100 (the first where the job started)."""
        self.best: Measure | None = None
        self._warm = False
        self._step = 2.0
        self._climbing = True
        self._probe_at = math.inf
        self._least_latency = math.inf
        self._waiters: deque[asyncio.Future[None]] = deque()
        # the window measuring the current limit
        self._epoch = 0
        self._opened: float | None = None
        self._answers = 0
        self._tokens = 0.0
        self._seconds = 0.0
        self._occupancy = 0.0  # requests in flight times seconds, since the window opened
        self._round_tokens = 0.0  # tokens of the answers to the round's own requests
        self._read_again = False  # the setting doubled to is read over a second round
        self._stamp = self._clock()
        self._token_mean = 1.0  # tokens of an answer, for those that report none
        # backing off
        self._recent: deque[bool] = deque(maxlen=64)  # True: a timeout or a 429
        self._timed_out: deque[bool] = deque(maxlen=32)  # True: a timeout, False: an answer
        self._usual_latency: float | None = None  # per token, while few attempts fail
        self._latest_latency: float | None = None  # per token
        self._last_decrease = -math.inf

    def resume(self, learned: int) -> None:
        """Start from what an earlier job on this endpoint settled on, before any request."""
        if not self.given and self._epoch == 0 and self.in_flight == 0:
            self.limit = max(1, min(self.cap, learned))
            self.why = "where the last job on this endpoint settled"
            self.history.append((self.limit, self.why))
            self._climbing, self._step = False, PROBE_STEP  # near the knee already

    # -- slots ----------------------------------------------------------------------------------

    async def acquire(self) -> int:
        """Wait for a slot; returns the setting it was taken under, for :meth:`observe`."""
        while self.in_flight >= self.limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                raise
        return self.take()

    def take(self) -> int:
        """Take a free slot (see :meth:`acquire`)."""
        self._count_occupancy()
        if self._opened is None and self._in_round():  # the first request of a round
            self._opened, self._occupancy = self._stamp, 0.0
        self.in_flight += 1
        return self._epoch

    def release(self) -> None:
        self._count_occupancy()
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        free = self.limit - self.in_flight
        while free > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                free -= 1

    def _count_occupancy(self) -> None:
        now = self._clock()
        if self._opened is not None:
            self._occupancy += self.in_flight * (now - self._stamp)
        self._stamp = now

    # -- measuring ------------------------------------------------------------------------------

    def observe(self, epoch: int, seconds: float, tokens: int | None) -> None:
        """An answer came ``seconds`` after its request was sent, taken under ``epoch``, with
        ``tokens`` of completion (``None``: not reported)."""
        self._recent.append(False)
        self._timed_out.append(False)
        if tokens is not None and tokens > 0:
            self._token_mean += (tokens - self._token_mean) / 16
        weight = float(tokens) if tokens is not None and tokens > 0 else self._token_mean
        per_token = seconds / weight
        self._least_latency = min(self._least_latency, per_token)
        self._latest_latency = _average(self._latest_latency, per_token, LATEST_ANSWERS)
        if not self._failing():  # the usual latency is the one from before failures began
            self._usual_latency = _average(self._usual_latency, per_token, USUAL_ANSWERS)
        now = self._clock()
        if self._in_round():
            self._count_round(epoch, seconds, weight, now)
            return
        if self._opened is None:
            if epoch == self._epoch:  # the first answer to the setting being measured
                self._count_occupancy()
                self._opened, self._occupancy = now, 0.0
            return
        if epoch != self._epoch or now - seconds < self._opened:
            return  # sent before the window opened: it saw the server as it was
        self._answers += 1
        self._tokens += weight
        self._seconds += seconds
        span = now - self._opened
        enough = max(MIN_WINDOW, MIN_TURNS * self._seconds / self._answers)
        if self._answers >= max(MIN_ANSWERS, self.limit) and span >= enough:
            self._count_occupancy()
            in_flight = self._occupancy / span
            # Little's law: what is in flight over the time an answer takes, in tokens
            throughput = in_flight * self._tokens / self._seconds
            measured = Measure(self.limit, throughput, self._seconds / self._tokens)
            self._decide(measured, in_flight >= FULL * self.limit, now)

    def _in_round(self) -> bool:
        """Whether the setting is measured over a round (see :meth:`_count_round`): while it
        climbs, at the start and at each doubling, not while it holds what it found."""
        best = self.best
        return self._climbing and not self.given and (best is None or self.limit > best.limit)

    def _count_round(self, epoch: int, seconds: float, weight: float, now: float) -> None:
        """An answer in a round of the climb. Latency is read from the round's own requests,
        those sent at the setting being measured; every answer since the round began counts
        as delivered in it, whenever its request was sent."""
        if self._opened is None:
            return
        self._answers += 1
        self._tokens += weight
        if epoch == self._epoch:
            self._seconds += seconds
            self._round_tokens += weight
        span = now - self._opened
        if self._answers >= self.limit and self._round_tokens > 0 and span >= MIN_ROUND:
            self._count_occupancy()
            in_flight = self._occupancy / span
            latency = self._seconds / self._round_tokens
            measured = Measure(self.limit, in_flight / latency, latency)  # Little's law
            full = in_flight >= FULL * self.limit
            self._decide(measured, full, now, delivered=self._tokens / span)

    def _decide(
        self, measured: Measure, full: bool, now: float, delivered: float | None = None
    ) -> None:
        """What to do after ``measured``; ``delivered``: for a round of the climb, what was
        answered over the time it took, in tokens (or requests) per second."""
        best = self.best
        if not self._warm:  # the first window saw the job start: one request alone, then a wave
            self._warm = True
            self._measure_again()
            return
        if not full:
            if best is None or measured.limit == best.limit:
                self.why = "fewer requests ready than the limit"
            self._measure_again()
            return
        if now - self._last_decrease < CALM:
            self.best = measured
            self._measure_again()
            return
        if best is None:  # the first measure, or the first after backing off
            self.best = measured
            if self._climbing and measured.limit < self.cap:
                self.why = "doubling while throughput rises"
            self._go_on(up=self._climbing, now=now)
            return
        if measured.limit == best.limit:
            self.best = _blend(best, measured)
            if now >= self._probe_at:
                self._climbing, self._step = False, PROBE_STEP
                self._go_on(up=True, now=now, because="the server may have changed")
            else:
                self._measure_again()
            return
        ratio = measured.limit / best.limit
        if ratio > 1:
            kept = measured.throughput >= best.throughput * (1 + RISE * (ratio - 1))
        else:
            kept = measured.throughput >= best.throughput * (1 - SAG * (1 - ratio))
        if ratio > 1 and delivered is not None:
            needed = best.throughput * (1 + RISE * (ratio - 1))
            if self._read_again:
                # read twice: what was answered must have risen too, for latency read from
                # the answers back first is short where some wait in a queue
                kept = kept and delivered >= needed
            elif not kept or delivered < max(needed, (1 - AGREE) * measured.throughput):
                # The round right after a doubling disagreed (a queue, long answers still
                # out) or read flat, maybe from the new requests' new connections: read the
                # setting once more, all in flight now sent at it.
                self._read_again = True
                self._measure_again()
                return
        if kept:
            gain = measured.throughput / best.throughput - 1
            if ratio > 1:
                self.best = measured
                self.why = f"rising: throughput {gain:+.0%} at x{ratio:.2g}"
            else:
                # Keep the higher throughput as the mark, so that small losses, each within
                # SAG, do not add up over several cuts.
                mark = max(best.throughput, measured.throughput)
                self.best = Measure(measured.limit, mark, measured.latency)
                self.why = f"queueing above {measured.limit}: as much done with fewer in flight"
            if not self._climbing:
                self._step = min(2.0, self._step**2)
            self._go_on(up=ratio > 1, now=now)
            return
        self._climbing = False
        self._step = math.sqrt(self._step)
        if ratio > 1:
            growth = measured.latency / best.latency
            self.why = f"throughput flat above {best.limit}, " + (
                f"latency x{growth:.1f}" if growth >= 1.1 else "latency flat"
            )
        else:
            self.why = f"throughput falls below {best.limit}"
        self._set(best.limit)
        self._go_on(up=ratio < 1, now=now)

    def _go_on(self, *, up: bool, now: float, because: str | None = None) -> None:
        """From the best limit: probe up (while below the cap), else down where requests seem
        to queue, by the current step; or hold, once the steps are small. ``because``: why
        a probe up is worth it (else what was found of the best limit, :attr:`why`)."""
        best = self.best
        assert best is not None
        limit = best.limit
        if self._step < MIN_STEP:
            self._hold(now)
        elif up and limit < self.cap:
            self._move(
                limit * (2.0 if self._climbing else self._step),
                now,
                f"probing above {limit}; {because or self.why}",
            )
        elif self._inflated():
            inflation = best.latency / self._least_latency
            self._move(
                limit / self._step,
                now,
                f"probing below {limit}; latency x{inflation:.1f} the least seen, requests "
                "may be queueing",
            )
        else:
            self._hold(now)

    def _inflated(self) -> bool:
        return self.best is not None and self.best.latency >= INFLATED * self._least_latency

    def _hold(self, now: float) -> None:
        self._probe_at = now + PROBE_SECONDS
        if self.given and self.limit == self.cap:
            self.why = f"{AT_THE_CAP}{self.cap}"
        self._measure_again()

    def _move(self, limit: float, now: float, why: str) -> None:
        """Set ``limit`` (a probe, ``why``), unless it rounds to the best: hold that."""
        target = max(1, min(self.cap, round(limit)))
        if self.best is not None and target == self.best.limit:
            self._hold(now)
        else:
            self.why = why  # the reason goes with the setting it explains
            self._set(target)

    def _set(self, limit: int) -> None:
        self.limit = limit
        self._read_again = False
        self.history.append((limit, self.why))
        self._measure_again()
        self._wake()

    def _measure_again(self) -> None:
        self._epoch += 1
        self._opened = None
        self._answers, self._tokens, self._seconds, self._occupancy = 0, 0.0, 0.0, 0.0
        self._round_tokens = 0.0

    # -- backing off ----------------------------------------------------------------------------

    def on_congestion(self, why: str = "429s") -> None:
        """A bare 429: halve only when they (and timeouts) are a good share of recent attempts,
        so stray 429s on a healthy endpoint do not throttle the rest."""
        self._recent.append(True)
        if self._failing():
            self.on_overload(why)

    def on_timeout(self) -> None:
        """A request that timed out: halve where that is a sign of load, a good share of recent
        attempts failing while the answers slowed, or nearly every recent request timing out.
        Otherwise the request is only retried: one that hangs while the others are answered at
        their usual pace says nothing of how many are in flight, and halving on each would
        drive the limit towards 1 on an endpoint where a few requests in a hundred hang."""
        self._recent.append(True)
        self._timed_out.append(True)
        stuck = len(self._timed_out) >= 16 and sum(self._timed_out) >= STUCK * len(self._timed_out)
        if stuck or (self._failing() and self._slowed()):
            self.on_overload("timeouts")

    def _failing(self) -> bool:
        """Whether a good share of recent attempts timed out or got a bare 429."""
        return len(self._recent) >= 8 and sum(self._recent) >= FAILING * len(self._recent)

    def _slowed(self) -> bool:
        """Whether the latest answers came :data:`SLOWED` times slower than usual."""
        usual, latest = self._usual_latency, self._latest_latency
        return usual is not None and latest is not None and latest >= SLOWED * usual

    def on_overload(self, why: str = "429s") -> None:
        """Halve, at most once per :data:`COOLDOWN`, and raise nothing for :data:`CALM`
        seconds; called directly for an explicit signal (a 429 with ``Retry-After``)."""
        now = self._clock()
        if now - self._last_decrease < COOLDOWN:
            return
        self._last_decrease = now
        self.best = None
        self._climbing, self._step = False, 2.0
        self._probe_at = now + CALM
        self.why = f"halved: {why}"
        self._set(max(1, self.limit // 2))


def _average(mean: float | None, value: float, count: int) -> float:
    """``mean`` moved towards ``value``: an average over about the last ``count`` values."""
    return value if mean is None else mean + (value - mean) / count


def _blend(held: Measure, again: Measure) -> Measure:
    """A held limit measured again: half the old figures, half the new."""
    return Measure(
        held.limit,
        (held.throughput + again.throughput) / 2,
        (held.latency + again.latency) / 2,
    )
