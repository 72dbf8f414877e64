"""The :class:`Table`: one job over a Parquet input, as the steps of :mod:`llm_ops.tables`.

Each step is a module of this package, and :class:`Table` takes them in order with the job's
files, cache and client: ``_files`` (the input read in batches, the output written in row
groups), ``_plan`` (the work database and the chunk files: :meth:`Table.plan`), ``_send`` (a
chunk through the pipeline, or as provider batches: :meth:`Table.run_chunk`,
:meth:`Table.submit`), ``_write`` (the answers joined back, batch by batch:
:meth:`Table.write`) and ``_accounting`` (the tallies, the report of :meth:`Table.finish`, and
:meth:`Table.estimate`); ``_cascade`` runs a cascade batch by batch instead
(:meth:`Table.run_cascade`).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Unpack

import polars as pl

from .._cache import Cache
from .._checks import positive_int
from .._client import Client
from .._failures import warn_report
from .._options import CallOptions, Job, ModelOption, check_job, make_job
from .._outcome import Counters
from .._pipeline.batch import BatchPart
from .._pipeline.estimate import Estimate
from .._pipeline.run import record_report
from .._pipeline.savings import completion_cost
from .._report import RunReport
from .._telemetry import count_cost, record, span
from ..exceptions import ConfigError
from ._accounting import estimate_table, table_report
from ._cascade import cascade_table
from ._files import input_files
from ._plan import TablePlan, plan_table
from ._send import send_chunk, send_chunks, submit_chunk
from ._write import Written, write_output


class Table:
    """One job over a Parquet input (a path or a glob), written to a Parquet file ``out``.

    Everything that can be checked is checked when the table is made, before anything is sent.

    Parameters
    ----------
    client
        The client to send with; its cache is required (answers are joined back from it).
    source, out
        Parquet path or glob to read; Parquet file to write (the input's columns in order,
        plus the added ones).
    prompt, model, **options
        As for :func:`llm_ops.llm_complete` (see :class:`llm_ops.CallOptions`).
    rows_per_read
        Rows read and written per batch (and per row group of the output).
    chunk_size
        Distinct requests per chunk file, the unit :meth:`run_chunk` sends.

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
    >>> with LocalEndpoint() as endpoint, Client(endpoint=endpoint.base_url, cache=cache) as client:
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
        rows_per_read: int = 100_000,
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
        self.rows_per_read = positive_int("rows_per_read", rows_per_read)
        self.chunk_size = positive_int("chunk_size", chunk_size)
        schema = pl.scan_parquet(self.files).collect_schema()
        self.job: Job = make_job(
            prompt=prompt,
            model=model,
            endpoint=client.endpoint.identity,
            dialect=client.endpoint.dialect,
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
        >>> with Client(endpoint="http://127.0.0.1:9/v1", cache=Path(work.name, "c.duckdb")) as c:
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
        with span("llm_ops.job", {"llm_ops.model": self.job.spec.model}) as job_span:
            if self.cascade:
                report = self.run_cascade()
            else:
                started_at = datetime.now(UTC)
                plan = self.plan()
                counters = send_chunks(self.client, self.job, self.cache, plan)
                report = self.finish(plan, counters, self.write(), started_at=started_at)
            record_report(job_span, report)
            return report

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
        >>> with LocalEndpoint() as endpoint, Client(endpoint=endpoint.base_url, cache=cache) as c:
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
        with span("llm_ops.plan") as planning:
            plan = plan_table(
                self.job,
                self.cache,
                self.files,
                self.work_dir,
                answers_dir=self.answers_dir,
                rows_per_read=self.rows_per_read,
                chunk_size=self.chunk_size,
            )
            record(
                planning,
                {
                    "llm_ops.rows": plan.rows,
                    "llm_ops.distinct_requests": plan.distinct,
                    "llm_ops.cache_hits": plan.cache_hits,
                    "llm_ops.misses": plan.misses,
                    "llm_ops.chunks": len(plan.chunks),
                },
            )
        if plan.misses:  # a misspelled model fails the plan, not every chunk task after it
            self.client.run(self.client.prepare(models=self.job.models))
        return plan

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
        """With ``batch=``: submit the chunk's requests that the cache lacks and no
        recorded batch carries, and return at once; :meth:`run_chunk` then waits for them
        and collects their answers (it submits nothing again).

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> import polars as pl
        >>> from llm_ops import BatchMode, Client
        >>> from llm_ops.tables import Table
        >>> from llm_ops.testing import LocalEndpoint
        >>> work = tempfile.TemporaryDirectory()
        >>> reviews, out = Path(work.name, "reviews.parquet"), Path(work.name, "out.parquet")
        >>> pl.DataFrame({"text": ["Runs small", "Lovely fabric"]}).write_parquet(reviews)
        >>> cache = Path(work.name, "cache.duckdb")
        >>> with (
        ...     LocalEndpoint(batch_seconds=0.2) as endpoint,  # its batches take 0.2 s
        ...     Client(endpoint=endpoint.base_url, cache=cache) as client,
        ... ):
        ...     table = Table(client, reviews, out, prompt="Summarize: {text}", model="sim",
        ...                   batch=BatchMode(poll_seconds=0.1))
        ...     chunk = table.plan().chunks[0]
        ...     parts = table.submit(chunk)     # returns once the batch is created
        ...     taken = table.run_chunk(chunk)  # waits for it, and collects its answers
        ...     uploaded = endpoint.stats()["lines_uploaded"]
        >>> [(part.state, part.requests) for part in parts], taken.answered, uploaded
        ([('submitted', 2)], 2, 2)
        >>> work.cleanup()
        """
        if self.job.batching is None:
            raise ConfigError(
                "submit() is for batch mode (batch=True); run_chunk() sends live requests"
            )
        return submit_chunk(self.client, self.job, self.cache, chunk)

    def write(self) -> Written:
        """Write the input plus the added columns, batch by batch.

        See the example of :meth:`plan`.
        """
        with span("llm_ops.write") as writing:
            written = write_output(
                self.job,
                self.cache,
                self.files,
                self.output,
                self.work_dir,
                rows_per_read=self.rows_per_read,
            )
            record(writing, {"llm_ops.rows": sum(written.statuses.values())})
            return written

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
        report = table_report(
            self.job,
            self.cache,
            plan,
            counters,
            statuses=written.statuses,
            tallies=written.tallies,
            started_at=started_at,
        )
        report = replace(report, errors=written.errors)
        with span("llm_ops.record_run"):
            report = replace(report, journal_pending=self.cache.record_run(report.as_dict()))
        count_cost(
            report.cost, {"gen_ai.request.model": self.job.spec.model, "llm_ops.mode": report.mode}
        )
        shutil.rmtree(self.work_dir, ignore_errors=True)
        warn_report(report, f"the {self.job.columns.error!r} column of {str(self.output)!r}")
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
        >>> from llm_ops import Cascade, Client, confidence_below
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
        >>> with LocalEndpoint() as endpoint, Client(endpoint=endpoint.base_url, cache=cache) as c:
        ...     table = Table(c, tickets, out, prompt="Sentiment of: {text}",
        ...                   model=Cascade(["sim-small", "sim"], escalate=confidence_below(0.5)),
        ...                   schema=Sentiment, output="sentiment")
        ...     report = table.run_cascade()  # what run() does with a cascade
        >>> {model: usage.rows for model, usage in report.models.items()}
        {'sim-small': 2, 'sim': 1}
        >>> pl.read_parquet(out)["sentiment_model"].to_list()
        ['sim-small', 'sim', 'sim-small']
        >>> work.cleanup()
        """
        return cascade_table(
            self.client,
            self.job,
            self.cache,
            self.files,
            self.output,
            rows_per_read=self.rows_per_read,
        )

    def estimate(self) -> Estimate:
        """What :meth:`run` would send and cost; nothing is sent and no cache file is made
        (a cascade is priced from the first model's requests).

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> import polars as pl
        >>> from llm_ops import Client, Sampling
        >>> from llm_ops.tables import Table
        >>> work = tempfile.TemporaryDirectory()
        >>> reviews, out = Path(work.name, "reviews.parquet"), Path(work.name, "out.parquet")
        >>> texts = ["Runs small", "Lovely fabric", None, "Runs small"]
        >>> pl.DataFrame({"text": texts}).write_parquet(reviews)
        >>> cache = Path(work.name, "cache.duckdb")
        >>> with Client(endpoint="http://127.0.0.1:9/v1", cache=cache) as client:  # not called
        ...     table = Table(client, reviews, out, prompt="Summarize: {text}",
        ...                   model="gpt-4o-mini", sampling=Sampling(max_tokens=50))
        ...     plan = table.estimate()
        >>> plan.rows, plan.skipped_rows, plan.requests, plan.output_tokens_max, cache.exists()
        (4, 1, 2, 100, False)
        >>> work.cleanup()
        """
        job = self.job if not self.cascade else self.job.for_model(self.job.models[0])
        return estimate_table(job, self.cache, self.files, rows_per_read=self.rows_per_read)
