"""Plan: render every row's request from its columns, key it, dedupe, and look up the cache.

Everything here is vectorised (Polars and DuckDB) and works on one frame or one batch of a
larger input, so the same functions serve ``llm_complete`` and the streaming table jobs. Rows
are first grouped by the values the templates read, so rendering, hashing and the join back
run once per group; a row only gets an integer group and gathers its group's columns.
"""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import dataclass

import duckdb
import polars as pl

from .._cache import DUCKDB_CONFIG, Cache
from .._in_place import in_place
from .._key import UPPERCASE_ESCAPE_PATTERN
from .._media import attach_bytes, binary_positions, describe_binary, describe_values, media_of
from .._outcome import TRUNCATED_MESSAGE
from .._spec import EmbeddingSpec, RequestSpec
from .._status import RESULTS
from .._telemetry import record, span
from .._template import render


@dataclass
class Keyed:
    """The rows of a frame, keyed: per-row keys and the distinct requests behind them.

    Rows are keyed per group: a group is one distinct combination of the values the templates
    read, so a table of many repeats is rendered, hashed and joined once per group. ``groups``
    holds the ``ROW_KEYS`` of each group and ``row_group`` the group of every input row, in
    order; :attr:`rows` spells them out per row.
    """

    groups: pl.DataFrame  # ROW_KEYS: one per group of rows
    row_group: pl.Series  # UInt32: the group of each input row, in order
    distinct: pl.DataFrame  # REQUESTS: one per key

    @property
    def rows(self) -> pl.DataFrame:
        """``ROW_KEYS``: one per input row, in order."""
        return self.groups.gather(self.row_group)


@dataclass
class Plan(Keyed):
    """A frame keyed and looked up: which distinct requests the cache answers, which not."""

    hits: pl.DataFrame  # RESULTS of the cached answers
    misses: pl.DataFrame  # REQUESTS to answer
    refreshed: int = 0  # of the misses, those cached but older than the cache's max_age


def key_rows(frame: pl.DataFrame, spec: RequestSpec) -> Keyed:
    """Group the rows by the values the templates (and media columns) read, render and key
    each group once, and dedupe the rendered requests by key.

    Rendering and hashing happen once per group and no per-row text is made, so a table of
    many repeats costs little more than its distinct prompts; see :mod:`llm_ops._key` for the
    key's definition. A row with a null in a referenced column gets no key and a
    ``skip_reason``; so does a row whose image or PDF cannot be sent, with ``skip_status``
    ``rejected`` (see :mod:`llm_ops._media`).
    """
    media = spec.media.columns if spec.media else ()
    referenced = list(
        dict.fromkeys([*spec.prompt.columns, *(spec.system.columns if spec.system else ()), *media])
    )
    known = {}
    if spec.media:  # Binary columns are grouped by their hashes, never copied
        documents = set(spec.media.document_columns)
        for position in binary_positions(spec.media, frame.schema):
            column = spec.media.columns[position]
            hashes, known[column] = describe_binary(
                frame[column], position=position, document=column in documents, media=spec.media
            )
            frame = frame.with_columns(hashes)
    row_group, values, counts = group_rows(frame, referenced)
    system = (
        spec.system.expr(values.schema, argument="system")
        if spec.system
        else pl.lit(None, dtype=pl.String)
    )
    # with_columns broadcasts a template without column references to every group
    texts = values.with_columns(prompt=spec.prompt.expr(values.schema), system=system)
    if spec.media:
        described = describe_values(values, spec.media, known)
        texts = pl.concat([texts, described], how="horizontal")
    expression, parameters = spec.key_sql()
    keys, grouped = key_texts(texts, counts, expression, parameters, spec)
    skip_reason: pl.Expr = pl.lit(None, dtype=pl.String)
    for column in reversed(referenced):
        skip_reason = (
            pl.when(pl.col(column).is_null())
            .then(pl.lit(f"column {column!r} is null; row not sent"))
            .otherwise(skip_reason)
        )
    skip_status = pl.lit("skipped")
    if spec.media:
        unusable = pl.col("media_error").is_not_null()
        skip_reason = pl.when(unusable).then(pl.col("media_error")).otherwise(skip_reason)
        skip_status = pl.when(unusable).then(pl.lit("rejected")).otherwise(skip_status)
    # with_columns, not select: literals broadcast to every group
    skipped = (texts if spec.media else values).with_columns(
        skip_reason=skip_reason, skip_status=skip_status
    )[["skip_reason", "skip_status"]]
    return Keyed(
        groups=pl.concat([keys.alias("key").to_frame(), skipped], how="horizontal"),
        row_group=row_group,
        distinct=grouped,
    )


def group_rows(
    frame: pl.DataFrame, columns: list[str]
) -> tuple[pl.Series, pl.DataFrame, pl.Series]:
    """Group the rows of ``frame`` by the values of ``columns``: the group of every row (UInt32,
    groups numbered in order of first appearance), the values of each group (float columns as
    their rendered text, so that ``0.0`` and ``-0.0``, equal to ``group_by``, stay apart) and
    each group's row count.

    Without ``columns`` every row is in group 0 (and ``values`` has a placeholder column).
    """
    height = frame.height
    if not columns:
        groups = min(height, 1)
        return (
            pl.zeros(height, pl.UInt32, eager=True),
            pl.DataFrame({"group": pl.zeros(groups, pl.UInt32, eager=True)}),
            pl.Series("rows", [height] * groups, dtype=pl.UInt32),
        )
    index = "row"
    while index in columns:
        index = f"_{index}"
    schema = frame.schema
    by = [
        render(column, schema[column]) if schema[column].is_float() else pl.col(column)
        for column in columns
    ]
    grouped = (
        frame.select(columns)
        .with_row_index(index)
        .group_by(by, maintain_order=True)
        .agg(pl.col(index))
    )
    members = grouped.select(
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("group"), pl.col(index)
    ).explode(index)
    row_group = pl.zeros(height, pl.UInt32, eager=True).scatter(members[index], members["group"])
    counts = grouped[index].list.len().cast(pl.UInt32).alias("rows")
    return row_group, grouped.select(columns), counts


def key_texts(
    texts: pl.DataFrame,
    counts: pl.Series,
    expression: str,
    parameters: list[str],
    spec: RequestSpec | EmbeddingSpec,
) -> tuple[pl.Series, pl.DataFrame]:
    """Key the requests of ``texts`` (columns system and prompt, and media and media_key with
    media, standing for ``counts`` rows each) in DuckDB, one hash per row of ``texts``, and
    dedupe equal requests by key.

    Returns the key of each row of ``texts`` (null where a needed text is null: such rows are
    not sent) and the distinct requests (``REQUESTS``: key, system, prompt, rows, and media
    with media), in order of first appearance. ``spec.key`` recomputes the rare keys DuckDB's
    JSON escaping gets wrong (:data:`~llm_ops._key.UPPERCASE_ESCAPE_PATTERN`).
    """
    with_media = "media_key" in texts.columns
    with_system = isinstance(spec, RequestSpec) and spec.system is not None
    needed = [
        "prompt",
        *(["system"] if with_system else []),
        *(["media_key"] if with_media else []),
    ]
    sendable = " AND ".join(f"{column} IS NOT NULL" for column in needed)
    carried = ["system", "prompt", *(["media_key"] if with_media else [])]
    table = texts.select(carried).with_row_index("text")
    with _memory_db() as con:
        con.register("texts", table.to_arrow())
        keys = (
            con.sql(
                f"SELECT CASE WHEN {sendable} THEN {expression} END AS key "
                "FROM texts ORDER BY text",
                params=parameters,
            )
            .pl()
            .get_column("key")
        )
    odd = table.select(
        pl.any_horizontal(
            pl.col("prompt").str.contains(UPPERCASE_ESCAPE_PATTERN),
            pl.col("system").str.contains(UPPERCASE_ESCAPE_PATTERN),
        ).fill_null(False)
        & keys.is_not_null()
    ).to_series()
    if odd.any():
        fixed = keys.to_list()
        for index in odd.arg_true().to_list():
            system, prompt = table["system"][index], table["prompt"][index]
            if with_media:
                assert isinstance(spec, RequestSpec)
                fixed[index] = spec.key(system, prompt, media_of(texts["media"][index]))
            else:
                fixed[index] = spec.key(system, prompt)
        keys = pl.Series("key", fixed, dtype=pl.String)
    grouped = (
        table.select(
            keys.alias("key"), "system", "prompt", "text", counts.cast(pl.Int64).alias("rows")
        )
        .drop_nulls("key")
        .group_by("key", maintain_order=True)
        .agg(pl.col("system", "prompt", "text").first(), pl.col("rows").sum())
    )
    if with_media:  # gathered by row, not copied through DuckDB and the grouping
        grouped = grouped.with_columns(media=texts["media"].gather(grouped["text"]))
    grouped = grouped.drop("text")
    return keys, grouped


def group_and_key(
    texts: pl.DataFrame, expression: str, parameters: list[str], spec: RequestSpec | EmbeddingSpec
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Dedupe ``texts`` (columns system, prompt) and key each distinct pair once.

    Returns the per-row keys (null where a needed text is null: such rows are not sent) and
    the distinct requests (key, system, prompt, rows); see :func:`key_texts`.
    """
    row_group, values, counts = group_rows(texts, ["system", "prompt"])
    keys, grouped = key_texts(values, counts, expression, parameters, spec)
    return keys.gather(row_group).to_frame("key"), grouped


async def plan(
    frame: pl.DataFrame, spec: RequestSpec, cache: Cache | None, *, reasoning: bool = False
) -> Plan:
    """:func:`plan_frame` on a worker thread (DuckDB and Polars leave the event loop free)."""
    return await asyncio.to_thread(plan_frame, frame, spec, cache, reasoning=reasoning)


@in_place
def plan_frame(
    frame: pl.DataFrame, spec: RequestSpec, cache: Cache | None, *, reasoning: bool = False
) -> Plan:
    """Render every row, key it, dedupe and anti-join the distinct requests against the cache
    (the hits' thinking read only if ``reasoning``: see :func:`lookup_answers`)."""
    keyed = key_rows(frame, spec)
    with span("llm_ops.lookup", {"llm_ops.distinct_requests": keyed.distinct.height}) as looking:
        hits = lookup_answers(cache, keyed.distinct, reasoning=reasoning)
        record(looking, {"llm_ops.cache_hits": hits.height})
    misses = keyed.distinct.join(hits.select("key"), on="key", how="anti", maintain_order="left")
    if spec.media:  # the bytes of the Binary media to send, gathered (not copied) from frame
        misses = attach_bytes(misses, frame, spec.media)
    return Plan(
        groups=keyed.groups,
        row_group=keyed.row_group,
        distinct=keyed.distinct,
        hits=hits,
        misses=misses,
        refreshed=stale_answers(cache, misses),
    )


def stale_answers(cache: Cache | None, misses: pl.DataFrame) -> int:
    """Of ``misses``, those the cache holds an answer to, too old for its ``max_age``: sent
    again like any miss (claimed, deduped, resumed), and counted apart in the report."""
    if cache is None or cache.max_age is None or misses.is_empty():
        return 0
    return len(cache.lookup(misses.select("key").to_arrow(), any_age=True))


_shared: tuple[int, duckdb.DuckDBPyConnection] | None = None
_sharing = threading.Lock()


def _memory_db() -> duckdb.DuckDBPyConnection:
    """A connection of this process's in-memory database (made once: a connection costs more
    than keying a few thousand requests); close it after use."""
    global _shared
    with _sharing:
        if _shared is None or _shared[0] != os.getpid():  # a forked child makes its own
            _shared = (os.getpid(), duckdb.connect(config=DUCKDB_CONFIG))
        return _shared[1].cursor()


@in_place
def lookup_answers(
    cache: Cache | None, distinct: pl.DataFrame, *, reasoning: bool = False
) -> pl.DataFrame:
    """The cached answers to the ``key`` column of ``distinct``, as :data:`RESULTS` rows; their
    thinking only if ``reasoning`` (``keep_reasoning``: it is read from the cache for no other
    job), else null."""
    if cache is None or distinct.is_empty():
        return pl.DataFrame(schema=RESULTS)
    found = pl.from_arrow(cache.lookup(distinct.select("key").to_arrow(), reasoning=reasoning))
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
        pl.col("reasoning_text").alias("reasoning"),
    )
