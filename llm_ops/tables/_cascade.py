"""A cascade over a table: batch by batch through the models, since which rows reach the next
model depends on the answers, so there is no plan of chunks to send ahead."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from .._cache import Cache
from .._client import Client
from .._failures import warn_report
from .._options import Job
from .._pipeline.cascade import run_cascade
from .._report import RunReport, add_spending, sum_reports
from ._files import OutputFile, no_rows, read_batches


def cascade_table(
    client: Client, job: Job, cache: Cache, files: list[Path], output: Path, *, rows_per_read: int
) -> RunReport:
    """:meth:`Table.run_cascade`: each batch of ``files`` through ``job``'s models, written to
    ``output`` as one row group, under budgets that span the batches; one run recorded."""
    started_at, clock = datetime.now(UTC), time.perf_counter()
    reports: list[RunReport] = []
    spent: tuple[float, int, int] = (0.0, 0, 0)
    stopped: BaseException | None = None
    with OutputFile(output) as out:
        for batch in read_batches(files, rows_per_read):
            added, report, stopped = client.run(_cascade(client, batch, job.after(spent)))
            reports.append(report)
            spent = add_spending(spent, report.spending())
            if stopped is not None:
                break
            out.append(batch, added)
    if not reports:
        raise no_rows(files)
    total = sum_reports(
        reports,
        started_at=started_at,
        model=" > ".join(job.models),
        wall_seconds=time.perf_counter() - clock,
    )
    waiting = cache.record_run(total.as_dict(), wait=None if stopped is None else 2.0)
    total = replace(total, journal_pending=waiting)
    if stopped is not None:
        raise stopped
    out.publish()
    warn_report(total, f"the {job.columns.error!r} column of {str(output)!r}")
    return total


async def _cascade(
    client: Client, batch: pl.DataFrame, job: Job
) -> tuple[pl.DataFrame, RunReport, BaseException | None]:
    return await run_cascade(batch, job, await client.prepare())
