"""Plan: render every row's request from its columns, key it, dedupe, and look up the cache.

Everything here is vectorised (Polars and DuckDB) and works on one frame or one batch of a
larger input, so the same functions serve ``llm_complete`` and the streaming table jobs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import polars as pl

from ._cache import DUCKDB_CONFIG, Cache
from ._engine import TRUNCATED_MESSAGE
from ._key import UPPERCASE_ESCAPE_PATTERN
from ._spec import RequestSpec
from ._status import RESULTS


@dataclass
class Keyed:
    """The rows of a frame, keyed: per-row keys and the distinct requests behind them."""

    rows: pl.DataFrame  # ROW_KEYS: one per input row, in order
    distinct: pl.DataFrame  # REQUESTS: one per key


@dataclass
class Plan(Keyed):
    """A frame keyed and looked up: which distinct requests the cache answers, which not."""

    hits: pl.DataFrame  # RESULTS of the cached answers
    misses: pl.DataFrame  # REQUESTS to answer


def key_rows(frame: pl.DataFrame, spec: RequestSpec) -> Keyed:
    """Render every row, dedupe the rendered requests in DuckDB and key each distinct one.

    Hashing happens once per distinct request, so a table of many repeats costs little more
    than its distinct prompts; see :mod:`llm_ops._key` for the key's definition.
    """
    system = spec.system.expr() if spec.system else pl.lit(None, dtype=pl.String)
    # with_columns broadcasts a template without column references to every row
    texts = frame.with_columns(prompt=spec.prompt.expr(), system=system).select("prompt", "system")
    expression, parameters = spec.key_sql()
    row_keys, grouped = group_and_key(
        texts, expression, parameters, spec.key, with_system=spec.system is not None
    )
    referenced = [*spec.prompt.columns, *(spec.system.columns if spec.system else ())]
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
    texts: pl.DataFrame,
    expression: str,
    parameters: list[str],
    reference_key: Callable[[str | None, str], str],
    *,
    with_system: bool,
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


def plan_frame(frame: pl.DataFrame, spec: RequestSpec, cache: Cache | None) -> Plan:
    """Render every row, key it, dedupe and anti-join the distinct requests against the cache."""
    keyed = key_rows(frame, spec)
    hits = lookup_answers(cache, keyed.distinct)
    misses = keyed.distinct.join(hits.select("key"), on="key", how="anti")
    return Plan(rows=keyed.rows, distinct=keyed.distinct, hits=hits, misses=misses)


def _memory_db() -> duckdb.DuckDBPyConnection:
    return duckdb.connect(config=DUCKDB_CONFIG)


def lookup_answers(cache: Cache | None, distinct: pl.DataFrame) -> pl.DataFrame:
    """The cached answers to the ``key`` column of ``distinct``, as :data:`RESULTS` rows."""
    if cache is None or distinct.is_empty():
        return pl.DataFrame(schema=RESULTS)
    found = pl.from_arrow(cache.lookup(distinct.select("key").to_arrow()))
    assert isinstance(found, pl.DataFrame)
    truncated = pl.col("status") == "truncated"
    return found.select(
        "key",
        pl.col("response_text").alias("text"),
        pl.col("response_json").alias("json"),
        pl.when(truncated).then(pl.lit("truncated")).otherwise(pl.lit("cached")).alias("status"),
        pl.when(truncated)
        .then(pl.lit(f"{TRUNCATED_MESSAGE} (from the cache)"))
        .otherwise(pl.lit(None, dtype=pl.String))
        .alias("error"),
        pl.col("prompt_tokens").cast(pl.Int64),
        pl.col("completion_tokens").cast(pl.Int64),
        pl.lit(None, pl.String).alias("similar_to"),
        pl.lit(None, pl.Float64).alias("similarity"),
    )
