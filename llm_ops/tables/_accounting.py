"""What a table job costs and saves: the estimate before it runs, and after it the requests
and tokens behind its rows (the tallies) and the report."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from .._cache import Cache
from .._options import Job
from .._outcome import Counters
from .._pipeline.estimate import Estimate, count_rejected, price_plan
from .._pipeline.plan import key_rows, lookup_answers, stale_answers
from .._pipeline.savings import Tally, usage_report
from .._report import RunFacts, RunReport
from ._files import read_batches
from ._plan import TablePlan, open_plan_db


def estimate_table(job: Job, cache: Cache, files: list[Path], *, rows_per_read: int) -> Estimate:
    """:meth:`Table.estimate`: ``files`` keyed batch by batch, their distinct requests looked
    up in ``cache`` (if its file exists; none is made) and the misses priced."""
    plan_cache = cache if cache.path.exists() else None
    rows = keyed = rejected = 0
    distinct: list[pl.DataFrame] = []
    for batch in read_batches(files, rows_per_read):
        keyed_batch = key_rows(batch, job.spec)
        rows += batch.height
        keyed += int(keyed_batch.distinct["rows"].sum())
        rejected += count_rejected(keyed_batch)
        distinct.append(keyed_batch.distinct)
    texts = [column for column in distinct[0].columns if column not in ("key", "rows")]
    requests = (
        pl.concat(distinct)
        .group_by("key", maintain_order=True)
        .agg(pl.col(texts).first(), pl.col("rows").sum())
        .select(distinct[0].columns)
    )
    hits = lookup_answers(plan_cache, requests)
    misses = requests.join(hits.select("key"), on="key", how="anti")
    return price_plan(
        job,
        [misses],
        rows=rows,
        keyed_rows=keyed,
        rejected_rows=rejected,
        distinct=requests.height,
        cache_hits=hits.height,
        refreshed=stale_answers(plan_cache, misses),
    )


def count_tallies(work_dir: Path, cache: Cache, similar: pl.DataFrame) -> dict[str, Tally]:
    """Requests and tokens as if every row were sent, each distinct request once, for the
    cache hits and for the ``similar`` answers, from the plan's tables and the answers now
    in the cache."""
    columns = ["key", "prompt_tokens", "completion_tokens"]
    with open_plan_db(work_dir) as con, cache.answers_view(con, name="cached", columns=columns):
        con.register("similar_answers", similar.to_arrow())
        row = con.execute(
            "WITH t AS (SELECT r.rows, coalesce(c.prompt_tokens, s.prompt_tokens, 0) AS p, "
            "coalesce(c.completion_tokens, s.completion_tokens, 0) AS c, "
            "m.key IS NULL AS hit, s.key IS NOT NULL AS is_similar FROM requests r "
            "LEFT JOIN cached c ON c.key = r.key "
            "LEFT JOIN misses m ON m.key = r.key "
            "LEFT JOIN similar_answers s ON s.key = r.key) "
            "SELECT sum(rows), sum(rows * p), sum(rows * c), count(*), sum(p), sum(c), "
            "count(*) FILTER (hit), sum(p) FILTER (hit), sum(c) FILTER (hit), "
            "count(*) FILTER (is_similar), sum(p) FILTER (is_similar), "
            "sum(c) FILTER (is_similar) FROM t"
        ).fetchall()[0]
    values = [int(v or 0) for v in row]
    return {
        "every_row": Tally(*values[0:3]),
        "each_distinct": Tally(*values[3:6]),
        "cache": Tally(*values[6:9]),
        "similar": Tally(*values[9:12]),
    }


def table_report(
    job: Job,
    cache: Cache,
    plan: TablePlan,
    counters: Counters,
    *,
    statuses: dict[str, int],
    tallies: dict[str, Tally],
    started_at: datetime,
) -> RunReport:
    """The report of the job since ``started_at`` (not yet recorded): ``plan``'s counts, what
    its chunks took (``counters``) and the rows written per status, with their ``tallies``."""
    facts = RunFacts(
        model=job.spec.model,
        endpoint=job.spec.endpoint,
        started_at=started_at,
        wall_seconds=(datetime.now(UTC) - started_at).total_seconds(),
        rows=plan.rows,
        distinct=plan.distinct,
        cache_hits=plan.cache_hits,
        refreshed=plan.refreshed,
        statuses=statuses,
        counters=counters,
        stopped=None,
        budget_stop=_budget_stop(job, counters),
        cache=cache.path,
        mode="live" if job.batching is None else "batch",
    )
    return usage_report(job, facts, tallies)


def _budget_stop(job: Job, spent: Counters) -> str | None:
    """The report's reason when a budget kept requests from being sent."""
    if not spent.over_budget:
        return None
    limits = job.spending.limits
    return (
        f"{spent.over_budget:,} request(s) not sent: a budget was reached "
        f"(max_cost={limits.max_cost}, max_requests={limits.max_requests}, "
        f"max_tokens_total={limits.max_tokens_total})"
    )
