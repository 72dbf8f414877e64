"""OpenTelemetry attributes beyond the span tree: every GenAI name one of the conventions'
(as the ``opentelemetry-semantic-conventions`` package lists them), and what each attempt's
answer named (``gen_ai.response.*``, ``gen_ai.usage.*``), in every dialect."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics

from llm_ops import Endpoint, SemanticCache, llm_complete
from llm_ops.testing import LocalEndpoint

DIALECTS = ["openai", "anthropic", "gemini"]
CONVENTIONS = {
    value
    for module in (gen_ai, gen_ai_metrics)
    for name, value in vars(module).items()
    if name.startswith("GEN_AI_") and isinstance(value, str)
}

SHARING_JOB = """
import json, sys
import polars as pl
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics
from llm_ops import _telemetry as telemetry, llm_complete
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
telemetry.use_tracer_provider(provider)
base_url, cache, rows = sys.argv[1:4]
texts = pl.DataFrame({"text": [f"shared {i}" for i in range(int(rows))]})
texts.pipe(llm_complete, prompt="{text}", model="sim", endpoint=base_url, cache=cache,
           concurrency=16, progress=False)
(job,) = [span for span in exporter.get_finished_spans() if span.name == "llm_ops.job"]
print(json.dumps(dict(job.attributes)))
"""


@pytest.fixture(scope="module", params=DIALECTS)
def speaking(request: pytest.FixtureRequest) -> Iterator[LocalEndpoint]:
    with LocalEndpoint(dialect=request.param) as server:
        yield server


def _attempt(exporter: InMemorySpanExporter, sim: LocalEndpoint, cache: Path) -> dict[str, object]:
    """The attributes of the one attempt a one-row job sends to ``sim`` in its dialect."""
    endpoint = Endpoint(sim.base_url, provider=sim.config.dialect)
    pl.DataFrame({"text": ["a"]}).pipe(
        llm_complete, prompt="{text}", model="sim", endpoint=endpoint, cache=cache
    )
    (attempt,) = [span for span in exporter.get_finished_spans() if span.name == "chat sim"]
    return dict(attempt.attributes or {})


def test_every_gen_ai_name_of_a_jobs_spans_and_metrics_is_the_conventions(
    exporter, metrics, speaking, cache
):
    _attempt(exporter, speaking, cache)
    data = metrics.get_metrics_data()
    measured = [
        metric for rm in data.resource_metrics for sm in rm.scope_metrics for metric in sm.metrics
    ]
    points = [point for metric in measured for point in metric.data.data_points]
    named = {metric.name for metric in measured} | {
        key
        for attributes in [span.attributes for span in exporter.get_finished_spans()]
        + [point.attributes for point in points]
        for key in attributes or {}
    }
    gen_ai_names = {name for name in named if name.startswith("gen_ai.")}
    assert "gen_ai.client.token.usage" in gen_ai_names and gen_ai_names <= CONVENTIONS


def test_an_attempt_names_its_provider_and_operation_as_the_conventions_do(
    exporter, speaking, cache
):
    attempt = _attempt(exporter, speaking, cache)
    assert attempt["gen_ai.provider.name"] in {v.value for v in gen_ai.GenAiProviderNameValues}
    assert attempt["gen_ai.operation.name"] == gen_ai.GenAiOperationNameValues.CHAT.value


def test_an_attempt_counts_the_prompt_cache_tokens_it_wrote_and_read(exporter, cache):
    with LocalEndpoint(dialect="anthropic") as sim:
        pl.DataFrame({"text": ["abcd", "efgh"]}).pipe(
            llm_complete,
            prompt="{text}",
            system="x" * 4096,  # 1,028 tokens: over the least prefix the provider caches
            model="sim",
            endpoint=Endpoint(sim.base_url, provider="anthropic"),
            cache=cache,
            concurrency=1,
        )
    attempts = sorted(
        (span for span in exporter.get_finished_spans() if span.name == "chat sim"),
        key=lambda span: span.start_time,
    )
    assert [
        (
            span.attributes["gen_ai.usage.cache_creation.input_tokens"],
            span.attributes["gen_ai.usage.cache_read.input_tokens"],
        )
        for span in attempts
    ] == [(1028, 0), (0, 1028)]


def test_an_attempt_names_the_model_that_answered(exporter, speaking, cache):
    assert _attempt(exporter, speaking, cache)["gen_ai.response.model"] == "sim"


def test_an_attempt_names_the_answers_id(exporter, speaking, cache):
    answer_id = _attempt(exporter, speaking, cache)["gen_ai.response.id"]
    assert isinstance(answer_id, str) and answer_id


def _job(exporter: InMemorySpanExporter) -> dict[str, object]:
    (job,) = [span for span in exporter.get_finished_spans() if span.name == "llm_ops.job"]
    return dict(job.attributes or {})


def test_a_job_alone_on_its_cache_says_no_request_was_claimed_by_another(exporter, complete):
    pl.DataFrame({"text": ["a", "b"]}).pipe(complete, prompt="{text}")
    assert _job(exporter)["llm_ops.claimed"] == 0


def test_requests_another_job_claimed_are_counted_on_the_job_span(endpoint, cache):
    # No answer until more requests are in flight than one job sends (16): the jobs overlap,
    # so each claims some keys after the other did, and takes their answers from the cache.
    endpoint.configure(latency=0.02, gather=17)
    rows = 200
    jobs = [
        subprocess.Popen(
            [sys.executable, "-c", SHARING_JOB, endpoint.base_url, str(cache), str(rows)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    spans = []
    for job in jobs:
        out, err = job.communicate(timeout=120)
        assert job.returncode == 0, err
        spans.append(json.loads(out))
    assert sum(span["llm_ops.claimed"] for span in spans) > 0
    assert all(span["llm_ops.claimed"] <= span["llm_ops.cache_hits"] for span in spans)


def test_a_job_without_the_semantic_cache_says_it_answered_none_by_similarity(exporter, complete):
    pl.DataFrame({"text": ["a", "b"]}).pipe(complete, prompt="{text}")
    assert _job(exporter)["llm_ops.semantic_hits"] == 0


def test_a_job_counts_its_answers_by_similarity_apart_from_its_exact_hits(exporter, complete):
    semantic = SemanticCache("sim-embed", threshold=0.9)
    asked = "the red dress is lovely"
    pl.DataFrame({"text": [asked]}).pipe(complete, prompt="{text}", semantic_cache=semantic)
    exporter.clear()
    near_and_exact = pl.DataFrame({"text": ["The red dress is LOVELY!", asked]})
    near_and_exact.pipe(complete, prompt="{text}", semantic_cache=semantic)
    job = _job(exporter)
    assert (job["llm_ops.semantic_hits"], job["llm_ops.cache_hits"]) == (1, 1)
