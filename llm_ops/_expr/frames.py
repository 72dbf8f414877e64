"""Semantic operators on frames: ``llm_filter``, ``llm_classify`` and ``llm_extract``.

Each is a thin layer on the ``llm`` expression namespace: the prompt is a template over the
frame's columns (as for :func:`~llm_ops.llm_complete`), the columns it reads go to the model
as one struct expression, and the answer is asked for, and parsed, by a schema. So the keys,
the cache, dedupe, statuses, budgets, cascades (``model=Cascade([...], escalate=...)``) and the
semantic cache work exactly as in ``llm_complete``; a ``LazyFrame`` stays lazy (and streams)
until it is collected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Unpack, cast, overload

import polars as pl
import pyarrow as pa

from .._client import Client, provide_semantic_operators
from .._config import Cascade
from .._frames import Frame, PolarsFrame, from_arrow, schema_of
from .._options import ModelOption, SchemaOption
from .._report import RunReport
from .._template import check_columns, parse_template
from ..exceptions import ConfigError
from . import ExprOptions, ExtractOptions
from .asks import Ask, classification, extraction, verdict
from .batches import Completions, completion

__all__ = ["llm_classify", "llm_extract", "llm_filter"]


@overload
def llm_filter(
    df: PolarsFrame,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[ExprOptions],
) -> PolarsFrame: ...
@overload
def llm_filter(
    df: PolarsFrame,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[ExprOptions],
) -> tuple[PolarsFrame, RunReport]: ...
@overload
def llm_filter(
    df: pa.Table,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[ExprOptions],
) -> pa.Table: ...
@overload
def llm_filter(
    df: pa.Table,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[ExprOptions],
) -> tuple[pa.Table, RunReport]: ...
def llm_filter(
    df: Frame,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: bool = False,
    client: Client | None = None,
    **options: Unpack[ExprOptions],
) -> Frame | tuple[Frame, RunReport]:
    """Keep the rows for which the model answers yes to ``prompt``.

    The answer is asked for as JSON ``{"answer": true|false}``. Rows whose answer failed (or
    whose columns are null) are dropped with the ``false`` ones; the report (``return_report``,
    :func:`llm_ops.last_report`, ``llm_runs``) counts them. Rows dropped by an earlier filter
    are never asked about: the answer is a column first, then the filter.

    Parameters
    ----------
    df
        A Polars DataFrame or LazyFrame, or a pyarrow Table; the result is of the same kind. A
        LazyFrame stays lazy: the requests are made when it is collected (or streamed).
    prompt
        A yes/no question as a template over the columns: ``"Is {text} about shipping?"``.
    model
        Model name, or a cascade's list of names (an ``escalate=`` rule reads the answer as
        ``pl.col("answer")``, a struct with the boolean field ``answer``).
    return_report
        Return ``(frame, RunReport)``; not for a LazyFrame (see :func:`llm_ops.last_report`).
    client
        A :class:`~llm_ops.Client` to run on, instead of the shared one for these options.
    **options
        As for :func:`~llm_ops.llm_complete` (``system``, ``endpoint``, ``cache``,
        ``semantic_cache``, ``budget``, ...).

    Examples
    --------
    >>> import polars as pl
    >>> from llm_ops import llm_filter
    >>> from llm_ops.testing import LocalEndpoint
    >>> reviews = pl.DataFrame({"id": [1, 2, 3],
    ...                         "text": ["Shipping was slow", "Love the colour", "Never arrived"]})
    >>> with LocalEndpoint() as endpoint:
    ...     late = llm_filter(reviews, "Is this review about shipping? {text}", model="sim",
    ...                       endpoint=endpoint.base_url, cache=False)
    >>> late
    shape: (2, 2)
    ┌─────┬───────────────────┐
    │ id  ┆ text              │
    │ --- ┆ ---               │
    │ i64 ┆ str               │
    ╞═════╪═══════════════════╡
    │ 1   ┆ Shipping was slow │
    │ 3   ┆ Never arrived     │
    └─────┴───────────────────┘
    """
    ask, values = verdict(), _values(df, prompt, model, options)
    expr, batches = completion(values, ask, prompt, "llm_filter", model, "answer", client, options)
    keep = _free_name(schema_of(df), "__llm_ops_keep")
    result = _apply(df, lambda frame: frame.with_columns(expr.alias(keep)).filter(keep).drop(keep))
    return _returned(df, result, batches, return_report)


@overload
def llm_classify(
    df: PolarsFrame,
    /,
    column: str,
    labels: Sequence[str],
    *,
    model: ModelOption,
    prompt: str | None = None,
    output: str = "label",
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[ExprOptions],
) -> PolarsFrame: ...
@overload
def llm_classify(
    df: PolarsFrame,
    /,
    column: str,
    labels: Sequence[str],
    *,
    model: ModelOption,
    prompt: str | None = None,
    output: str = "label",
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[ExprOptions],
) -> tuple[PolarsFrame, RunReport]: ...
@overload
def llm_classify(
    df: pa.Table,
    /,
    column: str,
    labels: Sequence[str],
    *,
    model: ModelOption,
    prompt: str | None = None,
    output: str = "label",
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[ExprOptions],
) -> pa.Table: ...
@overload
def llm_classify(
    df: pa.Table,
    /,
    column: str,
    labels: Sequence[str],
    *,
    model: ModelOption,
    prompt: str | None = None,
    output: str = "label",
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[ExprOptions],
) -> tuple[pa.Table, RunReport]: ...
def llm_classify(
    df: Frame,
    /,
    column: str,
    labels: Sequence[str],
    *,
    model: ModelOption,
    prompt: str | None = None,
    output: str = "label",
    return_report: bool = False,
    client: Client | None = None,
    **options: Unpack[ExprOptions],
) -> Frame | tuple[Frame, RunReport]:
    """Classify ``column`` as one of ``labels``: an ``Enum`` column, with status and error.

    The request's JSON schema allows only these labels; an answer that is not one of them is
    ``invalid`` (null, its text in ``<output>_raw``), never coerced to a label. Adds
    ``<output>``, ``<output>_status``, ``<output>_error`` and ``<output>_raw`` (and the
    columns ``llm_complete`` adds for a cascade or the semantic cache).

    Parameters
    ----------
    df
        A Polars DataFrame or LazyFrame, or a pyarrow Table; the result is of the same kind (a
        LazyFrame stays lazy).
    column
        The text to classify.
    labels
        The label names, each once.
    model
        Model name, or a cascade's list of names; an ``escalate=`` rule reads the answer as
        ``pl.col(output)``, a struct with the string field ``label``.
    prompt
        A template over the columns; by default ``"Classify the text as exactly one of these
        labels: <labels>.\\n\\nText: {<column>}"``. Name the labels in your own.
    output
        Name of the label column; the others are named after it.
    return_report, client, **options
        As for :func:`llm_filter`.

    Examples
    --------
    >>> import polars as pl
    >>> from llm_ops import llm_classify
    >>> from llm_ops.testing import LocalEndpoint
    >>> reviews = pl.DataFrame({"text": ["Shipping was slow", "Lovely fabric", None]})
    >>> with LocalEndpoint() as endpoint:
    ...     topics = llm_classify(reviews, "text", ["shipping", "product"], model="sim",
    ...                           endpoint=endpoint.base_url, cache=False)
    >>> topics.select("text", "label", "label_status")
    shape: (3, 3)
    ┌───────────────────┬──────────┬──────────────┐
    │ text              ┆ label    ┆ label_status │
    │ ---               ┆ ---      ┆ ---          │
    │ str               ┆ enum     ┆ enum         │
    ╞═══════════════════╪══════════╪══════════════╡
    │ Shipping was slow ┆ shipping ┆ ok           │
    │ Lovely fabric     ┆ product  ┆ ok           │
    │ null              ┆ null     ┆ skipped      │
    └───────────────────┴──────────┴──────────────┘
    """
    ask = classification(labels, _reference(column))
    return _add_columns(
        df, column, prompt, model, output, return_report, client, options, ask, "llm_classify"
    )


@overload
def llm_extract(
    df: PolarsFrame,
    /,
    column: str,
    schema: SchemaOption,
    *,
    model: ModelOption,
    prompt: str | None = None,
    output: str = "extracted",
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[ExtractOptions],
) -> PolarsFrame: ...
@overload
def llm_extract(
    df: PolarsFrame,
    /,
    column: str,
    schema: SchemaOption,
    *,
    model: ModelOption,
    prompt: str | None = None,
    output: str = "extracted",
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[ExtractOptions],
) -> tuple[PolarsFrame, RunReport]: ...
@overload
def llm_extract(
    df: pa.Table,
    /,
    column: str,
    schema: SchemaOption,
    *,
    model: ModelOption,
    prompt: str | None = None,
    output: str = "extracted",
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[ExtractOptions],
) -> pa.Table: ...
@overload
def llm_extract(
    df: pa.Table,
    /,
    column: str,
    schema: SchemaOption,
    *,
    model: ModelOption,
    prompt: str | None = None,
    output: str = "extracted",
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[ExtractOptions],
) -> tuple[pa.Table, RunReport]: ...
def llm_extract(
    df: Frame,
    /,
    column: str,
    schema: SchemaOption,
    *,
    model: ModelOption,
    prompt: str | None = None,
    output: str = "extracted",
    return_report: bool = False,
    client: Client | None = None,
    **options: Unpack[ExtractOptions],
) -> Frame | tuple[Frame, RunReport]:
    """Extract the fields of ``schema`` from ``column``: a ``Struct`` column, with status and
    error.

    As ``llm_complete(schema=...)``: answers are validated, one that does not match is
    ``invalid`` (null, its text in ``<output>_raw``; ``repair=True`` asks once more, showing
    the model what was wrong), and a rerun is served by the cache.

    Parameters
    ----------
    df
        A Polars DataFrame or LazyFrame, or a pyarrow Table; the result is of the same kind (a
        LazyFrame stays lazy).
    column
        The text to extract from.
    schema
        A pydantic model class or a JSON schema dict of an object (positional, or
        ``schema=``).
    model
        Model name, or a cascade's list of names; ``escalate=confidence_below(...)`` reads a
        confidence field of the schema.
    prompt
        A template over the columns; by default ``"Extract the fields of the JSON schema from
        the text.\\n\\nText: {<column>}"``.
    output
        Name of the struct column; the others are named after it.
    return_report, client, **options
        As for :func:`llm_filter`.

    Examples
    --------
    >>> import polars as pl
    >>> from pydantic import BaseModel
    >>> from llm_ops import llm_extract
    >>> from llm_ops.testing import LocalEndpoint
    >>> class Order(BaseModel):
    ...     item: str
    ...     quantity: int
    >>> notes = pl.DataFrame({"text": ["two red scarves", "a blue hat"]})
    >>> with LocalEndpoint() as endpoint:
    ...     orders = llm_extract(notes, "text", Order, model="sim",
    ...                          endpoint=endpoint.base_url, cache=False)
    >>> orders.schema["extracted"]
    Struct({'item': String, 'quantity': Int64})
    >>> orders["extracted_status"].to_list()
    ['ok', 'ok']
    """
    ask = extraction(schema, _reference(column))
    return _add_columns(
        df, column, prompt, model, output, return_report, client, options, ask, "llm_extract"
    )


def _add_columns(
    df: Frame,
    column: str,
    prompt: str | None,
    model: ModelOption,
    output: str,
    return_report: bool,
    client: Client | None,
    options: Mapping[str, Any],
    ask: Ask,
    caller: str,
) -> Frame | tuple[Frame, RunReport]:
    schema = schema_of(df)
    if not isinstance(column, str) or column not in schema:
        raise ConfigError(
            f"column {column!r} is not in the table; available columns: {', '.join(schema)}"
        )
    if not isinstance(output, str) or not output:
        raise ConfigError(f"output must be a non-empty column name, got {output!r}")
    template = prompt if prompt is not None else cast(str, ask.prompt)
    values = _values(df, template, model, options)
    expr, batches = completion(
        values, ask, template, caller, model, "struct", client, options, output
    )
    fields = [field.name for field in cast(pl.Struct, batches.dtype).fields]
    names = {field: output if field == "answer" else f"{output}_{field}" for field in fields}
    for name in names.values():
        if name in schema:
            raise ConfigError(
                f"the input already has a column {name!r}; choose another output= name or "
                "drop that column first"
            )
    struct = _free_name(schema, "__llm_ops_answer")
    unnested = [pl.col(struct).struct.field(field).alias(name) for field, name in names.items()]
    result = _apply(
        df, lambda frame: frame.with_columns(expr.alias(struct)).with_columns(unnested).drop(struct)
    )
    return _returned(df, result, batches, return_report)


def _reference(column: str) -> str:
    """``{column}`` in a template (the column is checked against the frame after)."""
    if not isinstance(column, str) or not column or any(c in column for c in "{}[].!:"):
        raise ConfigError(
            f"column must name a text column whose name a template can reference, got "
            f"{column!r}; rename it first, e.g. df.rename({{{column!r}: 'text'}})"
        )
    return "{" + column + "}"


def _values(df: Frame, prompt: object, model: object, options: Mapping[str, Any]) -> pl.Expr:
    """The columns the model reads (the templates' and the escalation rule's), as a struct."""
    if not isinstance(prompt, str):
        raise ConfigError(
            f"prompt must be a template string like 'Is {{text}} late?', got {prompt!r}"
        )
    schema = schema_of(df)
    templates = [parse_template(prompt, argument="prompt")]
    system = options.get("system")
    if system is not None:
        templates.append(parse_template(system, argument="system"))
    for template, argument in zip(templates, ("prompt", "system"), strict=False):
        check_columns(template, schema, argument=argument)
    columns = [c for template in templates for c in template.columns]
    if not templates[0].columns:
        raise ConfigError(
            f"prompt {prompt!r} references no column, so every row would get one answer; "
            "name the columns to ask about, e.g. 'Is {text} about shipping?'"
        )
    escalate = model.escalate if isinstance(model, Cascade) else None
    columns += [c for c in _escalation_columns(escalate) if c in schema]
    return pl.struct(list(dict.fromkeys(columns)))


def _escalation_columns(escalate: object) -> list[str]:
    """The columns an ``escalate=`` rule reads (``confidence_below`` reads only the answer)."""
    rule = escalate
    if isinstance(rule, str):
        try:
            rule = pl.sql_expr(rule)
        except pl.exceptions.PolarsError:
            return []  # make_job explains what is wrong with it
    return rule.meta.root_names() if isinstance(rule, pl.Expr) else []


def _free_name(schema: Mapping[str, Any], name: str) -> str:
    while name in schema:
        name = f"_{name}"
    return name


def _apply(df: Any, step: Any) -> Any:
    """``step`` on the frame as Polars (eager stays eager, lazy stays lazy)."""
    if isinstance(df, pa.Table):
        return step(from_arrow(df)).to_arrow()
    if isinstance(df, pl.DataFrame | pl.LazyFrame):
        return step(df)
    raise ConfigError(
        f"takes a polars DataFrame or LazyFrame or a pyarrow Table, got {type(df).__name__}; "
        "convert it first, e.g. pl.from_pandas(df)"
    )


def _returned(
    df: Frame, result: Frame, batches: Completions, return_report: bool
) -> Frame | tuple[Frame, RunReport]:
    if not return_report:
        return result
    if isinstance(df, pl.LazyFrame):
        raise ConfigError(
            "return_report=True needs an eager frame: a LazyFrame is answered when it is "
            "collected; then read llm_ops.last_report()"
        )
    return result, batches.report()


provide_semantic_operators(filter=llm_filter, classify=llm_classify, extract=llm_extract)
