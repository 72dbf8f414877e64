"""Enrich a Parquet table with one LLM answer per row: Parquet in, Parquet out.

``python flows/enrich.py`` runs it once on the sample reviews against the bundled local
endpoint; ``--help`` lists a flag per parameter; ``python flows/enrich.py serve`` serves it as
a deployment. Its parameters are the table's, then llm-ops' settings, declared once in the
library. The work is split into retryable tasks over files next to the output: ``plan``, one
``send-chunk`` per chunk of distinct requests (never one per row), ``write``. Answers live in
the DuckDB cache, not in Prefect, so a rerun sends only what the cache lacks.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, cast
from uuid import UUID

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_progress_artifact, create_table_artifact
from prefect.artifacts import update_progress_artifact as progressed
from prefect.blocks.system import Secret
from prefect.cache_policies import NO_CACHE
from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings
from pydantic import Field

from llm_ops import (
    JobAbortedError,
    LlmOpsError,
    Progress,
    RunReport,
    parse_settings,
    settings_parser,
    with_settings,
)
from llm_ops.exceptions import said_in
from llm_ops.tables import (
    BatchPart,
    Counters,
    Table,
    TablePlan,
    TableSettings,
    Written,
    table_of_settings,
)

STARTUP_SECONDS = 180  # for Prefect's temporary API server, when the main job starts one
LOG_EVERY_SECONDS = 30.0  # a chunk's progress line at least this often, for whoever watches


@with_settings(
    defaults={
        "input": "data/womens_clothing_reviews.parquet",
        "output": "output/reviews_enriched.parquet",
        "prompt": "Summarize this customer review in one sentence:\n\n{text}",
        "model": "sim",
        "output_column": "summary",
    }
)
class EnrichConfig(TableSettings):
    """Parameters of :func:`enrich_table`: the table's, a field per llm-ops setting, then the
    flow's. Secrets (``api_key_secret``, ``header_secrets``) are Prefect Secret blocks."""

    ray_address: str | None = Field(
        None,
        description="send the chunks on a Ray cluster: 'local' (started on this machine), "
        "'auto' or 'ray://host:10001'; with none, on this machine as usual",
    )
    ray_workers: int | None = Field(
        None, ge=1, description="with Ray: chunks sent at once (a local cluster's CPUs)"
    )

    def secret(self, name: str) -> str:
        """The Prefect Secret block ``name``'s value."""
        return cast("Secret[str]", Secret.load(name)).get()  # sync in a sync flow


PARAMETER_WORDS = EnrichConfig.words()


def open_table(config: EnrichConfig, progress: Callable[[Progress], None] | None = None) -> Table:
    """The job the config describes; raises ``ConfigError`` for what can be checked first.
    ``progress`` hears the job's :class:`~llm_ops.Progress` snapshots while a chunk is sent."""
    if progress is None:
        return config.table()
    return table_of_settings(
        {**config.settings(), "progress": progress},
        config.input,
        config.output,
        prompt=config.prompt,
        rows_per_read=config.rows_per_read,
        chunk_size=config.chunk_size,
    )


class ProgressLog:
    """A chunk's progress as log lines: the library's snapshots come twice a second, a line
    goes out once every ``every`` seconds (a flow's log is read, not watched), and
    :meth:`end` writes the last snapshot unless it was just written.

    Examples
    --------
    >>> from llm_ops import Progress
    >>> now = [0.0]
    >>> log = ProgressLog(print, "chunk 1/2", every=30, clock=lambda: now[0])
    >>> def at(seconds, done):
    ...     now[0] = seconds
    ...     log(Progress(rows=1000, rows_done=done, requests=1000, requests_done=done, sent=done,
    ...                  retries=0, rate_limited=0, timeouts=0, prompt_tokens=0,
    ...                  completion_tokens=0, concurrency=8, elapsed=seconds, failed=2))
    >>> at(0.5, 10); at(29.5, 590); at(30.0, 600); at(45.0, 900)
    chunk 1/2: 600/1000 rows, 600/1000 requests (20/s), 2 failed, 0 rate limited, 0 timeouts, 0 retries, cost unknown
    >>> log.end()
    chunk 1/2: 900/1000 rows, 900/1000 requests (20/s), 2 failed, 0 rate limited, 0 timeouts, 0 retries, cost unknown
    """  # noqa: E501

    def __init__(
        self,
        log: Callable[[str], None],
        what: str,
        *,
        every: float = LOG_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.log, self.what, self.every, self.clock = log, what, every, clock
        self.last_line = clock()  # the first line comes ``every`` seconds after the start
        self.unsaid: Progress | None = None  # the latest snapshot, if no line said it

    def __call__(self, progress: Progress) -> None:
        self.unsaid = progress
        if self.clock() - self.last_line >= self.every:
            self._say()

    def end(self) -> None:
        """Write the last snapshot, if it came after the last line."""
        if self.unsaid is not None:
            self._say()

    def _say(self) -> None:
        progress, self.unsaid, self.last_line = self.unsaid, None, self.clock()
        assert progress is not None
        rate = progress.requests_done / progress.elapsed if progress.elapsed > 0 else 0.0
        cost = "cost unknown" if progress.cost is None else f"${progress.cost:,.4f} so far"
        self.log(
            f"{self.what}: {progress.rows_done}/{progress.rows} rows, "
            f"{progress.requests_done}/{progress.requests} requests ({rate:,.0f}/s), "
            f"{progress.failed} failed, {progress.rate_limited} rate limited, "
            f"{progress.timeouts} timeouts, {progress.retries} retries, {cost}"
        )


class ChunkLogs:
    """The progress of the chunks running on Ray as log lines: a :class:`ProgressLog` per
    chunk, fed the snapshots :func:`llm_ops.ray.send_chunks` hears (it is its
    ``on_progress``), and ended with the chunk's last.

    Examples
    --------
    >>> from llm_ops import Progress
    >>> now = [0.0]
    >>> logs = ChunkLogs(print, every=30, clock=lambda: now[0])
    >>> def at(seconds, number, done, last=False):
    ...     now[0] = seconds
    ...     logs(number, 4, Progress(rows=100, rows_done=done, requests=100, requests_done=done,
    ...                              sent=done, retries=0, rate_limited=0, timeouts=0,
    ...                              prompt_tokens=0, completion_tokens=0, concurrency=8,
    ...                              elapsed=seconds), last)
    >>> at(1, 1, 5); at(1, 2, 4); at(31, 1, 60); at(32, 2, 100, last=True)
    chunk 1/4 on Ray: 60/100 rows, 60/100 requests (2/s), 0 failed, 0 rate limited, 0 timeouts, 0 retries, cost unknown
    chunk 2/4 on Ray: 100/100 rows, 100/100 requests (3/s), 0 failed, 0 rate limited, 0 timeouts, 0 retries, cost unknown
    """  # noqa: E501

    def __init__(
        self,
        log: Callable[[str], None],
        *,
        every: float = LOG_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.log, self.every, self.clock = log, every, clock
        self.running: dict[int, ProgressLog] = {}

    def __call__(self, number: int, chunks: int, progress: Progress, last: bool) -> None:
        logged = self.running.get(number)
        if logged is None:
            what = f"chunk {number}/{chunks} on Ray"
            logged = self.running[number] = ProgressLog(
                self.log, what, every=self.every, clock=self.clock
            )
        logged(progress)
        if last:
            self.running.pop(number).end()


def _retry_unless_aborted(task: Any, task_run: Any, state: Any) -> bool:
    # A refused key or an empty quota will not fix itself on retry.
    return not isinstance(state.result(raise_on_failure=False), JobAbortedError)


@task(name="plan", cache_policy=NO_CACHE, retries=1)
@said_in(PARAMETER_WORDS)
def plan_requests(config: EnrichConfig) -> TablePlan:
    return open_table(config).plan()


@task(name="send-chunk", task_run_name="send-chunk-{number}", cache_policy=NO_CACHE, retries=2,
      retry_delay_seconds=2, retry_condition_fn=_retry_unless_aborted)  # fmt: skip
@said_in(PARAMETER_WORDS)
def send_chunk(
    config: EnrichConfig, chunk: str, number: int, chunks: int, spent: Counters
) -> Counters:
    # the snapshots come on the client's thread, where Prefect's run context is not: the
    # task's logger is taken here
    logged = ProgressLog(get_run_logger().info, f"chunk {number}/{chunks}")
    try:
        return open_table(config, progress=logged).run_chunk(chunk, spent=spent)
    finally:
        logged.end()


@task(name="cascade", cache_policy=NO_CACHE, retries=1, retry_condition_fn=_retry_unless_aborted)
@said_in(PARAMETER_WORDS)
def cascade_table(config: EnrichConfig) -> RunReport:
    """The whole table through the cascade; a retry re-sends only what the cache lacks."""
    return open_table(config).run_cascade()


@task(name="submit-batches", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5,
      retry_condition_fn=_retry_unless_aborted)  # fmt: skip
def submit_batches(config: EnrichConfig, chunk: str) -> list[BatchPart]:
    """A chunk's requests as recorded provider batches: a rerun submits none twice."""
    return open_table(config).submit(chunk)


@task(name="send-chunks-on-ray", cache_policy=NO_CACHE, retries=1,
      retry_condition_fn=_retry_unless_aborted)  # fmt: skip
def send_chunks_on_ray(config: EnrichConfig, chunks: list[str], progress: UUID) -> Counters:
    """Every chunk as a Ray task on the cluster, under one rate limit."""
    from llm_ops.ray import connect, send_chunks

    table, started = open_table(config), time.perf_counter()

    logger = get_run_logger()

    def on_chunk(done: int, total: int, counters: Counters) -> None:
        progressed(progress, 100.0 * done / total)
        rate, cost = counters.sent / (time.perf_counter() - started), table.cost(counters)
        spent = "cost unknown" if cost is None else f"${cost:,.4f} so far"
        logger.info(
            f"chunk {done}/{total} done on Ray: {counters.sent} requests ({rate:.0f}/s), "
            f"{counters.rate_limited} rate limited, {counters.retries} retries, {spent}"
        )

    connect(config.ray_address or "local", config.ray_workers)
    return send_chunks(
        table,
        chunks,
        workers=config.ray_workers,
        on_chunk=on_chunk,
        on_progress=ChunkLogs(logger.info),
    )


@task(name="write", cache_policy=NO_CACHE, retries=1)
@said_in(PARAMETER_WORDS)
def write_output(config: EnrichConfig) -> Written:
    return open_table(config).write()


@flow(name="enrich-table")
def enrich_table(config: EnrichConfig | None = None) -> dict[str, Any]:
    """Add ``config.output_column`` (+ ``_status``, ``_error``) to every row of a Parquet input."""
    with said_in(PARAMETER_WORDS):
        return _enrich_table(config or EnrichConfig.model_validate({}))


def _enrich_table(config: EnrichConfig) -> dict[str, Any]:
    logger, started_at = get_run_logger(), datetime.now(UTC)
    table = open_table(config)  # bad parameters fail the run here, before anything is written
    logger.info(f"enriching {len(table.files)} file(s) of {config.input} with {config.model}")
    if table.cascade:
        return _finish(config, cascade_table(config))
    plan = plan_requests(config)
    chunks = plan.chunks
    logger.info(
        f"{plan.rows} rows, {plan.distinct} distinct requests, {plan.cache_hits} cached, "
        f"{plan.misses} to send in {len(chunks)} chunk(s)"
    )
    made = create_progress_artifact(0.0 if chunks else 100.0, key="enrich-progress")
    progress = cast(UUID, made)  # sync in a sync flow
    batched = table.job.batching is not None
    submitted = [part for chunk in chunks if batched for part in submit_batches(config, chunk)]
    _publish_batches(submitted, "submitted")
    counters = Counters()
    if config.ray_address is not None:
        counters = send_chunks_on_ray(config, chunks, progress)
    for number, chunk in enumerate(chunks if config.ray_address is None else [], start=1):
        counters.add(send_chunk(config, chunk, number, len(chunks), counters))
        progressed(progress, 100.0 * number / len(chunks))
        logger.info(f"chunk {number}/{len(chunks)} done: {counters.sent} requests sent so far")
    report = table.finish(plan, counters, write_output(config), started_at=started_at)
    if submitted:
        ids = {part.job_id for part in submitted}
        _publish_batches([p for p in table.client.batches() if p.job_id in ids], "at the end")
    return _finish(config, report)


def _publish_batches(parts: list[BatchPart], when: str) -> None:
    if parts:
        rows = [asdict(part) for part in parts]
        create_table_artifact(rows, key="enrich-batches", description=f"provider batches, {when}")


def report_table(report: RunReport) -> list[dict[str, Any]]:
    """The run report as rows of (figure, value) for a Prefect table artifact."""
    return [{"figure": name, "value": value} for name, value in report.figures().items()]


def _finish(config: EnrichConfig, report: RunReport) -> dict[str, Any]:
    """Publish the report, and fail the run when rows failed and ``on_error`` is "raise"."""
    about = f"llm-ops run {report.run_id}: {config.input}"
    create_table_artifact(report_table(report), key="enrich-report", description=about)
    get_run_logger().info("wrote %s\n%s", config.output, report)
    if config.on_error == "raise" and report.failed_rows:
        raise LlmOpsError(
            f"{report.failed_rows} of {report.rows} rows failed (on_error='raise'); the output "
            "was written and every answer is cached, so a rerun sends only the failed rows"
        )
    return asdict(report)


def config_of(argv: list[str]) -> EnrichConfig:
    """The flow's parameters from the command line; exits with a usage error for wrong ones."""
    parser = settings_parser(
        EnrichConfig,
        prog="python flows/enrich.py",
        description="Enrich a Parquet table with one LLM answer per row, as a Prefect flow run. "
        "Without --base-url: the demo, on the bundled local simulator (concurrency 64).",
        epilog="python flows/enrich.py serve: serve the flow as the deployment 'reviews'.",
    )
    return parse_settings(parser, EnrichConfig, argv)


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"]:
        # The API then refuses a run whose base_url holds a key before storing its parameters.
        enrich_table.serve(name="reviews", tags=["llm-ops"], enforce_parameter_schema=True)
        return
    config = config_of(argv)
    # Prefect's temporary API server can take longer than its default 20 s on a busy machine.
    startup = {PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: STARTUP_SECONDS}
    with temporary_settings(startup), ExitStack() as stack:
        if config.base_url is None:  # the demo, on the bundled simulator
            from llm_ops.testing import LocalEndpoint

            # Any free port: the simulator's name, not its URL, is what the cache keys hold.
            endpoint = stack.enter_context(LocalEndpoint())
            name, concurrency = config.endpoint_name or endpoint.name, config.concurrency or 64
            update = {"base_url": endpoint.base_url, "endpoint_name": name}
            config = config.model_copy(update={**update, "concurrency": concurrency})
        try:
            enrich_table(config)
        except RuntimeError as exc:
            if "ephemeral Prefect API server" not in str(exc):
                raise
            sys.exit(
                f"Prefect's temporary API server did not start within {STARTUP_SECONDS} s (a "
                "busy machine?). Run the command again, or start a server once with "
                "'prefect server start' and set PREFECT_API_URL=http://127.0.0.1:4200/api."
            )


if __name__ == "__main__":
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    main(sys.argv[1:])
