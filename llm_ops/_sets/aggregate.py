"""``llm_aggregate``: a column's values folded into one answer per group, by a tree fold.

A group's values, in a fixed order, are packed into as few requests as the model's context
holds; each request's answer stands for its values, and the answers are packed and folded
again, level after level, until one request holds them all: its answer is the group's. Each
level is one wave (:class:`~._waves.Waves`) for every group at once, so the wall time is the
deepest group's depth in round trips, not the sum over groups, and each judgment is cached: a
rerun sends nothing.

The context is the endpoint's where it says (llama.cpp's ``GET /props``), else
``context_tokens=``, else :data:`DEFAULT_CONTEXT_TOKENS`. Tokens are estimated as everywhere
in llm-ops (four characters a token) and taken :data:`TOKENIZER_SLACK` times over, so a
tokenizer that counts more (digits and brackets, as LLaMA's does) still fits; an answer counts
as ``max_tokens`` when it was cut there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Unpack, overload

import polars as pl
import pyarrow as pa

from .._client import Client
from .._frames import PolarsFrame, same_kind, schema_of, to_polars
from .._options import Columns, ModelOption, SchemaOption
from .._pricing import CHARS_PER_TOKEN, approx_tokens
from .._report import RunReport
from .._status import STATUS_DTYPE
from ..exceptions import ConfigError
from . import plans
from ._waves import Answers, InPlace, SetEstimate, SetOptions, Waves, priced

DEFAULT_CONTEXT_TOKENS = 8192
"""The context assumed when the endpoint does not say (``/props``) and ``context_tokens=`` is
unset: what today's hosted models all hold, so packing to it never overflows them."""
TOKENIZER_SLACK = 1.5
"""How many times the four-characters-a-token estimate a request's text is counted: LLaMA's
tokenizer counts text with facts and numbers (``[score=0.83]``) up to 1.4 times over it."""
TEMPLATE_TOKENS = 32
"""Tokens kept for the chat template around the messages (LLaMA-2's takes about 20)."""
MAX_ANSWER_TOKENS = 512
"""The largest default ``max_tokens``: a quarter of the context, up to this."""
ESTIMATED_ANSWER_CHARS = 100
"""How long the planner takes each answer to be (at most ``max_tokens``): a summary is about
as long whatever it summarises. Longer answers fold in more levels, and cost a few more calls,
than estimated; the values' requests, most of the calls, do not depend on it."""
MIN_ROOM_TOKENS = 64
"""The fewest tokens of values a request must have room for, or the arguments are refused."""

_ITEM_CHARS = 8  # "[123] " and the line's end, around each value
_LEAF = "The values, in order:"
_UPPER = (
    "The values were answered in parts; the answers of the parts, in order, follow. "
    "Combine them into one answer for all the values:"
)


@dataclass
class _Group:
    """One group's fold: the items of its current level and what became of it."""

    items: list[str]
    weights: list[float]
    leaf: bool = True
    answer: Any = None
    done: bool = False
    statuses: set[str] = field(default_factory=set)
    error: str | None = None
    failed: str | None = None
    cut: int = 0
    truncated: int = 0
    calls: int = 0
    depth: int = 0


@dataclass(frozen=True)
class _Room:
    """What one request of the fold holds, in tokens as estimated (times the slack)."""

    context: int
    source: str
    max_tokens: int
    items: float  # tokens of values (with their markers) one request holds

    def weight(self, text: str) -> float:
        return TOKENIZER_SLACK * (len(text) + _ITEM_CHARS) / CHARS_PER_TOKEN

    def cut(self, text: str, tokens: float) -> str:
        """``text`` cut to weigh ``tokens`` at most."""
        chars = max(1, math.floor(tokens * CHARS_PER_TOKEN / TOKENIZER_SLACK) - _ITEM_CHARS - 1)
        return text[:chars] + "…"


def _room(
    instruction: str,
    system: str | None,
    *,
    context: int,
    source: str,
    max_tokens: int | None,
) -> _Room:
    answer = min(MAX_ANSWER_TOKENS, context // 4) if max_tokens is None else max_tokens
    header = len(instruction) + len(_UPPER) + 2 + (len(system) if system else 0)
    fixed = TOKENIZER_SLACK * approx_tokens(header, 2 if system else 1) + TEMPLATE_TOKENS
    items = context - answer - fixed
    if items < MIN_ROOM_TOKENS:
        raise ConfigError(
            f"llm_aggregate: a request of {context:,} tokens ({source}) has room for "
            f"{max(0, round(items))} tokens of values after the instruction and "
            f"max_tokens={answer}; lower max_tokens, shorten the instruction, or give the "
            "model's real context with context_tokens="
        )
    return _Room(context, source, answer, items)


def _pack(weights: Sequence[float], room: float) -> list[range]:
    """Consecutive items in requests of ``room`` tokens, in order: each request takes as
    many as fit, and at least one."""
    chunks: list[range] = []
    start, used = 0, 0.0
    for i, weight in enumerate(weights):
        if i > start and used + weight > room:
            chunks.append(range(start, i))
            start, used = i, 0.0
        used += weight
    if weights:
        chunks.append(range(start, len(weights)))
    return chunks


def _prompt(instruction: str, items: Sequence[str], *, leaf: bool) -> str:
    lines = [f"[{i}] {item}" for i, item in enumerate(items, 1)]
    return f"{instruction}\n\n{_LEAF if leaf else _UPPER}\n" + "\n".join(lines)


def _start(values: Sequence[str], room: _Room) -> _Group:
    """A group's first level: its values, each one too long for a request cut to fit."""
    group = _Group(items=[], weights=[])
    for value in values:
        weight = room.weight(value)
        if weight > room.items:
            value, weight = room.cut(value, room.items), room.items
            group.cut += 1
        group.items.append(value)
        group.weights.append(weight)
    return group


class _Asker(Protocol):
    def __call__(
        self, prompts: Sequence[str], *, schema: SchemaOption, max_tokens: int | None
    ) -> Answers: ...


def _fold(
    ask: _Asker,
    groups: list[_Group],
    instruction: str,
    room: _Room,
    schema: SchemaOption,
) -> None:
    """Fold every group to one answer, a level (a wave) at a time for all of them."""
    for group in groups:
        if not group.items:
            group.done, group.statuses = True, {"skipped"}
            group.error = "no values to aggregate (none, or all null)"
    while True:
        asked: list[tuple[_Group, list[range], bool]] = []
        for group in groups:
            if group.done:
                continue
            chunks = _pack(group.weights, room.items)
            asked.append((group, chunks, len(chunks) == 1))
        if not asked:
            return
        # Without a schema, the roots go in the same wave as the other groups' parts; with
        # one (a wave asks for one shape), in a wave of their own.
        parts = [entry for entry in asked if schema is None or not entry[2]]
        roots = [] if schema is None else [entry for entry in asked if entry[2]]
        for todo, shape in ((parts, None), (roots, schema)):
            prompts = [
                _prompt(instruction, [group.items[i] for i in chunk], leaf=group.leaf)
                for group, chunks, root in todo
                for chunk in chunks
                if root or len(chunk) > 1 or group.leaf
            ]
            _take(todo, ask(prompts, schema=shape, max_tokens=room.max_tokens), room)


def _take(todo: list[tuple[_Group, list[range], bool]], answers: Answers, room: _Room) -> None:
    """Each group's next level (or its answer, at the root) from one wave's answers."""
    at = 0
    for group, chunks, root in todo:
        items: list[str] = []
        weights: list[float] = []
        for chunk in chunks:
            if not (root or len(chunk) > 1 or group.leaf):  # an answer alone: carried up
                items.append(group.items[chunk[0]])
                weights.append(group.weights[chunk[0]])
                continue
            status, value, error = answers.statuses[at], answers.values[at], answers.errors[at]
            group.calls += 1
            at += 1
            group.statuses.add(status)
            if not answers.ok(at - 1):
                group.failed = group.failed or status
                group.error = group.error or error or f"a partial answer is {status}"
                continue
            if status == "truncated":
                group.truncated += 1
            items.append(value if isinstance(value, str) else str(value))
            full = status == "truncated"
            weights.append(
                room.max_tokens if full else min(room.weight(items[-1]), room.max_tokens)
            )
            if root:
                group.answer = value
        group.depth += 1
        if group.failed is not None or root:
            group.done = True
            continue
        half = room.items / 2  # an answer over half a request is cut: two always fit
        for i, weight in enumerate(weights):
            if weight > half:
                items[i], weights[i] = room.cut(items[i], half), half
                group.cut += 1
        group.items, group.weights, group.leaf = items, weights, False


def _status(group: _Group, room: _Room) -> tuple[str, str | None]:
    """A group's status and error: a failed partial answer fails the group (no answer from
    part of its values); values or answers cut say so, as ``truncated``."""
    if group.failed is not None:
        return group.failed, group.error
    if "skipped" in group.statuses:
        return "skipped", group.error
    notes = []
    if group.cut:
        notes.append(f"{group.cut} value(s) or partial answer(s) were cut to fit a request")
    if group.truncated:
        notes.append(f"{group.truncated} answer(s) stopped at max_tokens={room.max_tokens}")
    if notes:
        return "truncated", "; ".join(notes)
    return ("cached" if group.statuses == {"cached"} else "ok"), None


async def _endpoint_context(client: Client) -> int | None:
    backend = await client.prepare()
    return await backend.engine.slot_context()


def _context(waves: Waves, context_tokens: int | None) -> tuple[int, str]:
    """The tokens a request may hold and where that was read: the endpoint's own word
    (asked once per call), else ``context_tokens=``, else the default."""
    said = waves.client.run(_endpoint_context(waves.client))
    if said is not None:
        return said, "the endpoint's /props"
    if context_tokens is not None:
        return context_tokens, "context_tokens="
    return DEFAULT_CONTEXT_TOKENS, "the default: the endpoint does not say"


def _check(
    df: Any,
    column: str,
    instruction: str,
    by: Sequence[str],
    order_by: Sequence[str],
    context_tokens: int | None,
    max_tokens: int | None,
) -> None:
    if not isinstance(instruction, str) or not instruction.strip():
        raise ConfigError("llm_aggregate needs an instruction, e.g. 'Summarize the reviews'")
    names = schema_of(df).names()
    for name in (column, *by, *order_by):
        if name not in names:
            raise ConfigError(
                f"llm_aggregate: no column {name!r} in the frame (it has {', '.join(names)})"
            )
    for option, value in (("context_tokens", context_tokens), ("max_tokens", max_tokens)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ConfigError(f"llm_aggregate: {option} must be a positive int, got {value!r}")


def _names(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _grouped(
    df: pl.DataFrame, column: str, by: list[str], order_by: list[str]
) -> tuple[pl.DataFrame, list[list[str]]]:
    """The group keys in order of first appearance, and each group's values (nulls out,
    as text) in the fold's order: ``order_by``'s (stable), else the frame's."""
    values = pl.col(column)
    if order_by:
        values = values.sort_by(order_by, maintain_order=True)
    if by:
        grouped = df.group_by(by, maintain_order=True).agg(values.alias("__values"))
    else:
        grouped = df.select(values.implode().alias("__values"))
    lists = [[str(v) for v in vs if v is not None] for vs in grouped["__values"].to_list()]
    return grouped.drop("__values"), lists


@overload
def llm_aggregate(
    df: PolarsFrame,
    /,
    column: str,
    instruction: str,
    *,
    model: ModelOption,
    by: str | Sequence[str] | None = None,
    order_by: str | Sequence[str] | None = None,
    schema: SchemaOption = None,
    context_tokens: int | None = None,
    max_tokens: int | None = None,
    output: str = "aggregate",
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> PolarsFrame: ...
@overload
def llm_aggregate(
    df: PolarsFrame,
    /,
    column: str,
    instruction: str,
    *,
    model: ModelOption,
    by: str | Sequence[str] | None = None,
    order_by: str | Sequence[str] | None = None,
    schema: SchemaOption = None,
    context_tokens: int | None = None,
    max_tokens: int | None = None,
    output: str = "aggregate",
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> tuple[PolarsFrame, RunReport]: ...
@overload
def llm_aggregate(
    df: pa.Table,
    /,
    column: str,
    instruction: str,
    *,
    model: ModelOption,
    by: str | Sequence[str] | None = None,
    order_by: str | Sequence[str] | None = None,
    schema: SchemaOption = None,
    context_tokens: int | None = None,
    max_tokens: int | None = None,
    output: str = "aggregate",
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> pa.Table: ...
@overload
def llm_aggregate(
    df: pa.Table,
    /,
    column: str,
    instruction: str,
    *,
    model: ModelOption,
    by: str | Sequence[str] | None = None,
    order_by: str | Sequence[str] | None = None,
    schema: SchemaOption = None,
    context_tokens: int | None = None,
    max_tokens: int | None = None,
    output: str = "aggregate",
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> tuple[pa.Table, RunReport]: ...
def llm_aggregate(
    df: Any,
    /,
    column: str,
    instruction: str,
    *,
    model: ModelOption,
    by: str | Sequence[str] | None = None,
    order_by: str | Sequence[str] | None = None,
    schema: SchemaOption = None,
    context_tokens: int | None = None,
    max_tokens: int | None = None,
    output: str = "aggregate",
    return_report: bool = False,
    client: Client | None = None,
    **options: Unpack[SetOptions],
) -> Any:
    """Fold ``column``'s values into one answer per group of ``by`` (or one for the frame).

    A tree fold: a group's values, in order, are packed into as few requests as the model's
    context holds, each answering ``instruction`` for its values; the answers are packed and
    folded the same way until one request holds them all (the *root*: its answer is the
    group's). Each level is one wave for **every group at once**. A group of ``n`` values
    costs at most ``ceil(n / (b - 1)) + depth`` calls, ``b`` values to a request, and its
    depth is about ``log_b(n)`` waves; a group that fits one request costs one call.

    Parameters
    ----------
    df
        A Polars DataFrame or LazyFrame, or a pyarrow Table; the result is of the same kind.
        A LazyFrame is collected (a fold needs every value of a group).
    column
        The values to fold (any type; written as text).
    instruction
        What to make of them, e.g. ``"Summarize the reviews"``; sent with every request of the
        fold, the values numbered after it.
    model
        The model.
    by
        Group key column(s). The result has one row per group, in order of first appearance,
        with its keys; ``None``: one row for the whole frame.
    order_by
        Column(s) ordering each group's values (a stable sort); ``None``: the frame's order.
        The fold's requests follow from the order, so the same order is answered by the cache.
    schema
        A Pydantic model or JSON schema for the group's answer, asked of the root request
        only (the parts answer in text); the output is then a struct.
    context_tokens
        The tokens a request may hold when the endpoint does not say: llama.cpp's
        ``GET /props`` (``default_generation_settings.n_ctx``, one slot's) is read first.
        Without either, :data:`DEFAULT_CONTEXT_TOKENS`.
    max_tokens
        Each answer's limit; ``None``: a quarter of the context, at most 512. Kept free in
        every request, so a request never overflows the context.
    output
        The name of the answer column; ``<output>_status`` and ``<output>_error`` follow it.
    return_report
        Return ``(frame, RunReport)``: the waves added up, with ``plan_why`` saying the
        context used and where it was read.
    client
        A :class:`~llm_ops.Client` to run on; ``None``: one made from ``options``.
    **options
        As for :func:`~llm_ops.llm_complete` (``endpoint``, ``cache``, ``budget``,
        ``batch``, ``system``, ...), but ``output`` and ``schema``.

    Returns
    -------
    The group keys, ``<output>``, ``<output>_status`` and ``<output>_error``. A group none of
    whose partial answers failed is ``ok`` (``cached`` when the cache answered it all); one
    with a failed partial answer gets that status and its error and no answer (never an
    answer from part of its values); ``skipped`` when it has no values or the budget ran out;
    ``truncated``, with the error saying how many, when a value longer than a request (or a
    partial answer longer than half of one) was cut to fit, or an answer stopped at
    ``max_tokens``.

    Examples
    --------
    >>> import polars as pl
    >>> from llm_ops import llm_aggregate
    >>> from llm_ops.testing import LocalEndpoint
    >>> reviews = pl.DataFrame({"shop": ["a", "b", "a"],
    ...                         "text": ["Slow [entity=1]", "Great [entity=2]", "Late [entity=3]"]})
    >>> with LocalEndpoint() as endpoint:
    ...     summary = llm_aggregate(reviews, "text", "Summarize the reviews", by="shop",
    ...                             model="sim", endpoint=endpoint.base_url, cache=False)
    >>> summary.select("shop", "aggregate_status")
    shape: (2, 2)
    ┌──────┬──────────────────┐
    │ shop ┆ aggregate_status │
    │ ---  ┆ ---              │
    │ str  ┆ enum             │
    ╞══════╪══════════════════╡
    │ a    ┆ ok               │
    │ b    ┆ ok               │
    └──────┴──────────────────┘
    >>> summary["aggregate"].to_list()  # the simulator names the facts it was given
    ['sim #0a789136: [entity=1] [entity=3]', 'sim #75d1a01b: [entity=2]']
    """
    return _aggregate(
        df,
        column,
        instruction,
        model=model,
        by=by,
        order_by=order_by,
        schema=schema,
        context_tokens=context_tokens,
        max_tokens=max_tokens,
        output=output,
        return_report=return_report,
        client=client,
        options=options,
    )


def _aggregate(
    df: Any,
    column: str,
    instruction: str,
    *,
    model: ModelOption,
    by: str | Sequence[str] | None,
    order_by: str | Sequence[str] | None,
    schema: SchemaOption,
    context_tokens: int | None,
    max_tokens: int | None,
    output: str,
    return_report: bool,
    client: Client | None,
    options: Mapping[str, Any],
    in_place: InPlace | None = None,
) -> Any:
    """:func:`llm_aggregate`, its waves run ``in_place`` when given (see
    :class:`~._waves.Waves`)."""
    keys, order = _names(by), _names(order_by)
    _check(df, column, instruction, keys, order, context_tokens, max_tokens)
    columns = Columns(output)
    if output in keys or any(name in keys for name in (columns.status, columns.error)):
        raise ConfigError(f"llm_aggregate: output={output!r} names a group key; choose another")
    if return_report and isinstance(df, pl.LazyFrame):
        raise ConfigError(
            "return_report=True needs an eager frame: read llm_ops.last_report() instead"
        )
    frame = to_polars(df)
    grouped, values = _grouped(frame, column, keys, order)
    with Waves(
        "llm_aggregate", model=model, client=client, options=options, in_place=in_place
    ) as waves:
        context, source = _context(waves, context_tokens)
        room = _room(
            instruction,
            options.get("system"),
            context=context,
            source=source,
            max_tokens=max_tokens,
        )
        groups = [_start(vs, room) for vs in values]
        _fold(waves.ask, groups, instruction, room, schema)
        depth = max((g.depth for g in groups), default=0)
        waves.plan = "tree fold"
        waves.plan_why = (
            f"{room.context:,}-token requests ({source}), {round(room.items):,} tokens of "
            f"values each; {len(groups):,} group(s) folded in {depth} level(s)"
        )
        said = [_status(g, room) for g in groups]
        added = pl.DataFrame(
            {
                columns.output: pl.Series([g.answer for g in groups])
                if schema is not None
                else pl.Series([g.answer for g in groups], dtype=pl.String),
                columns.status: pl.Series([s for s, _ in said], dtype=STATUS_DTYPE),
                columns.error: pl.Series([e for _, e in said], dtype=pl.String),
            }
        )
        report = waves.finish(added, columns)
    result = same_kind(df, pl.concat([grouped, added], how="horizontal"))
    return (result, report) if return_report else result


@dataclass
class _Rehearsal:
    """The fold's waves without a request, counted, each answer taken
    :data:`ESTIMATED_ANSWER_CHARS` long (at most ``max_tokens``)."""

    answer: str
    calls: int = 0
    waves: int = 0
    prompt_chars: int = 0

    def __call__(
        self, prompts: Sequence[str], *, schema: SchemaOption, max_tokens: int | None
    ) -> Answers:
        if not prompts:
            return Answers([], [], [])
        self.waves += 1
        self.calls += len(prompts)
        self.prompt_chars += sum(map(len, prompts))
        n = len(prompts)
        return Answers([self.answer] * n, ["ok"] * n, [None] * n)


@plans(llm_aggregate)
def _plan(
    df: Any,
    /,
    column: str,
    instruction: str,
    *,
    model: ModelOption,
    by: str | Sequence[str] | None = None,
    order_by: str | Sequence[str] | None = None,
    schema: SchemaOption = None,
    context_tokens: int | None = None,
    max_tokens: int | None = None,
    output: str = "aggregate",
    return_report: bool = False,
    client: Client | None = None,
    **options: Any,
) -> SetEstimate:
    """The fold rehearsed on the values, each answer taken :data:`ESTIMATED_ANSWER_CHARS`
    long; the context read as :func:`llm_aggregate` reads it (``/props``)."""
    keys, order = _names(by), _names(order_by)
    _check(df, column, instruction, keys, order, context_tokens, max_tokens)
    _, values = _grouped(to_polars(df), column, keys, order)
    with Waves("llm_aggregate", model=model, client=client, options=options) as waves:
        context, source = _context(waves, context_tokens)
    room = _room(
        instruction, options.get("system"), context=context, source=source, max_tokens=max_tokens
    )
    answer_chars = min(ESTIMATED_ANSWER_CHARS, room.max_tokens * CHARS_PER_TOKEN)
    rehearsal = _Rehearsal("x" * answer_chars)
    _fold(rehearsal, [_start(vs, room) for vs in values], instruction, room, schema)
    return priced(
        "llm_aggregate",
        plan="tree fold",
        plan_why=f"{context:,}-token requests ({source})",
        calls=rehearsal.calls,
        waves=rehearsal.waves,
        prompt_chars=rehearsal.prompt_chars / max(1, rehearsal.calls),
        output_tokens=answer_chars / CHARS_PER_TOKEN,
        model=model,
        options=options,
    )
