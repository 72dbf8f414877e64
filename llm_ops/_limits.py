"""Rate budgets shared by every sender of one job: requests and tokens per minute.

A single-event-loop object (no thread safety needed), per endpoint, so a ``Retry-After`` from
one answer pauses every sender together. How many requests are in flight is
:mod:`llm_ops._concurrency`'s. Processes sharing one budget (a cluster's workers) each lease
from a :class:`SharedQuota` living in one of them, through a :class:`LeasedLimiter`.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from ._dialects import HeardLimits

Clock = Callable[[], float]
"""Seconds on a monotonic clock: :func:`time.monotonic`, or a test's fake one."""
Sleep = Callable[[float], Awaitable[None]]
"""How the limiter waits: :func:`asyncio.sleep`, or a test's, which moves its fake clock."""

NOTHING_HEARD = HeardLimits()
"""An answer that named no rate limit."""


class _TokenBucket:
    """A per-minute rate paced as a token bucket holding ``burst`` seconds of it."""

    def __init__(self, per_minute: float, burst: float, *, clock: Clock = time.monotonic):
        self.per_minute = per_minute
        self.capacity = max(1.0, per_minute * burst / 60)
        self.level = self.capacity
        self._clock = clock
        self.stamp = clock()
        self.burst = burst

    def set_rate(self, per_minute: float) -> None:
        self._refill()
        self.per_minute = per_minute
        self.capacity = max(1.0, per_minute * self.burst / 60)
        self.level = min(self.level, self.capacity)

    def _refill(self) -> None:
        now = self._clock()
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.per_minute / 60)
            self.stamp = now

    def wait_for(self, amount: float) -> float:
        self._refill()
        need = min(amount, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) * 60 / self.per_minute

    def take(self, amount: float) -> None:
        self.level -= amount  # may go negative for a request larger than one burst

    def empty_until(self, moment: float, ready: float = 0.0) -> None:
        """Empty now, refilled so as to hold ``ready`` (at most one unit) at ``moment``."""
        self.level = 0.0
        self.stamp = moment - (min(ready, 1.0) * 60 / self.per_minute if ready > 0 else 0.0)

    def drain(self, left: float) -> None:
        """The endpoint says less than one unit is left: if this bucket would pay one now, it
        is ahead of the endpoint and holds ``left`` from now. Less than one, it agrees (the
        header counts whole units), and keeps its place in the refill: draining it too would
        drop the share of a unit refilled so far at every such answer."""
        self._refill()
        if self.level >= 1.0:
            self.level = min(self.level, left)


class _LeasedTokenBucket(_TokenBucket):
    """A token bucket that time does not refill: what was leased from a budget shared with other
    processes (see :class:`LeasedLimiter`), spent as :class:`RateLimiter` spends
    its own."""

    def __init__(self, *, clock: Clock = time.monotonic) -> None:
        super().__init__(per_minute=0.0, burst=1.0, clock=clock)
        self.capacity = math.inf
        self.level = 0.0

    def wait_for(self, amount: float) -> float:
        return 0.0 if self.level >= amount else math.inf  # until more is leased

    def empty_until(self, moment: float, ready: float = 0.0) -> None:
        super().empty_until(moment)  # nothing is ready that was not leased


class SlowStart:
    """A job's first requests, paced until the endpoint's first answer says what its limits are.

    No limit is known before an answer names one, and requests sent blind meet a limit all at
    once: against a burst of 20, a wave of 64 took 15 429s before the first came back (1 to 3
    with a slow start). So the count sent doubles every ``doubling`` seconds: the first request
    (which the engine's first-request gate sends alone) and the ``first`` after it go at once,
    the rest at an even exponential pace. The first answer ends it (:meth:`end`), a 429 naming
    the limit included, and the budgets pace from there. A job that meets no limit loses
    about ``doubling * (log2(concurrency / first) - 1.4)`` seconds of its concurrency, once
    per client; an endpoint farther away than ``doubling`` answers too late to spare the
    wave its 429s (they are retried), and ``rpm=`` spares them.

    ``clock`` tells the time and ``sleep`` waits for a turn: :func:`time.monotonic` and
    :func:`asyncio.sleep` but in tests, whose fake ones drive time.
    """

    def __init__(
        self,
        *,
        first: int = 4,
        doubling: float = 0.01,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ):
        self.first = first
        self.doubling = doubling
        self._clock = clock
        self._sleep = sleep
        self.sent = 0
        self.started = 0.0  # when the second request went: the gate held the rest till then
        self._ended: asyncio.Future[None] | None = None

    async def admit(self) -> None:
        """Wait for this request's turn, or for the end of the slow start."""
        sent, self.sent = self.sent, self.sent + 1
        now = self._clock()
        if sent == 1:
            self.started = now
        if sent <= self.first:
            return
        wait = self.started + self.doubling * math.log2(sent / self.first) - now
        if wait > 0:
            if self._ended is None:
                self._ended = asyncio.get_running_loop().create_future()
            turn = asyncio.ensure_future(self._sleep(wait))
            try:
                await asyncio.wait((self._ended, turn), return_when=asyncio.FIRST_COMPLETED)
            finally:
                turn.cancel()

    def end(self) -> None:
        """An answer came: whoever waits for a turn goes on to the budgets."""
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(None)


class Limiter(Protocol):
    """What the engine asks of a rate limiter: this process's :class:`RateLimiter`, or one
    that leases from a budget shared by a cluster's workers (:class:`LeasedLimiter`)."""

    @property
    def tpm(self) -> float | None: ...

    def too_large(self, tokens: int) -> bool: ...

    async def admit(self, tokens: int) -> None: ...

    def settle(self, estimated: int, actual: int) -> None: ...

    def pause(self, seconds: float) -> None: ...

    def observe(self, heard: HeardLimits) -> None: ...


class RateLimiter:
    """Requests/min and tokens/min budgets, user-set or learned from the endpoint's rate-limit
    headers (as its dialect reads them: :class:`HeardLimits`).

    The tighter of the two wins. A ``Retry-After`` pauses every sender until it has passed and
    empties the budgets but for one request then, so traffic resumes at the paced rate rather
    than all at once.

    ``clock`` tells the time and every wait goes through ``sleep``: :func:`time.monotonic` and
    :func:`asyncio.sleep` but in tests, whose fake ones drive time, so what the limiter lets
    through when does not depend on how busy the machine is.
    """

    def __init__(
        self,
        *,
        rpm: float | None,
        tpm: float | None,
        burst: float = 1.0,
        slow_start: bool = True,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ):
        self.user_rpm, self.user_tpm = rpm, tpm
        self._clock = clock
        self._sleep = sleep
        # with no limit given, the first requests go slowly until an answer names one
        self.slow_start = (
            SlowStart(clock=clock, sleep=sleep) if slow_start and not rpm and not tpm else None
        )
        self.learned_rpm: float | None = None
        self.learned_tpm: float | None = None
        self.burst = burst
        self.paused_until = 0.0
        self.requests: _TokenBucket | None = _TokenBucket(rpm, burst, clock=clock) if rpm else None
        self.tokens: _TokenBucket | None = _TokenBucket(tpm, burst, clock=clock) if tpm else None

    @property
    def rpm(self) -> float | None:
        return _tighter(self.user_rpm, self.learned_rpm)

    @property
    def tpm(self) -> float | None:
        return _tighter(self.user_tpm, self.learned_tpm)

    def too_large(self, tokens: int) -> bool:
        """A request that could never fit in one minute of the token budget."""
        return self.tpm is not None and tokens > self.tpm

    async def admit(self, tokens: int) -> None:
        """Wait for the slow start's turn, until a pause is over and until both budgets can
        pay for this request, then pay."""
        if self.slow_start is not None:
            await self.slow_start.admit()
        while True:
            now = self._clock()
            if now < self.paused_until:
                # Spread the restart so senders do not come back as one herd.
                await self._sleep(self.paused_until - now + random.uniform(0, 0.05))
                continue
            wait = self.shortfall(tokens)
            if wait <= 0:
                break
            await self.refill(wait, tokens)
        if self.requests:
            self.requests.take(1)
        if self.tokens:
            self.tokens.take(tokens)

    def shortfall(self, tokens: int) -> float:
        """Seconds until both budgets can pay for a request of ``tokens`` (0: they can now)."""
        return max(
            self.requests.wait_for(1) if self.requests else 0.0,
            self.tokens.wait_for(tokens) if self.tokens else 0.0,
        )

    async def refill(self, wait: float, tokens: int) -> None:
        """Wait until the budgets can pay for a request of ``tokens``: ``wait`` seconds, at
        their pace. (A budget that time does not refill is refilled here otherwise.)"""
        await self._sleep(wait)

    def settle(self, estimated: int, actual: int) -> None:
        """Correct the token budget once ``usage`` tells what a request really cost."""
        if self.tokens:
            self.tokens.level = min(self.tokens.capacity, self.tokens.level + estimated - actual)

    def _answered(self) -> None:
        if self.slow_start is not None:
            self.slow_start.end()
            self.slow_start = None

    def pause(self, seconds: float) -> None:
        """Stop every sender for ``seconds`` (a ``Retry-After``)."""
        self._answered()
        until = self._clock() + seconds
        if until > self.paused_until:
            self.paused_until = until
            # Retry-After names when the refused request will be taken: one may go then, the
            # rest at the pace. Refilling from empty only once the wait was over cost every
            # 429 one more request's time of the limit.
            if self.requests:
                self.requests.empty_until(until, ready=1.0)
            if self.tokens:
                self.tokens.empty_until(until)

    def observe(self, heard: HeardLimits) -> None:
        """Learn the limits an answer named (any answer ends the slow start); hold a budget
        back when it says it is spent."""
        self._answered()
        for kind in ("requests", "tokens"):
            said = heard.of(kind)
            if said is None or said.per_minute is None:
                continue
            value = said.per_minute
            if value > 0:
                self._learn(kind, value, said.remaining)
            reset = said.reset
            if not said.spent or not reset:
                continue
            bucket = self.requests if kind == "requests" else self.tokens
            if bucket is None or value <= 0:
                self.pause(min(reset, 1.0))
            elif kind == "requests":
                # Less than one request left: the next may go once one has refilled, or at
                # the reset (the time to a full bucket) if sooner. Only this bucket is
                # spent, so no sender is paused: pausing and then refilling from empty
                # waited two requests' time, and kept the pace behind the endpoint's.
                bucket.drain(1.0 - min(reset * bucket.per_minute / 60, 1.0))
            else:
                bucket.drain(0.0)

    def _learn(self, kind: str, per_minute: float, remaining: float | None) -> None:
        """A limit the endpoint names; a new bucket starts with what it says ``remaining``
        (the burst it still allows), or empty when it does not say."""
        if kind == "requests":
            if self.learned_rpm == per_minute:
                return
            self.learned_rpm = per_minute
            rate, bucket = self.rpm, self.requests
        else:
            if self.learned_tpm == per_minute:
                return
            self.learned_tpm = per_minute
            rate, bucket = self.tpm, self.tokens
        assert rate is not None
        if bucket is None:
            bucket = _TokenBucket(rate, self.burst, clock=self._clock)
            # What the server still allows now, less one for safety (an answer in flight may
            # not be counted yet); without the header, start paced: we cannot know.
            allowed = 0.0 if remaining is None else remaining - 1.0
            bucket.level = min(bucket.capacity, max(0.0, allowed))
            if kind == "requests":
                self.requests = bucket
            else:
                self.tokens = bucket
        else:
            bucket.set_rate(rate)


def _tighter(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


# -- a budget shared by many processes ----------------------------------------------------------

LEASE_SECONDS = 0.25  # a lease covers about this long of the budget
CHECK_SECONDS = 1.0  # an unlimited limiter asks this often whether another learned a limit


class SharedQuota:
    """A rate budget shared by many processes (a cluster's workers): the configured limits,
    those any of them learned from the endpoint's headers, and every pause, in one place,
    handed out in leases (see :class:`LeasedLimiter`). It lives in one process (a Ray actor:
    :class:`llm_ops.ray.Quota`); the others reach it through a :class:`QuotaLink`."""

    def __init__(self, rpm: float | None, tpm: float | None, *, clock: Clock = time.monotonic):
        self.limiter = RateLimiter(rpm=rpm, tpm=tpm, clock=clock)
        self._clock = clock

    def limits(self) -> tuple[float | None, float | None]:
        return self.limiter.rpm, self.limiter.tpm

    def lease(self, requests: int, tokens: int) -> tuple[int, int, float]:
        """Up to ``requests`` requests and ``tokens`` tokens, what the budgets hold now:
        (requests granted, tokens granted, seconds to wait when nothing could be)."""
        limiter, now = self.limiter, self._clock()
        if now < limiter.paused_until:
            return 0, 0, limiter.paused_until - now
        per_request, per_token = limiter.requests, limiter.tokens
        granted_requests, granted_tokens = requests, tokens
        if per_request is not None:
            per_request.wait_for(0)  # refills
            granted_requests = min(requests, int(per_request.level))
        if per_token is not None:
            per_token.wait_for(0)
            granted_tokens = min(tokens, max(0, int(per_token.level)))
        if granted_requests < 1 or (per_token is not None and granted_tokens < 1):
            wait = max(
                per_request.wait_for(1) if per_request else 0.0,
                per_token.wait_for(1) if per_token else 0.0,
            )
            return 0, 0, max(wait, 0.01)
        if per_request is not None:
            per_request.take(granted_requests)
        if per_token is not None:
            per_token.take(granted_tokens)
        return granted_requests, granted_tokens, 0.0

    def observe(self, heard: HeardLimits) -> None:
        self.limiter.observe(heard)

    def pause(self, seconds: float) -> None:
        self.limiter.pause(seconds)


class QuotaLink(Protocol):
    """How a process reaches a :class:`SharedQuota` living in another one: its limits and
    leases awaited, what the endpoint said told without waiting."""

    async def limits(self) -> tuple[float | None, float | None]: ...

    async def lease(self, requests: int, tokens: int) -> tuple[int, int, float]: ...

    def observe(self, heard: HeardLimits) -> None: ...

    def pause(self, seconds: float) -> None: ...


class LeasedLimiter(RateLimiter):
    """A rate limiter of one of many processes: :class:`RateLimiter`'s admission, over budgets
    that leases from a :class:`SharedQuota` (through ``quota``) refill instead of time; it
    tells the quota what the endpoint says (limits, ``Retry-After``)."""

    def __init__(
        self,
        quota: QuotaLink,
        *,
        rpm: float | None,
        tpm: float | None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ):
        # the quota paces them all
        super().__init__(rpm=None, tpm=None, slow_start=False, clock=clock, sleep=sleep)
        self.quota = quota
        self._checked = -CHECK_SECONDS
        self._told: tuple[float | None, float | None] = (None, None)  # limits the quota heard
        self._leasing = asyncio.Lock()
        self._limit(rpm, tpm)

    def _limit(self, rpm: float | None, tpm: float | None) -> None:
        """The shared limits: unlimited needs no lease; else requests are leased, and tokens
        too under a tokens-per-minute limit."""
        self.user_rpm, self.user_tpm = rpm, tpm
        limited = rpm is not None or tpm is not None
        leased = _LeasedTokenBucket
        self.requests = (self.requests or leased(clock=self._clock)) if limited else None
        self.tokens = (self.tokens or leased(clock=self._clock)) if tpm is not None else None

    async def admit(self, tokens: int) -> None:
        await self._learn_limits()
        await super().admit(tokens)

    async def _learn_limits(self) -> None:
        """Ask the quota for the shared limits, at most every :data:`CHECK_SECONDS`, so an
        unlimited process hears of a limit another one learned."""
        now = self._clock()
        if now - self._checked > CHECK_SECONDS:
            # Each sender asks before it goes: none goes unleased on limits not yet known.
            self._limit(*await self.quota.limits())
            self._checked = now

    async def refill(self, wait: float, tokens: int) -> None:
        """Lease about :data:`LEASE_SECONDS` of the shared budget, or wait as long as the
        quota says nothing can be leased."""
        await self._learn_limits()
        async with self._leasing:
            if self.shortfall(tokens) <= 0:  # another sender leased meanwhile
                return
            block = max(1, round((self.rpm or 240) * LEASE_SECONDS / 60))
            granted, more_tokens, empty_for = await self.quota.lease(block, block * tokens)
            if self.requests is not None:
                self.requests.level += granted
            if self.tokens is not None:
                self.tokens.level += more_tokens
            if empty_for:
                await self._sleep(empty_for)

    def pause(self, seconds: float) -> None:
        super().pause(seconds)
        self.quota.pause(seconds)

    def observe(self, heard: HeardLimits) -> None:
        """Tell the quota the limits an answer named, when they change."""
        said = (
            None if heard.requests is None else heard.requests.per_minute,
            None if heard.tokens is None else heard.tokens.per_minute,
        )
        spent = [h for h in (heard.requests, heard.tokens) if h is not None and h.spent]
        if said != (None, None) and said != self._told:
            self._told = said
            self._checked = -CHECK_SECONDS  # ask for the limits again before the next lease
            self.quota.observe(heard)
        elif spent:
            reset = heard.requests.reset if heard.requests is not None else None
            self.pause(min(reset or 1.0, 1.0))
