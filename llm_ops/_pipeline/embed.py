"""Embeddings of a column: one vector per row, batched, deduped and cached like completions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

import polars as pl

from .._failures import failure_reasons
from .._options import Columns
from .._progress import ProgressCallback
from .._report import RunFacts, RunReport, make_report
from .._spec import EmbeddingSpec
from ..exceptions import ConfigError
from .backend import Backend
from .join import raise_failed_rows, status_and_error, status_counts
from .vectors import distinct_texts, embed_distinct


async def embed_frame(
    frame: pl.DataFrame,
    column: str,
    spec: EmbeddingSpec,
    backend: Backend,
    *,
    columns: Columns,
    inputs_per_request: int,
    on_error: str,
    progress: ProgressCallback | None,
    on_report: Callable[[RunReport], None] | None = None,
) -> pl.DataFrame:
    """The vector, status and error columns for ``column`` of ``frame``; the run is recorded
    in ``llm_runs``, or given to ``on_report`` instead (before anything is raised)."""
    started_at, clock = datetime.now(UTC), time.perf_counter()
    row_keys, distinct = await asyncio.to_thread(distinct_texts, frame, column, spec)
    done = await embed_distinct(
        distinct,
        spec,
        backend,
        inputs_per_request=inputs_per_request,
        progress=progress,
        rows=frame.height,
    )
    added = _join_back(
        row_keys, done.vectors, frame[column].is_null(), column, columns, dimensions=spec.dimensions
    )
    facts = RunFacts(
        model=spec.model,
        endpoint=spec.endpoint,
        started_at=started_at,
        wall_seconds=time.perf_counter() - clock,
        rows=frame.height,
        distinct=distinct.height,
        cache_hits=done.cache_hits,
        counters=done.counters,
        statuses=status_counts(added, columns),
        stopped=done.stopped,
        cache=backend.cache.path if backend.cache else None,
    )
    report = replace(
        make_report(facts), errors=failure_reasons(added, columns.status, columns.error)
    )
    if on_report is not None:
        on_report(report)
    elif backend.cache is not None:
        await asyncio.to_thread(
            backend.cache.record_run, report.as_dict(), wait=None if done.stopped is None else 2.0
        )
    if done.stopped is not None:
        raise done.stopped
    if on_error == "raise" and report.failed_rows:
        raise_failed_rows(added, columns, cached=backend.cache is not None)
    return added


def _join_back(
    row_keys: pl.DataFrame,
    results: pl.DataFrame,
    skipped: pl.Series,
    column: str,
    columns: Columns,
    *,
    dimensions: int | None,
) -> pl.DataFrame:
    joined = row_keys.join(results, on="key", how="left", maintain_order="left")
    widths = joined["embedding"].drop_nulls().list.len().unique()
    if len(widths) > 1:
        raise ConfigError(
            f"the endpoint returned vectors of different sizes {widths.to_list()}; "
            "pass dimensions= to fix one"
        )
    # An Array column even when no row got a vector, so frames of reruns line up.
    width = int(widths[0]) if len(widths) == 1 else (dimensions or 0)
    skip_reason = pl.when(skipped).then(pl.lit(f"column {column!r} is null; row not sent"))
    return joined.with_columns(skip_reason=skip_reason, skip_status=pl.lit("skipped")).select(
        pl.col("embedding").list.to_array(width).alias(columns.output),
        *status_and_error(columns),
    )
