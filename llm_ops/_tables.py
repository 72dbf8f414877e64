"""Jobs over Parquet inputs of any size: plan, chunks of distinct requests, write.

Three steps, each a self-contained unit of work that reads and writes files in a work
directory, so a Prefect task, a Ray task or a plain loop can run it, and run it again:

1. :func:`plan_table` streams the input in batches, keys every row, dedupes in a DuckDB work
   database, anti-joins the distinct requests against the cache and writes the misses as chunk
   files of at most ``chunk_size`` requests.
2. :func:`run_chunk` sends one chunk. It re-checks the cache first, so a rerun after a crash
   sends only what is still missing; answers go to the cache as they arrive, every outcome to
   the chunk's results file.
3. :func:`write_table` streams the input again, gives each row its answer and writes the output
   one row group per batch, to a temporary file renamed into place at the end.

Memory is bounded by the batch size and the chunk size, not by the table.

A cascade (``model=[small, large]``) runs differently, batch by batch through the models
(:func:`run_cascade_table`), because which rows reach the next model depends on the answers.
"""

from __future__ import annotations

import glob
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from . import _cache
from ._cascade import run_cascade
from ._engine import Counters
from ._job import Job
from ._plan import (
    ANSWERED,
    CACHEABLE,
    RESULT_SCHEMA,
    from_arrow,
    join_back,
    key_rows,
    lookup_answers,
)
from ._report import RunReport, add_spending, sum_reports
from ._run import answer_misses, make_report, run_sync
from ._savings import Tally, less_spent, with_usage
from .exceptions import ConfigError

_CHUNK_GLOB = "chunk-*.parquet"
# What a chunk's results file keeps: the outcome of every request, and the answers the cache
# does not hold under the request's own key (failures' raw text, answers of similar requests).
_OUTCOME_SCHEMA = {"key": pl.String, "status": pl.String, "error": pl.String, "text": pl.String,
                   "json": pl.String, "prompt_tokens": pl.Int64, "completion_tokens": pl.Int64,
                   "similar_to": pl.String, "similarity": pl.Float64}


def input_files(pattern: str | os.PathLike[str]) -> list[Path]:
    """The Parquet files named by a path or a glob, sorted; :class:`ConfigError` if none."""
    text = os.fspath(pattern)
    files = sorted(Path(p) for p in glob.glob(text)) if glob.has_magic(text) else [Path(text)]
    files = [f for f in files if f.is_file()]
    if not files:
        raise ConfigError(f"no input file matches {text!r}; check the path (globs like "
                          "'data/*.parquet' are allowed)")
    return files


def input_schema(files: list[Path]) -> pl.Schema:
    """The columns of the input, read from the Parquet footers only."""
    return pl.scan_parquet(files).collect_schema()


def iter_batches(files: list[Path], batch_rows: int) -> Iterator[pl.DataFrame]:
    """The input as Polars frames of at most ``batch_rows`` rows, in file and row order."""
    for file in files:
        # One batch at a time: a dataset scanner would read ahead many batches.
        for batch in pq.ParquetFile(file).iter_batches(batch_size=batch_rows):
            if batch.num_rows:
                yield from_arrow(pa.Table.from_batches([batch]))


@dataclass
class TablePlan:
    """What :func:`plan_table` found: counts and the chunk files to send."""

    rows: int
    distinct: int
    cache_hits: int
    skipped: int = 0
    chunks: list[str] = field(default_factory=list)

    @property
    def misses(self) -> int:
        return self.distinct - self.cache_hits


def plan_table(
    job: Job, files: list[Path], work_dir: Path, *, batch_rows: int, chunk_size: int
) -> TablePlan:
    """Key and dedupe the whole input, anti-join the cache, write the misses as chunk files."""
    if job.cache is None:
        raise ConfigError("table jobs need a cache (answers are joined back from it); "
                          "pass a cache path instead of cache=False")
    if job.cascade:
        raise ConfigError("a cascade runs over a table batch by batch: use run_cascade_table")
    work_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*work_dir.glob(_CHUNK_GLOB), work_dir / "plan.duckdb"]:
        stale.unlink(missing_ok=True)
    job.cache.prepare()
    with duckdb.connect(str(work_dir / "plan.duckdb"), config=_cache.NO_EXTENSION_DOWNLOADS) as con:
        # Counted up batch by batch, so the table never holds more than the distinct requests.
        con.execute("CREATE TABLE requests (key VARCHAR PRIMARY KEY, system VARCHAR, "
                    "prompt VARCHAR, rows BIGINT)")
        rows = 0
        for batch in iter_batches(files, batch_rows):
            rows += batch.height
            con.register("batch_requests", key_rows(batch, job).distinct.to_arrow())
            con.execute("INSERT INTO requests SELECT key, system, prompt, rows "
                        "FROM batch_requests ON CONFLICT (key) DO UPDATE "
                        "SET rows = requests.rows + excluded.rows")
            con.unregister("batch_requests")
        with job.cache.attached(con, alias="cache"):
            con.execute(
                "CREATE TABLE misses AS SELECT r.* FROM requests r "
                f"ANTI JOIN ({job.cache.answers_sql('cache', ['key'])}) c ON r.key = c.key "
                "ORDER BY r.key"
            )
        distinct, keyed_rows = con.execute(
            "SELECT count(*), coalesce(sum(rows), 0) FROM requests").fetchall()[0]
        reader = con.sql("SELECT key, system, prompt, rows FROM misses").to_arrow_reader(
            chunk_size
        )
        chunks = []
        for number, chunk in enumerate(reader):
            path = work_dir / f"chunk-{number:05d}.parquet"
            pq.write_table(pa.Table.from_batches([chunk]), path)
            chunks.append(str(path))
        misses = int(con.execute("SELECT count(*) FROM misses").fetchall()[0][0])
    return TablePlan(rows=rows, distinct=int(distinct), cache_hits=int(distinct) - misses,
                     skipped=rows - int(keyed_rows), chunks=chunks)


def results_path(chunk: str | Path) -> Path:
    """Where :func:`run_chunk` writes the outcomes of ``chunk``."""
    return Path(chunk).with_suffix(".results.parquet")


def remaining_budget(job: Job, spent: Counters) -> Job:
    """``job`` with its budgets reduced by what earlier chunks of the same job spent."""
    return less_spent(job, spent)


def budget_stop(job: Job, spent: Counters) -> str | None:
    """The report's reason when a budget kept requests from being sent."""
    if not spent.over_budget:
        return None
    return (f"{spent.over_budget:,} request(s) not sent: a budget was reached "
            f"(max_cost={job.max_cost}, max_requests={job.max_requests}, "
            f"max_tokens_total={job.max_tokens_total})")


def run_chunk(job: Job, chunk: str | Path) -> Counters:
    """Send the requests of one chunk file that the cache still lacks; returns the counters.

    Budgets apply to this chunk alone: pass :func:`remaining_budget` of the job's. Raises
    :class:`~llm_ops.JobAbortedError` (after caching what was answered) if the endpoint
    stopped the job.
    """
    assert job.cache is not None  # plan_table refuses to run without a cache
    job.cache.prepare()
    misses = pl.read_parquet(chunk)
    # Answered by an earlier attempt of this chunk: they count as answered in this run.
    earlier = lookup_answers(job.cache, misses).with_columns(
        pl.col("status").replace({"cached": "ok"})
    )
    remaining = misses.join(earlier.select("key"), on="key", how="anti")
    outcomes, counters = run_sync(_answer(job, remaining, rows=int(misses["rows"].sum())))
    earlier = earlier.select("key", "status", "error").cast(pl.String)
    pl.concat([earlier, outcomes], how="diagonal_relaxed").select(
        list(_OUTCOME_SCHEMA)).write_parquet(results_path(chunk))
    return counters


async def _answer(job: Job, misses: pl.DataFrame, *, rows: int) -> tuple[pl.DataFrame, Counters]:
    """Answer ``misses`` (by similarity or by sending); outcomes as in a results file, and the
    counters."""
    done = await answer_misses(misses, job, rows=rows)
    if done.stopped is not None:
        raise done.stopped
    # Answers are read back from the cache; only what the cache does not keep is kept here.
    fresh = pl.DataFrame(
        {"key": [o.key for o in done.outcomes], "status": [o.status for o in done.outcomes],
         "error": [o.error for o in done.outcomes],
         "text": [None if o.status in CACHEABLE else o.text for o in done.outcomes]},
        schema={name: _OUTCOME_SCHEMA[name] for name in ("key", "status", "error", "text")},
    )
    similar = done.settled.select(list(_OUTCOME_SCHEMA))
    return pl.concat([similar, fresh], how="diagonal_relaxed"), done.counters


@dataclass
class Written:
    """What :func:`write_table` wrote: rows per status, and the requests and tokens behind
    them for the report's savings (see :func:`~llm_ops._savings.tally`)."""

    statuses: dict[str, int]
    tallies: dict[str, Tally]


def _tallies(job: Job, work_dir: Path, similar: pl.DataFrame) -> dict[str, Tally]:
    """Requests and tokens as if every row were sent, each distinct request once, for the
    cache hits and for the ``similar`` answers (key, prompt_tokens, completion_tokens), from
    the plan's tables and the answers now in the cache."""
    assert job.cache is not None
    plan = work_dir / "plan.duckdb"
    answers = job.cache.answers_sql("cache", ["key", "prompt_tokens", "completion_tokens"])
    with (duckdb.connect(str(plan), config=_cache.NO_EXTENSION_DOWNLOADS) as con,
          job.cache.attached(con, alias="cache")):
        con.register("similar_answers", similar.to_arrow())
        row = con.execute(
            "WITH t AS (SELECT r.rows, coalesce(c.prompt_tokens, s.prompt_tokens, 0) AS p, "
            "coalesce(c.completion_tokens, s.completion_tokens, 0) AS c, m.key IS NULL AS hit, "
            "s.key IS NOT NULL AS is_similar FROM requests r "
            f"LEFT JOIN ({answers}) c ON c.key = r.key "
            "LEFT JOIN misses m ON m.key = r.key "
            "LEFT JOIN similar_answers s ON s.key = r.key) "
            "SELECT sum(rows), sum(rows * p), sum(rows * c), count(*), sum(p), sum(c), "
            "count(*) FILTER (hit), sum(p) FILTER (hit), sum(c) FILTER (hit), "
            "count(*) FILTER (is_similar), sum(p) FILTER (is_similar), sum(c) FILTER (is_similar) "
            "FROM t"
        ).fetchall()[0]
    values = [int(v or 0) for v in row]
    return {"every_row": Tally(*values[0:3]), "each_distinct": Tally(*values[3:6]),
            "cache": Tally(*values[6:9]), "similar": Tally(*values[9:12])}


def write_table(
    job: Job, files: list[Path], output: Path, work_dir: Path, *, batch_rows: int
) -> Written:
    """Write the input plus the answer, status and error columns."""
    outcome_files = sorted(work_dir.glob("chunk-*.results.parquet"))
    fresh = (
        pl.read_parquet(outcome_files) if outcome_files else pl.DataFrame(schema=_OUTCOME_SCHEMA)
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    counts: dict[str, int] = {}
    writer: pq.ParquetWriter | None = None
    try:
        for batch in iter_batches(files, batch_rows):
            keyed = key_rows(batch, job)
            wanted = keyed.distinct.select("key")
            results = _batch_results(lookup_answers(job.cache, wanted),
                                     wanted.join(fresh, on="key"))
            columns = join_back(keyed.rows, results, job)
            for status, n in columns[job.status_column].value_counts().iter_rows():
                counts[str(status)] = counts.get(str(status), 0) + int(n)
            table = batch.hstack(columns.get_columns()).to_arrow()
            if writer is None:
                writer = pq.ParquetWriter(partial, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        raise ConfigError(f"the input {', '.join(map(str, files))} has no rows")
    partial.replace(output)
    similar = fresh.filter(pl.col("status") == "similar").select(
        "key", "prompt_tokens", "completion_tokens")
    return Written(statuses=counts, tallies=_tallies(job, work_dir, similar))


def _batch_results(cached: pl.DataFrame, fresh: pl.DataFrame) -> pl.DataFrame:
    """Answers from the cache, with this run's statuses (ok, failed, ...) taking precedence,
    and this run's answers where the cache has none under the key (similar, invalid)."""
    merged = cached.join(fresh, on="key", how="full", coalesce=True, suffix="_run")
    run_first = ("status", "error")
    return merged.select(
        "key",
        *(pl.coalesce(f"{name}_run", name).alias(name) if name in run_first
          else pl.coalesce(name, f"{name}_run").alias(name)
          for name in RESULT_SCHEMA if name != "key"),
    ).cast(RESULT_SCHEMA)  # type: ignore[arg-type]


def finish_report(
    job: Job, plan: TablePlan, counters: Counters, written: Written, *,
    started_at: datetime, wall_seconds: float,
) -> RunReport:
    """The report of a table job, recorded in ``llm_runs``."""
    report = make_report(
        job, started_at=started_at, wall_seconds=wall_seconds, rows=plan.rows,
        distinct=plan.distinct, cache_hits=plan.cache_hits, counters=counters,
        statuses=written.statuses, stopped=None, budget_stop=budget_stop(job, counters),
    )
    answered = sum(n for status, n in written.statuses.items() if status in ANSWERED)
    report = with_usage(report, job, answered_rows=answered, tallies=written.tallies,
                        counters=counters)
    assert job.cache is not None  # plan_table refuses to run without a cache
    job.cache.record_run(report.as_dict())
    return report


def run_cascade_table(job: Job, files: list[Path], output: Path, *, batch_rows: int) -> RunReport:
    """A cascade over a Parquet input, one batch of rows at a time, recorded as one run.

    Each batch goes through the models as in ``llm_complete`` and is written as one row group
    of a temporary file renamed into place at the end; budgets span the batches. The cache
    carries answers from batch to batch, so a request repeated in a later batch is a cache hit
    and a rerun after a crash sends only what the cache lacks.
    """
    started_at, clock = datetime.now(UTC), time.perf_counter()
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    reports: list[RunReport] = []
    spent: tuple[float, int, int] = (0.0, 0, 0)
    stopped: BaseException | None = None
    writer: pq.ParquetWriter | None = None
    try:
        for batch in iter_batches(files, batch_rows):
            columns, report, stopped = run_sync(run_cascade(batch, job.less_budget(*spent)))
            reports.append(report)
            spent = add_spending(spent, report.spending())
            if stopped is not None:
                break
            table = batch.hstack(columns.get_columns()).to_arrow()
            writer = writer or pq.ParquetWriter(partial, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()
    if not reports:
        raise ConfigError(f"the input {', '.join(map(str, files))} has no rows")
    total = sum_reports(reports, started_at=started_at, model=" > ".join(job.models),
                        wall_seconds=time.perf_counter() - clock)
    if job.cache is not None:
        job.cache.record_run(total.as_dict())
    if stopped is not None:
        raise stopped
    partial.replace(output)
    return total


def run_table(
    job: Job, files: list[Path], output: Path, *, batch_rows: int, chunk_size: int
) -> RunReport:
    """Plan, send every chunk and write, in this process; the work directory is removed.
    A cascade runs batch by batch instead (:func:`run_cascade_table`)."""
    if job.cascade:
        return run_cascade_table(job, files, output, batch_rows=batch_rows)
    started_at, clock = datetime.now(UTC), time.perf_counter()
    work_dir = output.with_name(output.name + ".work")
    plan = plan_table(job, files, work_dir, batch_rows=batch_rows, chunk_size=chunk_size)
    counters = Counters()
    for chunk in plan.chunks:
        counters.add(run_chunk(remaining_budget(job, counters), chunk))
    written = write_table(job, files, output, work_dir, batch_rows=batch_rows)
    shutil.rmtree(work_dir, ignore_errors=True)
    return finish_report(job, plan, counters, written, started_at=started_at,
                         wall_seconds=time.perf_counter() - clock)
