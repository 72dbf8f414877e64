"""A fake clock for tests of timed behaviour: what happens at what time is then the code's
plan, never how fast a busy machine ran it."""

from __future__ import annotations

import asyncio
import heapq
import itertools


class VirtualTime:
    """A fake clock (call it for the time) and the sleep that waits on it.

    Time moves only when the test moves it: :meth:`run` drives a coroutine to its end, jumping
    to the earliest wake-up whenever every task waits; :meth:`advance` moves it by a given
    amount from inside a running loop; a test of code without a loop just sets :attr:`now`.
    """

    SETTLE = 20  # loop turns for every task that can run to reach its next wait (a few hops)

    def __init__(self) -> None:
        self.now = 0.0
        self._wakeups: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        wakeup = asyncio.get_running_loop().create_future()
        heapq.heappush(self._wakeups, (self.now + max(seconds, 0.0), next(self._order), wakeup))
        await wakeup

    async def _settle(self) -> None:
        for _ in range(self.SETTLE):
            await asyncio.sleep(0)

    def _wake_due(self) -> None:
        while self._wakeups and self._wakeups[0][0] <= self.now:
            wakeup = heapq.heappop(self._wakeups)[2]
            if not wakeup.done():
                wakeup.set_result(None)

    async def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on, waking every sleep due by then (in order), and let
        what they woke run to its next wait."""
        until = self.now + seconds
        await self._settle()
        while self._wakeups and self._wakeups[0][0] <= until:
            self.now = max(self.now, self._wakeups[0][0])
            self._wake_due()
            await self._settle()
        self.now = until

    def run(self, main):
        """Run the coroutine ``main`` to its end, moving the clock whenever every task waits."""

        async def drive():
            task = asyncio.ensure_future(main)
            while True:
                await self._settle()
                if task.done():
                    return task.result()
                while self._wakeups and self._wakeups[0][2].done():  # a sleep cancelled
                    heapq.heappop(self._wakeups)
                assert self._wakeups, "every task waits on something other than time"
                self.now = max(self.now, self._wakeups[0][0])
                self._wake_due()

        return asyncio.run(drive())
