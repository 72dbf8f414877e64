"""Where a job is entered from elsewhere: the flow's progress lines while a chunk is sent,
and the caller's span carried to Ray workers and SQL queries."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from spans import named, one, parent_id, span_id

from flows.enrich import EnrichConfig, ProgressLog, enrich_table
from llm_ops import Client, Progress
from llm_ops import _telemetry as telemetry

TEXTS = ["great fit", "runs small", None, "love it"] * 5


def _snapshot(rows_done: int, *, failed: int = 0, elapsed: float = 1.0) -> Progress:
    return Progress(
        rows=100,
        rows_done=rows_done,
        requests=100,
        requests_done=rows_done,
        sent=rows_done,
        retries=0,
        rate_limited=0,
        timeouts=0,
        prompt_tokens=0,
        completion_tokens=0,
        concurrency=4,
        elapsed=elapsed,
        failed=failed,
    )


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_progress_log_writes_one_line_per_interval_however_many_snapshots_come():
    clock, lines = FakeClock(), []
    log = ProgressLog(lines.append, "chunk 1/1", every=30, clock=clock)
    for tick in range(1, 181):  # 90 s of snapshots, twice a second
        clock.now = tick / 2
        log(_snapshot(tick))
    assert [line.split(": ")[1].split(",")[0] for line in lines] == [
        "60/100 rows",
        "120/100 rows",
        "180/100 rows",
    ]


def test_the_progress_log_says_rows_done_rate_failures_and_cost():
    clock, lines = FakeClock(), []
    log = ProgressLog(lines.append, "chunk 2/3", every=30, clock=clock)
    clock.now = 30
    log(_snapshot(50, failed=3, elapsed=10.0))
    assert lines == [
        "chunk 2/3: 50/100 rows, 50/100 requests (5/s), 3 failed, 0 rate limited, "
        "0 timeouts, 0 retries, cost unknown"
    ]


def test_the_progress_log_ends_with_the_last_snapshot_once():
    clock, lines = FakeClock(), []
    log = ProgressLog(lines.append, "chunk 1/1", every=30, clock=clock)
    log(_snapshot(7))
    log.end()
    log.end()
    assert len(lines) == 1 and lines[0].startswith("chunk 1/1: 7/100 rows")


def test_a_flow_logs_each_chunks_progress_with_rows_done_and_failures(
    prefect, tmp_path, endpoint, cache, caplog
):
    source = tmp_path / "reviews.parquet"
    pl.DataFrame({"text": TEXTS}).write_parquet(source)
    config = EnrichConfig(
        input=str(source),
        output=str(tmp_path / "out.parquet"),
        prompt="{text}",
        base_url=endpoint.base_url,
        cache=str(cache),
        chunk_size=2,
    )
    with caplog.at_level(logging.INFO):
        enrich_table(config)
    said = [record.getMessage() for record in caplog.records]
    progress = [line for line in said if line.startswith("chunk 1/2: ")]
    assert progress and " rows, " in progress[-1] and " failed, " in progress[-1]


def _caller_tracer() -> trace.Tracer:
    """The caller's own tracer, on the test's provider, whose spans llm-ops's join."""
    provider = telemetry._provider
    assert provider is not None
    return provider.get_tracer("caller")


def _spans_to_files(folder: str) -> Any:
    """A Ray worker's setup: a global tracer provider writing each span ended in the worker
    as a JSON line of a file of its own in ``folder`` (workers are other processes)."""

    def setup() -> None:
        import json
        import os

        from opentelemetry import trace
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        out = open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a")  # noqa: SIM115

        def line(span: Any) -> str:
            parent = span.parent.span_id if span.parent else None
            ids = {"trace": span.context.trace_id, "span": span.context.span_id}
            return json.dumps({"name": span.name, **ids, "parent": parent})

        provider = TracerProvider()
        exporter = ConsoleSpanExporter(out=out, formatter=lambda span: line(span) + "\n")
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)

    return setup


@pytest.fixture(scope="module")
def traced_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A local Ray cluster of two workers whose spans go to files in the folder yielded."""
    ray = pytest.importorskip("ray")
    folder = tmp_path_factory.mktemp("worker-spans")
    if ray.is_initialized():  # another module's cluster, whose workers export nothing
        ray.shutdown()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"worker_process_setup_hook": _spans_to_files(str(folder))},
    )
    yield folder
    ray.shutdown()


def test_ray_workers_spans_are_children_of_the_drivers_span(
    traced_cluster, exporter, endpoint, cache, tmp_path
):
    from llm_ops.ray import run_on_ray
    from llm_ops.tables import Table

    source = tmp_path / "in.parquet"
    pl.DataFrame({"text": [f"review {i}" for i in range(6)]}).write_parquet(source)
    with (
        Client(endpoint=endpoint.base_url, cache=cache) as client,
        _caller_tracer().start_as_current_span("enrich on ray") as driving,
    ):
        table = Table(
            client, source, tmp_path / "out.parquet", prompt="{text}", model="sim", chunk_size=2
        )
        run_on_ray(table, workers=2)
    spans = [
        json.loads(line)
        for file in traced_cluster.glob("*.jsonl")
        for line in file.read_text().splitlines()
    ]
    chunks = [span for span in spans if span["name"] == "llm_ops.chunk"]
    attempts = [span for span in spans if span["name"] == "chat sim"]
    assert len(chunks) == 3 and len(attempts) == 6
    assert {span["trace"] for span in chunks + attempts} == {driving.get_span_context().trace_id}
    assert {span["parent"] for span in chunks} == {driving.get_span_context().span_id}
    dispatches = [span for span in spans if span["name"] == "llm_ops.dispatch"]
    assert {span["parent"] for span in dispatches} <= {span["span"] for span in chunks}
    assert {span["parent"] for span in attempts} <= {span["span"] for span in dispatches}


def test_a_table_job_is_a_span_tree_of_its_steps_under_the_callers_span(
    exporter, endpoint, cache, tmp_path
):
    from llm_ops.tables import Table

    reviews = tmp_path / "reviews.parquet"
    pl.DataFrame({"text": ["a", "b", "c"]}).write_parquet(reviews)
    with (
        Client(endpoint=endpoint.base_url, cache=cache) as client,
        _caller_tracer().start_as_current_span("nightly") as caller,
    ):
        out = tmp_path / "out.parquet"
        Table(client, reviews, out, prompt="{text}", model="sim", chunk_size=2).run()
    spans = exporter.get_finished_spans()
    job = one(spans, "llm_ops.job")
    assert parent_id(job) == caller.get_span_context().span_id
    steps = [
        "llm_ops.plan",
        "llm_ops.chunk",
        "llm_ops.chunk",
        "llm_ops.write",
        "llm_ops.record_run",
    ]
    assert [
        s.name for s in sorted(spans, key=lambda s: s.start_time) if parent_id(s) == span_id(job)
    ] == steps
    chunks = {span_id(chunk) for chunk in named(spans, "llm_ops.chunk")}
    assert {parent_id(d) for d in named(spans, "llm_ops.dispatch")} == chunks
    assert len(named(spans, "chat sim")) == 3


def _sql_jobs_parents(exporter: Any) -> list[int | None]:
    jobs = [span for span in exporter.get_finished_spans() if span.name == "llm_ops.job"]
    assert jobs
    return [span.parent.span_id if span.parent else None for span in jobs]


def _connection(endpoint: Any, cache: Path) -> Any:
    import duckdb

    from llm_ops.sql import register

    con = duckdb.connect()
    register(con, endpoint=endpoint.base_url, cache=cache, model="sim")
    con.execute(
        "CREATE TABLE reviews AS SELECT 'review ' || (i % 3) AS text FROM range(20000) t(i)"
    )
    return con


def test_a_sql_query_in_carry_context_runs_its_jobs_under_the_callers_span(
    exporter, endpoint, cache
):
    from llm_ops.sql import carry_context

    con = _connection(endpoint, cache)
    con.execute("SET threads TO 4")  # ten vectors, on DuckDB's threads as well as the caller's
    with _caller_tracer().start_as_current_span("report query") as querying, carry_context(con):
        con.sql("SELECT llm_complete(text) FROM reviews").fetchall()
    assert set(_sql_jobs_parents(exporter)) == {querying.get_span_context().span_id}


def test_carry_context_reaches_a_query_run_on_a_thread_without_the_callers_span(
    exporter, endpoint, cache
):
    import threading

    from llm_ops.sql import carry_context

    con = _connection(endpoint, cache)
    with _caller_tracer().start_as_current_span("report query") as querying, carry_context(con):
        # a new thread starts with an empty context, as DuckDB's own threads do
        querying_thread = threading.Thread(
            target=lambda: con.sql("SELECT llm_agg('Summarize', text) FROM reviews").fetchall()
        )
        querying_thread.start()
        querying_thread.join()
    assert set(_sql_jobs_parents(exporter)) == {querying.get_span_context().span_id}


def test_carry_context_on_a_connection_without_the_functions_says_to_register_first():
    import duckdb

    from llm_ops.exceptions import ConfigError
    from llm_ops.sql import carry_context

    with pytest.raises(ConfigError, match=r"register\(con"), carry_context(duckdb.connect()):
        pass


def test_a_sql_query_on_one_duckdb_thread_runs_its_jobs_under_the_callers_span(
    exporter, endpoint, cache
):
    con = _connection(endpoint, cache)
    con.execute("SET threads TO 1")  # every vector on the caller's thread
    with _caller_tracer().start_as_current_span("report query") as querying:
        con.sql("SELECT llm_complete(text) FROM reviews").fetchall()
    assert set(_sql_jobs_parents(exporter)) == {querying.get_span_context().span_id}
