"""Model cascades: rows go to the first model; rows whose answer fails or is flagged go on.

``model=[small, large]`` sends every row to ``small``. Rows whose status is a failure or
``truncated`` (see :data:`ESCALATE_STATUSES`), and rows for which the caller's ``escalate=``
expression is true, are sent to ``large``, and so on down the list. Each row keeps the answer
of the last model it reached, and ``<output>_model`` says which model that was.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from datetime import UTC, datetime

import polars as pl

from ._escalate import ESCALATE_STATUSES
from ._job import Job
from ._plan import ANSWERED
from ._report import STATUSES, ModelUsage, RunReport, Saving
from ._run import Tier, run_once, status_counts
from ._savings import Tally, add_costs, subtract_costs, tally

_ROW = "__llm_ops_row"


def escalation(frame: pl.DataFrame, columns: pl.DataFrame, job: Job) -> pl.Series:
    """True for the rows to send to the next model (null from ``escalate`` counts as false)."""
    status = columns[job.status_column].cast(pl.String)
    flagged = status.is_in(ESCALATE_STATUSES)
    if job.escalate is not None:
        rule = frame.hstack(columns.get_columns()).select(job.escalate).to_series()
        flagged = flagged | (rule.fill_null(False) & status.is_in(ANSWERED))
    return flagged


async def run_cascade(
    frame: pl.DataFrame, job: Job
) -> tuple[pl.DataFrame, RunReport, BaseException | None]:
    """Every model of ``job.models`` in turn over the rows still flagged; the new columns
    (with ``<output>_model``), the combined report and why the job stopped, if it did."""
    started_at, clock = datetime.now(UTC), time.perf_counter()
    rows = pl.Series(_ROW, range(frame.height), dtype=pl.UInt32)
    subset = frame
    finals: list[pl.DataFrame] = []
    tiers: list[tuple[Job, Tier, pl.Series]] = []  # tier job, its pass, its rows kept
    cost, requests, tokens = 0.0, 0, 0
    for number, model in enumerate(job.models):
        tier_job = job.for_model(model).less_budget(cost=cost, requests=requests, tokens=tokens)
        tier = await run_once(subset, tier_job)
        cost += tier.report.cost or 0.0
        for usage in tier.report.models.values():  # embeddings too
            requests += usage.requests
            tokens += usage.prompt_tokens + usage.completion_tokens
        skipped = tier.columns[job.status_column].cast(pl.String) == "skipped"
        labelled = tier.columns.with_columns(
            pl.when(~skipped).then(pl.lit(model)).alias(job.model_column), rows)
        last = number == len(job.models) - 1 or tier.stopped is not None
        flagged = (pl.Series([False] * subset.height) if last
                   else escalation(subset, tier.columns, job))
        finals.append(labelled.filter(~flagged))
        tiers.append((tier_job, tier, ~flagged))
        if last or not flagged.any():
            break
        rows, subset = rows.filter(flagged), subset.filter(flagged)
    columns = pl.concat(finals).sort(_ROW).drop(_ROW)
    stopped = tiers[-1][1].stopped
    report = _combined_report(job, tiers, columns, started_at=started_at,
                              wall_seconds=time.perf_counter() - clock)
    return columns, report, stopped


def _combined_report(job: Job, tiers: list[tuple[Job, Tier, pl.Series]],
                     columns: pl.DataFrame, *, started_at: datetime,
                     wall_seconds: float) -> RunReport:
    """One report for the whole cascade: sums over the models, rows per model from the final
    columns, and the cascade's own saving."""
    reports = [tier.report for _, tier, _ in tiers]
    models: dict[str, ModelUsage] = {}
    savings: dict[str, Saving] = {}
    for report in reports:
        for name, usage in report.models.items():
            models[name] = _sum_usage(models.get(name, ModelUsage()), usage)
        for lever, saving in report.savings.items():
            before = savings.get(lever, Saving(0, 0.0))
            savings[lever] = Saving(before.requests + saving.requests,
                                    add_costs(before.cost, saving.cost))
    answered = columns.filter(pl.col(job.status_column).cast(pl.String).is_in(ANSWERED))
    final_rows = dict(answered[job.model_column].value_counts().iter_rows())
    for name in job.models:
        if name in models:
            models[name] = dataclasses.replace(models[name], rows=int(final_rows.get(name, 0)))

    # The cascade saves the last model's price on the rows an earlier model answered and kept,
    # and pays for everything the earlier models did.
    last_model, last_price = job.models[-1], job.prices.get(job.models[-1])
    kept_fresh, every_row = Tally(), Tally()
    earlier_cost: float | None = 0.0
    for tier_job, tier, kept in tiers:
        keys = tier.row_keys.filter(kept)
        every_row += tally(keys.drop_nulls("key").group_by("key").len("rows"),
                           tier.results)["every_row"]
        if tier_job.model != last_model:
            earlier_cost = add_costs(earlier_cost, tier.report.cost)
            fresh = tier.results.filter(pl.col("status") == "ok").join(keys, on="key", how="semi")
            kept_fresh += Tally(fresh.height, int(fresh["prompt_tokens"].sum() or 0),
                                int(fresh["completion_tokens"].sum() or 0))
    would_cost = kept_fresh.cost(last_price)
    savings["cascade"] = Saving(kept_fresh.requests, subtract_costs(would_cost, earlier_cost))

    total_cost: float | None = 0.0
    for report in reports:
        total_cost = add_costs(total_cost, report.cost)
    without = every_row.cost(last_price)
    stopped = next((r for r in reports if r.outcome != "completed"), None)
    counts = status_counts(columns, job)
    first = reports[0]
    return RunReport(
        run_id=uuid.uuid4().hex[:12], started_at=started_at, finished_at=datetime.now(UTC),
        model=" > ".join(job.models), endpoint=first.endpoint, rows=first.rows,
        distinct_requests=first.distinct_requests,
        cache_hits=sum(r.cache_hits for r in reports),
        requests_sent=sum(r.requests_sent for r in reports),
        retries=sum(r.retries for r in reports),
        statuses={status: counts.get(status, 0) for status in STATUSES},
        prompt_tokens=sum(r.prompt_tokens for r in reports),
        completion_tokens=sum(r.completion_tokens for r in reports),
        wall_seconds=wall_seconds,
        outcome=stopped.outcome if stopped else "completed",
        error=stopped.error if stopped else None,
        cost=total_cost,
        cost_saved=subtract_costs(without, total_cost),
        budget_stop=next((r.budget_stop for r in reports if r.budget_stop), None),
        savings=savings, models=models,
    )


def _sum_usage(a: ModelUsage, b: ModelUsage) -> ModelUsage:
    return ModelUsage(a.rows + b.rows, a.requests + b.requests, a.prompt_tokens + b.prompt_tokens,
                      a.completion_tokens + b.completion_tokens, add_costs(a.cost, b.cost))
