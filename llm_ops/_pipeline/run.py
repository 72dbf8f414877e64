"""Run one job over an in-memory frame: a single pass or a cascade, recorded as one run."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import polars as pl

from .._options import Job
from .._report import RunReport
from .._telemetry import record as record_attributes
from .._telemetry import span
from ..exceptions import JobInterruptedError
from .backend import Backend
from .cascade import run_cascade
from .join import raise_failed_rows
from .line import run_once

if TYPE_CHECKING:
    from opentelemetry.trace import Span


async def run_frame(
    frame: pl.DataFrame,
    job: Job,
    backend: Backend,
    *,
    record: bool = True,
    on_report: Callable[[RunReport], None] | None = None,
) -> tuple[pl.DataFrame, RunReport]:
    """The whole pipeline over one in-memory frame; returns the added columns and the report.

    ``record=False`` leaves ``llm_runs`` alone (the SQL functions run once per vector);
    ``on_report`` gets the report before anything is raised (the ``llm`` expressions add up
    their batches' reports and record them together).
    """
    with span("llm_ops.job", {"llm_ops.model": job.spec.model}) as job_span:
        columns, report, stopped = await _run(frame, job, backend, record=record)
        record_report(job_span, report)
        if on_report is not None:
            on_report(report)
        if stopped is not None:
            if isinstance(stopped, asyncio.CancelledError | JobInterruptedError):
                kept = "answers so far are cached" if backend.cache else "the cache is off"
                print(f"interrupted; {kept}.\n{report}", file=sys.stderr)
            raise stopped
        if job.on_error == "raise" and report.failed_rows:
            raise_failed_rows(columns, job.columns, cached=backend.cache is not None)
        return columns, report


async def _run(
    frame: pl.DataFrame, job: Job, backend: Backend, *, record: bool
) -> tuple[pl.DataFrame, RunReport, BaseException | None]:
    """The passes over ``frame`` (one, or a cascade's), recorded as one run if ``record``."""
    if record and backend.cache is not None:
        backend = replace(backend, settles=True)  # one merge at the end, with the run record
    if job.cascade is not None:
        columns, report, stopped = await run_cascade(frame, job, backend)
    else:
        tier = await run_once(frame, job, backend)
        columns, report, stopped = tier.columns, tier.report, tier.stopped
    if record and backend.cache is not None:
        # a stopped job ends soon: it tries the file briefly, and leaves the rest in the journal
        with span("llm_ops.record_run"):
            waiting = await asyncio.to_thread(
                backend.cache.record_run, report.as_dict(), wait=None if stopped is None else 2.0
            )
        report = replace(report, journal_pending=waiting)
    return columns, report, stopped


def record_report(job_span: Span | None, report: RunReport) -> None:
    """A job's span gets what its report counts (nothing is built when it does not record)."""
    if job_span is None or not job_span.is_recording():
        return
    record_attributes(
        job_span,
        {
            "llm_ops.run_id": report.run_id,
            "llm_ops.mode": report.mode,
            "llm_ops.rows": report.rows,
            "llm_ops.distinct_requests": report.distinct_requests,
            "llm_ops.cache_hits": report.cache_hits,
            "llm_ops.claimed": report.claimed,
            "llm_ops.semantic_hits": _semantic_hits(report),
            "llm_ops.requests_sent": report.requests_sent,
            "llm_ops.retries": report.retries,
            "llm_ops.failed_rows": report.failed_rows,
            "llm_ops.cost": report.cost,
            "llm_ops.outcome": report.outcome,
            "llm_ops.concurrency": report.concurrency,
            "gen_ai.usage.input_tokens": report.prompt_tokens,
            "gen_ai.usage.output_tokens": report.completion_tokens,
        },
    )


def _semantic_hits(report: RunReport) -> int:
    """The distinct requests the semantic cache answered (0 where it was off)."""
    saving = report.savings.get("semantic_cache")
    return 0 if saving is None else saving.requests
