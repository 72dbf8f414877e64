"""Run one job over an in-memory frame: a single pass or a cascade, recorded as one run."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import replace

import polars as pl

from .._options import Job
from .._report import RunReport
from ..exceptions import JobInterruptedError
from .backend import Backend
from .cascade import run_cascade
from .join import raise_failed_rows
from .line import run_once


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
    if record and backend.cache is not None:
        backend = replace(backend, settles=True)  # one merge at the end, with the run record
    if job.cascade is not None:
        columns, report, stopped = await run_cascade(frame, job, backend)
    else:
        tier = await run_once(frame, job, backend)
        columns, report, stopped = tier.columns, tier.report, tier.stopped
    if record and backend.cache is not None:
        # a stopped job ends soon: it tries the file briefly, and leaves the rest in the journal
        waiting = await asyncio.to_thread(
            backend.cache.record_run, report.as_dict(), wait=None if stopped is None else 2.0
        )
        report = replace(report, journal_pending=waiting)
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
