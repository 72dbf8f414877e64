"""``llm_embed``: one embedding per row, batched, deduped and cached like completions."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any, Literal

import polars as pl

from ._job import CachePath, Job, ProgressOption, make_job
from ._operator import Frame, _same_kind, _schema, _to_polars
from ._plan import STATUS_DTYPE
from ._run import make_report, raise_failed_rows, run_sync, status_counts
from ._vectors import distinct_texts, embed_distinct
from .exceptions import ConfigError


def llm_embed(
    df: Frame,
    /,
    *,
    column: str,
    model: str,
    output: str = "embedding",
    dimensions: int | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    cache: CachePath = None,
    batch_size: int = 256,
    concurrency: int = 8,
    max_attempts: int = 5,
    timeout: float = 60.0,
    on_error: Literal["null", "raise"] = "null",
    progress: ProgressOption = None,
) -> Frame:
    """Add an embedding of ``column`` to every row, as a fixed-size ``Float32`` array column.

    Distinct texts are embedded once, many per request (``batch_size`` inputs, within the
    endpoint's limits), and cached in the ``llm_embeddings`` table of the same cache database.
    ``<output>_status`` and ``<output>_error`` work as for :func:`llm_ops.llm_complete`.

    Parameters
    ----------
    df
        A Polars DataFrame or LazyFrame, or a pyarrow Table; the result is of the same kind.
    column
        The text column to embed; null rows are ``skipped``.
    model
        Embedding model name as the endpoint knows it.
    output
        Name of the vector column.
    dimensions
        Ask the endpoint for vectors of this size (part of the cache key).
    batch_size
        Inputs per request.
    base_url, api_key, cache, concurrency, max_attempts, timeout, on_error, progress
        As for :func:`llm_ops.llm_complete`.

    Examples
    --------
    >>> import polars as pl
    >>> from llm_ops import llm_embed
    >>> from llm_ops.testing import LocalEndpoint
    >>> with LocalEndpoint() as endpoint:
    ...     out = pl.DataFrame({"text": ["red dress", None]}).pipe(
    ...         llm_embed, column="text", model="sim-embed", dimensions=8,
    ...         base_url=endpoint.base_url, cache=False)
    >>> out.schema["embedding"], out["embedding_status"].to_list()
    (Array(Float32, shape=(8,)), ['ok', 'skipped'])
    """
    if not isinstance(column, str) or not column:
        raise ConfigError(f"column must name the text column to embed, got {column!r}")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                   or dimensions < 1):
        raise ConfigError(f"dimensions must be a positive integer, got {dimensions!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not batch_size >= 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    job = make_job(
        _schema(df), prompt="{" + column + "}", model=model, output=output, base_url=base_url,
        api_key=api_key, cache=cache, concurrency=concurrency, max_attempts=max_attempts,
        timeout=timeout, on_error=on_error, progress=progress,
    )
    frame = _to_polars(df)
    params = {"dimensions": dimensions} if dimensions is not None else {}
    columns = run_sync(_run(frame, job, column, params, batch_size))
    result: Frame = _same_kind(df, frame.hstack(columns.get_columns()))
    return result


async def _run(frame: pl.DataFrame, job: Job, column: str, params: dict[str, Any],
               batch_size: int) -> pl.DataFrame:
    started_at, clock = datetime.now(UTC), time.perf_counter()
    if job.cache is not None:
        await asyncio.to_thread(job.cache.prepare)  # before anything is paid for
    row_keys, distinct = await asyncio.to_thread(distinct_texts, frame, job, column, params)
    done = await embed_distinct(distinct, job, params, batch_size, rows=frame.height)
    columns = _join_back(row_keys, done.vectors, frame, column, job,
                         dimensions=params.get("dimensions"))
    report = make_report(
        job, started_at=started_at, wall_seconds=time.perf_counter() - clock, rows=frame.height,
        distinct=distinct.height, cache_hits=done.cache_hits, counters=done.counters,
        statuses=status_counts(columns, job), stopped=done.stopped,
    )
    if job.cache is not None:
        await asyncio.to_thread(job.cache.record_run, report.as_dict())
    if done.stopped is not None:
        raise done.stopped
    if job.on_error == "raise" and report.failed_rows:
        raise_failed_rows(columns, job)
    return columns


def _join_back(row_keys: pl.DataFrame, results: pl.DataFrame, frame: pl.DataFrame, column: str,
               job: Job, *, dimensions: int | None) -> pl.DataFrame:
    joined = row_keys.join(results, on="key", how="left", maintain_order="left")
    widths = joined["embedding"].drop_nulls().list.len().unique()
    if len(widths) > 1:
        raise ConfigError(f"the endpoint returned vectors of different sizes {widths.to_list()}; "
                          "pass dimensions= to fix one")
    # An Array column even when no row got a vector, so frames of reruns line up.
    width = int(widths[0]) if len(widths) == 1 else (dimensions or 0)
    vector = pl.col("embedding").list.to_array(width)
    skipped = frame[column].is_null()
    return joined.with_columns(skipped=skipped).select(
        vector.alias(job.output),
        pl.when("skipped").then(pl.lit("skipped"))
        .when(pl.col("status").is_null()).then(pl.lit("failed"))
        .otherwise(pl.col("status")).cast(STATUS_DTYPE).alias(job.status_column),
        pl.when("skipped").then(pl.lit(f"column {column!r} is null; row not sent"))
        .when(pl.col("status").is_null())
        .then(pl.lit("not sent: the job was stopped before this request was dispatched"))
        .otherwise(pl.col("error")).alias(job.error_column),
    )

