"""Model cascades: rows go to the first model; rows whose answer fails or is flagged go on.

``model=[small, large]`` sends every row to ``small``. Rows whose status is a failure or
``truncated`` (see :data:`ESCALATE_STATUSES`), and rows for which the caller's ``escalate=``
expression is true, are sent to ``large``, and so on down the list. Each row keeps the answer
of the last model it reached, and ``<output>_model`` says which model that was.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime

import polars as pl

from .._failures import failure_reasons
from .._options import Job
from .._pricing import add_costs, subtract_costs
from .._report import RunReport, Saving, add_spending, sum_reports
from .._status import ANSWERED, ESCALATE, STATUSES
from .backend import Backend
from .join import status_counts
from .line import ModelPass, run_once
from .savings import Tally, prefix_discount, tally

_ROW = "__llm_ops_row"


def escalation(frame: pl.DataFrame, columns: pl.DataFrame, job: Job) -> pl.Series:
    """True for the rows to send to the next model (null from ``escalate`` counts as false)."""
    status = columns[job.columns.status].cast(pl.String)
    flagged = status.is_in(list(ESCALATE))
    rule = job.escalate_rule
    if rule is not None:
        chosen = frame.hstack(columns.get_columns()).select(rule).to_series()
        flagged = flagged | (chosen.fill_null(False) & status.is_in(list(ANSWERED)))
    return flagged


async def run_cascade(
    frame: pl.DataFrame, job: Job, backend: Backend
) -> tuple[pl.DataFrame, RunReport, BaseException | None]:
    """Every model of ``job.models`` in turn over the rows still flagged; the new columns
    (with ``<output>_model``), the combined report and why the job stopped, if it did."""
    started_at, clock = datetime.now(UTC), time.perf_counter()
    rows = pl.Series(_ROW, range(frame.height), dtype=pl.UInt32)
    subset = frame
    finals: list[pl.DataFrame] = []
    tiers: list[tuple[Job, ModelPass, pl.Series]] = []  # tier job, its pass, its rows kept
    spent: tuple[float, int, int] = (0.0, 0, 0)
    for number, model in enumerate(job.models):
        tier_job = job.for_model(model).after(spent)
        tier = await run_once(subset, tier_job, backend)
        spent = add_spending(spent, tier.report.spending())
        skipped = tier.columns[job.columns.status].cast(pl.String) == "skipped"
        labelled = tier.columns.with_columns(
            pl.when(~skipped).then(pl.lit(model)).alias(job.columns.model), rows
        )
        last = number == len(job.models) - 1 or tier.stopped is not None
        flagged = (
            pl.repeat(False, subset.height, eager=True)
            if last
            else escalation(subset, tier.columns, job)
        )
        finals.append(labelled.filter(~flagged))
        tiers.append((tier_job, tier, ~flagged))
        if last or not flagged.any():
            break
        rows, subset = rows.filter(flagged), subset.filter(flagged)
    columns = pl.concat(finals).sort(_ROW).drop(_ROW)
    stopped = tiers[-1][1].stopped
    report = _combined_report(
        job, tiers, columns, started_at=started_at, wall_seconds=time.perf_counter() - clock
    )
    return columns, report, stopped


def _combined_report(
    job: Job,
    tiers: list[tuple[Job, ModelPass, pl.Series]],
    columns: pl.DataFrame,
    *,
    started_at: datetime,
    wall_seconds: float,
) -> RunReport:
    """One report for the whole cascade: the models' reports added up, with the rows, statuses
    and rows per model of the final columns, and the cascade's own saving."""
    reports = [tier.report for _, tier, _ in tiers]
    total = sum_reports(
        reports, started_at=started_at, wall_seconds=wall_seconds, model=" > ".join(job.models)
    )
    answered = columns.filter(pl.col(job.columns.status).cast(pl.String).is_in(list(ANSWERED)))
    final_rows = dict(answered[job.columns.model].value_counts().iter_rows())
    models = {
        name: dataclasses.replace(usage, rows=int(final_rows.get(name, 0)))
        if name in job.models
        else usage
        for name, usage in total.models.items()
    }

    # The cascade saves the last model's price on the rows an earlier model answered and kept,
    # and pays for everything the earlier models did. Savings count what was spent at the full
    # input price: a server's prefix-cache discount is no lever's (see llm_ops._pipeline.savings).
    last_model = job.models[-1]
    last_price = job.spending.price(last_model)
    kept_fresh, every_row = Tally(), Tally()
    earlier_cost: float | None = 0.0
    spent: float | None = total.cost
    for tier_job, tier, kept in tiers:
        report = tier.report
        discount = prefix_discount(tier_job.price, report.cached_tokens, report.cache_write_tokens)
        spent = add_costs(spent, discount)
        keys = tier.row_keys.filter(kept)
        every_row += tally(keys.drop_nulls("key").group_by("key").len("rows"), tier.results)[
            "every_row"
        ]
        if tier_job.spec.model != last_model:
            earlier_cost = add_costs(earlier_cost, add_costs(tier.report.cost, discount))
            fresh = tier.results.filter(pl.col("status") == "ok").join(keys, on="key", how="semi")
            kept_fresh += Tally(
                fresh.height,
                int(fresh["prompt_tokens"].sum() or 0),
                int(fresh["completion_tokens"].sum() or 0),
            )
    savings = {
        **total.savings,
        "cascade": Saving(
            kept_fresh.requests, subtract_costs(kept_fresh.cost(last_price), earlier_cost)
        ),
    }
    counts = status_counts(columns, job.columns)
    return dataclasses.replace(
        total,
        rows=reports[0].rows,
        distinct_requests=reports[0].distinct_requests,
        statuses={status: counts.get(status, 0) for status in STATUSES},
        cost_saved=subtract_costs(every_row.cost(last_price), spent),
        savings=savings,
        models=models,
        errors=failure_reasons(columns, job.columns.status, job.columns.error),
    )
