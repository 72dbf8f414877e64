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

import functools
import json
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import CallbackOptions, Histogram, Meter, MeterProvider, Observation
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
_client_metrics: ClientMetrics | None = None


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Emit through ``provider`` rather than the global one (``None``: the global one again);
    for tests, since OpenTelemetry lets a process set its global provider only once."""
    global _tracer, _provider
    _provider, _tracer = provider, None


def use_meter_provider(provider: MeterProvider | None) -> None:
    """Measure through ``provider`` rather than the global one (``None``: the global one
    again); for tests, as :func:`use_tracer_provider`."""
    global _instruments, _meter_provider, _client_metrics
    _meter_provider, _instruments, _client_metrics = provider, None, None


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
        self.client = client_metrics()
        # the limit is the engine's, whatever the model: by provider and server only
        self.engine: dict[str, AttributeValue] = {
            name: self.common[name]
            for name in ("gen_ai.provider.name", "server.address", "server.port")
            if name in self.common
        }
        self.capture = capture_content()  # read once a dispatch, not once an attempt

    def watch(self, slots: Slots) -> None:
        """Report the engine's requests in flight and limit (``slots``, its concurrency)."""
        if self.client is not None:
            self.client.watch(slots, self.engine)

    def rate_limited(self, status: int) -> None:
        """An answer said the client was over a rate limit (HTTP ``status``)."""
        if self.client is not None:
            self.client.rate_limited.add(1, {**self.common, "http.response.status_code": status})

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
        cache_read_tokens: int | None = None,
        cache_write_tokens: int | None = None,
        reasoning_tokens: int | None = None,
        answer: str | None = None,
        response_model: str | None = None,
        response_id: str | None = None,
    ) -> None:
        """End an attempt with what became of it: ``status`` (a row status, or
        ``retryable``), ``error_type`` when it failed, and the model and id the answer
        named, with its tokens (of the input tokens, those read from and written to the
        provider's prompt cache; of the output tokens, the reasoning ones); ``answer`` is an
        attribute only where the user opted in to content (see
        :func:`capture_content`)."""
        span, started = attempt
        if span.is_recording():
            span.set_attributes(
                _present(
                    {
                        "llm_ops.status": status,
                        "error.type": error_type,
                        "gen_ai.usage.input_tokens": input_tokens,
                        "gen_ai.usage.output_tokens": output_tokens,
                        "gen_ai.usage.cache_read.input_tokens": cache_read_tokens,
                        "gen_ai.usage.cache_creation.input_tokens": cache_write_tokens,
                        "gen_ai.usage.reasoning.output_tokens": reasoning_tokens,
                        "gen_ai.response.model": response_model,
                        "gen_ai.response.id": response_id,
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


class BatchSpans:
    """The spans of a batch runner's provider batches: one ``llm_ops.batch`` span per part,
    from its submission (or its resumption by a rerun) to its collection, a child of the span
    current where it starts (the dispatch's). A poll is counted, not a span of its own: a
    batch may be polled for hours; each state the provider reports is an event. Without a
    tracer every method does nothing."""

    def __init__(self, *, dialect: str, model: str):
        self._tracer = tracer()
        self._common = {
            "gen_ai.provider.name": PROVIDER_NAMES.get(dialect, dialect),
            "gen_ai.request.model": model,
        }
        self._open: dict[str, tuple[Span, list[int]]] = {}  # by part label: span, polls

    def start(self, label: str, attributes: Mapping[str, AttributeValue | None]) -> None:
        """Start the span of the part labelled ``label``, unless one is open already."""
        if self._tracer is None or label in self._open:
            return
        started = self._tracer.start_span(
            "llm_ops.batch", attributes=_present({**self._common, **attributes})
        )
        self._open[label] = (started, [0])

    def record(self, label: str, attributes: Mapping[str, AttributeValue | None]) -> None:
        """Set ``attributes`` on the part's span."""
        opened = self._open.get(label)
        if opened is not None:
            record(opened[0], attributes)

    def event(self, label: str, name: str, attributes: Mapping[str, AttributeValue | None]) -> None:
        """Note ``name`` on the part's span, with ``attributes``."""
        opened = self._open.get(label)
        if opened is not None and opened[0].is_recording():
            opened[0].add_event(name, _present(attributes))

    def polled(self, label: str) -> None:
        """Count a poll of the part's batch."""
        opened = self._open.get(label)
        if opened is not None:
            opened[1][0] += 1

    def end(
        self,
        label: str,
        attributes: Mapping[str, AttributeValue | None],
        *,
        error_type: str | None = None,
    ) -> None:
        """End the part's span with ``attributes`` and its poll count; ``error_type`` marks
        it failed."""
        opened = self._open.pop(label, None)
        if opened is None:
            return
        ended, polls = opened
        if ended.is_recording():
            ended.set_attributes(
                _present({**attributes, "llm_ops.batch.polls": polls[0], "error.type": error_type})
            )
            if error_type is not None:
                from opentelemetry.trace import StatusCode

                ended.set_status(StatusCode.ERROR, error_type)
        ended.end()

    def end_all(self, error_type: str | None) -> None:
        """End the spans still open (the runner stopped before collecting their parts)."""
        for label in list(self._open):
            self.end(label, {}, error_type=error_type)


class Slots(Protocol):
    """An engine's concurrency, as its metrics read it."""

    in_flight: int
    limit: int


class ClientMetrics:
    """llm-ops's own client metrics beside the GenAI conventions' two: requests in flight,
    the knee controller's limit, rate-limited answers and cost (see :func:`client_metrics`).

    The first two are read from each engine's concurrency when the meter provider collects,
    so that no request pays for them: an engine is watched (weakly) from its first measured
    dispatch on."""

    def __init__(self, meter: Meter):
        self._watched: weakref.WeakKeyDictionary[Slots, dict[str, AttributeValue]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()  # collected on the reader's thread
        meter.create_observable_up_down_counter(
            "llm_ops.client.requests_in_flight",
            callbacks=[functools.partial(self._observe, "in_flight")],
            unit="{request}",
            description="Requests sent and not yet answered.",
        )
        meter.create_observable_gauge(
            "llm_ops.client.concurrency_limit",
            callbacks=[functools.partial(self._observe, "limit")],
            unit="{request}",
            description="The most requests in flight the concurrency controller allows.",
        )
        self.rate_limited = meter.create_counter(
            "llm_ops.client.rate_limited",
            unit="{response}",
            description="Answers that said the client was over a rate limit (a 429, or an "
            "overload such as Anthropic's 529).",
        )
        self.cost = meter.create_counter(
            "llm_ops.cost",
            unit="USD",
            description="What the jobs' requests cost, at the prices known, when each job ends.",
        )

    def watch(self, slots: Slots, attributes: dict[str, AttributeValue]) -> None:
        """Report ``slots``'s requests in flight and limit, with ``attributes``, while it
        lives."""
        with self._lock:
            self._watched[slots] = attributes

    def _observe(self, figure: str, options: CallbackOptions) -> Iterator[Observation]:
        """Each watched endpoint's ``figure`` (summed over the engines that share it)."""
        from opentelemetry.metrics import Observation

        with self._lock:
            watched = list(self._watched.items())
        totals: dict[tuple[tuple[str, AttributeValue], ...], int] = {}
        for slots, attributes in watched:
            named = tuple(sorted(attributes.items()))
            totals[named] = totals.get(named, 0) + getattr(slots, figure)
        for named, total in totals.items():
            yield Observation(total, dict(named))


def client_metrics() -> ClientMetrics | None:
    """llm-ops's own client metrics, made once per meter provider; ``None`` (nothing built)
    while OpenTelemetry is not imported or no tracer or meter provider is set."""
    global _client_metrics
    if tracer() is None or not _providers_set():
        return None
    if _client_metrics is None:
        from opentelemetry import metrics

        meter = metrics.get_meter(INSTRUMENTATION, meter_provider=_meter_provider)
        _client_metrics = ClientMetrics(meter)
    return _client_metrics


def count_cost(dollars: float | None, attributes: Mapping[str, AttributeValue | None]) -> None:
    """Add a finished job's cost to ``llm_ops.cost`` (nothing when it is unknown or zero)."""
    if not dollars:
        return
    measuring = client_metrics()
    if measuring is not None:
        measuring.cost.add(dollars, _present(attributes))


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
