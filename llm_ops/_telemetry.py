"""OpenTelemetry spans of a job and of each request attempt, and the GenAI client metrics,
emitted only where the process uses OpenTelemetry.

OpenTelemetry is an optional extra (``pip install 'llm-ops[otel]'``). This module never
imports it on its own: it looks for it in :data:`sys.modules`, where anything that configures
a tracer provider (the SDK, ``opentelemetry-instrument``, Logfire, Prefect) has put it. A
process that does not use OpenTelemetry therefore imports none of it and pays a dictionary
lookup a stage of a job. Where it is imported but no tracer or meter provider is set, a job's
few spans are OpenTelemetry's no-op ones and a dispatch builds nothing per attempt; where one
is, an attempt whose span is sampled out builds none of its attributes.

Spans follow the OpenTelemetry GenAI semantic conventions (status: development) for the
request attempts (``chat {model}``, kind CLIENT, ``gen_ai.*`` attributes); llm-ops's own facts
are under ``llm_ops.``. Prompt and answer text are never attributes unless
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``, as the conventions ask; no
header, key or URL with credentials is ever one.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import Histogram, MeterProvider
    from opentelemetry.trace import Span, Tracer, TracerProvider

INSTRUMENTATION = "llm_ops"
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

PROVIDER_NAMES = {"openai": "openai", "anthropic": "anthropic", "gemini": "gcp.gemini"}
"""``gen_ai.provider.name`` of each dialect: the conventions' well-known values (Gemini's API,
as opposed to Vertex AI's, is ``gcp.gemini``)."""

AttributeValue = str | bool | int | float

# the buckets the GenAI conventions advise for each metric
TOKEN_BUCKETS = [4**n for n in range(1, 14)]  # 4 to 67,108,864
SECONDS_BUCKETS = [0.01 * 2**n for n in range(14)]  # 0.01 s to 81.92 s

_tracer: Tracer | None = None
_provider: TracerProvider | None = None  # None: OpenTelemetry's global tracer provider
_instruments: tuple[Histogram, Histogram] | None = None
_meter_provider: MeterProvider | None = None  # None: OpenTelemetry's global meter provider


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Emit through ``provider`` rather than the global one (``None``: the global one again);
    for tests, since OpenTelemetry lets a process set its global provider only once."""
    global _tracer, _provider
    _provider, _tracer = provider, None


def use_meter_provider(provider: MeterProvider | None) -> None:
    """Measure through ``provider`` rather than the global one (``None``: the global one
    again); for tests, as :func:`use_tracer_provider`."""
    global _instruments, _meter_provider
    _meter_provider, _instruments = provider, None


def tracer() -> Tracer | None:
    """The tracer of llm-ops's spans; ``None`` while OpenTelemetry is not imported in this
    process (then nothing is emitted and nothing is imported)."""
    global _tracer
    if _tracer is None and sys.modules.get("opentelemetry") is not None:
        try:
            from opentelemetry import trace
        except ImportError:  # a broken or partial install: no telemetry rather than no job
            return None
        _tracer = trace.get_tracer(INSTRUMENTATION, tracer_provider=_provider)
    return _tracer


def current_context() -> Context | None:
    """The caller's OpenTelemetry context, to carry to a thread that does not inherit it;
    ``None`` when nothing is emitted."""
    if tracer() is None:
        return None
    from opentelemetry import context

    return context.get_current()


@contextmanager
def carried(parent: Context | None) -> Iterator[None]:
    """Run the block in ``parent`` (a :func:`current_context`), unless a span is current
    already: Polars calls an expression on a thread of its own, where the caller's span is
    not current, so its jobs would start traces of their own."""
    if parent is None:
        yield
        return
    from opentelemetry import context, trace

    if trace.get_current_span().get_span_context().is_valid:
        yield
        return
    token = context.attach(parent)
    try:
        yield
    finally:
        context.detach(token)


def capture_content() -> bool:
    """Whether prompt and answer text may be span attributes: only when the user opts in."""
    return os.environ.get(CAPTURE_CONTENT, "").strip().lower() == "true"


@contextmanager
def span(
    name: str, attributes: Mapping[str, AttributeValue | None] | None = None
) -> Iterator[Span | None]:
    """A span of one stage of a job, current while the block runs (so the stage's own spans,
    on any task it starts, are its children); ``None`` when nothing is emitted."""
    tracing = tracer()
    if tracing is None:
        yield None
        return
    with tracing.start_as_current_span(name, attributes=_present(attributes or {})) as current:
        yield current


def record(span: Span | None, attributes: Mapping[str, AttributeValue | None]) -> None:
    """Set ``attributes`` (those not ``None``) on ``span``, if it records."""
    if span is not None and span.is_recording():
        span.set_attributes(_present(attributes))


class Attempts:
    """The telemetry of one dispatch's request attempts: a CLIENT span each (GenAI
    conventions), and the conventions' two metrics. What every attempt shares is built once
    here; an attempt builds its span's attributes only when the span records."""

    def __init__(
        self,
        tracing: Tracer,
        *,
        operation: str,
        dialect: str,
        model: str,
        params: Mapping[str, Any],
        server: tuple[str | None, int | None],
    ):
        from opentelemetry.trace import SpanKind, StatusCode

        self._tracer, self._client, self._error = tracing, SpanKind.CLIENT, StatusCode.ERROR
        self.name = f"{operation} {model}"
        host, port = server
        self.common = _present(
            {
                "gen_ai.operation.name": operation,
                "gen_ai.provider.name": PROVIDER_NAMES.get(dialect, dialect),
                "gen_ai.request.model": model,
                "server.address": host,
                "server.port": port,
            }
        )
        max_tokens = params.get("max_tokens", params.get("max_completion_tokens"))
        self.requested = {
            **self.common,
            **_present(
                {
                    "gen_ai.request.max_tokens": _number(max_tokens),
                    "gen_ai.request.temperature": _number(params.get("temperature")),
                    "gen_ai.request.top_p": _number(params.get("top_p")),
                    "gen_ai.request.seed": _number(params.get("seed")),
                }
            ),
        }
        self.input = {**self.common, "gen_ai.token.type": "input"}
        self.output = {**self.common, "gen_ai.token.type": "output"}
        self.instruments = instruments()
        self.capture = capture_content()  # read once a dispatch, not once an attempt

    def start(self, attempt: int, prompt: Sequence[tuple[str, str]] = ()) -> tuple[Span, float]:
        """The span of attempt number ``attempt``, and when it started (for its duration);
        ``prompt`` (each message's role and text) is an attribute only where the user opted in
        to content (:attr:`capture`). Not made current: nothing runs under it."""
        started = self._tracer.start_span(self.name, kind=self._client)
        if started.is_recording():
            started.set_attributes(self.requested)
            started.set_attribute("llm_ops.attempt", attempt)
            if prompt and self.capture:
                asked = [
                    {"role": role, "parts": [{"type": "text", "content": text}]}
                    for role, text in prompt
                ]
                started.set_attribute("gen_ai.input.messages", json.dumps(asked))
        return started, time.perf_counter()

    def end(
        self,
        attempt: tuple[Span, float],
        *,
        status: str,
        error_type: str | None = None,
        stop_reason: str | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        answer: str | None = None,
    ) -> None:
        """End an attempt with what became of it: ``status`` (a row status, or
        ``retryable``), ``error_type`` when it failed; ``answer`` is an attribute only where
        the user opted in to content (see :func:`capture_content`)."""
        span, started = attempt
        if span.is_recording():
            span.set_attributes(
                _present(
                    {
                        "llm_ops.status": status,
                        "error.type": error_type,
                        "gen_ai.usage.input_tokens": input_tokens,
                        "gen_ai.usage.output_tokens": output_tokens,
                    }
                )
            )
            if stop_reason is not None:
                span.set_attribute("gen_ai.response.finish_reasons", [stop_reason])
            if answer is not None and self.capture:
                said = {"role": "assistant", "parts": [{"type": "text", "content": answer}]}
                span.set_attribute("gen_ai.output.messages", json.dumps([said]))
            if error_type is not None:
                span.set_status(self._error, error_type)
        span.end()
        if self.instruments is not None:
            usage, duration = self.instruments
            failed = (
                self.common if error_type is None else {**self.common, "error.type": error_type}
            )
            duration.record(time.perf_counter() - started, failed)
            if input_tokens is not None:
                usage.record(input_tokens, self.input)
            if output_tokens is not None:
                usage.record(output_tokens, self.output)


def attempts(
    *,
    operation: str,
    dialect: str,
    model: str,
    params: Mapping[str, Any],
    server: tuple[str | None, int | None],
) -> Attempts | None:
    """The telemetry of a dispatch's attempts; ``None`` (no work at all on the hot path)
    while OpenTelemetry is not imported in this process, or no tracer or meter provider is
    set yet (one set later counts from the next dispatch)."""
    tracing = tracer()
    if tracing is None or not _providers_set():
        return None
    return Attempts(
        tracing, operation=operation, dialect=dialect, model=model, params=params, server=server
    )


def _providers_set() -> bool:
    """Whether a tracer or meter provider is set (here, or as OpenTelemetry's global one):
    without one, an attempt's no-op span and measurements would still cost a few
    microseconds each, for nothing."""
    if _provider is not None or _meter_provider is not None:
        return True
    from opentelemetry import metrics, trace

    tracing, measuring = trace.get_tracer_provider(), metrics.get_meter_provider()
    idle_tracing = isinstance(tracing, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    # the API's stand-in until a meter provider is set has no public name
    idle_measuring = isinstance(measuring, metrics.NoOpMeterProvider) or (
        type(measuring).__name__ == "_ProxyMeterProvider"
    )
    return not (idle_tracing and idle_measuring)


def instruments() -> tuple[Histogram, Histogram] | None:
    """The GenAI conventions' client metrics, ``gen_ai.client.token.usage`` and
    ``gen_ai.client.operation.duration``, made once per meter provider; ``None`` while
    OpenTelemetry is not imported."""
    global _instruments
    if _instruments is None and tracer() is not None:
        from opentelemetry import metrics

        meter = metrics.get_meter(INSTRUMENTATION, meter_provider=_meter_provider)
        usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        _instruments = (usage, duration)
    return _instruments


def _number(value: Any) -> int | float | None:
    """A numeric request parameter as an attribute; anything else (absent, odd) is left out."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _present(attributes: Mapping[str, AttributeValue | None]) -> dict[str, AttributeValue]:
    return {name: value for name, value in attributes.items() if value is not None}


def carrier() -> dict[str, str] | None:
    """The caller's span as W3C trace-context headers (OpenTelemetry's configured
    propagator), to send along with work that runs in another process, such as a Ray
    worker; ``None`` when nothing is emitted here or no span is current."""
    if tracer() is None:
        return None
    from opentelemetry import propagate

    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers or None


@contextmanager
def joined(headers: Mapping[str, str] | None) -> Iterator[None]:
    """Run the block under the span that :func:`carrier` carried from another process, so
    that the spans made here are its children; with no headers, as it is."""
    if not headers:
        yield
        return
    try:
        from opentelemetry import context, propagate
    except ImportError:  # the driver traces, this worker cannot: its work runs untraced
        yield
        return
    token = context.attach(propagate.extract(headers))
    try:
        yield
    finally:
        context.detach(token)
