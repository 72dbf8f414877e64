"""Planning and joining back: render, key, dedupe, look up the cache, give rows their answers.

Everything here is vectorised (Polars and DuckDB) and works on one frame or one batch of a
larger input, so the same functions serve ``llm_complete`` and the streaming flows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import polars as pl
import pyarrow as pa

from . import _cache
from ._cache import Cache
from ._engine import TRUNCATED_MESSAGE, Outcome
from ._job import Job, request_for
from ._key import UPPERCASE_ESCAPE_PATTERN, key_sql, request_key
from ._report import STATUSES
from .exceptions import ConfigError

STATUS_DTYPE = pl.Enum(STATUSES)
CACHEABLE = frozenset({"ok", "truncated"})
RESULT_SCHEMA = {"key": pl.String, "text": pl.String, "json": pl.String, "status": pl.String,
                 "error": pl.String, "prompt_tokens": pl.Int64, "completion_tokens": pl.Int64,
                 "similar_to": pl.String, "similarity": pl.Float64}
ANSWERED = ("ok", "cached", "similar", "truncated")


def from_arrow(table: pa.Table) -> pl.DataFrame:
    """An Arrow table as a Polars frame; :class:`ConfigError` naming the column for text that
    is not valid UTF-8 (Polars would panic on it, taking the whole job down)."""
    for name, column in zip(table.column_names, table.columns, strict=True):
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            continue
        try:
            column.validate(full=True)
        except pa.ArrowInvalid:
            rows = [i for i, value in enumerate(column.cast(pa.binary()).to_pylist())
                    if value is not None and not _is_utf8(value)]
            raise ConfigError(
                f"column {name!r} holds text that is not valid UTF-8 in {len(rows):,} row(s) "
                f"(first: row {rows[0] if rows else '?'}); repair or drop those rows first, e.g. "
                "decode the source bytes with errors='replace'"
            ) from None
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass
class Plan:
    """Per-row keys and the distinct requests to answer."""

    row_keys: pl.DataFrame  # one row per input row: key (null when skipped), skip_reason
    distinct: pl.DataFrame  # key, system, prompt, rows (how many input rows share it)
    hits: pl.DataFrame  # key, text, status, error
    misses: pl.DataFrame  # key, system, prompt, rows


@dataclass
class Keyed:
    """The rows of a frame, keyed: per-row keys and the distinct requests behind them."""

    rows: pl.DataFrame  # one per input row, in order: key (null when skipped), skip_reason
    distinct: pl.DataFrame  # one per key: key, system, prompt, rows (input rows sharing it)


def key_rows(frame: pl.DataFrame, job: Job) -> Keyed:
    """Render every row, dedupe the rendered requests in DuckDB and key each distinct one.

    Hashing happens once per distinct request, so a table of many repeats costs little more
    than its distinct prompts; see :mod:`llm_ops._key` for the key's definition.
    """
    system_expr = job.system.expr() if job.system else pl.lit(None, dtype=pl.String)
    # with_columns broadcasts a template without column references to every row
    texts = frame.with_columns(prompt=job.prompt.expr(), system=system_expr).select(
        "prompt", "system")
    expression, parameters = key_sql(
        endpoint=job.base_url, model=job.model, params=job.params,
        with_system=job.system is not None,
    )
    row_keys, grouped = group_and_key(
        texts, expression, parameters,
        lambda system, prompt: request_key(request_for(job, system, prompt)),
        with_system=job.system is not None,
    )
    referenced = [*job.prompt.columns, *(job.system.columns if job.system else ())]
    skip_reason: pl.Expr = pl.lit(None, dtype=pl.String)
    for column in reversed(list(dict.fromkeys(referenced))):
        skip_reason = (
            pl.when(pl.col(column).is_null())
            .then(pl.lit(f"column {column!r} is null; row not sent"))
            .otherwise(skip_reason)
        )
    return Keyed(
        rows=row_keys.with_columns(frame.with_columns(skip_reason=skip_reason)["skip_reason"]),
        distinct=grouped,
    )


def group_and_key(
    texts: pl.DataFrame, expression: str, parameters: list[str],
    reference_key: Callable[[str | None, str], str], *, with_system: bool,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Dedupe ``texts`` (columns system, prompt) in DuckDB and key each distinct pair once.

    Returns the per-row keys (null where a needed text is null: such rows are not sent) and
    the distinct requests (key, system, prompt, rows). ``reference_key`` recomputes the rare
    keys DuckDB's JSON escaping gets wrong (:data:`~llm_ops._key.UPPERCASE_ESCAPE_PATTERN`).
    """
    sendable = "prompt IS NOT NULL" + (" AND system IS NOT NULL" if with_system else "")
    with _memory_db() as con:
        con.register("texts", texts.with_row_index("row").to_arrow())
        grouped: pl.DataFrame = con.sql(
            f"SELECT {expression} AS key, system, prompt, count(*)::BIGINT AS rows, "
            f"list(row) AS row_ids FROM texts WHERE {sendable} GROUP BY system, prompt",
            params=parameters,
        ).pl()
    odd = grouped.select(
        pl.any_horizontal(
            pl.col("prompt").str.contains(UPPERCASE_ESCAPE_PATTERN),
            pl.col("system").str.contains(UPPERCASE_ESCAPE_PATTERN),
        ).fill_null(False)
    ).to_series()
    if odd.any():
        keys = grouped["key"].to_list()
        for index in odd.arg_true().to_list():
            keys[index] = reference_key(grouped["system"][index], grouped["prompt"][index])
        grouped = grouped.with_columns(pl.Series("key", keys, dtype=pl.String))
    members = grouped.select("key", "row_ids").explode("row_ids")
    row_keys = (
        pl.DataFrame({"row": pl.arange(0, texts.height, dtype=pl.UInt32, eager=True)})
        .join(members, left_on="row", right_on="row_ids", how="left", maintain_order="left")
        .select("key")
    )
    return row_keys, grouped.select("key", "system", "prompt", "rows")


def plan_frame(frame: pl.DataFrame, job: Job) -> Plan:
    """Render every row, key it, dedupe and anti-join the distinct requests against the cache."""
    keyed = key_rows(frame, job)
    hits = lookup_answers(job.cache, keyed.distinct)
    misses = keyed.distinct.join(hits.select("key"), on="key", how="anti")
    return Plan(row_keys=keyed.rows, distinct=keyed.distinct, hits=hits, misses=misses)


def _memory_db() -> duckdb.DuckDBPyConnection:
    return duckdb.connect(config=_cache.NO_EXTENSION_DOWNLOADS)


def lookup_answers(cache: Cache | None, distinct: pl.DataFrame) -> pl.DataFrame:
    empty = pl.DataFrame(schema=RESULT_SCHEMA)
    if cache is None or distinct.is_empty():
        return empty
    found = pl.from_arrow(cache.lookup(distinct.select("key").to_arrow()))
    assert isinstance(found, pl.DataFrame)
    return found.select(
        "key",
        pl.col("response_text").alias("text"),
        pl.col("response_json").alias("json"),
        pl.when(pl.col("status") == "truncated").then(pl.lit("truncated"))
        .otherwise(pl.lit("cached")).alias("status"),
        pl.when(pl.col("status") == "truncated")
        .then(pl.lit(f"{TRUNCATED_MESSAGE} (from the cache)"))
        .otherwise(pl.lit(None, dtype=pl.String)).alias("error"),
        pl.col("prompt_tokens").cast(pl.Int64),
        pl.col("completion_tokens").cast(pl.Int64),
        pl.lit(None, pl.String).alias("similar_to"),
        pl.lit(None, pl.Float64).alias("similarity"),
    )




def results_frame(earlier: list[pl.DataFrame], outcomes: list[Outcome]) -> pl.DataFrame:
    """One row per settled request (:data:`RESULT_SCHEMA`): those settled before sending
    (cache hits, similar answers), then fresh outcomes."""
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
        },
        schema=RESULT_SCHEMA,
    )
    return pl.concat([*earlier, answered])


def join_back(row_keys: pl.DataFrame, results: pl.DataFrame, job: Job) -> pl.DataFrame:
    """The output, status and error columns, one row per row of ``row_keys``, in its order."""
    joined = row_keys.join(results, on="key", how="left", maintain_order="left")
    not_sent = "not sent: the job was stopped before this request was dispatched"
    answered = pl.col("status").is_in(ANSWERED)
    output: pl.Expr
    if job.schema is None:
        output = pl.when(answered).then(pl.col("text"))
    else:
        output = pl.when(answered).then(pl.col("json")).str.json_decode(job.schema.dtype)
    columns = [
        output.alias(job.output),
        pl.when(pl.col("skip_reason").is_not_null()).then(pl.lit("skipped"))
        .when(pl.col("status").is_null()).then(pl.lit("failed"))
        .otherwise(pl.col("status")).cast(STATUS_DTYPE).alias(job.status_column),
        pl.coalesce(pl.col("skip_reason"), pl.col("error"),
                    pl.when(pl.col("status").is_null()).then(pl.lit(not_sent)))
        .alias(job.error_column),
    ]
    if job.schema is not None:
        columns.append(pl.col("text").alias(job.raw_column))
    if job.semantic is not None:
        columns += [pl.col("similar_to").alias(job.similar_to_column),
                    pl.col("similarity").alias(job.similarity_column)]
    return joined.select(columns)
