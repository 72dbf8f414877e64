"""OpenTelemetry of provider batches (a span per part: submitted, polled, read back) and
llm-ops's own client metrics (requests in flight, the concurrency limit, 429s, cost)."""

from __future__ import annotations

import functools
import gc
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from spans import named, one, parent_id, span_id

from llm_ops import BatchMode, Client, Endpoint, Price, llm_complete
from llm_ops import _telemetry as telemetry
from llm_ops.testing import LocalEndpoint

REPO = Path(__file__).resolve().parent.parent
SECRET = "sk-batch-telemetry-0123456789abcdef"


@pytest.fixture
def batch(endpoint: LocalEndpoint, cache: Any) -> Callable[..., Any]:
    """``llm_complete`` in batch mode against the simulator, polling every 0.05 s."""
    endpoint.configure(batch_seconds=0.3, batch_validation_seconds=0.05)
    return functools.partial(
        llm_complete,
        prompt="Say {text}",
        model="sim",
        endpoint=endpoint.base_url,
        batch=BatchMode(poll_seconds=0.05),
        cache=cache,
    )


def _points(reader: InMemoryMetricReader, name: str) -> list[NumberDataPoint]:
    """The sum and gauge points of metric ``name``."""
    data = reader.get_metrics_data()
    assert data is not None
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
        if isinstance(point, NumberDataPoint)
    ]


# -- spans of provider batches ----------------------------------------------------------------


def test_a_batch_part_is_a_span_under_the_dispatch_of_the_callers_job(exporter, batch):
    provider = telemetry._provider
    assert provider is not None
    with provider.get_tracer("caller").start_as_current_span("caller"):
        pl.DataFrame({"text": ["a", "b"]}).pipe(batch)
    spans = exporter.get_finished_spans()
    job = one(spans, "llm_ops.job")
    dispatch = one(spans, "llm_ops.dispatch")
    assert parent_id(job) == span_id(one(spans, "caller"))
    assert parent_id(dispatch) == span_id(job)
    assert parent_id(one(spans, "llm_ops.batch")) == span_id(dispatch)


def test_a_batch_span_says_what_was_submitted(exporter, batch):
    pl.DataFrame({"text": ["a", "b", "a"]}).pipe(batch)
    attributes = one(exporter.get_finished_spans(), "llm_ops.batch").attributes or {}
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == "sim"
    assert attributes["llm_ops.batch.requests"] == 2
    assert attributes["llm_ops.batch.bytes"] > 0
    assert str(attributes["llm_ops.batch.id"]).startswith("batch")
    assert attributes["llm_ops.batch.part"] == 0


def test_a_batch_span_counts_its_polls_and_notes_each_state(exporter, batch):
    pl.DataFrame({"text": ["a"]}).pipe(batch)
    batch_span = one(exporter.get_finished_spans(), "llm_ops.batch")
    states = [
        event.attributes["llm_ops.batch.state"]
        for event in batch_span.events
        if event.name == "llm_ops.batch.state_changed" and event.attributes
    ]
    assert states[-1] == "completed"
    polls = (batch_span.attributes or {})["llm_ops.batch.polls"]
    assert isinstance(polls, int) and polls >= len(states)
    assert batch_span.events[0].name == "llm_ops.batch.submitted"


def test_a_batch_span_says_what_was_read_back(exporter, batch):
    pl.DataFrame({"text": ["a", "bad [[sim:status=400]]"]}).pipe(batch)
    attributes = one(exporter.get_finished_spans(), "llm_ops.batch").attributes or {}
    assert attributes["llm_ops.batch.lines_read"] == 2
    assert attributes["llm_ops.batch.answered"] == 1
    assert attributes["llm_ops.batch.failed_lines"] == 1
    assert attributes["llm_ops.batch.state"] == "completed"


def test_an_expired_batchs_resubmission_is_a_span_of_its_own(exporter, batch, endpoint):
    endpoint.configure(batch_seconds=0.3, batch_validation_seconds=0.05, batch_expire_share=0.5)
    pl.DataFrame({"text": [f"item {i}" for i in range(8)]}).pipe(batch)
    first, again = sorted(
        named(exporter.get_finished_spans(), "llm_ops.batch"), key=lambda span: span.start_time
    )
    expired, resubmitted = first.attributes or {}, again.attributes or {}
    assert expired["llm_ops.batch.state"] == "expired"
    assert expired["llm_ops.batch.resubmitted_requests"] == expired["llm_ops.batch.unanswered"]
    assert resubmitted["llm_ops.batch.resubmitted"] is True
    assert resubmitted["llm_ops.batch.requests"] == expired["llm_ops.batch.unanswered"]


def test_a_submitted_batch_collected_by_a_later_job_is_a_span_in_each(exporter, endpoint, cache):
    endpoint.configure(batch_seconds=0.3, batch_validation_seconds=0.05)
    frame = pl.DataFrame({"text": ["a", "b"]})
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        client.submit(frame, prompt="Say {text}", model="sim")
        submitted = one(exporter.get_finished_spans(), "llm_ops.batch").attributes or {}
        exporter.clear()
        client.complete(frame, prompt="Say {text}", model="sim", batch=BatchMode(poll_seconds=0.05))
    collected = one(exporter.get_finished_spans(), "llm_ops.batch").attributes or {}
    assert submitted["llm_ops.batch.polls"] == 0
    assert collected["llm_ops.batch.resumed"] is True
    assert collected["llm_ops.batch.id"] == submitted["llm_ops.batch.id"]
    assert collected["llm_ops.batch.state"] == "completed"


def test_no_batch_span_holds_the_api_key_or_a_prompt(exporter, cache):
    with LocalEndpoint(api_key=SECRET) as guarded:
        guarded.configure(batch_seconds=0.3, batch_validation_seconds=0.05)
        pl.DataFrame({"text": ["the secret plan"]}).pipe(
            llm_complete,
            prompt="{text}",
            model="sim",
            endpoint=Endpoint(guarded.base_url, api_key=SECRET),
            batch=BatchMode(poll_seconds=0.05),
            cache=cache,
        )
    spans = exporter.get_finished_spans()
    assert named(spans, "llm_ops.batch")
    for span in spans:
        described = [*(span.attributes or {}).items()]
        described += [item for event in span.events for item in (event.attributes or {}).items()]
        for name, value in described:
            assert SECRET not in str(value) and "secret plan" not in str(value), name
            assert "key" not in name, name


# -- llm-ops's own client metrics -------------------------------------------------------------


def test_no_client_metric_is_built_without_a_provider():
    # in a fresh process: another test of this worker (a docs example) may have set a global one
    code = "import opentelemetry.metrics, opentelemetry.trace\n"
    code += "from llm_ops import _telemetry\nprint(_telemetry.client_metrics())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "None"


def test_a_429_is_counted(metrics, complete):
    prompt = "[[sim:fail_times=1]][[sim:fail_status=429]] hello"
    pl.DataFrame({"text": [prompt, "fine"]}).pipe(complete, prompt="{text}")
    (point,) = _points(metrics, "llm_ops.client.rate_limited")
    assert point.value == 1
    assert point.attributes["http.response.status_code"] == 429
    assert point.attributes["gen_ai.request.model"] == "sim"


def test_requests_in_flight_are_read_from_the_endpoints_engine(metrics, endpoint, cache):
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        client.complete(pl.DataFrame({"text": ["a", "b", "c"]}), prompt="{text}", model="sim")
        (point,) = _points(metrics, "llm_ops.client.requests_in_flight")
    assert point.value == 0  # all answered
    assert point.attributes["gen_ai.provider.name"] == "openai"
    assert point.attributes["server.address"] == "127.0.0.1"


def test_the_concurrency_limit_is_a_gauge_of_the_endpoint(metrics, endpoint, cache):
    with Client(endpoint=endpoint.base_url, cache=cache, concurrency=3) as client:
        client.complete(pl.DataFrame({"text": ["a", "b"]}), prompt="{text}", model="sim")
        (point,) = _points(metrics, "llm_ops.client.concurrency_limit")
    assert point.value == 3
    assert point.attributes["gen_ai.provider.name"] == "openai"
    assert "gen_ai.request.model" not in point.attributes


def test_an_engine_no_longer_used_is_no_longer_reported(metrics, endpoint, cache):
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        client.complete(pl.DataFrame({"text": ["a"]}), prompt="{text}", model="sim")
    del client
    gc.collect()
    assert _points(metrics, "llm_ops.client.concurrency_limit") == []


def test_a_jobs_cost_is_counted_in_dollars_when_it_ends(metrics, complete):
    _, report = pl.DataFrame({"text": ["a", "b"]}).pipe(
        complete, prompt="{text}", pricing={"sim": Price(1.0, 4.0)}, return_report=True
    )
    (point,) = _points(metrics, "llm_ops.cost")
    assert report.cost and point.value == pytest.approx(report.cost)
    assert point.attributes == {"gen_ai.request.model": "sim", "llm_ops.mode": report.mode}


def test_a_cascades_cost_is_counted_under_each_model_it_paid(metrics, complete):
    _, report = pl.DataFrame({"text": ["a", "b [[sim:fail_for=sim-small]]"]}).pipe(
        complete,
        prompt="{text}",
        model=["sim-small", "sim"],
        pricing={"sim-small": Price(0.05, 0.20), "sim": Price(2.50, 10.00)},
        return_report=True,
    )
    points = {
        point.attributes["gen_ai.request.model"]: point.value
        for point in _points(metrics, "llm_ops.cost")
    }
    assert set(points) == {"sim-small", "sim"} and points["sim"] > points["sim-small"]
    assert sum(points.values()) == pytest.approx(report.cost)


def test_a_table_jobs_cost_is_counted_when_it_finishes(metrics, endpoint, cache, tmp_path):
    from llm_ops.tables import Table

    reviews = tmp_path / "reviews.parquet"
    pl.DataFrame({"text": ["a", "b"]}).write_parquet(reviews)
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        report = Table(
            client, reviews, tmp_path / "out.parquet", prompt="{text}", model="sim",
            pricing={"sim": Price(1.0, 4.0)},
        ).run()  # fmt: skip
    (point,) = _points(metrics, "llm_ops.cost")
    assert report.cost and point.value == pytest.approx(report.cost)


# -- what tracing costs, in the benchmark -----------------------------------------------------


def test_the_quick_benchmark_shows_tracing_sampled_and_not_beside_off(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "run.py"),
            *("--quick", "--scale", "0.02", "--reps", "1", "--only", "telemetry"),
            *("--out", str(tmp_path / "r.md")),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "## 11. telemetry\n" in done.stdout
    assert "\n| off | no | " in done.stdout  # not even imported
    for mode in ("none sampled", "all sampled", "all sampled + metrics"):
        assert f"\n| {mode} | yes | " in done.stdout
