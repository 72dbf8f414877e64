"""Jobs over Parquet inputs of any size, as steps over files that any process can run.

A :class:`Table` is one job over a Parquet path or glob, on a :class:`~llm_ops.Client`::

    from llm_ops import Client
    from llm_ops.tables import Table

    with Client(base_url=..., cache="output/cache.duckdb") as client:
        table = Table(client, "data/*.parquet", "output/out.parquet",
                      prompt="Summarize: {text}", model="gpt-4o-mini")
        report = table.run()  # or the steps, one by one:

1. :meth:`Table.plan` streams the input in batches, keys every row, dedupes in a DuckDB work
   database, anti-joins the distinct requests against the cache and writes the misses as chunk
   files of at most ``chunk_size`` requests, in a work directory next to the output.
2. :meth:`Table.run_chunk` sends one chunk. It re-checks the cache first, so a rerun after a
   crash sends only what is still missing; answers go to the cache as they arrive, every
   outcome to the chunk's results file.
3. :meth:`Table.write` streams the input again, gives each row its answer and writes the
   output one row group per batch, to a temporary file renamed into place at the end.
4. :meth:`Table.finish` makes the report, records it in ``llm_runs`` and removes the work
   directory.

Each step is a self-contained unit of work over files, so a Prefect task (or a Ray task) can run
it, and run it again. Memory is bounded by the batch size and the chunk size, not by the table.
A cascade (``model=[small, large]``) runs batch by batch through the models instead
(:meth:`Table.run_cascade`), because which rows reach the next model depends on the answers.
"""

from __future__ import annotations

import glob
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Unpack

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ._batch import BatchPart, BatchRunner
from ._cache import DUCKDB_CONFIG, Cache
from ._cascade import run_cascade
from ._client import Client
from ._dispatch import requests_for
from ._estimate import Estimate, price_plan
from ._frames import from_arrow
from ._join import join_back, status_counts
from ._options import CallOptions, Job, ModelOption, check_job, make_job
from ._outcome import Counters, Outcome, Request
from ._pipeline import answer_misses
from ._plan import key_rows, lookup_answers
from ._progress import ChunkedProgress
from ._report import RunReport, add_spending, make_report, sum_reports
from ._savings import Tally, completion_cost, spent_by, with_usage
from ._spec import positive_int
from ._status import ANSWERED, CACHEABLE, RESULTS
from .exceptions import ConfigError

__all__ = ["BatchPart", "Counters", "Table", "TablePlan", "Written", "input_files"]

_CHUNK_GLOB = "chunk-*.parquet"
# What a chunk's results file keeps: the outcome of every request, and the answers the cache
# does not hold under the request's own key (failures' raw text, answers of similar requests).
_OUTCOME_SCHEMA = {
    "key": pl.String,
    "status": pl.String,
    "error": pl.String,
    "text": pl.String,
    "json": pl.String,
    "prompt_tokens": pl.Int64,
    "completion_tokens": pl.Int64,
    "similar_to": pl.String,
    "similarity": pl.Float64,
}


def input_files(pattern: str | os.PathLike[str]) -> list[Path]:
    """The Parquet files named by a path or a glob, sorted; :class:`ConfigError` if none.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> import polars as pl
    >>> from llm_ops.tables import input_files
    >>> work = tempfile.TemporaryDirectory()
    >>> for part in (1, 0):
    ...     pl.DataFrame({"text": ["a"]}).write_parquet(Path(work.name, f"part-{part}.parquet"))
    >>> [path.name for path in input_files(Path(work.name, "part-*.parquet"))]
    ['part-0.parquet', 'part-1.parquet']
    >>> input_files(Path(work.name, "missing-*.parquet"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    llm_ops.exceptions.ConfigError: no input file matches '...missing-*.parquet'; check the ...
    >>> work.cleanup()
    """
    text = os.fspath(pattern)
    files = sorted(Path(p) for p in glob.glob(text)) if glob.has_magic(text) else [Path(text)]
    files = [f for f in files if f.is_file()]
    if not files:
        raise ConfigError(
            f"no input file matches {text!r}; check the path (globs like "
            "'data/*.parquet' are allowed)"
        )
    return files


def _batches(files: list[Path], batch_rows: int) -> Iterator[pl.DataFrame]:
    """The input as Polars frames of at most ``batch_rows`` rows, in file and row order."""
    for file in files:
        # One batch at a time: a dataset scanner would read ahead many batches.
        for batch in pq.ParquetFile(file).iter_batches(batch_size=batch_rows):
            if batch.num_rows:
                yield from_arrow(pa.Table.from_batches([batch]))


@dataclass
class TablePlan:
    """What :meth:`Table.plan` found: counts and the chunk files to send.

    Attributes
    ----------
    rows
        Rows of the input.
    distinct
        Distinct requests among them (a row whose columns are null makes none).
    cache_hits
        Distinct requests the cache answers already.
    skipped
        Rows not sent: a column the prompt reads is null.
    chunks
        The chunk files of the requests to send, for :meth:`Table.run_chunk`.
    misses
        Distinct requests to send: ``distinct - cache_hits``.

    Examples
    --------
    >>> from llm_ops.tables import TablePlan
    >>> TablePlan(rows=1_000, distinct=120, cache_hits=100).misses
    20
    """

    rows: int
    distinct: int
    cache_hits: int
    skipped: int = 0
    chunks: list[str] = field(default_factory=list)

    @property
    def misses(self) -> int:
        return self.distinct - self.cache_hits


@dataclass
class Written:
    """What :meth:`Table.write` wrote: rows per status, and the requests and tokens behind
    them for the report's savings.

    Attributes
    ----------
    statuses
        Rows written per status (:data:`llm_ops.STATUSES`); statuses no row has are left out.
    tallies
        Requests and tokens as if every row were sent (``every_row``), each distinct request
        once (``each_distinct``), and those the cache (``cache``) and the semantic cache
        (``similar``) answered, for :meth:`Table.finish`.

    See the example of :meth:`Table.plan`.
    """

    statuses: dict[str, int]
    tallies: dict[str, Tally]


class Table:
    """One job over a Parquet input (a path or a glob), written to a Parquet file ``out``.

    Parameters
    ----------
    client
        The client to send with; its cache is required (answers are joined back from it).
    source, out
        Parquet path or glob to read; Parquet file to write (the input's columns in order,
        plus the added ones).
    prompt, model, **options
        As for :func:`llm_ops.llm_complete` (see :class:`llm_ops.CallOptions`).
    batch_rows
        Rows read and written per batch (and per row group of the output).
    chunk_size
        Distinct requests per chunk file, the unit :meth:`run_chunk` sends.

    Everything that can be checked is checked when the table is made, before anything is sent.

    Examples
    --------
    The whole job in one call (:meth:`run`); :meth:`plan` shows it step by step:

    >>> import tempfile
    >>> from pathlib import Path
    >>> import polars as pl
    >>> from llm_ops import Client
    >>> from llm_ops.tables import Table
    >>> from llm_ops.testing import LocalEndpoint
    >>> work = tempfile.TemporaryDirectory()
    >>> reviews, summaries = Path(work.name, "reviews.parquet"), Path(work.name, "out.parquet")
    >>> texts = ["Runs small", "Lovely fabric", None, "Runs small"]
    >>> pl.DataFrame({"id": [1, 2, 3, 4], "text": texts}).write_parquet(reviews)
    >>> cache = Path(work.name, "cache.duckdb")
    >>> with LocalEndpoint() as endpoint, Client(base_url=endpoint.base_url, cache=cache) as client:
    ...     table = Table(client, reviews, summaries, prompt="Summarize: {text}", model="sim")
    ...     report = table.run()
    >>> report.rows, report.requests_sent, table.columns
    (4, 2, ('completion', 'completion_status', 'completion_error'))
    >>> pl.read_parquet(summaries).select("id", "completion_status", "completion_error")
    shape: (4, 3)
    ┌─────┬───────────────────┬─────────────────────────────────┐
    │ id  ┆ completion_status ┆ completion_error                │
    │ --- ┆ ---               ┆ ---                             │
    │ i64 ┆ enum              ┆ str                             │
    ╞═════╪═══════════════════╪═════════════════════════════════╡
    │ 1   ┆ ok                ┆ null                            │
    │ 2   ┆ ok                ┆ null                            │
    │ 3   ┆ skipped           ┆ column 'text' is null; row not… │
    │ 4   ┆ ok                ┆ null                            │
    └─────┴───────────────────┴─────────────────────────────────┘
    >>> work.cleanup()
    """

    def __init__(
        self,
        client: Client,
        source: str | os.PathLike[str],
        out: str | os.PathLike[str],
        /,
        *,
        prompt: str,
        model: ModelOption,
        batch_rows: int = 100_000,
        chunk_size: int = 5_000,
        **options: Unpack[CallOptions],
    ) -> None:
        if client.cache is None:
            raise ConfigError(
                "table jobs need a cache (answers are joined back from it); "
                "pass a cache path instead of cache=False"
            )
        self.client = client
        self.cache: Cache = client.cache
        self.files = input_files(source)
        self.output = Path(out)
        if any(f.resolve() == self.output.resolve() for f in self.files):
            raise ConfigError(f"output {os.fspath(out)!r} is also an input; write somewhere else")
        self.batch_rows = positive_int("batch_rows", batch_rows)
        self.chunk_size = positive_int("chunk_size", chunk_size)
        schema = pl.scan_parquet(self.files).collect_schema()
        self.job: Job = make_job(
            prompt=prompt,
            model=model,
            endpoint=client.endpoint.identity,
            cached=True,
            options=options,
        )
        check_job(self.job, schema)
        self.work_dir = self.output.with_name(self.output.name + ".work")
        # where workers that may not open the cache leave their answers (see llm_ops.ray)
        self.answers_dir = self.work_dir / "answers"

    @property
    def cascade(self) -> bool:
        return self.job.cascade is not None

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns the job adds."""
        return self.job.columns.names

    def cost(self, counters: Counters) -> float | None:
        """What the requests ``counters`` count cost at the job's price (``None``: unknown).

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> import polars as pl
        >>> from llm_ops import Client, Price
        >>> from llm_ops.tables import Counters, Table
        >>> work = tempfile.TemporaryDirectory()
        >>> pl.DataFrame({"text": ["a"]}).write_parquet(Path(work.name, "in.parquet"))
        >>> with Client(base_url="http://127.0.0.1:9/v1", cache=Path(work.name, "c.duckdb")) as c:
        ...     table = Table(c, Path(work.name, "in.parquet"), Path(work.name, "out.parquet"),
        ...                   prompt="{text}", model="m", pricing={"m": Price(1.00, 4.00)})
        >>> table.cost(Counters(prompt_tokens=1_000_000, completion_tokens=500_000))
        3.0
        >>> work.cleanup()
        """
        return completion_cost(self.job, counters)

    def run(self) -> RunReport:
        """Plan, send every chunk, write and finish, in this process (a cascade batch by
        batch); returns the report, recorded in ``llm_runs``.

        A rerun sends only what the cache lacks. See the example of :class:`Table`, and
        :meth:`plan` for the same steps one by one.
        """
        if self.cascade:
            return self.run_cascade()
        started_at = datetime.now(UTC)
        plan = self.plan()
        if self.job.batching is not None:  # every chunk's batches run at once
            for chunk in plan.chunks:
                self.submit(chunk)
        counters = Counters()
        progress = self._progress(plan)
        job = self.job if progress is None else replace(self.job, progress=progress)
        try:
            for chunk in plan.chunks:
                taken = send_chunk(self.client, job, self.cache, chunk, spent=counters)
                counters.add(taken)
                if progress is not None:
                    progress.chunk_done(taken)
        finally:
            if progress is not None:
                progress.close()
        return self.finish(plan, counters, self.write(), started_at=started_at)

    # -- the steps ----------------------------------------------------------------------------

    def plan(self) -> TablePlan:
        """Key and dedupe the whole input, anti-join the cache, write the misses as chunk
        files in the work directory.

        The first of the steps :meth:`run` takes, each a unit of work that a task (of a
        Prefect flow, or on another machine) can run, and run again: :meth:`plan`, then
        :meth:`run_chunk` for every chunk, :meth:`write` and :meth:`finish`.

        Examples
        --------
        >>> import tempfile
        >>> from datetime import UTC, datetime
        >>> from pathlib import Path
        >>> import polars as pl
        >>> from llm_ops import Client
        >>> from llm_ops.tables import Counters, Table
        >>> from llm_ops.testing import LocalEndpoint
        >>> work = tempfile.TemporaryDirectory()
        >>> reviews, out = Path(work.name, "reviews.parquet"), Path(work.name, "out.parquet")
        >>> texts = [f"review {i % 3}" for i in range(10)] + [None]
        >>> pl.DataFrame({"text": texts}).write_parquet(reviews)
        >>> cache = Path(work.name, "cache.duckdb")
        >>> with LocalEndpoint() as endpoint, Client(base_url=endpoint.base_url, cache=cache) as c:
        ...     table = Table(c, reviews, out, prompt="Summarize: {text}", model="sim",
        ...                   chunk_size=2)
        ...     started, spent = datetime.now(UTC), Counters()
        ...     plan = table.plan()
        ...     for chunk in plan.chunks:
        ...         spent.add(table.run_chunk(chunk, spent=spent))
        ...     written = table.write()
        ...     report = table.finish(plan, spent, written, started_at=started)
        >>> plan.rows, plan.distinct, plan.skipped, plan.misses, len(plan.chunks)
        (11, 3, 1, 3, 2)
        >>> spent.sent, sorted(written.statuses.items())
        (3, [('ok', 10), ('skipped', 1)])
        >>> report.requests_sent, table.work_dir.exists(), pl.read_parquet(out).height
        (3, False, 11)
        >>> work.cleanup()
        """
        if self.cascade:
            raise ConfigError("a cascade runs over a table batch by batch: use run_cascade()")
        self.cache.prepare()
        # answers a crashed run's workers left are cache hits, not requests to send again
        self.cache.adopt(self.answers_dir, wait=2.0)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        for stale in [*self.work_dir.glob(_CHUNK_GLOB), self.work_dir / "plan.duckdb"]:
            stale.unlink(missing_ok=True)
        with self._plan_db() as con:
            # Counted up batch by batch, so the table never holds more than the distinct
            # requests.
            # first: the request's rank by its first row, for send_order="input"
            con.execute(
                "CREATE TABLE requests (key VARCHAR PRIMARY KEY, system VARCHAR, "
                "prompt VARCHAR, rows BIGINT, first BIGINT)"
            )
            rows = seen = 0
            for batch in _batches(self.files, self.batch_rows):
                rows += batch.height
                found = key_rows(batch, self.job.spec).distinct.with_row_index("first", seen)
                seen += found.height
                con.register("batch_requests", found.to_arrow())
                con.execute(
                    "INSERT INTO requests SELECT key, system, prompt, rows, first "
                    "FROM batch_requests ON CONFLICT (key) DO UPDATE "
                    "SET rows = requests.rows + excluded.rows"
                )
                con.unregister("batch_requests")
            # Chunks are runs of the send order (llm_ops._order): byte-wise, as Polars sorts.
            prefix = self.job.send_order == "prefix"
            order = "r.system NULLS FIRST, r.prompt, r.key" if prefix else "r.first"
            with self.cache.answers_view(con, name="cached", columns=["key"]):
                con.execute(
                    "CREATE TABLE misses AS SELECT r.* FROM requests r "
                    f"ANTI JOIN cached c ON r.key = c.key ORDER BY {order}"
                )
            distinct, keyed_rows = con.execute(
                "SELECT count(*), coalesce(sum(rows), 0) FROM requests"
            ).fetchall()[0]
            reader = con.sql("SELECT key, system, prompt, rows FROM misses").to_arrow_reader(
                self.chunk_size
            )
            chunks = []
            for number, chunk in enumerate(reader):
                path = self.work_dir / f"chunk-{number:05d}.parquet"
                pq.write_table(pa.Table.from_batches([chunk]), path)
                chunks.append(str(path))
            misses = int(con.execute("SELECT count(*) FROM misses").fetchall()[0][0])
        if misses:  # a misspelled model fails the plan, not every chunk task after it
            self.client.run(self.client.prepare(models=self.job.models))
        return TablePlan(
            rows=rows,
            distinct=int(distinct),
            cache_hits=int(distinct) - misses,
            skipped=rows - int(keyed_rows),
            chunks=chunks,
        )

    def run_chunk(
        self, chunk: str | os.PathLike[str], *, spent: Counters | None = None
    ) -> Counters:
        """Send the requests of one chunk file that the cache still lacks; returns what it
        took. Budgets count what ``spent`` (earlier chunks) took. Raises
        :class:`~llm_ops.JobAbortedError` (after caching what was answered) if the endpoint
        stopped the job.

        See the example of :meth:`plan`.
        """
        return send_chunk(self.client, self.job, self.cache, chunk, spent=spent)

    def submit(self, chunk: str | os.PathLike[str]) -> list[BatchPart]:
        """With ``mode="batch"``: submit the chunk's requests that the cache lacks and no
        recorded batch carries, and return at once; :meth:`run_chunk` then waits for them
        and collects their answers (it submits nothing again).

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> import polars as pl
        >>> from llm_ops import Client
        >>> from llm_ops.tables import Table
        >>> from llm_ops.testing import LocalEndpoint
        >>> work = tempfile.TemporaryDirectory()
        >>> reviews, out = Path(work.name, "reviews.parquet"), Path(work.name, "out.parquet")
        >>> pl.DataFrame({"text": ["Runs small", "Lovely fabric"]}).write_parquet(reviews)
        >>> cache = Path(work.name, "cache.duckdb")
        >>> with (
        ...     LocalEndpoint(batch_seconds=0.2) as endpoint,  # its batches take 0.2 s
        ...     Client(base_url=endpoint.base_url, cache=cache) as client,
        ... ):
        ...     table = Table(client, reviews, out, prompt="Summarize: {text}", model="sim",
        ...                   mode="batch", batch_poll_seconds=0.1)
        ...     chunk = table.plan().chunks[0]
        ...     parts = table.submit(chunk)     # returns once the batch is created
        ...     taken = table.run_chunk(chunk)  # waits for it, and collects its answers
        ...     uploaded = endpoint.stats()["lines_uploaded"]
        >>> [(part.state, part.requests) for part in parts], taken.answered, uploaded
        ([('submitted', 2)], 2, 2)
        >>> work.cleanup()
        """
        if self.job.batching is None:
            raise ConfigError("submit() is for mode='batch'; run_chunk() sends live requests")
        misses = pl.read_parquet(Path(chunk))
        remaining = misses.join(
            lookup_answers(self.cache, misses).select("key"), on="key", how="anti"
        )
        return self.client.run(_submit(self.client, self.job, remaining))

    def write(self) -> Written:
        """Write the input plus the added columns, batch by batch.

        See the example of :meth:`plan`.
        """
        outcome_files = sorted(self.work_dir.glob("chunk-*.results.parquet"))
        fresh = (
            pl.read_parquet(outcome_files)
            if outcome_files
            else pl.DataFrame(schema=_OUTCOME_SCHEMA)
        )
        self.output.parent.mkdir(parents=True, exist_ok=True)
        partial = self.output.with_name(self.output.name + ".partial")
        counts: dict[str, int] = {}
        writer: pq.ParquetWriter | None = None
        try:
            for batch in _batches(self.files, self.batch_rows):
                keyed = key_rows(batch, self.job.spec)
                wanted = keyed.distinct.select("key")
                results = _batch_results(
                    lookup_answers(self.cache, wanted), wanted.join(fresh, on="key")
                )
                added = join_back(
                    keyed.groups,
                    results,
                    self.job.columns,
                    self.job.spec.schema,
                    row_group=keyed.row_group,
                )
                for status, n in status_counts(added, self.job.columns).items():
                    counts[status] = counts.get(status, 0) + n
                table = batch.hstack(added.get_columns()).to_arrow()
                if writer is None:
                    writer = pq.ParquetWriter(partial, table.schema)
                writer.write_table(table)
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise ConfigError(f"the input {', '.join(map(str, self.files))} has no rows")
        partial.replace(self.output)
        similar = fresh.filter(pl.col("status") == "similar").select(
            "key", "prompt_tokens", "completion_tokens"
        )
        return Written(statuses=counts, tallies=self._tallies(similar))

    def finish(
        self,
        plan: TablePlan,
        counters: Counters,
        written: Written,
        *,
        started_at: datetime,
    ) -> RunReport:
        """The report of the job since ``started_at``, recorded in ``llm_runs``; the work
        directory is removed.

        See the example of :meth:`plan`.
        """
        job = self.job
        wall_seconds = (datetime.now(UTC) - started_at).total_seconds()
        report = make_report(
            model=job.spec.model,
            endpoint=job.spec.endpoint,
            started_at=started_at,
            wall_seconds=wall_seconds,
            rows=plan.rows,
            distinct=plan.distinct,
            cache_hits=plan.cache_hits,
            counters=counters,
            statuses=written.statuses,
            stopped=None,
            cost=completion_cost(job, counters),
            budget_stop=_budget_stop(job, counters),
            cache=self.cache.path,
        )
        answered = sum(n for status, n in written.statuses.items() if status in ANSWERED)
        report = with_usage(
            report,
            job,
            answered_rows=answered,
            cached=True,
            tallies=written.tallies,
            counters=counters,
        )
        report = replace(report, journal_pending=self.cache.record_run(report.as_dict()))
        shutil.rmtree(self.work_dir, ignore_errors=True)
        return report

    def run_cascade(self) -> RunReport:
        """A cascade over the input, one batch of rows at a time, recorded as one run.

        Each batch goes through the models as in ``llm_complete`` and is written as one row
        group of a temporary file renamed into place at the end; budgets span the batches.
        The cache carries answers from batch to batch, so a request repeated in a later batch
        is a cache hit and a rerun after a crash sends only what the cache lacks.

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> import polars as pl
        >>> from pydantic import BaseModel
        >>> from llm_ops import Client, confidence_below
        >>> from llm_ops.tables import Table
        >>> from llm_ops.testing import LocalEndpoint
        >>> class Sentiment(BaseModel):
        ...     label: str
        ...     confidence: float
        >>> work = tempfile.TemporaryDirectory()
        >>> tickets, out = Path(work.name, "tickets.parquet"), Path(work.name, "out.parquet")
        >>> hard = "Not sure [[sim:unsure_for=sim-small]]"  # sim-small is unsure of this one
        >>> pl.DataFrame({"text": ["Great fit", hard, "Too small"]}).write_parquet(tickets)
        >>> cache = Path(work.name, "cache.duckdb")
        >>> with LocalEndpoint() as endpoint, Client(base_url=endpoint.base_url, cache=cache) as c:
        ...     table = Table(c, tickets, out, prompt="Sentiment of: {text}",
        ...                   model=["sim-small", "sim"], schema=Sentiment, output="sentiment",
        ...                   escalate=confidence_below(0.5))
        ...     report = table.run_cascade()  # what run() does with a cascade
        >>> {model: usage.rows for model, usage in report.models.items()}
        {'sim-small': 2, 'sim': 1}
        >>> pl.read_parquet(out)["sentiment_model"].to_list()
        ['sim-small', 'sim', 'sim-small']
        >>> work.cleanup()
        """
        started_at, clock = datetime.now(UTC), time.perf_counter()
        self.output.parent.mkdir(parents=True, exist_ok=True)
        partial = self.output.with_name(self.output.name + ".partial")
        reports: list[RunReport] = []
        spent: tuple[float, int, int] = (0.0, 0, 0)
        stopped: BaseException | None = None
        writer: pq.ParquetWriter | None = None
        try:
            for batch in _batches(self.files, self.batch_rows):
                added, report, stopped = self.client.run(
                    _cascade(self.client, batch, self.job.after(spent))
                )
                reports.append(report)
                spent = add_spending(spent, report.spending())
                if stopped is not None:
                    break
                table = batch.hstack(added.get_columns()).to_arrow()
                writer = writer or pq.ParquetWriter(partial, table.schema)
                writer.write_table(table)
        finally:
            if writer is not None:
                writer.close()
        if not reports:
            raise ConfigError(f"the input {', '.join(map(str, self.files))} has no rows")
        total = sum_reports(
            reports,
            started_at=started_at,
            model=" > ".join(self.job.models),
            wall_seconds=time.perf_counter() - clock,
        )
        waiting = self.cache.record_run(total.as_dict(), wait=None if stopped is None else 2.0)
        total = replace(total, journal_pending=waiting)
        if stopped is not None:
            raise stopped
        partial.replace(self.output)
        return total

    def estimate(self) -> Estimate:
        """What :meth:`run` would send and cost; nothing is sent and no cache file is made
        (a cascade is priced from the first model's requests).

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> import polars as pl
        >>> from llm_ops import Client
        >>> from llm_ops.tables import Table
        >>> work = tempfile.TemporaryDirectory()
        >>> reviews, out = Path(work.name, "reviews.parquet"), Path(work.name, "out.parquet")
        >>> texts = ["Runs small", "Lovely fabric", None, "Runs small"]
        >>> pl.DataFrame({"text": texts}).write_parquet(reviews)
        >>> cache = Path(work.name, "cache.duckdb")
        >>> with Client(base_url="http://127.0.0.1:9/v1", cache=cache) as client:  # not called
        ...     table = Table(client, reviews, out, prompt="Summarize: {text}",
        ...                   model="gpt-4o-mini", max_tokens=50)
        ...     plan = table.estimate()
        >>> plan.rows, plan.skipped_rows, plan.requests, plan.output_tokens_max, cache.exists()
        (4, 1, 2, 100, False)
        >>> work.cleanup()
        """
        job = self.job if not self.cascade else self.job.for_model(self.job.models[0])
        plan_cache = self.cache if self.cache.path.exists() else None
        rows = keyed = 0
        distinct: list[pl.DataFrame] = []
        for batch in _batches(self.files, self.batch_rows):
            keyed_batch = key_rows(batch, job.spec)
            rows += batch.height
            keyed += int(keyed_batch.distinct["rows"].sum())
            distinct.append(keyed_batch.distinct)
        requests = (
            pl.concat(distinct)
            .group_by("key", maintain_order=True)
            .agg(pl.col("system", "prompt").first(), pl.col("rows").sum())
        )
        hits = lookup_answers(plan_cache, requests)
        misses = requests.join(hits.select("key"), on="key", how="anti")
        return price_plan(
            job,
            [misses],
            rows=rows,
            keyed_rows=keyed,
            distinct=requests.height,
            cache_hits=hits.height,
        )

    # -- helpers ------------------------------------------------------------------------------

    def _progress(self, plan: TablePlan) -> ChunkedProgress | None:
        """One progress line over all of ``plan``'s chunks, if the job shows progress."""
        if self.job.progress is None or not plan.chunks:
            return None
        sizes = []
        for chunk in plan.chunks:
            rows = pl.read_parquet(chunk, columns=["rows"])["rows"]  # a request's rows
            sizes.append((rows.len(), int(rows.sum())))
        return ChunkedProgress(self.job.progress, rows=plan.rows, chunks=sizes)

    def _plan_db(self) -> duckdb.DuckDBPyConnection:
        return duckdb.connect(str(self.work_dir / "plan.duckdb"), config=DUCKDB_CONFIG)

    def _tallies(self, similar: pl.DataFrame) -> dict[str, Tally]:
        """Requests and tokens as if every row were sent, each distinct request once, for the
        cache hits and for the ``similar`` answers, from the plan's tables and the answers now
        in the cache."""
        columns = ["key", "prompt_tokens", "completion_tokens"]
        with self._plan_db() as con, self.cache.answers_view(con, name="cached", columns=columns):
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


def _results_path(chunk: str | os.PathLike[str]) -> Path:
    return Path(chunk).with_suffix(".results.parquet")


def send_chunk(
    client: Client,
    job: Job,
    cache: Cache,
    chunk: str | os.PathLike[str],
    *,
    spent: Counters | None = None,
) -> Counters:
    """:meth:`Table.run_chunk`, with answers written through ``cache`` (a cluster worker's
    passes a store that only appends to the work directory: see :mod:`llm_ops.ray`).

    See the example of :class:`llm_ops.ray.WorkerStore`: a chunk sent as a worker sends it.
    """
    misses = pl.read_parquet(Path(chunk))
    # Answered by an earlier attempt of this chunk: they count as answered in this run.
    earlier = lookup_answers(cache, misses).with_columns(pl.col("status").replace({"cached": "ok"}))
    remaining = misses.join(earlier.select("key"), on="key", how="anti")
    job = job.after(spent_by(job, spent)) if spent else job
    outcomes, counters = client.run(
        _answer(client, job, remaining, cache, rows=int(misses["rows"].sum()))
    )
    earlier = earlier.select("key", "status", "error").cast(pl.String)
    pl.concat([earlier, outcomes], how="diagonal_relaxed").select(
        list(_OUTCOME_SCHEMA)
    ).write_parquet(_results_path(chunk))
    return counters


async def _answer(
    client: Client, job: Job, misses: pl.DataFrame, cache: Cache, *, rows: int
) -> tuple[pl.DataFrame, Counters]:
    """Answer ``misses`` (by similarity or by sending); outcomes as in a results file, and
    the counters."""
    backend = replace(await client.prepare(), cache=cache)
    done = await answer_misses(misses, job, backend, rows=rows)
    if done.stopped is not None:
        raise done.stopped
    # Answers are read back from the cache; only what the cache does not keep is kept here.
    fresh = pl.DataFrame(
        {
            "key": [o.key for o in done.outcomes],
            "status": [o.status for o in done.outcomes],
            "error": [o.error for o in done.outcomes],
            "text": [None if o.status in CACHEABLE else o.text for o in done.outcomes],
        },
        schema={name: _OUTCOME_SCHEMA[name] for name in ("key", "status", "error", "text")},
    )
    similar = done.settled.select(list(_OUTCOME_SCHEMA))
    return pl.concat([similar, fresh], how="diagonal_relaxed"), done.counters


async def _submit(client: Client, job: Job, misses: pl.DataFrame) -> list[BatchPart]:
    wanted = {request.key: request for request in requests_for(misses, job)}

    async def not_sent(request: Request, outcome: Outcome) -> None:
        """A budget kept it from the batch; run_chunk says so in the results file."""

    return await BatchRunner(job, await client.prepare()).submit(wanted, not_sent)


async def _cascade(
    client: Client, batch: pl.DataFrame, job: Job
) -> tuple[pl.DataFrame, RunReport, BaseException | None]:
    return await run_cascade(batch, job, await client.prepare())


def _batch_results(cached: pl.DataFrame, fresh: pl.DataFrame) -> pl.DataFrame:
    """Answers from the cache, with this run's statuses (ok, failed, ...) taking precedence,
    and this run's answers where the cache has none under the key (similar, invalid)."""
    merged = cached.join(fresh, on="key", how="full", coalesce=True, suffix="_run")
    run_first = ("status", "error")
    return merged.select(
        "key",
        *(
            pl.coalesce(f"{name}_run", name).alias(name)
            if name in run_first
            else pl.coalesce(name, f"{name}_run").alias(name)
            for name in RESULTS
            if name != "key"
        ),
    ).cast(RESULTS)


def _budget_stop(job: Job, spent: Counters) -> str | None:
    """The report's reason when a budget kept requests from being sent."""
    if not spent.over_budget:
        return None
    limits = job.spending
    return (
        f"{spent.over_budget:,} request(s) not sent: a budget was reached "
        f"(max_cost={limits.max_cost}, max_requests={limits.max_requests}, "
        f"max_tokens_total={limits.max_tokens_total})"
    )
