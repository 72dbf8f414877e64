"""The ranking algorithms of top-k and rank, on item numbers and a judge, without a model.

Each plan asks a :class:`Judge` in waves (one :meth:`Judge.compare` or :meth:`Judge.rank` call
is one wave, for every group at once) and returns each group's best items, best first. The
judge may be wrong, inconsistent or fail: every plan ends after a bounded number of waves, and
a failed judgment never drops an item (see each plan).

- :func:`all_pairs`: every pair of a group compared once, ranked by wins (Copeland): the
  naive baseline, ``n(n-1)/2`` comparisons in one wave.
- :func:`quickselect`: a batched quickselect: each wave holds every group's comparisons with
  its pivot (and the confirmations of the previous split), the candidates around rank ``k``
  narrow until all pairs rank the last few. An item crosses the line (dropped below the
  k-th, or accepted above it) only on two agreeing answers, shown once in each order.
- :func:`listwise`: a listwise tournament (ListK's LTTopK, arXiv 2603.17223): windows of
  ``window`` items ranked in one call each, the best ``k`` of each window go on, until one
  window is left.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

Pair = tuple[int, int]
"""Two items in the order they are shown: (first, second)."""


class Judge(Protocol):
    """What the plans ask: each call is one wave."""

    def compare(self, pairs: Sequence[Pair]) -> list[int | None]:
        """The better item of each pair (``None``: the comparison failed)."""
        ...

    def rank(self, windows: Sequence[Sequence[int]]) -> list[list[int] | None]:
        """Each window's items, best first (``None``: the ranking failed)."""
        ...


Orient = Callable[[int, int], Pair]
"""The order in which two items are shown: the same for a pair every time it is asked."""


def seeded_coin(seed: int, key: Callable[[int], str] = str) -> Orient:
    """Show each pair in one fixed order, drawn by a coin seeded with ``seed`` and the two
    items' keys (so the same pair is shown alike in every wave and every run, and half the
    pairs show each item first: a judge's bias for the first item spreads evenly)."""

    def orient(a: int, b: int) -> Pair:
        low, high = sorted((a, b), key=lambda item: (key(item), item))
        text = f"{seed}\x00{key(low)}\x00{key(high)}".encode()
        heads = hashlib.blake2b(text, digest_size=1).digest()[0] & 1
        return (low, high) if heads else (high, low)

    return orient


@dataclass
class Ranked:
    """A plan's result: each group's best items, best first, and what its waves cost."""

    best: list[list[int]]
    waves: int = 0
    comparisons: int = 0
    unsettled: set[int] = field(default_factory=set)
    """Items whose place the wave limit left as estimated (ordered by what was already told)."""


def copeland(
    items: Sequence[int], pairs: Sequence[Pair], winners: Sequence[int | None]
) -> list[int]:
    """``items`` ranked by the comparisons they won (a failed one counts for neither); ties
    keep ``items``' order."""
    wins = dict.fromkeys(items, 0)
    for _pair, winner in zip(pairs, winners, strict=True):
        if winner is not None and winner in wins:
            wins[winner] += 1
    place = {item: i for i, item in enumerate(items)}
    return sorted(items, key=lambda item: (-wins[item], place[item]))


def _every_pair(items: Sequence[int], orient: Orient) -> list[Pair]:
    return [orient(a, b) for i, a in enumerate(items) for b in items[i + 1 :]]


def all_pairs(judge: Judge, groups: Sequence[Sequence[int]], k: int, orient: Orient) -> Ranked:
    """Every pair of each group compared once, in one wave; the best ``k`` by wins."""
    asked = [_every_pair(items, orient) for items in groups]
    flat = [pair for pairs in asked for pair in pairs]
    winners = judge.compare(flat) if flat else []
    best, start = [], 0
    for items, pairs in zip(groups, asked, strict=True):
        told = winners[start : start + len(pairs)]
        start += len(pairs)
        best.append(copeland(items, pairs, told)[:k])
    return Ranked(best, waves=1 if flat else 0, comparisons=len(flat))


def all_pairs_calls(n: int) -> int:
    return n * (n - 1) // 2


def final_size(k: int) -> int:
    """The candidates of a group that :func:`quickselect` ranks by all pairs at the end: at
    most the split target and ``k`` (25 items, 300 comparisons, for ``k = 10``): splitting
    fewer would take a wave for every few items it drops."""
    return target(k) + k


def target(k: int) -> int:
    """The rank :func:`quickselect` splits around: ``k`` plus a slack (``k / 2``, at least 2),
    so the best ``k`` stay among the candidates when a few judgments were wrong."""
    return k + max(2, math.ceil(k / 2))


@dataclass
class _Group:
    """One group's state in :func:`quickselect`.

    ``accepted`` items rank above the split target; ``candidates`` hold its boundary, in
    the order pivots are taken from; ``moving`` items wait for the answer, shown in the other
    order, that confirms they cross the target line (``dropping``: out below ``moved_by``;
    else accepted above it). The rest was dropped."""

    accepted: list[int]
    candidates: list[int]
    moving: list[int] = field(default_factory=list)
    moved_by: int = -1
    dropping: bool = False
    losers: list[int] = field(default_factory=list)
    pivot: int = -1
    split: list[int] = field(default_factory=list)
    final: bool = False
    done: bool = False
    best: list[int] = field(default_factory=list)
    sample: list[int] = field(default_factory=list)
    sampling: bool = False


SAMPLE = 20
"""The items of a large group a random-pivot quickselect ranks by all pairs in its first
wave (190 comparisons, and nothing else), to take its pivots near the boundary."""


def _sampled_pivot(state: _Group, need: int) -> int:
    """The ranked sample's item whose place among the candidates is likeliest to be about
    ``2·need + 2`` (a sample item ``j``-th of ``s`` left ranks about ``(j + 1)·n / (s + 1)``
    of ``n``); ``-1`` when fewer than 3 sample items are left."""
    left = set(state.candidates)
    ranked = [item for item in state.sample if item in left]
    if len(ranked) < 3:
        return -1
    wanted = 2 * need + 2 + len(state.candidates) // 10
    place = wanted * (len(ranked) + 1) / len(state.candidates) - 1
    return ranked[min(len(ranked) - 1, max(0, round(place)))]


def pivot_index(size: int, need: int, by_embedding: bool, rng: random.Random) -> int:
    """Where the pivot is taken from ``size`` candidates of which the best ``need`` are
    wanted. In embedding order (best first): at ``2·need + 2``, or a sixteenth of the way down
    when that is lower (embeddings order the best items only roughly), but never past the
    middle of what is beyond ``need``: with a good embedding most candidates fall below the
    pivot in one wave while the boundary stays above it, and with a poor one it is about as
    good as a random pick. Else a seeded random candidate (Hoare's quickselect)."""
    if not by_embedding:
        return rng.randrange(size)
    return min(size - 1, max(2 * need + 2, size // 16), (size + need) // 2)


def quickselect(
    judge: Judge,
    groups: Sequence[Sequence[int]],
    k: int,
    orient: Orient,
    *,
    by_embedding: bool,
    seed: int,
    max_waves: int,
) -> Ranked:
    """The best ``k`` items of each group, best first, by a batched, pipelined quickselect.

    ``groups`` hold each group's items in the order pivots are taken from: best first by
    embedding when ``by_embedding``, else any order (pivots are then drawn at random; in a
    group of at least ``8·SAMPLE`` items the first wave ranks only a seeded sample of
    :data:`SAMPLE` items by all pairs, and pivots are taken from it where it places them
    near the boundary).

    Each group keeps ``accepted`` items (above the split target, :func:`target`: ``k`` plus a
    slack) and ``candidates``, split around a pivot until at most :func:`final_size` items
    are left, which are ranked by all pairs (Copeland). One wave holds, for every group at
    once: each candidate compared with the group's new pivot (shown in the seeded order of
    ``orient``), and the items that the previous split would move across the target line
    asked again in the other order (its losers when enough items beat its pivot, so they
    would be dropped; else its winners, which would be accepted with it). Only two agreeing
    answers move an item (a judge wrong 5% of the time is wrong twice once in 400); a failed
    or disagreeing answer leaves it among the candidates. Each split takes its pivot out of
    the candidates, so a group ends whatever the answers; after ``max_waves`` waves the
    candidates left are ordered by the share of their comparisons they won (their items are
    :attr:`Ranked.unsettled`).
    """
    rng = random.Random(seed)
    wanted, final = target(k), final_size(k)
    wins: dict[int, list[int]] = {}
    states = [_Group([], list(items)) for items in groups]
    place = {item: i for items in groups for i, item in enumerate(items)}

    def plan(state: _Group) -> list[Pair]:
        """The group's judgments of the next wave (and its next split chosen)."""
        asked = [_reversed(orient(item, state.moved_by)) for item in state.moving]
        state.split, state.pivot = [], -1
        if state.moving and not state.dropping:
            return asked  # the pivot's winners are checked before anything else is split
        if not by_embedding and not state.sample and len(state.candidates) >= 8 * SAMPLE:
            # A random first pivot would split near the middle and leave half the items
            # for the next waves: the first wave ranks a sample only, whose order places
            # the first pivot near the boundary, so most items drop in one split.
            state.sample, state.sampling = rng.sample(state.candidates, SAMPLE), True
            return _every_pair(state.sample, orient)
        if len(state.accepted) + len(state.candidates) > final:
            need = max(1, wanted - len(state.accepted))
            # Candidates that lost a comparison before (taken back on a disagreement) are
            # likely worse than the others: pivots are taken from the others first.
            clean = sorted(
                state.candidates, key=lambda item: (-_share(wins.get(item)), place[item])
            )
            state.pivot = _sampled_pivot(state, need) if state.sample else -1
            if state.pivot < 0:
                state.pivot = clean[pivot_index(len(clean), need, by_embedding, rng)]
            state.split = [item for item in state.candidates if item != state.pivot]
            asked += [orient(item, state.pivot) for item in state.split]
        elif not state.moving:
            state.final = True
            asked = _every_pair(state.accepted + state.candidates, orient)
        return asked

    def settle(state: _Group, asked: list[Pair], told: Sequence[int | None]) -> None:
        if state.final:
            state.best = copeland(state.accepted + state.candidates, asked, told)[:k]
            state.done = True
            return
        if state.sampling:
            state.sample, state.sampling = copeland(state.sample, asked, told), False
            return
        confirmed = told[: len(state.moving)]
        agreed = [
            item
            for item, winner in zip(state.moving, confirmed, strict=True)
            if winner is not None and (winner == state.moved_by) == state.dropping
        ]
        if state.moving and not state.dropping:
            if len(state.accepted) + len(agreed) < wanted:
                state.accepted += [*agreed, state.moved_by]
                gone = set(agreed) | {state.moved_by}
                state.candidates = [item for item in state.candidates if item not in gone]
                state.moving, state.moved_by = [], -1
            else:  # its winners, twice told, are too many: the pivot is below the line
                state.moving, state.dropping = state.losers, True
                state.candidates = [c for c in state.candidates if c not in set(state.losers)]
                state.candidates.remove(state.moved_by)
            return
        back = [item for item in state.moving if item not in set(agreed)]
        state.moving, state.moved_by = [], -1
        if state.pivot >= 0:
            split_told = told[len(confirmed) :]
            above: list[int] = []
            below: list[int] = []
            for item, winner in zip(state.split, split_told, strict=True):
                if winner is not None:
                    (below if winner == state.pivot else above).append(item)
            # Of the items below the pivot, a share as large as the judge's error rate (10%
            # is assumed) won by mistake: the pivot's winners must be more than those.
            state.dropping = len(state.accepted) + len(above) >= wanted + len(below) // 10
            state.moving, state.losers = (below, []) if state.dropping else (above, below)
            state.moved_by = state.pivot
            if state.dropping:
                gone = set(state.moving) | {state.pivot}
                state.candidates = [item for item in state.candidates if item not in gone]
        if back:
            state.candidates = sorted(state.candidates + back, key=place.__getitem__)

    waves = comparisons = 0
    while waves < max_waves:
        busy = [state for state in states if not state.done]
        asked = [plan(state) for state in busy]
        for state, pairs in zip(busy, asked, strict=True):
            if not pairs:  # nothing to ask: one item, or none
                state.best, state.done = (state.accepted + state.candidates)[:k], True
        busy, asked = (
            [state for state in busy if not state.done],
            [pairs for state, pairs in zip(busy, asked, strict=True) if not state.done],
        )
        if not busy:
            break
        flat = [pair for pairs in asked for pair in pairs]
        winners = judge.compare(flat)
        waves += 1
        comparisons += len(flat)
        start = 0
        for state, pairs in zip(busy, asked, strict=True):
            told = winners[start : start + len(pairs)]
            start += len(pairs)
            for pair, winner in zip(pairs, told, strict=True):
                for item in pair:
                    tally = wins.setdefault(item, [0, 0])
                    tally[0] += winner == item
                    tally[1] += winner is not None
            settle(state, pairs, told)
    unsettled: set[int] = set()
    for state in states:
        if not state.done:  # the wave limit: what is left is ordered by what it won
            left = sorted(state.candidates, key=lambda item: -_share(wins.get(item)))
            unsettled.update(left)
            state.best = (state.accepted + left)[:k]
    best = [state.best for state in states]
    return Ranked(best, waves=waves, comparisons=comparisons, unsettled=unsettled)


def _share(tally: list[int] | None) -> float:
    """The share of its answered comparisons an item won (1 before any)."""
    return 1.0 if not tally or not tally[1] else tally[0] / tally[1]


def _reversed(pair: Pair) -> Pair:
    return pair[1], pair[0]


PLANNED_ERROR = 0.05
"""The judge error :func:`quickselect_calls` plans for: a few wrong answers cost a few more
comparisons (confirmations, candidates kept)."""


PLANNED_LARGEST = 4000
"""The largest group :func:`quickselect_calls` simulates (a few seconds)."""


@functools.lru_cache(maxsize=256)
def quickselect_calls(n: int, k: int, *, by_embedding: bool) -> tuple[float, int]:
    """The expected comparisons and waves of :func:`quickselect` on ``n`` items for the best
    ``k``: the mean of seeded runs of the same plan on a judge wrong :data:`PLANNED_ERROR`
    of the time (with an embedding, one that orders the items exactly: a rough one costs
    more)."""
    if n <= 1:
        return 0.0, 0
    if n > PLANNED_LARGEST:  # its calls grow as n: scaled from the largest simulated
        calls, waves = quickselect_calls(PLANNED_LARGEST, k, by_embedding=by_embedding)
        return calls * n / PLANNED_LARGEST, max(waves, max_waves(n) // 2)
    runs = 8 if by_embedding else 32  # random pivots vary more from run to run
    calls = waves = 0
    for run in range(runs):
        judge = _TrueJudge(error=PLANNED_ERROR, seed=run)
        ranked = quickselect(
            judge,
            [list(range(n))] if by_embedding else [_shuffled(n, run)],
            k,
            lambda a, b: (a, b),
            by_embedding=by_embedding,
            seed=run,
            max_waves=max_waves(n),
        )
        calls += ranked.comparisons
        waves += ranked.waves
    return calls / runs, round(waves / runs)


def _shuffled(n: int, seed: int) -> list[int]:
    items = list(range(n))
    random.Random(seed).shuffle(items)
    return items


class _TrueJudge:
    """Item ``i`` is better than item ``j`` when ``i < j``, but for a seeded share ``error``
    of the comparisons: for planning on a known order."""

    def __init__(self, *, error: float = 0.0, seed: int = 0) -> None:
        self.error = error
        self.draw = random.Random(seed)

    def compare(self, pairs: Sequence[Pair]) -> list[int | None]:
        return [max(pair) if self.draw.random() < self.error else min(pair) for pair in pairs]

    def rank(self, windows: Sequence[Sequence[int]]) -> list[list[int] | None]:
        return [sorted(window) for window in windows]


def max_waves(n: int) -> int:
    """The wave limit of :func:`quickselect` on groups of up to ``n`` items: twice the depth
    of a balanced split (``2·log2(n)``, at least 4), which a random pivot rarely needs."""
    return max(4, math.floor(2 * math.log2(max(n, 2))))


def listwise(judge: Judge, groups: Sequence[Sequence[int]], k: int, window: int) -> Ranked:
    """The best ``k`` items of each group by a listwise tournament (``window > k``).

    Each wave splits every group's items still in the running into windows of ``window``
    items, has each ranked in one call and keeps each window's best ``k`` (a window of at most
    ``k`` items goes on without a call), until a group fits one window; its last window's
    ranking is its answer. A failed ranking keeps its window's first ``k`` items, in the
    order they came (so every wave shrinks every group of more than ``window`` items).
    Calls: about ``n / (window - k)`` per group, in about ``log(n / window) / log(window /
    k) + 1`` waves (:func:`listwise_calls`)."""
    running = [list(items) for items in groups]
    best: list[list[int] | None] = [None] * len(groups)
    waves = calls = 0
    unsettled: set[int] = set()
    while any(b is None for b in best):
        windows: list[list[int]] = []
        owners: list[int] = []
        for group, items in enumerate(running):
            if best[group] is not None:
                continue
            if len(items) <= 1:
                best[group] = items[:k]
                continue
            if len(items) <= window:
                windows.append(items)
                owners.append(group)
                continue
            for start in range(0, len(items), window):
                windows.append(items[start : start + window])
                owners.append(group)
        if not windows:
            break
        asked = [
            i for i, w in enumerate(windows) if len(w) > k or len(running[owners[i]]) <= window
        ]
        answers = judge.rank([windows[i] for i in asked]) if asked else []
        if asked:
            waves += 1
            calls += len(asked)
        ranked_by = dict(zip(asked, answers, strict=True))
        next_running: dict[int, list[int]] = {}
        for i, (items, group) in enumerate(zip(windows, owners, strict=True)):
            order = ranked_by.get(i)
            if order is None:
                if i in ranked_by:  # the ranking failed: the window keeps its order
                    unsettled.update(items)
                order = items
            if len(running[group]) <= window:
                best[group] = order[:k]
            else:
                next_running.setdefault(group, []).extend(order[:k])
        for group, items in next_running.items():
            running[group] = items
    return Ranked([b or [] for b in best], waves=waves, comparisons=calls, unsettled=unsettled)


def listwise_calls(n: int, k: int, window: int) -> tuple[int, int]:
    """The calls and waves of :func:`listwise` on ``n`` items (exact: the plan does not
    depend on the answers)."""
    ranked = listwise(_TrueJudge(), [list(range(n))], k, window)
    return ranked.comparisons, ranked.waves
