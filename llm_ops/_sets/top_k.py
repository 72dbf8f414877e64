"""Top-k and rank: the best rows of a frame (or of each group) by a criterion in words.

A model compares two rows at a time (``{"better": "A" | "B"}``), or ranks a window of rows in
one call (``{"ranking": [...]}``); the plans that combine those judgments, and what each
costs and guarantees, are in :mod:`._ranking`. Every judgment goes through the operator's
waves (:mod:`._waves`): cached, deduped, budgeted, batched, with statuses.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Unpack, overload

import numpy as np
import polars as pl
import pyarrow as pa

from .._client import Client
from .._frames import Frame, PolarsFrame, same_kind, to_polars
from .._options import Columns, ModelOption
from .._report import RunReport
from .._status import STATUS_DTYPE
from ..exceptions import ConfigError
from . import plans
from ._pairs import unit_vectors
from ._ranking import (
    Judge,
    Pair,
    Ranked,
    all_pairs,
    all_pairs_calls,
    final_size,
    listwise,
    listwise_calls,
    max_waves,
    quickselect,
    quickselect_calls,
    seeded_coin,
)
from ._waves import InPlace, SetEstimate, SetOptions, Waves, priced

Method = Literal["auto", "quickselect", "listwise", "all_pairs"]
METHODS: tuple[str, ...] = ("auto", "quickselect", "listwise", "all_pairs")

COMPARISON: dict[str, Any] = {
    "title": "comparison",
    "type": "object",
    "properties": {"better": {"type": "string", "enum": ["A", "B"]}},
    "required": ["better"],
    "additionalProperties": False,
}
RANKING: dict[str, Any] = {
    "title": "ranking",
    "type": "object",
    "properties": {"ranking": {"type": "array", "items": {"type": "integer"}}},
    "required": ["ranking"],
    "additionalProperties": False,
}
COMPARISON_TOKENS = 16
"""``max_tokens`` of a comparison: ``{"better": "A"}`` is about 6 tokens."""


def comparison_prompt(criterion: str, first: str, second: str) -> str:
    """A comparison's prompt: the criterion, then the two items, ``A`` first."""
    return (
        f"Criterion: {criterion}\n\nWhich of the two items is better by the criterion? "
        f"Answer A or B.\n\nA: {first}\n\nB: {second}"
    )


def ranking_prompt(criterion: str, items: Sequence[str]) -> str:
    """A ranking's prompt: the criterion, then the items numbered from 1."""
    listed = "\n".join(f"{i}. {text}" for i, text in enumerate(items, start=1))
    return (
        f"Criterion: {criterion}\n\nRank the {len(items)} items below by the criterion, best "
        f"first: answer with their numbers (1 to {len(items)}), each once.\n\n{listed}"
    )


@dataclass
class _Trail:
    """What an item's judgments came to: for its row's status and error."""

    judged: int = 0
    sent: int = 0
    failed: int = 0
    skipped: int = 0
    error: str | None = None


class _ModelJudge(Judge):
    """The plans' judge: each call one wave of prompts on ``waves``, each answer read back
    as the better item (or a window's order), and noted on the items it judged."""

    def __init__(self, waves: Waves, criterion: str, texts: Sequence[str]) -> None:
        self.waves = waves
        self.criterion = criterion
        self.texts = texts
        self.trails: dict[int, _Trail] = {}

    def compare(self, pairs: Sequence[Pair]) -> list[int | None]:
        prompts = [
            comparison_prompt(self.criterion, self.texts[a], self.texts[b]) for a, b in pairs
        ]
        answers = self.waves.ask(prompts, schema=COMPARISON, max_tokens=COMPARISON_TOKENS)
        better: list[int | None] = []
        for i, (first, second) in enumerate(pairs):
            value = answers.values[i] if answers.ok(i) else None
            label = value.get("better") if isinstance(value, dict) else None
            winner = first if label == "A" else second if label == "B" else None
            error = answers.errors[i]
            if winner is None and answers.ok(i):
                error = f"the comparison answered {value!r}, not A or B"
            self._note((first, second), answers.statuses[i], error, winner is None)
            better.append(winner)
        return better

    def rank(self, windows: Sequence[Sequence[int]]) -> list[list[int] | None]:
        prompts = [ranking_prompt(self.criterion, [self.texts[i] for i in w]) for w in windows]
        answers = self.waves.ask(
            prompts, schema=RANKING, max_tokens=16 + 4 * max(map(len, windows))
        )
        orders: list[list[int] | None] = []
        for i, window in enumerate(windows):
            value = answers.values[i] if answers.ok(i) else None
            numbers = value.get("ranking") if isinstance(value, dict) else None
            order = _order(window, numbers)
            error = answers.errors[i]
            if order is None and answers.ok(i):
                error = f"the ranking answered {numbers!r}, not a list of the items' numbers"
            self._note(window, answers.statuses[i], error, order is None)
            orders.append(order)
        return orders

    def _note(self, items: Sequence[int], status: str, error: str | None, failed: bool) -> None:
        for item in items:
            trail = self.trails.setdefault(item, _Trail())
            trail.judged += 1
            trail.sent += status not in ("cached", "similar", "skipped")
            if failed:
                trail.skipped += status == "skipped"
                trail.failed += status != "skipped"
                trail.error = trail.error or error


def _order(window: Sequence[int], numbers: object) -> list[int] | None:
    """A window's items in the order a ranking answered: its numbers (1-based) in order, each
    once, then any it left out in the window's order; ``None`` when it named none of them."""
    if not isinstance(numbers, list):
        return None
    seen: list[int] = []
    for number in numbers:
        if isinstance(number, int) and 1 <= number <= len(window) and number - 1 not in seen:
            seen.append(number - 1)
    if not seen:
        return None
    seen += [i for i in range(len(window)) if i not in seen]
    return [window[i] for i in seen]


@dataclass(frozen=True)
class _Choice:
    method: str
    why: str


def _choose(method: str, sizes: Sequence[int], k: int, window: int, embedding: bool) -> _Choice:
    """The plan that runs, and why (``method="auto"``: all pairs when every group is as small
    as quickselect's final round, else quickselect)."""
    largest = max(sizes, default=0)
    if method == "all_pairs":
        return _Choice(method, "asked for: every pair compared once, ranked by wins")
    if method == "listwise":
        return _Choice(
            method, f"asked for: windows of {window} rows ranked in one call, the best {k} go on"
        )
    pivot = "pivots from embedding order" if embedding else "seeded random pivots"
    if method == "quickselect":
        return _Choice(method, f"asked for: batched quickselect with {pivot}")
    if largest <= final_size(k):
        return _Choice(
            "all_pairs",
            f"auto: the largest group has {largest} rows, no more than quickselect ranks by all "
            f"pairs at its end ({final_size(k)} for k={k}), so every pair is compared, in one wave",
        )
    return _Choice(
        "quickselect",
        f"auto: the largest group has {largest} rows; all pairs would ask "
        f"{all_pairs_calls(largest):,} comparisons, batched quickselect ({pivot}) about "
        f"{quickselect_calls(largest, k, by_embedding=embedding)[0]:,.0f}",
    )


def _check(
    frame_schema: pl.Schema,
    column: str,
    criterion: str,
    k: int,
    by: str | Sequence[str] | None,
    method: str,
    window: int,
    seed: int,
    output: str,
) -> list[str]:
    """The arguments checked before anything is sent; the group columns."""
    if column not in frame_schema:
        raise ConfigError(f"llm_top_k: no column {column!r}; the frame has {list(frame_schema)}")
    if not isinstance(criterion, str) or not criterion.strip():
        raise ConfigError("llm_top_k needs a criterion in words, e.g. 'the most helpful review'")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"k must be a whole number of rows, at least 1; got {k!r}")
    if method not in METHODS:
        raise ConfigError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise ConfigError(
            f"window must be a whole number of rows per call, at least 2; got {window!r}"
        )
    if method == "listwise" and window <= k:
        raise ConfigError(
            f"method='listwise' keeps the best k={k} of each window of {window} rows, so it needs "
            f"window > k: pass window={max(2 * k, 20)} (a longer prompt) or use quickselect"
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer; got {seed!r}")
    keys = [by] if isinstance(by, str) else list(by or [])
    for key in keys:
        if key not in frame_schema:
            raise ConfigError(
                f"llm_top_k: no group column {key!r}; the frame has {list(frame_schema)}"
            )
    columns = Columns(output)
    taken = [c for c in (columns.output, columns.status, columns.error) if c in frame_schema]
    if taken:
        raise ConfigError(f"the frame already has {taken}: pass another output= name")
    return keys


def _groups(frame: pl.DataFrame, column: str, keys: list[str]) -> list[list[int]]:
    """Each group's rows with a value (row numbers, in frame order), groups in order of
    first appearance."""
    numbered = frame.select(column, *keys).with_row_index("__llm_ops_row")
    valued = numbered.filter(pl.col(column).is_not_null())
    if not keys:
        return [valued["__llm_ops_row"].to_list()] if valued.height else []
    grouped = valued.group_by(keys, maintain_order=True).agg(pl.col("__llm_ops_row"))
    return [list(rows) for rows in grouped["__llm_ops_row"].to_list()]


@overload
def llm_top_k(
    df: PolarsFrame,
    /,
    column: str,
    criterion: str,
    *,
    k: int,
    model: ModelOption,
    by: str | Sequence[str] | None = None,
    method: Method = "auto",
    embedding_model: str | None = None,
    window: int = 20,
    seed: int = 0,
    output: str = "rank",
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> PolarsFrame: ...
@overload
def llm_top_k(
    df: PolarsFrame,
    /,
    column: str,
    criterion: str,
    *,
    k: int,
    model: ModelOption,
    by: str | Sequence[str] | None = None,
    method: Method = "auto",
    embedding_model: str | None = None,
    window: int = 20,
    seed: int = 0,
    output: str = "rank",
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> tuple[PolarsFrame, RunReport]: ...
@overload
def llm_top_k(
    df: pa.Table,
    /,
    column: str,
    criterion: str,
    *,
    k: int,
    model: ModelOption,
    by: str | Sequence[str] | None = None,
    method: Method = "auto",
    embedding_model: str | None = None,
    window: int = 20,
    seed: int = 0,
    output: str = "rank",
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> pa.Table: ...
@overload
def llm_top_k(
    df: pa.Table,
    /,
    column: str,
    criterion: str,
    *,
    k: int,
    model: ModelOption,
    by: str | Sequence[str] | None = None,
    method: Method = "auto",
    embedding_model: str | None = None,
    window: int = 20,
    seed: int = 0,
    output: str = "rank",
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> tuple[pa.Table, RunReport]: ...
def llm_top_k(
    df: Frame,
    /,
    column: str,
    criterion: str,
    *,
    k: int,
    model: ModelOption,
    by: str | Sequence[str] | None = None,
    method: Method = "auto",
    embedding_model: str | None = None,
    window: int = 20,
    seed: int = 0,
    output: str = "rank",
    return_report: bool = False,
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> Frame | tuple[Frame, RunReport]:
    """The ``k`` best rows by ``criterion`` (in each group of ``by``), best first, ranked.

    The model judges ``column``'s values: two at a time (JSON ``{"better": "A"|"B"}``), or a
    window at a time (``{"ranking": [...]}``, ``method="listwise"``). The plans:

    ``"all_pairs"``
        Every pair compared once, ranked by wins: ``n(n-1)/2`` comparisons in one wave. The
        naive baseline, and the most robust to a noisy judge.
    ``"quickselect"``
        Batched quickselect: candidates are split around a pivot, each wave sending every
        group's comparisons at once, until the boundary of the best ``k`` (plus a slack) is
        narrowed to a few candidates, which all pairs then rank. A row is dropped only after
        losing to the pivot twice, shown once in each order; a judge wrong 5% of the time drops
        a better row once in 400. About ``3n`` comparisons with random pivots, fewer with
        ``embedding_model`` (pivots from the rows' order by embedding similarity to the
        criterion), in at most ``2·log2(n)`` waves.
    ``"listwise"``
        A listwise tournament (as ListK, arXiv 2603.17223): windows of ``window`` rows ranked
        in one call each, the best ``k`` of each go on, until one window ranks the last; about
        ``n / (window - k)`` calls; needs ``window > k``.
    ``"auto"``
        All pairs when every group is small (as small as quickselect's final round), else
        quickselect; :func:`llm_ops.last_report`'s ``plan`` and ``plan_why`` say which ran and
        why.

    Each pair is shown in one fixed order, drawn by a coin seeded with ``seed`` and the two
    values, so a judge that favours the first item favours each row equally often, and a
    rerun asks exactly the same judgments (answered by the cache). A failed comparison counts
    for neither row (quickselect keeps the row among the candidates; a failed ranking keeps
    its window's order); the row's status says its rank rests on failed judgments. Rows whose
    ``column`` is null are never ranked. All rows are needed at once, so a LazyFrame is
    collected.

    Parameters
    ----------
    df
        A Polars DataFrame or LazyFrame, or a pyarrow Table; the result is of the same kind.
    column
        The column whose values are judged (their text).
    criterion
        What "better" means, in words: ``"the most helpful review"``.
    k
        How many rows to keep (per group).
    model
        The judging model.
    by
        Group column(s): the best ``k`` of each group, every group's judgments in the same
        waves; the group keys are kept.
    method
        ``"auto"``, ``"quickselect"``, ``"listwise"`` or ``"all_pairs"`` (see above).
    embedding_model
        An embedding model whose similarity to the criterion orders the rows quickselect
        takes its pivots from (embeddings are cached as any); ``None``: seeded random pivots.
    window
        Rows ranked per call by ``method="listwise"``.
    seed
        Seeds the pivots, the windows and the order pairs are shown in.
    output
        The rank column's name (1 is best); ``<output>_status`` and ``<output>_error`` say
        whether a rank rests on failed (``failed``), unsent (``skipped``, budget) or unsettled
        (``truncated``: the wave limit) judgments.
    return_report
        Return ``(frame, RunReport)``.
    client
        A :class:`~llm_ops.Client` to run on, instead of one made from the options.
    **options
        As for :func:`~llm_ops.llm_complete` but ``schema`` and ``output`` (``endpoint``,
        ``cache``, ``budget``, ``batch``, ``system``, ...).

    Examples
    --------
    >>> import polars as pl
    >>> from llm_ops import llm_top_k
    >>> from llm_ops.testing import LocalEndpoint
    >>> reviews = pl.DataFrame({
    ...     "shop": ["north", "north", "north", "south", "south"],
    ...     "text": ["Fine [score=0.5]", "Superb [score=0.9]", "Poor [score=0.1]",
    ...              "Good [score=0.7]", "Great [score=0.8]"]})
    >>> with LocalEndpoint() as endpoint:
    ...     best = llm_top_k(reviews, "text", "the most helpful review", k=2, by="shop",
    ...                      model="sim", endpoint=endpoint.base_url, cache=False)
    >>> best.select("shop", "text", "rank", "rank_status")
    shape: (4, 4)
    ┌───────┬────────────────────┬──────┬─────────────┐
    │ shop  ┆ text               ┆ rank ┆ rank_status │
    │ ---   ┆ ---                ┆ ---  ┆ ---         │
    │ str   ┆ str                ┆ u32  ┆ enum        │
    ╞═══════╪════════════════════╪══════╪═════════════╡
    │ north ┆ Superb [score=0.9] ┆ 1    ┆ ok          │
    │ north ┆ Fine [score=0.5]   ┆ 2    ┆ ok          │
    │ south ┆ Great [score=0.8]  ┆ 1    ┆ ok          │
    │ south ┆ Good [score=0.7]   ┆ 2    ┆ ok          │
    └───────┴────────────────────┴──────┴─────────────┘
    """
    result, report = _top_k(
        to_polars(df),
        column,
        criterion,
        k=k,
        model=model,
        by=by,
        method=method,
        embedding_model=embedding_model,
        window=window,
        seed=seed,
        output=output,
        client=client,
        options=options,
    )
    kept = same_kind(df, result)
    return (kept, report) if return_report else kept


def _top_k(
    frame: pl.DataFrame,
    column: str,
    criterion: str,
    *,
    k: int,
    model: ModelOption,
    by: str | Sequence[str] | None,
    method: str,
    embedding_model: str | None,
    window: int,
    seed: int,
    output: str,
    client: Client | None,
    options: Mapping[str, Any],
    in_place: InPlace | None = None,
) -> tuple[pl.DataFrame, RunReport]:
    """:func:`llm_top_k` on an eager frame (its waves run ``in_place`` when given)."""
    keys = _check(frame.schema, column, criterion, k, by, method, window, seed, output)
    groups = _groups(frame, column, keys)
    texts = [str(v) if v is not None else "" for v in frame[column].to_list()]
    choice = _choose(method, [len(g) for g in groups], k, window, embedding_model is not None)
    columns = Columns(output)
    with Waves(
        "llm_top_k", model=model, client=client, options=options, in_place=in_place
    ) as waves:
        waves.plan, waves.plan_why = choice.method, choice.why
        judge = _ModelJudge(waves, criterion, texts)
        ranked = _run(
            choice.method, judge, waves, groups, texts, criterion, k, window, seed, embedding_model
        )
        if ranked.unsettled:
            waves.plan_why += (
                f"; the wave limit left {len(ranked.unsettled)} candidate(s) ordered by the share "
                "of comparisons they won"
            )
        rows = [row for best in ranked.best for row in best]
        added = _added(ranked, judge, columns, rows)
        report = waves.finish(added, columns)
    result = pl.concat([frame[rows], added], how="horizontal") if rows else _empty(frame, added)
    return result, report


def _run(
    method: str,
    judge: _ModelJudge,
    waves: Waves,
    groups: list[list[int]],
    texts: list[str],
    criterion: str,
    k: int,
    window: int,
    seed: int,
    embedding_model: str | None,
) -> Ranked:
    orient = seeded_coin(seed, key=texts.__getitem__)
    if method == "all_pairs":
        return all_pairs(judge, groups, k, orient)
    if method == "listwise":
        shuffled = [random.Random(f"{seed}:{i}").sample(g, len(g)) for i, g in enumerate(groups)]
        return listwise(judge, shuffled, k, window)
    ordered = groups
    if embedding_model is not None:
        vectors, _ = unit_vectors(waves, [criterion, *texts], model=embedding_model)
        similarity = _similarity(vectors)
        ordered = [sorted(g, key=lambda row: -float(similarity[row])) for g in groups]
    largest = max((len(g) for g in groups), default=1)
    return quickselect(
        judge,
        ordered,
        k,
        orient,
        by_embedding=embedding_model is not None,
        seed=seed,
        max_waves=max_waves(largest),
    )


def _added(ranked: Ranked, judge: _ModelJudge, columns: Columns, rows: list[int]) -> pl.DataFrame:
    """The rank, status and error columns of the kept rows."""
    ranks = [place + 1 for best in ranked.best for place in range(len(best))]
    statuses: list[str] = []
    errors: list[str | None] = []
    for row in rows:
        trail = judge.trails.get(row, _Trail())
        if trail.failed:
            statuses.append("failed")
            errors.append(f"its rank rests on {trail.failed} failed judgment(s): {trail.error}")
        elif trail.skipped:
            statuses.append("skipped")
            errors.append(f"its rank rests on {trail.skipped} judgment(s) not sent: {trail.error}")
        elif row in ranked.unsettled:
            statuses.append("truncated")
            errors.append("its rank is estimated: the wave limit was reached before it was settled")
        else:
            statuses.append("cached" if trail.judged and not trail.sent else "ok")
            errors.append(None)
    return pl.DataFrame(
        {
            columns.output: pl.Series(ranks, dtype=pl.UInt32),
            columns.status: pl.Series(statuses, dtype=STATUS_DTYPE),
            columns.error: pl.Series(errors, dtype=pl.String),
        }
    )


def _empty(frame: pl.DataFrame, added: pl.DataFrame) -> pl.DataFrame:
    return pl.concat([frame.clear(), added.clear()], how="horizontal")


@plans(llm_top_k)
def plan_top_k(
    df: Any,
    /,
    column: str,
    criterion: str,
    *,
    k: int,
    model: ModelOption,
    by: str | Sequence[str] | None = None,
    method: Method = "auto",
    embedding_model: str | None = None,
    window: int = 20,
    seed: int = 0,
    output: str = "rank",
    return_report: bool = False,
    client: Client | None = None,
    **options: Any,
) -> SetEstimate:
    """What :func:`llm_top_k` would ask: exact for all pairs and listwise (their judgments do
    not depend on the answers); for quickselect, the mean of seeded runs of the same plan on
    a judge that is right (an embedding taken as exact: a rough one asks more)."""
    frame = to_polars(df)
    keys = _check(frame.schema, column, criterion, k, by, method, window, seed, output)
    groups = _groups(frame, column, keys)
    sizes = [len(g) for g in groups]
    embedding = embedding_model is not None
    choice = _choose(method, sizes, k, window, embedding)
    lengths = frame[column].drop_nulls().cast(pl.String).str.len_chars()
    text = float(lengths.mean() or 0.0) if lengths.len() else 0.0  # type: ignore[arg-type]
    calls = waves = 0
    output_tokens = 6.0
    if choice.method == "listwise":
        for n in sizes:
            c, w = listwise_calls(n, k, window)
            calls, waves = calls + c, max(waves, w)
        chars = len(ranking_prompt(criterion, [""] * window)) + window * (text + 4)
        output_tokens = 6.0 + 2 * window
    else:
        for n in sizes:
            if choice.method == "all_pairs":
                c, w = all_pairs_calls(n), 1 if n > 1 else 0
            else:
                mean, w = quickselect_calls(n, k, by_embedding=embedding)
                c = round(mean)
            calls, waves = calls + c, max(waves, w)
        chars = len(comparison_prompt(criterion, "", "")) + 2 * text
    return priced(
        "llm_top_k",
        plan=choice.method,
        plan_why=choice.why,
        calls=calls,
        waves=waves,
        prompt_chars=chars,
        output_tokens=output_tokens,
        model=model,
        options=options,
    )


def _similarity(vectors: np.ndarray) -> np.ndarray:
    """Each row's cosine similarity to the criterion (the first of the unit ``vectors``)."""
    return np.asarray(vectors[1:] @ vectors[0], dtype=np.float32)


def ranks_of(
    values: pl.Series,
    criterion: str,
    *,
    k: int | None,
    model: ModelOption,
    method: str,
    window: int,
    seed: int,
    client: Client,
    options: Mapping[str, Any],
    in_place: InPlace,
) -> list[int | None]:
    """Each value's rank among ``values`` by ``criterion`` (``None``: null, or not among the
    best ``k``; ``k=None``: every value is ranked), as :func:`llm_top_k` ranks them, its waves
    run ``in_place``: for the ``llm`` expressions ``top_k`` and ``rank``."""
    frame = pl.DataFrame({"value": values.cast(pl.String)}).with_row_index("row")
    best, _ = _top_k(
        frame,
        "value",
        criterion,
        k=max(1, frame.height) if k is None else k,
        model=model,
        by=None,
        method=method,
        embedding_model=None,
        window=window,
        seed=seed,
        output="rank",
        client=client,
        options=options,
        in_place=in_place,
    )
    ranks: list[int | None] = [None] * frame.height
    for row, rank in zip(best["row"].to_list(), best["rank"].to_list(), strict=True):
        ranks[row] = rank
    return ranks


__all__ = ["llm_top_k", "ranks_of"]
