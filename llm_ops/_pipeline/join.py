"""Join back: every input row gets its request's answer, status and error, in row order."""

from __future__ import annotations

import asyncio

import polars as pl

from .._in_place import in_place
from .._options import Columns
from .._outcome import Outcome
from .._schema import OutputSchema
from .._status import ANSWERED, FAILED, RESULTS, STATUS_DTYPE
from ..exceptions import RowsFailedError

NOT_SENT = "not sent: the job was stopped before this request was dispatched"


def results_frame(earlier: list[pl.DataFrame], outcomes: list[Outcome]) -> pl.DataFrame:
    """One row per settled request (:data:`~llm_ops._status.RESULTS`): those settled before
    sending (cache hits, similar answers), then fresh outcomes."""
    answered = pl.DataFrame(
        {
            "key": [o.key for o in outcomes],
            "text": [o.text for o in outcomes],
            "json": [o.json for o in outcomes],
            "status": [o.status for o in outcomes],
            "error": [o.error for o in outcomes],
            "prompt_tokens": [o.prompt_tokens for o in outcomes],
            "completion_tokens": [o.completion_tokens for o in outcomes],
            "similar_to": [None] * len(outcomes),
            "similarity": [None] * len(outcomes),
            "reasoning": [o.reasoning for o in outcomes],
        },
        schema=RESULTS,
    )
    return pl.concat([*earlier, answered])


async def join(
    row_keys: pl.DataFrame,
    results: pl.DataFrame,
    columns: Columns,
    schema: OutputSchema | None,
    *,
    row_group: pl.Series | None = None,
) -> pl.DataFrame:
    """:func:`join_back`, on a worker thread (Polars leaves the event loop free)."""
    return await asyncio.to_thread(
        join_back, row_keys, results, columns, schema, row_group=row_group
    )


@in_place
def join_back(
    row_keys: pl.DataFrame,
    results: pl.DataFrame,
    columns: Columns,
    schema: OutputSchema | None,
    *,
    row_group: pl.Series | None = None,
) -> pl.DataFrame:
    """The added columns, one row per row of ``row_keys`` (``ROW_KEYS``), in its order.

    With ``row_group``, ``row_keys`` holds one row per group of rows (see
    :class:`~llm_ops._pipeline.plan.Keyed`) and the columns get one row per entry of
    ``row_group``, the group of each row: the join and the expressions run once per group, and
    each row only gathers its group's values.
    """
    joined = row_keys.join(results, on="key", how="left", maintain_order="left")
    if row_group is not None and joined.height != row_keys.height:  # a key settled twice
        return join_back(row_keys.gather(row_group), results, columns, schema)
    answered = pl.col("status").is_in(ANSWERED)
    output: pl.Expr
    if schema is None:
        output = pl.when(answered).then(pl.col("text"))
    else:
        output = pl.when(answered).then(pl.col("json")).str.json_decode(schema.dtype)
    added = [output.alias(columns.output), *status_and_error(columns)]
    if columns.structured:
        added.append(pl.col("text").alias(columns.raw))
    if columns.semantic:
        added += [
            pl.col("similar_to").alias(columns.similar_to),
            pl.col("similarity").alias(columns.similarity),
        ]
    if columns.reasoning:  # thinking with no answer to go with it is left out, as the text is
        added.append(pl.when(answered).then(pl.col("reasoning")).alias(columns.reasoning_text))
    selected = joined.select(added)
    return selected if row_group is None else selected.gather(row_group)


def status_and_error(columns: Columns) -> list[pl.Expr]:
    """The status and error columns from a joined frame's ``skip_reason`` and ``skip_status``
    (why a row was not sent, and its status then), ``status`` and ``error`` (of its request;
    null when it was never dispatched)."""
    never_dispatched = pl.col("status").is_null()
    return [
        pl.when(pl.col("skip_reason").is_not_null())
        .then(pl.col("skip_status").fill_null("skipped"))
        .when(never_dispatched)
        .then(pl.lit("failed"))
        .otherwise(pl.col("status"))
        .cast(STATUS_DTYPE)
        .alias(columns.status),
        pl.coalesce(
            pl.col("skip_reason"),
            pl.col("error"),
            pl.when(never_dispatched).then(pl.lit(NOT_SENT)),
        ).alias(columns.error),
    ]


def status_counts(added: pl.DataFrame, columns: Columns) -> dict[str, int]:
    counts = added[columns.status].value_counts()
    return {str(status): int(n) for status, n in counts.iter_rows()}


def raise_failed_rows(added: pl.DataFrame, columns: Columns, *, cached: bool) -> None:
    """``on_error="raise"``: one :class:`~llm_ops.RowsFailedError` for every failed row
    (``cached``: whether the job's answers were kept in a cache)."""
    failed = added.with_row_index("row").filter(
        pl.col(columns.status).cast(pl.String).is_in(list(FAILED))
    )
    raise RowsFailedError(
        failed["row"].to_list(),
        failed[columns.error].fill_null("").to_list(),
        failed[columns.status].cast(pl.String).to_list(),
        cached=cached,
    )
