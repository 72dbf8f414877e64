"""OpenTelemetry attributes beyond the span tree: what each attempt's answer named (the GenAI
conventions' ``gen_ai.response.*``), in every dialect."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llm_ops import Endpoint, llm_complete
from llm_ops import _telemetry as telemetry
from llm_ops.testing import LocalEndpoint

DIALECTS = ["openai", "anthropic", "gemini"]


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """llm-ops's spans, kept in memory (a provider of the test's own: the global one can be
    set once per process)."""
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    telemetry.use_tracer_provider(provider)
    yield exported
    telemetry.use_tracer_provider(None)


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


def test_an_attempt_names_the_model_that_answered(exporter, speaking, cache):
    assert _attempt(exporter, speaking, cache)["gen_ai.response.model"] == "sim"


def test_an_attempt_names_the_answers_id(exporter, speaking, cache):
    answer_id = _attempt(exporter, speaking, cache)["gen_ai.response.id"]
    assert isinstance(answer_id, str) and answer_id
