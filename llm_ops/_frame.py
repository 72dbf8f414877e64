"""``run_frame``: one in-memory job end to end, with one model or a cascade."""

from __future__ import annotations

import asyncio
import sys

import polars as pl

from ._cascade import run_cascade
from ._job import Job
from ._report import RunReport
from ._run import raise_failed_rows, run_once
from .exceptions import JobInterruptedError


async def run_frame(
    frame: pl.DataFrame, job: Job, *, record: bool = True
) -> tuple[pl.DataFrame, RunReport]:
    """The whole pipeline over one in-memory frame; returns the new columns and the report.

    ``record=False`` leaves ``llm_runs`` alone (SQL functions run once per vector).
    """
    if job.cache is not None:
        await asyncio.to_thread(job.cache.prepare)  # before anything is paid for
    if job.cascade:
        columns, report, stopped = await run_cascade(frame, job)
    else:
        tier = await run_once(frame, job)
        columns, report, stopped = tier.columns, tier.report, tier.stopped
    if record and job.cache is not None:
        await asyncio.to_thread(job.cache.record_run, report.as_dict())
    if stopped is not None:
        if isinstance(stopped, asyncio.CancelledError | JobInterruptedError):
            print(f"interrupted; answers so far are cached.\n{report}", file=sys.stderr)
        raise stopped
    if job.on_error == "raise" and report.failed_rows:
        raise_failed_rows(columns, job)
    return columns, report
