"""``llm_resolve``: an entity id per row, for rows that mean the same real-world thing.

Judging every pair of N rows costs N(N-1)/2 calls. The blocked plan asks about far fewer:

1. **Blocking.** Each distinct value is embedded; its ``neighbours`` most similar values are
   its candidate pairs (the pool).
2. **A threshold for the target recall** (as DocETL's resolve): ``sample`` pairs of the pool,
   one from each of ``sample`` strata of equal size in similarity order (so the sample is
   spread over the whole pool and is unweighted), are judged first; the threshold is the
   similarity above which ``target_recall`` of the pool's matches lie with 95% confidence,
   as far as the sample's matches tell. The pool's pairs at or above it, and each value's two
   nearest, are judged, in one wave.
3. **Clustering that never trusts one link.** The verdicts are joined by a union-find whose
   merges each need corroboration (:class:`Clusters`): a link inside a triangle of matches, two
   clusters with at least two matches between them (more than twice their non-matches), or,
   with one match, a second check of two other rows of the two clusters (an extra call, in a
   wave of its own); a pair of lone rows is joined by its one link only when neither row has
   another unrefuted match. So a single wrong "yes" never joins two entities each of whose
   rows are linked to their own.

Exactly equal values are one entity without asking (a judge shown one record twice says yes).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Unpack, overload

import numpy as np
import polars as pl
import pyarrow as pa

from .._client import Client
from .._options import Columns, ModelOption
from .._report import RunReport
from .._status import ANSWERED, STATUS_DTYPE
from ..exceptions import ConfigError
from . import plans
from ._pairs import cosine, nearest, unit_vectors
from ._waves import Answers, SetEstimate, SetOptions, Waves, priced

Plan = Literal["auto", "blocking", "all_pairs"]
Pair = tuple[int, int]

OPERATOR = "llm_resolve"
PLANS = ("auto", "blocking", "all_pairs")
PAIR_PROMPT = (
    "Do these two records refer to the same real-world entity?\n"
    "Record 1: {left}\n"
    "Record 2: {right}\n"
    "Answer true if they do, false if they do not."
)
"""One pair check: record 1 then record 2, so a judge (and the simulator's) reads their facts
in that order."""
VERDICT = {
    "title": "verdict",
    "type": "object",
    "properties": {"answer": {"type": "boolean"}},
    "required": ["answer"],
    "additionalProperties": False,
}
VERDICT_TOKENS = 6
"""About the tokens of one ``{"answer": false}``."""
CHECK_ROUNDS = 3
"""At most this many waves of extra checks: each round's merges may call for new checks, and
noisy verdicts must not keep the operator asking."""
FLOOR = 2
"""Each value's nearest pairs checked whatever the threshold: two, so a value whose every
other pair falls below it still has the two links a merge needs."""
CONFIDENCE = 0.05
"""The chance the learned threshold may leave the recall below its target."""
CHUNK = 1024
"""Rows of the similarity matrix computed at a time (a 5,000-row frame needs no 100 MB)."""


def pair_prompt(left: str, right: str) -> str:
    """The check of whether ``left`` and ``right`` are the same entity."""
    return PAIR_PROMPT.format(left=left, right=right)


# -- clustering ---------------------------------------------------------------------------


def outvoted(yes: int, no: int) -> bool:
    """Whether ``yes`` matches outvote ``no`` non-matches between two clusters: two for each
    one, so two wrong matches against one right non-match do not merge them."""
    return yes > 2 * no


@dataclass
class Clusters:
    """A union-find over ``size`` items whose merges each need corroboration.

    Written here rather than taken from a library (``scipy.cluster.hierarchy.DisjointSet``,
    ``networkx``' components): those merge on any one link, and the rule of when a link may
    merge is all this class is for.

    ``verdicts`` holds the checked pairs (``(i, j)`` with ``i < j``: ``True`` for a match);
    :meth:`settle` merges what they support, asking ``check`` (a function from pairs to their
    verdicts, ``None`` where a check failed) about pairs that would corroborate a merge.

    The guarantee: let X and Y be two entities with at least two items each, each item linked
    by a correct "yes" to another item of its own entity. If every verdict but one is right
    and that one wrongly says an item of X matches an item of Y, no cluster holds items of
    both. Each merge needs a second piece of evidence that a single wrong link cannot supply:

    * a triangle: items i, j, k with all three pairs matching (two wrong links across X, Y);
    * two clusters with at least two matches between them, more than twice their non-matches;
    * two clusters, one of them of two or more items, with one match and no non-match between
      them, and a second check of two other items of theirs that matches (that check is
      right, so across X and Y it says no);
    * two lone items whose one match is the only unrefuted match of each (an item of X has a
      right match to another item of X, so it is never that lone).
    """

    size: int
    verdicts: dict[Pair, bool]
    similarity: Mapping[Pair, float] = field(default_factory=dict)
    parent: list[int] = field(init=False)
    members: dict[int, list[int]] = field(init=False)
    rechecked: set[Pair] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self.parent = list(range(self.size))
        self.members = {i: [i] for i in range(self.size)}

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        a, b = self.find(a), self.find(b)
        if a == b:
            return
        if len(self.members[a]) < len(self.members[b]):
            a, b = b, a
        self.parent[b] = a
        self.members[a].extend(self.members.pop(b))

    def settle(
        self, check: Callable[[list[Pair]], list[bool | None]], *, rounds: int = CHECK_ROUNDS
    ) -> None:
        """Merge what the verdicts support, asking ``check`` about at most ``rounds`` waves of
        corroborating pairs."""
        self._merge_triangles()
        self._merge_supported()
        for _ in range(rounds):
            asked = self._corroborations()
            if not asked:
                break
            pairs = [pair for pair, _ in asked]
            for (i, j), verdict in zip(pairs, check(pairs), strict=True):
                pair = (min(i, j), max(i, j))
                if (j, i) == pair:
                    self.rechecked.add(pair)
                    if verdict:  # two matches and a match asked again outvote one non-match
                        self.verdicts[pair] = verdict
                        self._merge_triangles()
                elif verdict is not None:
                    self.verdicts[pair] = verdict
            for (i, j), link in asked:
                pair = (min(i, j), max(i, j))
                if self.verdicts.get(pair) is True and self.find(link[0]) != self.find(link[1]):
                    self.union(*link)
            self._merge_supported()
        self._merge_lone_pairs()
        self._merge_supported()

    def _merge_triangles(self) -> None:
        """Join the two items of each match a third item confirms (it matches both), the
        best confirmed first (more third items confirm it than contradict it: match one and
        not the other); once either item is in a cluster of two or more, only if the
        clusters' matches outvote their non-matches (:func:`outvoted`), so an item with wrong
        matches to another entity does not carry its own cluster over."""
        matched, unmatched = self._neighbourhoods()
        confirmed: list[tuple[int, Pair]] = []
        for (i, j), verdict in self.verdicts.items():
            confirm = len(matched[i] & matched[j]) if verdict else 0
            if confirm:
                contradict = len(matched[i] & unmatched[j]) + len(matched[j] & unmatched[i])
                confirmed.append((contradict - confirm, (i, j)))
        for _, (i, j) in sorted(confirmed):
            a, b = self.find(i), self.find(j)
            if a == b:
                continue
            grown = len(self.members[a]) > 1 or len(self.members[b]) > 1
            if grown and not outvoted(*self._count(a, b)):
                continue
            self.union(a, b)

    def _count(self, a: int, b: int) -> tuple[int, int]:
        """Matches and non-matches between the clusters of roots ``a`` and ``b``."""
        yes = no = 0
        for i in self.members[a]:
            for j in self.members[b]:
                verdict = self.verdicts.get((min(i, j), max(i, j)))
                if verdict is not None:
                    yes, no = (yes + 1, no) if verdict else (yes, no + 1)
        return yes, no

    def _between(self) -> dict[Pair, list[int]]:
        """Between each two checked clusters (by roots): their matches, non-matches, and
        one matching pair ``[yes, no, i, j]``."""
        counts: dict[Pair, list[int]] = {}
        for (i, j), verdict in self.verdicts.items():
            a, b = self.find(i), self.find(j)
            if a != b:
                found = counts.setdefault((min(a, b), max(a, b)), [0, 0, -1, -1])
                found[0 if verdict else 1] += 1
                if verdict:
                    found[2:] = [i, j]
        return counts

    def _merge_supported(self) -> None:
        """Merge clusters with two or more matches between them (and more than non-matches),
        until none is left: every merge may bring two others' matches together."""
        while True:
            merged = False
            for (a, b), (yes, no, _, _) in sorted(self._between().items()):
                unchanged = self.find(a) == a and self.find(b) == b  # else its counts are stale
                if yes >= 2 and outvoted(yes, no) and unchanged:
                    self.union(a, b)
                    merged = True
            if not merged:
                return

    def _corroborations(self) -> list[tuple[Pair, Pair]]:
        """For two clusters (one of two or more) with one match and no non-match between
        them: an unchecked pair of their other items, with the link it would confirm."""
        wanted: dict[Pair, Pair] = {}
        for (a, b), (yes, no, i, j) in sorted(self._between().items()):
            if yes != 1 or no or (len(self.members[a]) == 1 and len(self.members[b]) == 1):
                continue
            link = (i, j)
            left = self._representative(a, avoid=link)
            right = self._representative(b, avoid=link)
            pair = (min(left, right), max(left, right))
            if pair not in self.verdicts and pair != link:
                wanted.setdefault(pair, link)
        for pair, link in self._wedges():
            wanted.setdefault(pair, link)
        return list(wanted.items())

    def _wedges(self) -> list[tuple[Pair, Pair]]:
        """Lone items a, c both matching a lone item b while a and c were checked not to
        match: one of the three verdicts is wrong. Each such pair is asked again the other
        way round (record 2 first: a request of its own, so an answer of its own), with the
        link a-b it would confirm."""
        lone_matches: dict[int, list[int]] = defaultdict(list)
        for (i, j), verdict in self.verdicts.items():
            if verdict and len(self.members[self.find(i)]) == 1 == len(self.members[self.find(j)]):
                lone_matches[i].append(j)
                lone_matches[j].append(i)
        found: list[tuple[Pair, Pair]] = []
        for b, partners in sorted(lone_matches.items()):
            if len(partners) != 2:
                continue
            a, c = sorted(partners)
            if self.verdicts.get((a, c)) is False and (a, c) not in self.rechecked:
                found.append(((c, a), (min(a, b), max(a, b))))
        return found

    def _representative(self, root: int, *, avoid: Pair) -> int:
        """The cluster's smallest item not in the link it should confirm (when it has one)."""
        others = [i for i in self.members[root] if i not in avoid]
        return min(others) if others else min(self.members[root])

    def _merge_lone_pairs(self) -> None:
        """Join two lone items by their one match when neither has another open match: one
        that no non-match between their clusters refutes, and that third items do not
        contradict (two or more, and more than confirm it; one wrong match contradicts a
        right one through one item only)."""
        between = self._between()
        matched, unmatched = self._neighbourhoods()
        open_links: dict[int, list[int]] = defaultdict(list)
        for (i, j), verdict in self.verdicts.items():
            a, b = self.find(i), self.find(j)
            if not verdict or a == b or between[(min(a, b), max(a, b))][1]:
                continue
            confirm = len(matched[i] & matched[j])
            contradict = len(matched[i] & unmatched[j]) + len(matched[j] & unmatched[i])
            if contradict < 2 or contradict <= confirm:
                open_links[i].append(j)
                open_links[j].append(i)
        for i, partners in sorted(open_links.items()):
            if len(partners) != 1:
                continue
            j = partners[0]
            lone = len(self.members[self.find(i)]) == 1 and len(self.members[self.find(j)]) == 1
            if lone and open_links[j] == [i]:
                self.union(i, j)

    def _neighbourhoods(self) -> tuple[dict[int, set[int]], dict[int, set[int]]]:
        """Each item's matches and checked non-matches."""
        matched: dict[int, set[int]] = defaultdict(set)
        unmatched: dict[int, set[int]] = defaultdict(set)
        for (i, j), verdict in self.verdicts.items():
            (matched if verdict else unmatched)[i].add(j)
            (matched if verdict else unmatched)[j].add(i)
        return matched, unmatched

    def labels(self) -> list[int]:
        """Each item's cluster, named by its smallest item."""
        smallest = {root: min(items) for root, items in self.members.items()}
        return [smallest[self.find(i)] for i in range(self.size)]


# -- blocking -----------------------------------------------------------------------------


def neighbour_pool(vectors: np.ndarray, live: np.ndarray, m: int) -> dict[Pair, float]:
    """Each live row's ``m`` most similar live rows, as pairs ``(i, j)``, ``i < j``, with
    their cosine similarity."""
    pool: dict[Pair, float] = {}
    rows = np.flatnonzero(live)
    if len(rows) < 2 or m <= 0:
        return pool
    kept = vectors[rows]
    for start in range(0, len(rows), CHUNK):
        similarity = cosine(kept[start : start + CHUNK], kept)
        for offset in range(similarity.shape[0]):
            similarity[offset, start + offset] = -np.inf
        for offset, neighbours in enumerate(nearest(similarity, min(m, len(rows) - 1))):
            i = int(rows[start + offset])
            for column in neighbours:
                j = int(rows[column])
                pool[(min(i, j), max(i, j))] = float(similarity[offset, column])
    return pool


def stratified_sample(pool: Mapping[Pair, float], size: int, seed: int) -> list[Pair]:
    """One pair from each of ``size`` strata of equal count, in similarity order: a uniform
    sample spread over the whole pool (all of it when it is no bigger)."""
    ordered = sorted(pool, key=lambda pair: (-pool[pair], pair))
    if len(ordered) <= size:
        return ordered
    draws = random.Random(seed)
    bounds = [round(k * len(ordered) / size) for k in range(size + 1)]
    return [ordered[draws.randrange(lo, hi)] for lo, hi in itertools.pairwise(bounds) if hi > lo]


def recall_threshold(
    pool: Mapping[Pair, float], matches: Sequence[Pair], target_recall: float
) -> float:
    """The similarity at or above which the pool's matches hold ``target_recall``, with 95%
    confidence, as far as the sample's ``matches`` tell: the ``k``-th least similar of them,
    ``k`` the most misses that would be unlikely (5% or less) were the recall no better than
    the target; with too few matches for that, the least similar one. ``-inf`` (every pair
    kept) with no match to learn from."""
    if not matches:
        return -math.inf
    similarities = sorted(pool[pair] for pair in matches)
    n, miss = len(similarities), 1.0 - target_recall
    missed, below = 0, (1.0 - miss) ** n  # P[Binomial(n, miss) <= k], k = 0
    while missed + 1 < n and miss > 0:
        below += math.comb(n, missed + 1) * miss ** (missed + 1) * (1 - miss) ** (n - missed - 1)
        if below > CONFIDENCE:
            break
        missed += 1
    return similarities[missed]


def nearest_pairs(pool: Mapping[Pair, float], r: int) -> set[Pair]:
    """Each item's ``r`` most similar pairs of the pool."""
    of_item: dict[int, list[Pair]] = defaultdict(list)
    for pair in pool:
        of_item[pair[0]].append(pair)
        of_item[pair[1]].append(pair)
    return {
        pair
        for pairs in of_item.values()
        for pair in sorted(pairs, key=lambda p: (-pool[p], p))[:r]
    }


def _above(
    pool: Mapping[Pair, float], threshold: float, floor: set[Pair], *, skip: set[Pair]
) -> list[Pair]:
    """The pool's pairs to judge after the sample: at or above the threshold, or among an
    item's nearest (``floor``), so no item is left unchecked by the threshold alone."""
    return [p for p in sorted(pool) if (pool[p] >= threshold or p in floor) and p not in skip]


# -- the operator -------------------------------------------------------------------------


@dataclass
class _Distinct:
    """The column's distinct non-null values, and each row's index into them."""

    values: list[str]
    of_row: list[int | None]
    first_row: list[int]


def _distinct(column: pl.Series) -> _Distinct:
    values: list[str] = []
    index: dict[str, int] = {}
    of_row: list[int | None] = []
    first_row: list[int] = []
    for row, value in enumerate(column.to_list()):
        if value is None:
            of_row.append(None)
            continue
        if value not in index:
            index[value] = len(values)
            values.append(value)
            first_row.append(row)
        of_row.append(index[value])
    return _Distinct(values, of_row, first_row)


def check_arguments(
    column: object,
    schema: Mapping[str, Any],
    *,
    target_recall: object,
    neighbours: object,
    sample: object,
    plan: object,
    seed: object,
) -> None:
    if not isinstance(column, str) or column not in schema:
        raise ConfigError(
            f"llm_resolve: column must name a column of the frame, got {column!r}; "
            f"the frame has {', '.join(schema)}"
        )
    if not isinstance(target_recall, int | float) or not 0 < target_recall <= 1:
        raise ConfigError(f"target_recall must be in (0, 1], got {target_recall!r}")
    for name, value in (("neighbours", neighbours), ("sample", sample)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if plan not in PLANS:
        raise ConfigError(f"plan must be one of {', '.join(PLANS)}, got {plan!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}")


def _chosen_plan(plan: str, distinct: int, sample: int) -> tuple[str, str]:
    every = distinct * (distinct - 1) // 2
    if plan == "all_pairs":
        return "all_pairs", "asked for (plan='all_pairs')"
    if plan == "blocking":
        return "blocking", "asked for (plan='blocking')"
    if every <= sample:
        return "all_pairs", (
            f"{distinct} distinct values make {every} pairs, no more than the blocked plan's "
            f"sample of {sample}: every pair is judged"
        )
    return "blocking", (
        f"{distinct} distinct values make {every:,} pairs: embedding neighbours and a "
        f"threshold learned from a sample of {sample} for the target recall pick the few to judge"
    )


@dataclass
class _Outcome:
    """What resolving the distinct values gave: each one's cluster, and per value the
    statuses and errors of its checks."""

    labels: list[int]
    embed_errors: list[str | None]
    statuses: dict[int, list[str]]
    errors: dict[int, str]


class _Resolver:
    """One run over the distinct values: embeds, blocks, judges, clusters."""

    def __init__(
        self,
        waves: Waves,
        values: list[str],
        *,
        embedding_model: str,
        target_recall: float,
        neighbours: int,
        sample: int,
        seed: int,
    ) -> None:
        self.waves = waves
        self.values = values
        self.embedding_model = embedding_model
        self.target_recall = target_recall
        self.neighbours = neighbours
        self.sample = sample
        self.seed = seed
        self.statuses: dict[int, list[str]] = defaultdict(list)
        self.errors: dict[int, str] = {}

    def judge(self, pairs: Sequence[Pair]) -> list[bool | None]:
        """One wave of pair checks; ``None`` where a check has no answer."""
        prompts = [pair_prompt(self.values[i], self.values[j]) for i, j in pairs]
        answers: Answers = self.waves.ask(prompts, schema=VERDICT, max_tokens=16)
        verdicts: list[bool | None] = []
        for k, (i, j) in enumerate(pairs):
            status, error = answers.statuses[k], answers.errors[k]
            value = answers.values[k]
            verdict = value.get("answer") if answers.ok(k) and isinstance(value, dict) else None
            if not isinstance(verdict, bool):
                verdict = None
                status = status if status not in ANSWERED else "invalid"
                error = error or "the check's answer has no boolean 'answer'"
            for row in (i, j):
                self.statuses[row].append(status)
                if verdict is None and error:
                    self.errors.setdefault(row, error)
            verdicts.append(verdict)
        return verdicts

    def run(self, plan: str) -> _Outcome:
        n = len(self.values)
        verdicts: dict[Pair, bool] = {}
        embed_errors: list[str | None] = [None] * n
        if plan == "all_pairs":
            pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
            pool: dict[Pair, float] = {}
        else:
            vectors, embed_errors = unit_vectors(
                self.waves, self.values, model=self.embedding_model
            )
            live = np.array([error is None for error in embed_errors], dtype=bool)
            pool = neighbour_pool(vectors, live, self.neighbours)
            sampled = stratified_sample(pool, self.sample, self.seed)
            for pair, verdict in zip(sampled, self.judge(sampled), strict=True):
                if verdict is not None:
                    verdicts[pair] = verdict
            matches = [pair for pair in sampled if verdicts.get(pair)]
            threshold = recall_threshold(pool, matches, self.target_recall)
            pairs = _above(pool, threshold, nearest_pairs(pool, FLOOR), skip=set(sampled))
        for pair, verdict in zip(pairs, self.judge(pairs), strict=True):
            if verdict is not None:
                verdicts[pair] = verdict
        clusters = Clusters(n, verdicts, pool)
        clusters.settle(self.judge)
        return _Outcome(clusters.labels(), embed_errors, self.statuses, self.errors)


def _row_columns(distinct: _Distinct, outcome: _Outcome, columns: Columns) -> pl.DataFrame:
    """The added columns, one row per input row: each row's entity (the smallest row index
    of its cluster), status and error."""
    smallest_row: dict[int, int] = {}
    for distinct_value, label in enumerate(outcome.labels):
        first = distinct.first_row[distinct_value]
        smallest_row[label] = min(smallest_row.get(label, first), first)
    entities: list[int | None] = []
    statuses: list[str] = []
    errors: list[str | None] = []
    for value in distinct.of_row:
        if value is None:
            entities.append(None)
            statuses.append("skipped")
            errors.append("the value is null: nothing to resolve")
            continue
        entities.append(smallest_row[outcome.labels[value]])
        embed_error = outcome.embed_errors[value]
        checks = outcome.statuses.get(value, [])
        answered = [s for s in checks if s in ANSWERED]
        if embed_error is not None:
            statuses.append("failed")
            errors.append(f"its embedding failed: {embed_error}")
        elif checks and not answered:
            statuses.append(checks[0])
            errors.append(outcome.errors.get(value, f"every check of it is {checks[0]}"))
        else:
            statuses.append("cached" if answered and set(answered) == {"cached"} else "ok")
            errors.append(None)
    return pl.DataFrame(
        {columns.output: entities, columns.status: statuses, columns.error: errors},
        schema={columns.output: pl.Int64, columns.status: STATUS_DTYPE, columns.error: pl.String},
    )


@overload
def llm_resolve(
    df: pl.DataFrame,
    /,
    column: str,
    *,
    model: ModelOption,
    embedding_model: str,
    target_recall: float = ...,
    neighbours: int = ...,
    sample: int = ...,
    plan: Plan = ...,
    seed: int = ...,
    output: str = ...,
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> pl.DataFrame: ...
@overload
def llm_resolve(
    df: pl.LazyFrame,
    /,
    column: str,
    *,
    model: ModelOption,
    embedding_model: str,
    target_recall: float = ...,
    neighbours: int = ...,
    sample: int = ...,
    plan: Plan = ...,
    seed: int = ...,
    output: str = ...,
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> pl.LazyFrame: ...
@overload
def llm_resolve(
    df: pa.Table,
    /,
    column: str,
    *,
    model: ModelOption,
    embedding_model: str,
    target_recall: float = ...,
    neighbours: int = ...,
    sample: int = ...,
    plan: Plan = ...,
    seed: int = ...,
    output: str = ...,
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> pa.Table: ...
@overload
def llm_resolve(
    df: pl.DataFrame,
    /,
    column: str,
    *,
    model: ModelOption,
    embedding_model: str,
    target_recall: float = ...,
    neighbours: int = ...,
    sample: int = ...,
    plan: Plan = ...,
    seed: int = ...,
    output: str = ...,
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> tuple[pl.DataFrame, RunReport]: ...
@overload
def llm_resolve(
    df: pa.Table,
    /,
    column: str,
    *,
    model: ModelOption,
    embedding_model: str,
    target_recall: float = ...,
    neighbours: int = ...,
    sample: int = ...,
    plan: Plan = ...,
    seed: int = ...,
    output: str = ...,
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> tuple[pa.Table, RunReport]: ...
def llm_resolve(
    df: pl.DataFrame | pl.LazyFrame | pa.Table,
    /,
    column: str,
    *,
    model: ModelOption,
    embedding_model: str,
    target_recall: float = 0.95,
    neighbours: int = 10,
    sample: int = 100,
    plan: Plan = "auto",
    seed: int = 0,
    output: str = "entity",
    return_report: bool = False,
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> pl.DataFrame | pl.LazyFrame | pa.Table | tuple[pl.DataFrame | pa.Table, RunReport]:
    """An entity id per row: rows whose ``column`` means the same real-world thing share it.

    Exactly equal values are one entity without a call. The other values are resolved by one
    of two plans (``RunReport.plan`` and ``plan_why`` say which ran and why):

    ``"blocking"``
        Each distinct value is embedded (``embedding_model``); its ``neighbours`` most similar
        values are its candidates. ``sample`` of those pairs, spread over the similarity
        range, are judged first; the pairs at or above the similarity that holds
        ``target_recall`` of the sample's matches are judged next, in one wave. Calls: the
        sample, plus at most ``distinct * neighbours`` pairs (far fewer once a threshold is
        learned), plus a few checks that corroborate merges. Waves: two, plus up to three
        small waves of checks.
    ``"all_pairs"``
        Every pair of distinct values is judged, in one wave: ``d * (d - 1) / 2`` calls for
        ``d`` distinct values. The baseline; ``"auto"`` picks it only when that is no more
        than the blocked plan's sample.

    Either way the verdicts are joined by a union-find that never merges two clusters on one
    unverified link: a merge needs a triangle of matches, two matches between the clusters
    (more than twice their non-matches), or one match and a second check of two other rows of
    theirs (an extra call); two lone rows are joined by their one match only when neither has
    another unrefuted match. So one wrong "yes" never joins two entities each of whose rows
    is matched to another row of its own (see :class:`llm_ops._sets.resolve.Clusters`).

    Parameters
    ----------
    df
        A Polars DataFrame or LazyFrame, or a pyarrow Table; the result is of the same kind.
        A LazyFrame is collected: resolving needs all rows at once.
    column
        The column of values (text) to resolve.
    model
        The model that checks pairs: asked ``{"answer": true|false}`` about two records.
    embedding_model
        The embedding model the blocked plan finds candidate pairs with.
    target_recall
        The share of true matches among the candidate pairs the learned threshold should
        keep.
    neighbours
        How many most similar values of each value are its candidates.
    sample
        How many candidate pairs are judged to learn the threshold.
    plan
        ``"auto"``, ``"blocking"`` or ``"all_pairs"``.
    seed
        Seeds the sample, so a rerun asks the same checks (and the cache answers them all).
    output
        The added columns' name: ``<output>`` (Int64: the smallest row index, counted from 0,
        of the rows of its entity), ``<output>_status`` and ``<output>_error``. A null value
        gets a null entity, ``skipped``; a value whose embedding or every check failed stays
        its own entity, with that status and the error.
    return_report
        Return ``(frame, RunReport)``; not for a LazyFrame (see :func:`llm_ops.last_report`).
    client
        A :class:`~llm_ops.Client` to run on, instead of one made from ``options``.
    **options
        As for :func:`~llm_ops.llm_complete` but ``output`` and ``schema`` (``endpoint``,
        ``cache``, ``budget``, ``batch``, ...): the keys of :class:`llm_ops._sets.SetOptions`.

    Examples
    --------
    >>> import polars as pl
    >>> from llm_ops import llm_resolve
    >>> from llm_ops.testing import LocalEndpoint
    >>> companies = pl.DataFrame({"name": [
    ...     "Acme Inc. [entity=1]", "ACME Incorporated [entity=1]", "Globex [entity=2]",
    ...     "Globex Corp [entity=2]", "Initech [entity=3]"]})
    >>> with LocalEndpoint() as endpoint:
    ...     resolved = llm_resolve(companies, "name", model="sim", embedding_model="sim-embed",
    ...                            endpoint=endpoint.base_url, cache=False)
    >>> resolved.select("name", "entity")
    shape: (5, 2)
    ┌──────────────────────────────┬────────┐
    │ name                         ┆ entity │
    │ ---                          ┆ ---    │
    │ str                          ┆ i64    │
    ╞══════════════════════════════╪════════╡
    │ Acme Inc. [entity=1]         ┆ 0      │
    │ ACME Incorporated [entity=1] ┆ 0      │
    │ Globex [entity=2]            ┆ 2      │
    │ Globex Corp [entity=2]       ┆ 2      │
    │ Initech [entity=3]           ┆ 4      │
    └──────────────────────────────┴────────┘
    """
    lazy = isinstance(df, pl.LazyFrame)
    if lazy and return_report:
        raise ConfigError(
            "return_report=True needs an eager frame: a LazyFrame's rows are resolved when it "
            "is collected; then read llm_ops.last_report()"
        )
    frame = _polars(df)
    columns = Columns(output)
    check_arguments(
        column,
        frame.schema,
        target_recall=target_recall,
        neighbours=neighbours,
        sample=sample,
        plan=plan,
        seed=seed,
    )
    with Waves(OPERATOR, model=model, client=client, options=options) as waves:
        added, report = resolve_values(
            frame.get_column(column),
            waves,
            embedding_model=embedding_model,
            target_recall=target_recall,
            neighbours=neighbours,
            sample=sample,
            plan=plan,
            seed=seed,
            columns=columns,
        )
    result = frame.drop([c for c in added.columns if c in frame.columns]).hstack(added)
    if isinstance(df, pa.Table):
        table = result.to_arrow()
        return (table, report) if return_report else table
    if lazy:
        return result.lazy()
    return (result, report) if return_report else result


def resolve_values(
    values: pl.Series,
    waves: Waves,
    *,
    embedding_model: str,
    target_recall: float,
    neighbours: int,
    sample: int,
    plan: str,
    seed: int,
    columns: Columns,
) -> tuple[pl.DataFrame, RunReport]:
    """The columns :func:`llm_resolve` adds for ``values`` (checked arguments), asked on
    ``waves``, and the report."""
    if not isinstance(embedding_model, str) or not embedding_model:
        raise ConfigError(f"embedding_model must name an embedding model, got {embedding_model!r}")
    distinct = _distinct(values.cast(pl.String))
    chosen, why = _chosen_plan(plan, len(distinct.values), sample)
    waves.plan, waves.plan_why = chosen, why
    resolver = _Resolver(
        waves,
        distinct.values,
        embedding_model=embedding_model,
        target_recall=float(target_recall),
        neighbours=neighbours,
        sample=sample,
        seed=seed,
    )
    added = _row_columns(distinct, resolver.run(chosen), columns)
    return added, waves.finish(added, columns)


def _polars(df: object) -> pl.DataFrame:
    if isinstance(df, pl.DataFrame):
        return df
    if isinstance(df, pl.LazyFrame):
        return df.collect()
    if isinstance(df, pa.Table):
        frame = pl.from_arrow(df)
        assert isinstance(frame, pl.DataFrame)
        return frame
    raise ConfigError(
        f"llm_resolve takes a polars DataFrame or LazyFrame or a pyarrow Table, got "
        f"{type(df).__name__}; convert it first, e.g. pl.from_pandas(df)"
    )


# -- the planner --------------------------------------------------------------------------


def _two_means(similarities: Sequence[float]) -> float:
    """The similarity that best splits ``similarities`` in two groups (Otsu's threshold):
    the planner's guess of where matches begin, as it has no verdict to learn from."""
    ordered = np.sort(np.asarray(similarities, dtype=np.float64))
    if len(ordered) < 2:
        return -math.inf
    total, count = ordered.cumsum(), np.arange(1, len(ordered) + 1)
    low_mean = total[:-1] / count[:-1]
    high_mean = (total[-1] - total[:-1]) / (len(ordered) - count[:-1])
    spread = count[:-1] * (len(ordered) - count[:-1]) * (low_mean - high_mean) ** 2
    k = int(np.argmax(spread))
    return float((ordered[k] + ordered[k + 1]) / 2)


_PROMPT_CHARS = len(PAIR_PROMPT) - len("{left}{right}")


def _guessed_waves(
    values: list[str],
    *,
    embedding_model: str,
    target_recall: float,
    neighbours: int,
    sample: int,
    seed: int,
    waves: Waves,
) -> list[list[Pair]]:
    """The blocked plan's waves of pairs, each verdict guessed from the similarity."""
    with waves:
        vectors, errors = unit_vectors(waves, values, model=embedding_model)
    live = np.array([error is None for error in errors], dtype=bool)
    pool = neighbour_pool(vectors, live, neighbours)
    guess = _two_means(list(pool.values()))
    sampled = stratified_sample(pool, sample, seed)
    matches = [pair for pair in sampled if pool[pair] >= guess]
    threshold = recall_threshold(pool, matches, target_recall)
    rest = _above(pool, threshold, nearest_pairs(pool, FLOOR), skip=set(sampled))
    asked = [sampled, rest]
    verdicts = {pair: pool[pair] >= guess for pair in sampled + rest}

    def guessed(pairs: list[Pair]) -> list[bool | None]:
        asked.append(pairs)
        return [float(vectors[i] @ vectors[j]) >= guess for i, j in pairs]

    Clusters(len(values), verdicts, pool).settle(guessed)
    return [pairs for pairs in asked if pairs]


@plans(llm_resolve)
def plan_resolve(
    df: pl.DataFrame | pl.LazyFrame | pa.Table,
    /,
    column: str,
    *,
    model: ModelOption,
    embedding_model: str,
    target_recall: float = 0.95,
    neighbours: int = 10,
    sample: int = 100,
    plan: Plan = "auto",
    seed: int = 0,
    output: str = "entity",
    return_report: bool = False,
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> SetEstimate:
    """What :func:`llm_resolve` would ask and cost. The blocked plan needs the embeddings to
    know its candidates, so the planner embeds the values (cached, as the run's; no check is
    sent) and stands in for each verdict the guess that pairs above the similarity that best
    splits the candidates in two match: the same sample, threshold and clustering then give
    the calls and waves the run would make in a world where that guess is right."""
    frame = _polars(df)
    Columns(output)
    check_arguments(
        column,
        frame.schema,
        target_recall=target_recall,
        neighbours=neighbours,
        sample=sample,
        plan=plan,
        seed=seed,
    )
    distinct = _distinct(frame.get_column(column).cast(pl.String))
    chosen, why = _chosen_plan(plan, len(distinct.values), sample)
    values = distinct.values
    n = len(values)
    if chosen == "all_pairs":
        calls, waves_asked = n * (n - 1) // 2, 1 if n > 1 else 0
        mean_chars = _PROMPT_CHARS + 2 * (sum(map(len, values)) / n if n else 0.0)
    else:
        asked = _guessed_waves(
            values,
            embedding_model=embedding_model,
            target_recall=float(target_recall),
            neighbours=neighbours,
            sample=sample,
            seed=seed,
            waves=Waves(OPERATOR, model=model, client=client, options=options),
        )
        calls, waves_asked = sum(map(len, asked)), len(asked)
        lengths = [len(values[i]) + len(values[j]) for pairs in asked for i, j in pairs]
        mean_chars = _PROMPT_CHARS + (sum(lengths) / len(lengths) if lengths else 0.0)
    return priced(
        OPERATOR,
        plan=chosen,
        plan_why=why,
        calls=calls,
        waves=waves_asked,
        prompt_chars=mean_chars,
        output_tokens=VERDICT_TOKENS,
        model=model,
        options=options,
    )
