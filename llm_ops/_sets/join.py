"""``llm_join``: the rows of two frames that a natural-language predicate pairs up.

Three plans, one result. The **nested** loop asks the model about every pair (n_left x n_right
calls). The **classify** rewrite asks, once per left row, which of the right side's few
distinct rows (at most ``classify_max``) the predicate holds for (n_left calls). The
**cascade** embeds both sides, labels a sample of pairs spread over the similarity range with
the model, and learns two thresholds on the similarity from it: pairs above the accept
threshold are joined without a call, pairs below the reject threshold are dropped, and only the
pairs in between are asked. ``plan="auto"`` picks one and the report says which and why.

The cascade's calibration is stratified importance sampling over the similarity ranking, in
the manner of SUPG (Kang et al., VLDB 2020) and LOTUS's ``sem_join`` cascade, with one change
for a judge that errs: the rate at which the model says "yes" to pairs that cannot match (its
noise floor, read on the least similar pairs) is subtracted before the thresholds are set, as
a few percent of wrong "yes" over hundreds of thousands of dissimilar pairs would otherwise
look like more matches than there are. :func:`_calibrate` states the guarantee.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Unpack, cast, overload

import numpy as np
import polars as pl
import pyarrow as pa

from .._client import Client
from .._frames import Frame, PolarsFrame, same_kind, to_polars
from .._options import Columns, ModelOption
from .._pricing import approx_tokens
from .._report import RunReport
from .._status import STATUS_DTYPE
from .._template import parse_template, render
from ..exceptions import ConfigError, LlmOpsWarning, TemplateError
from . import plans
from ._pairs import cosine, unit_vectors
from ._waves import Answers, SetEstimate, SetOptions, Waves, priced

__all__ = ["llm_join"]

How = Literal["inner", "left", "semi", "anti"]
Plan = Literal["auto", "nested", "classify", "cascade"]
HOWS: tuple[str, ...] = ("inner", "left", "semi", "anti")
PLANS: tuple[str, ...] = ("auto", "nested", "classify", "cascade")

NESTED_MAX = 400
"""``plan="auto"`` asks every pair up to this many pairs: below it the cheaper plans' own
calls (the cascade's sample) cost about as much as asking everything."""

CLASSIFY_MAX = 100
"""``plan="auto"`` classifies each left row into the right side's rows up to this many distinct
right rows (one call per left row, at most one match each)."""

MAX_CASCADE_PAIRS = 25_000_000
"""The cascade holds every pair's similarity and rank in memory (12 bytes a pair): beyond
this many pairs it asks for the left side in parts."""

SAMPLE_SIZE = 400
"""The cascade's labelled sample: about this many pairs, spread over the similarity strata."""

CONFIDENCE_Z = 1.645
"""The one-sided normal quantile of the cascade's bounds: 95% confidence."""

GATE_ALPHA = 0.01
"""A stratum counts as holding matches when its "yes" count would happen with probability
below this under the judge's noise floor alone (one-sided binomial test)."""

VERDICT: dict[str, Any] = {
    "title": "verdict",
    "type": "object",
    "properties": {"answer": {"type": "boolean"}},
    "required": ["answer"],
    "additionalProperties": False,
}
VERDICT_TOKENS = 8
CHOICE_TOKENS = 10
CHOICE_CHARS = 180
"""The classify prompt's fixed words, about: the estimate's share of each call."""


def _choice_schema(count: int) -> dict[str, Any]:
    labels = [str(i) for i in range(1, count + 1)] + ["none"]
    return {
        "title": "choice",
        "type": "object",
        "properties": {"choice": {"type": "string", "enum": labels}},
        "required": ["choice"],
        "additionalProperties": False,
    }


# -- the predicate: a template over both sides -------------------------------------------------


@dataclass(frozen=True)
class Predicate:
    """The predicate's template, each field resolved to a side's column.

    The rule: a field names a column of the joined row as the result names it. A column only
    one side has is written by its name; a column both sides have is the left one's when written
    plainly and the right one's when written with ``suffix`` (``{name}`` and ``{name_right}``).
    Writing a shared column plainly without also writing its right copy is ambiguous (which
    side did you mean?) and a :class:`~llm_ops.TemplateError`.
    """

    source: str
    parts: tuple[tuple[str, str | None, str | None], ...]  # literal, side, column
    left: tuple[str, ...]
    right: tuple[str, ...]

    def question(self, left_word: str, right_word: str) -> str:
        """The predicate with each field written as a reference to an item's column:
        ``Is the review (left text) about (right name)?``."""
        pieces = []
        for literal, side, column in self.parts:
            pieces.append(literal)
            if column is not None:
                pieces.append(f"({left_word if side == 'left' else right_word} {column})")
        return "".join(pieces)


def parse_predicate(predicate: str, left: pl.Schema, right: pl.Schema, *, suffix: str) -> Predicate:
    """``predicate`` resolved over the two sides' columns (see :class:`Predicate`)."""
    template = parse_template(predicate, argument="predicate")
    shared = set(left) & set(right)
    fields = set(template.columns)
    parts: list[tuple[str, str | None, str | None]] = []
    for literal, field in template.parts:
        if field is None:
            parts.append((literal, None, None))
            continue
        side, column = _side_of(field, left, right, shared, fields, suffix, predicate)
        parts.append((literal, side, column))
    left_columns = tuple(dict.fromkeys(c for _, s, c in parts if s == "left" and c))
    right_columns = tuple(dict.fromkeys(c for _, s, c in parts if s == "right" and c))
    if not left_columns or not right_columns:
        raise TemplateError(
            f"predicate {predicate!r} must name a column of each side (left: "
            f"{', '.join(left) or '(none)'}; right: {', '.join(right) or '(none)'}), e.g. "
            "'Is the review {text} about the product {name}?'"
        )
    for column in left_columns:
        render(column, left[column], used_by="predicate")
    for column in right_columns:
        render(column, right[column], used_by="predicate")
    return Predicate(predicate, tuple(parts), left_columns, right_columns)


def _side_of(
    field: str,
    left: pl.Schema,
    right: pl.Schema,
    shared: set[str],
    fields: set[str],
    suffix: str,
    predicate: str,
) -> tuple[str, str]:
    if field in shared:
        if field + suffix not in fields:
            raise TemplateError(
                f"predicate {predicate!r} writes {{{field}}}, a column both sides have: write "
                f"{{{field}{suffix}}} for the right side's (and {{{field}}} then means the "
                "left side's), or rename one of them"
            )
        return "left", field
    if field.endswith(suffix) and field[: -len(suffix)] in shared:
        return "right", field[: -len(suffix)]
    if field in left:
        return "left", field
    if field in right:
        return "right", field
    raise TemplateError(
        f"predicate references column {field!r}, which neither side has; left: "
        f"{', '.join(left) or '(none)'}; right: {', '.join(right) or '(none)'}"
    )


# -- the items: each side's distinct rows as the predicate reads them --------------------------


@dataclass(frozen=True)
class Items:
    """One side's distinct values of the predicate's columns: each row's item (-1 where a
    column is null: never asked), and each item's values."""

    of_row: np.ndarray
    values: list[tuple[str, ...]]
    columns: tuple[str, ...]

    def block(self, title: str, i: int) -> str:
        lines = [title] + [f"- {c}: {v}" for c, v in zip(self.columns, self.values[i], strict=True)]
        return "\n".join(lines)

    def text(self, i: int) -> str:
        """What is embedded: the values alone, so the column names shared by every item do
        not make every item look alike."""
        return "\n".join(self.values[i])

    def __len__(self) -> int:
        return len(self.values)


def items_of(frame: pl.DataFrame, columns: Sequence[str]) -> Items:
    rendered = frame.select(
        render(c, frame.schema[c], used_by="predicate").alias(f"_{i}")
        for i, c in enumerate(columns)
    ).rows()
    index: dict[tuple[str, ...], int] = {}
    of_row = np.full(len(rendered), -1, dtype=np.int64)
    for r, row in enumerate(rendered):
        if any(v is None for v in row):
            continue
        of_row[r] = index.setdefault(cast(tuple[str, ...], row), len(index))
    return Items(of_row, list(index), tuple(columns))


def pair_prompt(predicate: Predicate, left: Items, right: Items, i: int, j: int) -> str:
    """One pair's question: the left item first, then the right one, then the predicate."""
    return (
        f"{left.block('Left item:', i)}\n{right.block('Right item:', j)}\n\n"
        f"Is this true of these two items? {predicate.question('left', 'right')}"
    )


def choice_prompt(
    predicate: Predicate, left: Items, right: Items, i: int, js: Sequence[int]
) -> str:
    """One left item's question over some right items: the left one first, then the options
    in the order of the choice's labels."""
    options = "\n".join(right.block(f"Option {n}:", j) for n, j in enumerate(js, 1))
    return (
        f"{left.block('Item:', i)}\n\nOptions:\n{options}\n\n"
        f"For which option is this true? {predicate.question('item', 'option')}\n"
        'Answer with the number of the first option it is true for, or "none".'
    )


# -- outcomes: what each pair came to ----------------------------------------------------------


@dataclass
class Outcomes:
    """The judged or decided pairs of items: matches, and failed judgments with their error.
    Pairs in neither did not match."""

    matches: dict[tuple[int, int], str]  # (left item, right item) -> status
    # (status, error); right item None: the whole left item failed
    failed: dict[tuple[int, int | None], tuple[str, str]]

    @classmethod
    def empty(cls) -> Outcomes:
        return cls({}, {})

    def judged(self, pairs: Sequence[tuple[int, int]], answers: Answers) -> None:
        for n, pair in enumerate(pairs):
            if answers.ok(n):
                if _yes(answers.values[n]):
                    self.matches[pair] = answers.statuses[n]
            else:
                self.failed[pair] = (answers.statuses[n], answers.errors[n] or "no answer")


def _yes(value: Any) -> bool:
    return isinstance(value, dict) and value.get("answer") is True


# -- the plans ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    plan: str
    why: str


def choose_plan(
    plan: str,
    *,
    pairs: int,
    right_items: int,
    embedding_model: str | None,
    classify_max: int,
    nested_max: int,
) -> Choice:
    """Which plan runs, and why (``plan="auto"``: by the input's size, see the docstring)."""
    if plan == "nested":
        return Choice("nested", "asked for: every pair judged")
    if plan == "classify":
        return Choice("classify", "asked for: each left row classified into the right rows")
    if plan == "cascade":
        return Choice("cascade", "asked for: embedding similarity with calibrated thresholds")
    if pairs <= nested_max:
        return Choice("nested", f"{pairs:,} pairs <= nested_max={nested_max:,}: every pair asked")
    if right_items <= classify_max:
        return Choice(
            "classify",
            f"{right_items:,} distinct right rows <= classify_max={classify_max:,}: one call per "
            "left row (at most one match each)",
        )
    if embedding_model is not None:
        return Choice(
            "cascade",
            f"{pairs:,} pairs, {right_items:,} distinct right rows: embedding cascade",
        )
    raise ConfigError(
        f"llm_join would ask {pairs:,} pairs one call each: pass embedding_model= for the "
        "cascade (a calibrated sample plus the pairs near the threshold), or plan='nested' to "
        "ask every pair anyway"
    )


def run_nested(
    waves: Waves, predicate: Predicate, left: Items, right: Items, max_tokens: int | None
) -> Outcomes:
    pairs = [(i, j) for i in range(len(left)) for j in range(len(right))]
    answers = waves.ask(
        [pair_prompt(predicate, left, right, i, j) for i, j in pairs],
        schema=VERDICT,
        max_tokens=max_tokens,
    )
    outcomes = Outcomes.empty()
    outcomes.judged(pairs, answers)
    return outcomes


def option_groups(
    predicate: Predicate, left: Items, right: Items, context_tokens: int | None
) -> list[list[int]]:
    """The right items split into the option lists of one call each: one list, unless a
    prompt with all of them (for the longest left item) would not fit ``context_tokens``."""
    every = list(range(len(right)))
    if context_tokens is None or not every:
        return [every]
    longest = max(range(len(left)), key=lambda i: len(left.text(i)), default=None)
    if longest is None:
        return [every]
    room = int(context_tokens * 0.8) - CHOICE_TOKENS  # the estimate is rough: keep a margin
    groups: list[list[int]] = [[]]
    for j in every:
        trial = [*groups[-1], j]
        chars = len(choice_prompt(predicate, left, right, longest, trial))
        if groups[-1] and approx_tokens(chars, 1) > room:
            groups.append([j])
        else:
            groups[-1] = trial
    single = approx_tokens(len(choice_prompt(predicate, left, right, longest, [0])), 1)
    if single > room:
        raise ConfigError(
            f"one left row and one right row take about {single:,} tokens, more than "
            f"context_tokens={context_tokens:,} allows: use plan='nested' or a larger context"
        )
    return groups


def run_classify(
    waves: Waves,
    predicate: Predicate,
    left: Items,
    right: Items,
    groups: list[list[int]],
) -> Outcomes:
    asked = [(i, g) for i in range(len(left)) for g in range(len(groups))]
    outcomes = Outcomes.empty()
    # One wave per option-list length: each has its own enum.
    by_size: dict[int, list[tuple[int, int]]] = {}
    for i, g in asked:
        by_size.setdefault(len(groups[g]), []).append((i, g))
    for size, these in by_size.items():
        answers = waves.ask(
            [choice_prompt(predicate, left, right, i, groups[g]) for i, g in these],
            schema=_choice_schema(size),
            max_tokens=None,
        )
        for n, (i, g) in enumerate(these):
            if not answers.ok(n):
                outcomes.failed[(i, None)] = (answers.statuses[n], answers.errors[n] or "no answer")
                continue
            label = answers.values[n].get("choice") if isinstance(answers.values[n], dict) else None
            if isinstance(label, str) and label.isdigit() and 1 <= int(label) <= size:
                outcomes.matches[(i, groups[g][int(label) - 1])] = answers.statuses[n]
    return outcomes


# -- the cascade --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Strata:
    """The pairs ranked by similarity (most similar first), cut into shells of doubling size:
    ``bounds[h]:bounds[h+1]`` of ``order`` is stratum h."""

    order: np.ndarray
    bounds: list[int]

    @classmethod
    def of(cls, similarity: np.ndarray, first: int) -> Strata:
        flat = similarity.ravel()
        order = np.argsort(-flat, kind="stable")
        total, bounds, size = flat.size, [0], max(first, 1)
        while bounds[-1] < total:
            end = bounds[-1] + size
            if total - end < 2 * size:  # a remainder smaller than the next shell joins this one
                end = total
            bounds.append(min(end, total))
            size *= 2
        return cls(order, bounds)

    def sample(self, size: int, seed: int) -> list[np.ndarray]:
        """Each stratum's sampled pair positions (flat indices), the same for the same seed."""
        count = len(self.bounds) - 1
        per = max(2, math.ceil(size / max(count, 1)))
        rng = np.random.default_rng(seed)
        picked = []
        for h in range(count):
            start, end = self.bounds[h], self.bounds[h + 1]
            n = min(per, end - start)
            chosen = np.sort(rng.choice(end - start, size=n, replace=False))
            picked.append(self.order[start + chosen])
        return picked


@dataclass(frozen=True)
class Thresholds:
    """The calibrated similarity thresholds (``accept``: joined without a call at or above;
    ``reject``: dropped below; between: asked) and what the sample said."""

    accept: float
    reject: float
    noise_floor: float
    matches: float
    why: str


def _binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed exactly: n is one stratum's sample (hundreds at
    most), and this is the one place llm-ops needs it, so ``scipy.stats.binom.sf`` would bring a
    large dependency for one line."""
    if k <= 0:
        return 1.0
    return sum(math.comb(n, x) * p**x * (1 - p) ** (n - x) for x in range(k, n + 1))


def _calibrate(
    strata: Strata,
    picked: list[np.ndarray],
    labels: list[np.ndarray],
    flat: np.ndarray,
    *,
    recall_target: float,
    precision_target: float,
) -> Thresholds:
    """The accept and reject thresholds from the labelled sample.

    ``labels[h]`` holds stratum h's answers (1 yes, 0 no, -1 failed: left out). The lower
    half of the strata (by similarity; most of the pairs) is taken to hold no matches: their
    pooled "yes" rate is the judge's noise floor ``e``. An upper stratum's "yes" count counts
    only when a binomial test tells it from ``e`` (p < 0.01 / number of strata); then each
    answer ``y`` stands for ``N_h / n_h`` pairs with a de-noised label ``(y - e) / (1 - 2e)``.

    Guarantee, if the judge errs independently on each pair at one rate whatever the
    similarity and the strata the test cannot tell from the floor hold no matches: with about
    95% confidence (one-sided normal bounds, z = 1.645, on the Horvitz-Thompson estimates),
    the pairs joined without a call have a precision of at least ``precision_target``, the
    pairs kept (those joined plus those asked, counting the matches the judge then misses at
    its error rate) hold at least ``recall_target`` of all true matches.
    """
    count = len(picked)
    low = count // 2  # the lower half of the strata: most pairs, taken to hold no matches
    floor_labels = np.concatenate([y[y >= 0] for y in labels[low:]])
    n_floor = max(len(floor_labels), 1)
    noise = min(float(floor_labels.sum()) / n_floor, 0.25)
    gate = (float(floor_labels.sum()) + 0.5) / (n_floor + 1)
    alpha = GATE_ALPHA / count  # one test per stratum: Bonferroni
    sims, weights, clean, stratum = [], [], [], []
    for h in range(len(picked)):
        known = labels[h] >= 0
        y, where = labels[h][known], picked[h][known]
        size = strata.bounds[h + 1] - strata.bounds[h]
        if len(y) == 0:
            continue
        counts = h < low and _binomial_tail(int(y.sum()), len(y), gate) < alpha
        denoised = (y - noise) / (1 - 2 * noise) if counts else np.zeros(len(y))
        sims.append(flat[where])
        weights.append(np.full(len(y), size / len(y)))
        clean.append(denoised)
        stratum.append(np.full(len(y), h))
    if not sims:
        return Thresholds(math.inf, math.inf, noise, 0.0, "no pair of the sample was answered")
    s, w, c, hs = (np.concatenate(x) for x in (sims, weights, clean, stratum))
    ranked = np.argsort(-s, kind="stable")
    s, w, c, hs = s[ranked], w[ranked], c[ranked], hs[ranked]
    matches = float((w * c).sum())
    if matches <= 0:
        why = f"the sample's yes rate nowhere rose above the judge's noise floor {noise:.3f}"
        return Thresholds(math.inf, math.inf, noise, 0.0, why)
    accept = _accept_threshold(s, w, c, precision_target)
    edges = [float(flat[strata.order[end - 1]]) for end in strata.bounds[1:]]
    reject = _reject_threshold(s, w, c, hs, accept, noise, recall_target, edges)
    why = (
        f"noise floor {noise:.3f}; about {matches:,.0f} matches; accept at similarity >= "
        f"{accept:.3f}, reject below {min(reject, accept):.3f}"
    )
    return Thresholds(accept, min(reject, accept), noise, matches, why)


def _accept_threshold(s: np.ndarray, w: np.ndarray, c: np.ndarray, target: float) -> float:
    """The lowest sampled similarity above which the de-noised precision's lower bound
    reaches ``target`` (at least 5 answers above it); ``inf``: none, every pair is asked.

    Only a "yes" that counts (``c > 0``) can be the threshold: accepting further down, where
    the sample saw no more matches, would add no match and only lower the precision.
    """
    best = math.inf
    cw, cwc = np.cumsum(w), np.cumsum(w * c)
    for k in range(4, len(s)):
        if c[k] <= 0 or (k + 1 < len(s) and s[k + 1] == s[k]):
            continue
        precision = cwc[k] / cw[k]
        spread = math.sqrt(float((w[: k + 1] ** 2 * (c[: k + 1] - precision) ** 2).sum())) / cw[k]
        if precision - CONFIDENCE_Z * spread >= target:
            best = float(s[k])
    return best


def _reject_threshold(
    s: np.ndarray,
    w: np.ndarray,
    c: np.ndarray,
    hs: np.ndarray,
    accept: float,
    noise: float,
    target: float,
    edges: Sequence[float],
) -> float:
    """The highest similarity at or above which the kept pairs' recall lower bound reaches
    ``target``, among the lowest similarities of the strata (``edges``), so that a stratum is
    kept whole or dropped whole; ``-inf``: every pair below ``accept`` is asked.

    Never a similarity inside a stratum (not even ``accept``): the pairs between a stratum's
    lowest sampled one and its lower edge were not sampled, and the few answers at the edge
    of a sample cannot tell how many of them match (a threshold there loses them unseen).
    """
    candidates = [*[e for e in edges if e <= accept], -math.inf]
    wc = w * c
    total = float(wc.sum())
    for t in candidates:
        kept = s >= t
        accepted = float(wc[s >= accept].sum())
        band = float(wc[kept & (s < accept)].sum())
        missed = total - accepted - band
        variance = 0.0
        for h in np.unique(hs):
            mine = hs == h
            missed_here = np.where(kept[mine], 0.0, c[mine])
            n = int(mine.sum())
            size = float(w[mine][0]) * n
            if n > 1:
                variance += size**2 * float(np.var(missed_here, ddof=1)) / n * (1 - n / size)
        bound = missed + CONFIDENCE_Z * math.sqrt(max(variance, 0.0))
        found = accepted + (1 - noise) * band
        if found / max(accepted + band + bound, 1e-12) >= target:
            return t
    return -math.inf


@dataclass
class CascadeRun:
    outcomes: Outcomes
    thresholds: Thresholds
    sampled: int
    band: int


def run_cascade(
    waves: Waves,
    predicate: Predicate,
    left: Items,
    right: Items,
    *,
    embedding_model: str,
    recall_target: float,
    precision_target: float,
    sample_size: int,
    seed: int,
    max_tokens: int | None,
) -> CascadeRun:
    similarity, unembedded = similarities(waves, left, right, embedding_model)
    flat = similarity.ravel()
    width = similarity.shape[1]
    if flat.size == 0:
        return CascadeRun(Outcomes.empty(), Thresholds(math.inf, math.inf, 0.0, 0.0, ""), 0, 0)
    strata = Strata.of(similarity, max(len(left), len(right)))
    picked = strata.sample(sample_size, seed)
    sample = np.concatenate(picked)
    pairs = [(int(p) // width, int(p) % width) for p in sample]
    answers = waves.ask(
        [pair_prompt(predicate, left, right, i, j) for i, j in pairs],
        schema=VERDICT,
        max_tokens=max_tokens,
    )
    answered: dict[int, int] = {}
    coded = np.array(
        [(1 if _yes(answers.values[n]) else 0) if answers.ok(n) else -1 for n in range(len(pairs))]
    )
    labels, at = [], 0
    for chunk in picked:
        labels.append(coded[at : at + len(chunk)])
        at += len(chunk)
    for n, p in enumerate(sample):
        answered[int(p)] = n
    thresholds = _calibrate(
        strata,
        picked,
        labels,
        flat,
        recall_target=recall_target,
        precision_target=precision_target,
    )
    if thresholds.matches <= 0:
        warnings.warn(
            f"llm_join's cascade found no similarity stratum where the model said yes more "
            f"often than its noise floor ({thresholds.noise_floor:.3f}) in a sample of "
            f"{len(pairs):,} pairs, so it joined nothing by similarity: either nothing "
            "matches, or the embedding does not rank the matches first. Try a larger "
            "sample_size=, another embedding_model=, or plan='nested' on a part to see",
            LlmOpsWarning,
            stacklevel=4,
        )
    outcomes = Outcomes.empty()
    for p in np.flatnonzero(flat >= thresholds.accept):
        outcomes.matches[(int(p) // width, int(p) % width)] = "similar"
    # A pair whose similarity is unknown (an embedding failed) is asked: nothing says it
    # does not match.
    between = (flat >= thresholds.reject) & (flat < thresholds.accept)
    band = [int(p) for p in np.flatnonzero(between | unembedded.ravel())]
    fresh = [p for p in band if p not in answered]
    new = waves.ask(
        [pair_prompt(predicate, left, right, p // width, p % width) for p in fresh],
        schema=VERDICT,
        max_tokens=max_tokens,
    )
    outcomes.judged([(p // width, p % width) for p in fresh], new)
    known = [p for p in band if p in answered]
    reused = Answers(
        [answers.values[answered[p]] for p in known],
        [answers.statuses[answered[p]] for p in known],
        [answers.errors[answered[p]] for p in known],
    )
    outcomes.judged([(p // width, p % width) for p in known], reused)
    return CascadeRun(outcomes, thresholds, len(pairs), len(band))


def similarities(
    waves: Waves, left: Items, right: Items, model: str
) -> tuple[np.ndarray, np.ndarray]:
    """Every left item's cosine similarity to every right item, and which pairs have none
    (an embedding failed: similarity 0)."""
    if len(left) * len(right) > MAX_CASCADE_PAIRS:
        raise ConfigError(
            f"the cascade compares {len(left):,} x {len(right):,} distinct rows, more than "
            f"{MAX_CASCADE_PAIRS:,} pairs in memory: join the left side in parts of "
            f"{max(MAX_CASCADE_PAIRS // max(len(right), 1), 1):,} rows and concatenate"
        )
    if not len(left) or not len(right):
        shape = (len(left), len(right))
        return np.zeros(shape, dtype=np.float32), np.zeros(shape, dtype=bool)
    left_vectors, left_errors = unit_vectors(
        waves, [left.text(i) for i in range(len(left))], model=model
    )
    right_vectors, right_errors = unit_vectors(
        waves, [right.text(j) for j in range(len(right))], model=model
    )
    left_failed = np.array([e is not None for e in left_errors], dtype=bool)
    right_failed = np.array([e is not None for e in right_errors], dtype=bool)
    unembedded = left_failed[:, None] | right_failed[None, :]
    return cosine(left_vectors, right_vectors), unembedded


# -- the result --------------------------------------------------------------------------------


def joined(
    left: pl.DataFrame,
    right: pl.DataFrame,
    left_items: Items,
    right_items: Items,
    outcomes: Outcomes,
    *,
    how: str,
    suffix: str,
    columns: Columns,
) -> pl.DataFrame:
    """The join's rows, from what the item pairs came to."""
    lrow, rrow = "__llm_ops_left_row", "__llm_ops_right_row"
    li, ri = "__llm_ops_left_item", "__llm_ops_right_item"
    left_keyed = left.with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).alias(lrow), pl.Series(li, left_items.of_row)
    )
    right_keyed = right.with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).alias(rrow), pl.Series(ri, right_items.of_row)
    )
    pair_rows: list[tuple[int, int | None, bool | None, str, str | None]] = [
        (i, j, True, status, None) for (i, j), status in outcomes.matches.items()
    ]
    pair_rows += [
        (i, j, None, status, error)
        for (i, j), (status, error) in outcomes.failed.items()
        if (i, j) not in outcomes.matches
    ]
    decided = pl.DataFrame(
        pair_rows,
        schema={
            li: pl.Int64,
            ri: pl.Int64,
            columns.output: pl.Boolean,
            columns.status: pl.String,
            columns.error: pl.String,
        },
        orient="row",
    )
    if how in ("inner", "left"):
        pairs = (
            left_keyed.join(decided, on=li, how="inner")
            .join(right_keyed, on=ri, how="left", suffix=suffix)
            .filter(pl.col(ri).is_null() | pl.col(rrow).is_not_null())
        )
        result = pairs
        if how == "left":
            unmatched = left_keyed.join(decided, on=li, how="anti").with_columns(
                pl.when(pl.col(li) >= 0).then(pl.lit(False)).alias(columns.output),
                pl.when(pl.col(li) >= 0)
                .then(pl.lit("ok"))
                .otherwise(pl.lit("skipped"))
                .alias(columns.status),
                pl.when(pl.col(li) >= 0)
                .then(pl.lit(None, dtype=pl.String))
                .otherwise(pl.lit("a column the predicate reads is null: not asked"))
                .alias(columns.error),
            )
            result = pl.concat([pairs, unmatched], how="diagonal_relaxed")
        result = result.sort(lrow, rrow, nulls_last=True)
        keep = [c for c in result.columns if c not in (li, ri, lrow, rrow)]
        body = [c for c in keep if c not in (columns.output, columns.status, columns.error)]
        result = result.select(*body, columns.output, columns.status, columns.error)
    else:
        per_item = decided.group_by(li).agg(
            pl.col(columns.output).any().alias("__any"),
            pl.col(columns.error).drop_nulls().first().alias(columns.error),
            pl.col(columns.status).filter(pl.col(columns.output)).first().alias("__status"),
            pl.col(columns.status).filter(pl.col(columns.output).is_null()).first().alias("__why"),
        )
        rows = left_keyed.filter(pl.col(li) >= 0).join(per_item, on=li, how="left")
        matched = pl.col("__any").fill_null(False)
        failed = ~matched & pl.col(columns.error).is_not_null()
        wanted = matched if how == "semi" else ~matched
        result = (
            rows.filter(wanted | failed)
            .with_columns(
                pl.when(failed).then(pl.lit(None)).otherwise(matched).alias(columns.output),
                pl.when(failed)
                .then(pl.col("__why"))
                .when(matched)
                .then(pl.col("__status"))
                .otherwise(pl.lit("ok"))
                .alias(columns.status),
            )
            .sort(lrow)
            .select(*left.columns, columns.output, columns.status, columns.error)
        )
    return result.with_columns(pl.col(columns.status).cast(STATUS_DTYPE))


# -- the operator ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    left: pl.DataFrame
    right: pl.DataFrame
    predicate: Predicate
    left_items: Items
    right_items: Items
    choice: Choice


def prepare(
    left: Any,
    right: Any,
    predicate: str,
    *,
    how: str,
    plan: str,
    embedding_model: str | None,
    recall_target: float,
    precision_target: float,
    sample_size: int,
    suffix: str,
    classify_max: int,
    nested_max: int,
    context_tokens: int | None,
    output: str,
) -> Prepared:
    """The checked arguments and each side's items: every ConfigError before a request."""
    if how not in HOWS:
        raise ConfigError(f"how must be one of {', '.join(map(repr, HOWS))}, got {how!r}")
    if plan not in PLANS:
        raise ConfigError(f"plan must be one of {', '.join(map(repr, PLANS))}, got {plan!r}")
    for name, value in (("recall_target", recall_target), ("precision_target", precision_target)):
        if not 0 < value < 1:
            raise ConfigError(f"{name} must be between 0 and 1 (exclusive), got {value!r}")
    if sample_size < 10:
        raise ConfigError(f"sample_size must be at least 10 pairs, got {sample_size!r}")
    if not suffix:
        raise ConfigError("suffix must be a non-empty text, e.g. '_right'")
    if plan == "cascade" and embedding_model is None:
        raise ConfigError("plan='cascade' needs embedding_model= (e.g. 'text-embedding-3-small')")
    if context_tokens is not None and context_tokens < 64:
        raise ConfigError(f"context_tokens must be at least 64, got {context_tokens!r}")
    left_frame, right_frame = to_polars(left), to_polars(right)
    added = Columns(output)
    shared = set(left_frame.columns) & set(right_frame.columns)
    result = {*left_frame.columns, *(c + suffix if c in shared else c for c in right_frame.columns)}
    taken = sorted(result & {added.output, added.status, added.error})
    if taken:
        raise ConfigError(
            f"llm_join adds the columns {added.output!r}, {added.status!r} and "
            f"{added.error!r}, but the joined rows already have {', '.join(map(repr, taken))}: "
            "pass another output= name"
        )
    parsed = parse_predicate(predicate, left_frame.schema, right_frame.schema, suffix=suffix)
    left_items = items_of(left_frame, parsed.left)
    right_items = items_of(right_frame, parsed.right)
    choice = choose_plan(
        plan,
        pairs=len(left_items) * len(right_items),
        right_items=len(right_items),
        embedding_model=embedding_model,
        classify_max=classify_max,
        nested_max=nested_max,
    )
    return Prepared(left_frame, right_frame, parsed, left_items, right_items, choice)


@overload
def llm_join(
    left: PolarsFrame,
    right: Any,
    /,
    predicate: str,
    *,
    model: ModelOption,
    how: How = "inner",
    plan: Plan = "auto",
    embedding_model: str | None = None,
    recall_target: float = 0.9,
    precision_target: float = 0.9,
    sample_size: int = SAMPLE_SIZE,
    seed: int = 0,
    suffix: str = "_right",
    output: str = "match",
    classify_max: int = CLASSIFY_MAX,
    nested_max: int = NESTED_MAX,
    context_tokens: int | None = None,
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> PolarsFrame: ...
@overload
def llm_join(
    left: PolarsFrame,
    right: Any,
    /,
    predicate: str,
    *,
    model: ModelOption,
    how: How = "inner",
    plan: Plan = "auto",
    embedding_model: str | None = None,
    recall_target: float = 0.9,
    precision_target: float = 0.9,
    sample_size: int = SAMPLE_SIZE,
    seed: int = 0,
    suffix: str = "_right",
    output: str = "match",
    classify_max: int = CLASSIFY_MAX,
    nested_max: int = NESTED_MAX,
    context_tokens: int | None = None,
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> tuple[PolarsFrame, RunReport]: ...
@overload
def llm_join(
    left: pa.Table,
    right: Any,
    /,
    predicate: str,
    *,
    model: ModelOption,
    how: How = "inner",
    plan: Plan = "auto",
    embedding_model: str | None = None,
    recall_target: float = 0.9,
    precision_target: float = 0.9,
    sample_size: int = SAMPLE_SIZE,
    seed: int = 0,
    suffix: str = "_right",
    output: str = "match",
    classify_max: int = CLASSIFY_MAX,
    nested_max: int = NESTED_MAX,
    context_tokens: int | None = None,
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> pa.Table: ...
@overload
def llm_join(
    left: pa.Table,
    right: Any,
    /,
    predicate: str,
    *,
    model: ModelOption,
    how: How = "inner",
    plan: Plan = "auto",
    embedding_model: str | None = None,
    recall_target: float = 0.9,
    precision_target: float = 0.9,
    sample_size: int = SAMPLE_SIZE,
    seed: int = 0,
    suffix: str = "_right",
    output: str = "match",
    classify_max: int = CLASSIFY_MAX,
    nested_max: int = NESTED_MAX,
    context_tokens: int | None = None,
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> tuple[pa.Table, RunReport]: ...
def llm_join(
    left: Frame,
    right: Any,
    /,
    predicate: str,
    *,
    model: ModelOption,
    how: How = "inner",
    plan: Plan = "auto",
    embedding_model: str | None = None,
    recall_target: float = 0.9,
    precision_target: float = 0.9,
    sample_size: int = SAMPLE_SIZE,
    seed: int = 0,
    suffix: str = "_right",
    output: str = "match",
    classify_max: int = CLASSIFY_MAX,
    nested_max: int = NESTED_MAX,
    context_tokens: int | None = None,
    return_report: bool = False,
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> Frame | tuple[Frame, RunReport]:
    """Join the rows of ``left`` and ``right`` for which the model says ``predicate`` holds.

    Each judgment shows the model the left row's columns that the predicate names, then the
    right row's, then the predicate, and asks for ``{"answer": true|false}`` (the classify plan:
    ``{"choice": "1".."n"|"none"}``). Rows are asked about once per distinct value of those
    columns; every judgment is cached, so a rerun sends nothing.

    Plans (``plan="auto"`` picks in this order; the report's ``plan`` and ``plan_why`` say
    which ran and why):

    - ``"nested"``: every pair asked, ``n_left x n_right`` calls in one wave. Auto up to
      ``nested_max`` pairs.
    - ``"classify"``: each left row asked once which of the right side's distinct rows the
      predicate holds for, ``n_left`` calls (more only when the options must be split to fit
      ``context_tokens``). It finds **at most one match per left row** (per option list): use
      it for many-to-one joins (a review and its product), not many-to-many. Auto when the
      right side has at most ``classify_max`` distinct rows.
    - ``"cascade"``: both sides embedded with ``embedding_model``; a sample of about
      ``sample_size`` pairs, drawn from strata of the similarity ranking (importance sampling
      that favours the similar pairs, SUPG-style), is labelled by the model in one wave; from
      it two similarity thresholds are calibrated: pairs above the accept threshold are joined
      without a call, pairs below the reject threshold are dropped, pairs between are asked
      in a second wave. The judge's noise floor (its "yes" rate on the least similar half of
      the pairs) is subtracted first. Guarantee, assuming the judge errs independently at one
      rate and strata indistinguishable from the floor hold no matches: with about 95%
      confidence, the pairs joined without a call have precision >= ``precision_target``, and
      the pairs joined or asked hold >= ``recall_target`` of the true matches (the band's
      answers being the model's). Auto for larger inputs when ``embedding_model`` is given;
      without it, auto raises :class:`~llm_ops.ConfigError` rather than send every pair.

    Parameters
    ----------
    left, right
        Polars DataFrames or LazyFrames, or pyarrow Tables; the result is of ``left``'s kind.
        A LazyFrame is collected: a join needs all its rows.
    predicate
        A yes/no question as a template over both sides' columns: ``"Is the review {text}
        about the product {name}?"``. A column both sides have is the left one's when written
        plainly and the right one's with ``suffix`` (``{name}`` vs ``{name_right}``); writing
        it plainly alone is ambiguous and a :class:`~llm_ops.TemplateError`.
    model
        The judging model.
    how
        ``"inner"``: the matched pairs; ``"left"``: those and each left row without a match
        (right columns null); ``"semi"``: the left rows with a match; ``"anti"``: those with
        none.
    plan
        ``"auto"``, ``"nested"``, ``"classify"`` or ``"cascade"`` (see above).
    embedding_model
        The cascade's embedding model.
    recall_target, precision_target
        The cascade's targets.
    sample_size
        About how many pairs the cascade labels to calibrate.
    seed
        The cascade's sampling seed: the same seed asks the same pairs.
    suffix
        Added to a right column whose name the left side has too, in the result and in the
        predicate.
    output
        The added columns: ``<output>`` (true: matched; false: a ``left``/``anti`` row without
        a match; null: its judgment failed or was not sent), ``<output>_status`` (``similar``
        for a pair the cascade joined by similarity alone; ``skipped`` for one a spent budget
        left unasked, or a row with a null in the predicate's columns) and ``<output>_error``.
    classify_max, nested_max
        The sizes up to which ``plan="auto"`` classifies or asks every pair.
    context_tokens
        The model's context per request: the classify plan splits the options over several
        calls so each fits.
    return_report
        Also return the :class:`~llm_ops.RunReport` (a LazyFrame too is computed at once).
    client, **options
        As for :func:`~llm_ops.llm_complete` (``endpoint``, ``cache``, ``budget``, ...).

    Examples
    --------
    >>> import polars as pl
    >>> from llm_ops import llm_join
    >>> from llm_ops.testing import LocalEndpoint
    >>> reviews = pl.DataFrame({"review": ["Sturdy boots [entity=1]", "Warm coat [entity=2]",
    ...                                    "Lost parcel [entity=9]"]})
    >>> products = pl.DataFrame({"product": ["Coat [entity=2]", "Boots [entity=1]"]})
    >>> with LocalEndpoint() as endpoint:
    ...     pairs = llm_join(reviews, products, "Is {review} about {product}?", model="sim",
    ...                      endpoint=endpoint.base_url, cache=False)
    >>> pairs.select("review", "product", "match")
    shape: (2, 3)
    ┌─────────────────────────┬──────────────────┬───────┐
    │ review                  ┆ product          ┆ match │
    │ ---                     ┆ ---              ┆ ---   │
    │ str                     ┆ str              ┆ bool  │
    ╞═════════════════════════╪══════════════════╪═══════╡
    │ Sturdy boots [entity=1] ┆ Boots [entity=1] ┆ true  │
    │ Warm coat [entity=2]    ┆ Coat [entity=2]  ┆ true  │
    └─────────────────────────┴──────────────────┴───────┘
    """
    prepared = prepare(
        left,
        right,
        predicate,
        how=how,
        plan=plan,
        embedding_model=embedding_model,
        recall_target=recall_target,
        precision_target=precision_target,
        sample_size=sample_size,
        suffix=suffix,
        classify_max=classify_max,
        nested_max=nested_max,
        context_tokens=context_tokens,
        output=output,
    )
    columns = Columns(output)
    with Waves("llm_join", model=model, client=client, options=options) as waves:
        outcomes, why = _run(
            waves,
            prepared,
            embedding_model,
            recall_target,
            precision_target,
            sample_size,
            seed,
            context_tokens,
        )
        waves.plan, waves.plan_why = prepared.choice.plan, why
        result = joined(
            prepared.left,
            prepared.right,
            prepared.left_items,
            prepared.right_items,
            outcomes,
            how=how,
            suffix=suffix,
            columns=columns,
        )
        report = waves.finish(result.select(columns.status, columns.error), columns)
    shaped = same_kind(left, result)
    return (shaped, report) if return_report else shaped


def _run(
    waves: Waves,
    prepared: Prepared,
    embedding_model: str | None,
    recall_target: float,
    precision_target: float,
    sample_size: int,
    seed: int,
    context_tokens: int | None,
) -> tuple[Outcomes, str]:
    p, left, right = prepared.predicate, prepared.left_items, prepared.right_items
    why = prepared.choice.why
    if prepared.choice.plan == "nested":
        return run_nested(waves, p, left, right, VERDICT_TOKENS), why
    if prepared.choice.plan == "classify":
        groups = option_groups(p, left, right, context_tokens)
        if len(groups) > 1:
            why += f"; options split over {len(groups)} calls per left row to fit the context"
        return run_classify(waves, p, left, right, groups), why
    assert embedding_model is not None
    run = run_cascade(
        waves,
        p,
        left,
        right,
        embedding_model=embedding_model,
        recall_target=recall_target,
        precision_target=precision_target,
        sample_size=sample_size,
        seed=seed,
        max_tokens=VERDICT_TOKENS,
    )
    why += f"; {run.sampled:,} pairs sampled, {run.band:,} asked between thresholds; "
    return run.outcomes, why + run.thresholds.why


@plans(llm_join)
def plan_join(
    left: Any,
    /,
    right: Any,
    predicate: str,
    *,
    model: ModelOption,
    how: str = "inner",
    plan: str = "auto",
    embedding_model: str | None = None,
    recall_target: float = 0.9,
    precision_target: float = 0.9,
    sample_size: int = SAMPLE_SIZE,
    seed: int = 0,
    suffix: str = "_right",
    output: str = "match",
    classify_max: int = CLASSIFY_MAX,
    nested_max: int = NESTED_MAX,
    context_tokens: int | None = None,
    client: Client | None = None,
    **options: Any,
) -> SetEstimate:
    """What :func:`llm_join` would ask: the nested loop's and the classify plan's calls are
    counted exactly from the distinct rows; the cascade's sample is counted exactly too (the
    planner embeds both sides, cached and cheap), and its band, which only the labelled sample
    reveals, is estimated as one sampling interval of the top stratum: what is asked when
    the embedding ranks the matches first and the sample certifies their precision. When it
    cannot (a judge erring often on the top stratum's sample), the band is that whole
    stratum, up to ``max(n_left, n_right)`` calls more than estimated."""
    prepared = prepare(
        left,
        right,
        predicate,
        how=how,
        plan=plan,
        embedding_model=embedding_model,
        recall_target=recall_target,
        precision_target=precision_target,
        sample_size=sample_size,
        suffix=suffix,
        classify_max=classify_max,
        nested_max=nested_max,
        context_tokens=context_tokens,
        output=output,
    )
    p, li, ri = prepared.predicate, prepared.left_items, prepared.right_items
    mean_left = _mean_chars(li, "Left item:")
    mean_right = _mean_chars(ri, "Right item:")
    pair_chars = mean_left + mean_right + len(p.question("left", "right")) + 40
    chosen = prepared.choice
    if chosen.plan == "nested":
        calls, waves, chars, out = len(li) * len(ri), 1, pair_chars, VERDICT_TOKENS
    elif chosen.plan == "classify":
        groups = option_groups(p, li, ri, context_tokens)
        calls = len(li) * len(groups)
        waves = len({len(g) for g in groups}) if calls else 0
        chars = mean_left + mean_right * len(ri) / max(len(groups), 1) + CHOICE_CHARS
        out = CHOICE_TOKENS
    else:
        assert embedding_model is not None
        with Waves("llm_join", model=model, client=client, options=options) as embedder:
            similarity, unembedded = similarities(embedder, li, ri, embedding_model)
        strata = Strata.of(similarity, max(len(li), len(ri)))
        picked = strata.sample(sample_size, seed)
        # The band: the top stratum's pairs below its lowest sampled match, about one
        # sampling interval of it when the embedding separates the matches.
        band = round(strata.bounds[1] / max(len(picked[0]), 1)) if picked else 0
        calls = sum(len(x) for x in picked) + band + int(unembedded.sum())
        waves, chars, out = 2 if band else 1, pair_chars, VERDICT_TOKENS
    return priced(
        "llm_join",
        plan=chosen.plan,
        plan_why=chosen.why,
        calls=calls,
        waves=waves if calls else 0,
        prompt_chars=chars,
        output_tokens=out,
        model=model,
        options=options,
    )


def _mean_chars(items: Items, title: str) -> float:
    if not len(items):
        return 0.0
    return sum(len(items.block(title, i)) for i in range(len(items))) / len(items)
