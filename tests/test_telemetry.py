"""OpenTelemetry: a job's span tree under the caller's span, the GenAI conventions' attempt
spans, nothing imported where OpenTelemetry is not used, and no prompt or key in any span."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import polars as pl
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from spans import named, one, parent_id, span_id

from llm_ops import BatchMode, Client, Endpoint, Sampling, llm_complete
from llm_ops import _telemetry as telemetry
from llm_ops.testing import LocalEndpoint

SECRET = "sk-telemetry-0123456789abcdef"
HEADER_SECRET = "gateway-token-fedcba9876543210"


def _points(reader: InMemoryMetricReader, name: str) -> list[HistogramDataPoint]:
    """The histogram points of metric ``name``."""
    data = reader.get_metrics_data()
    assert data is not None
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
        if isinstance(point, HistogramDataPoint)
    ]


def _caller_tracer() -> trace.Tracer:
    """The caller's own tracer, on the test's provider, whose spans llm-ops's join."""
    provider = telemetry._provider
    assert provider is not None
    return provider.get_tracer("caller")


def test_a_frame_job_is_a_child_of_the_callers_span(exporter, complete):
    with _caller_tracer().start_as_current_span("caller"):
        pl.DataFrame({"text": ["a", "b"]}).pipe(complete, prompt="{text}")
    spans = exporter.get_finished_spans()
    assert parent_id(one(spans, "llm_ops.job")) == span_id(one(spans, "caller"))


def test_plan_lookup_dispatch_and_persist_are_children_of_the_job(exporter, complete):
    pl.DataFrame({"text": ["a", "b"]}).pipe(complete, prompt="{text}")
    spans = exporter.get_finished_spans()
    job = span_id(one(spans, "llm_ops.job"))
    assert parent_id(one(spans, "llm_ops.plan")) == job
    assert parent_id(one(spans, "llm_ops.lookup")) == span_id(one(spans, "llm_ops.plan"))
    assert parent_id(one(spans, "llm_ops.dispatch")) == job
    assert parent_id(one(spans, "llm_ops.persist")) == span_id(one(spans, "llm_ops.dispatch"))


def test_each_attempt_is_a_client_span_under_the_dispatch(exporter, complete):
    pl.DataFrame({"text": ["a", "b", "a"]}).pipe(complete, prompt="{text}")
    spans = exporter.get_finished_spans()
    attempts = named(spans, "chat sim")
    assert len(attempts) == 2  # one per distinct prompt
    dispatch = span_id(one(spans, "llm_ops.dispatch"))
    assert {parent_id(span) for span in attempts} == {dispatch}
    assert {span.kind for span in attempts} == {trace.SpanKind.CLIENT}


def test_an_attempt_carries_the_genai_conventions_attributes(exporter, complete):
    sampling = Sampling(max_tokens=50, temperature=0.5)
    pl.DataFrame({"text": ["a"]}).pipe(complete, prompt="{text}", sampling=sampling)
    attributes = one(exporter.get_finished_spans(), "chat sim").attributes or {}
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == "sim"
    assert attributes["gen_ai.request.max_tokens"] == 50
    assert attributes["gen_ai.request.temperature"] == 0.5
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["gen_ai.usage.output_tokens"] > 0
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["llm_ops.attempt"] == 1
    assert attributes["llm_ops.status"] == "ok"


def test_a_failed_attempt_names_its_error_type(exporter, complete):
    prompt = "[[sim:fail_times=1]][[sim:fail_status=503]] hello"
    pl.DataFrame({"text": [prompt]}).pipe(complete, prompt="{text}")
    first, second = sorted(
        named(exporter.get_finished_spans(), "chat sim"),
        key=lambda span: (span.attributes or {})["llm_ops.attempt"],
    )
    assert (first.attributes or {})["error.type"] == "503"
    assert first.status.status_code == trace.StatusCode.ERROR
    assert "error.type" not in (second.attributes or {})


def test_the_job_span_counts_rows_requests_and_hits(exporter, complete):
    frame = pl.DataFrame({"text": ["a", "b", "a"]})
    frame.pipe(complete, prompt="{text}")
    exporter.clear()
    frame.pipe(complete, prompt="{text}")
    attributes = one(exporter.get_finished_spans(), "llm_ops.job").attributes or {}
    assert attributes["llm_ops.rows"] == 3
    assert attributes["llm_ops.distinct_requests"] == 2
    assert attributes["llm_ops.cache_hits"] == 2
    assert attributes["llm_ops.requests_sent"] == 0


def test_a_sampled_out_job_exports_nothing(complete):
    exported = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exported))
    telemetry.use_tracer_provider(provider)
    try:
        out = pl.DataFrame({"text": ["a"]}).pipe(complete, prompt="{text}")
    finally:
        telemetry.use_tracer_provider(None)
    assert out["completion_status"].to_list() == ["ok"]
    assert exported.get_finished_spans() == ()


def test_no_span_holds_a_prompt_or_an_answer(exporter, complete):
    out = pl.DataFrame({"text": ["the secret plan"]}).pipe(complete, prompt="{text}")
    answer = out["completion"][0]
    values = [str(v) for s in exporter.get_finished_spans() for v in (s.attributes or {}).values()]
    assert not [value for value in values if "secret plan" in value or answer in value]


def test_prompts_and_answers_are_attributes_once_the_user_opts_in(exporter, complete, monkeypatch):
    monkeypatch.setenv(telemetry.CAPTURE_CONTENT, "true")
    out = pl.DataFrame({"text": ["hello"]}).pipe(complete, prompt="Say {text}")
    attributes = one(exporter.get_finished_spans(), "chat sim").attributes or {}
    assert "Say hello" in str(attributes["gen_ai.input.messages"])
    assert out["completion"][0] in str(attributes["gen_ai.output.messages"])


def test_no_span_holds_the_api_key_or_a_credential_header(exporter, cache):
    with LocalEndpoint(api_key=SECRET) as guarded:
        pl.DataFrame({"text": ["a", "b"]}).pipe(
            llm_complete,
            prompt="{text}",
            model="sim",
            endpoint=Endpoint(
                guarded.base_url, api_key=SECRET, headers={"X-Gateway-Token": HEADER_SECRET}
            ),
            cache=cache,
        )
    spans = exporter.get_finished_spans()
    assert named(spans, "chat sim")
    for span in spans:
        for name, value in (span.attributes or {}).items():
            assert SECRET not in str(value) and HEADER_SECRET not in str(value), name
            assert not any(word in name for word in ("key", "authorization", "header")), name


def _job_in_a_subprocess(endpoint: LocalEndpoint, cache: str | bool, prelude: str) -> str:
    """Run a job in a fresh interpreter after ``prelude``; its first row's status, and
    whether OpenTelemetry was imported."""
    script = textwrap.dedent(f"""
        import sys
        {prelude}
        import polars as pl
        from llm_ops import llm_complete
        out = pl.DataFrame({{"text": ["a"]}}).pipe(
            llm_complete, prompt="{{text}}", model="sim", endpoint={endpoint.base_url!r},
            cache={cache!r},
        )
        print(out["completion_status"][0], "opentelemetry" in sys.modules)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip()


def test_a_job_runs_where_opentelemetry_is_not_installed(endpoint, cache):
    blocked = "sys.modules['opentelemetry'] = None  # an import of it fails, as if not installed"
    assert _job_in_a_subprocess(endpoint, str(cache), blocked) == "ok True"  # True: the block


def test_a_job_imports_no_opentelemetry_where_the_process_does_not_use_it(endpoint):
    # without a cache: opening one imports portalocker, which imports redis where it is
    # installed, and redis imports OpenTelemetry (that is theirs, not llm-ops's)
    assert _job_in_a_subprocess(endpoint, False, "") == "ok False"


def test_an_expression_job_is_a_child_of_the_callers_span(exporter, endpoint, cache):
    with (
        Client(endpoint=endpoint.base_url, cache=cache) as client,
        _caller_tracer().start_as_current_span("caller"),
    ):
        pl.DataFrame({"text": ["a", "b"]}).lazy().select(
            pl.col("text").llm.complete("{}", model="sim", client=client)
        ).collect()
    spans = exporter.get_finished_spans()
    jobs = named(spans, "llm_ops.job")
    assert jobs and {parent_id(job) for job in jobs} == {span_id(one(spans, "caller"))}


def test_token_usage_is_measured_by_token_type(metrics, complete):
    pl.DataFrame({"text": ["a", "b"]}).pipe(complete, prompt="{text}")
    points = _points(metrics, "gen_ai.client.token.usage")
    by_type = {point.attributes["gen_ai.token.type"]: point for point in points}
    assert set(by_type) == {"input", "output"}
    assert by_type["input"].count == 2 and by_type["input"].sum > 0
    assert by_type["output"].attributes["gen_ai.request.model"] == "sim"


def test_each_attempt_has_a_duration_and_a_failed_one_its_error_type(metrics, complete):
    prompt = "[[sim:fail_times=1]][[sim:fail_status=503]] hello"
    pl.DataFrame({"text": [prompt]}).pipe(complete, prompt="{text}")
    points = _points(metrics, "gen_ai.client.operation.duration")
    errors = sorted(str(point.attributes.get("error.type")) for point in points)
    assert errors == ["503", "None"]
    assert all(point.count == 1 for point in points)


def test_a_batch_jobs_spans_are_children_of_the_callers_span(exporter, endpoint, cache):
    endpoint.configure(batch_seconds=0.3, batch_validation_seconds=0.05)
    with _caller_tracer().start_as_current_span("caller"):
        pl.DataFrame({"text": ["a", "b"]}).pipe(
            llm_complete,
            prompt="{text}",
            model="sim",
            endpoint=endpoint.base_url,
            batch=BatchMode(poll_seconds=0.05),
            cache=cache,
        )
    spans = exporter.get_finished_spans()
    job = one(spans, "llm_ops.job")
    assert parent_id(job) == span_id(one(spans, "caller"))
    assert (job.attributes or {})["llm_ops.mode"] == "batch"
    assert parent_id(one(spans, "llm_ops.dispatch")) == span_id(job)
