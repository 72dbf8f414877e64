"""OpenTelemetry spans of a job and of each request attempt, emitted only where the process
uses OpenTelemetry.

OpenTelemetry is an optional extra (``pip install 'llm-ops[otel]'``). This module never
imports it on its own: it looks for it in :data:`sys.modules`, where anything that configures
a tracer provider (the SDK, ``opentelemetry-instrument``, Logfire, Prefect) has put it. A
process that does not use OpenTelemetry therefore imports none of it and pays one dictionary
lookup a job; a process that imports it without a tracer provider gets OpenTelemetry's no-op
tracer, whose spans record nothing, and the request attempts check
:meth:`~opentelemetry.trace.Span.is_recording` before building any attribute.

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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

INSTRUMENTATION = "llm_ops"
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

PROVIDER_NAMES = {"openai": "openai", "anthropic": "anthropic", "gemini": "gcp.gemini"}
"""``gen_ai.provider.name`` of each dialect: the conventions' well-known values (Gemini's API,
as opposed to Vertex AI's, is ``gcp.gemini``)."""

AttributeValue = str | bool | int | float

_tracer: Tracer | None = None
_provider: TracerProvider | None = None  # None: OpenTelemetry's global tracer provider


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Emit through ``provider`` rather than the global one (``None``: the global one again);
    for tests, since OpenTelemetry lets a process set its global provider only once."""
    global _tracer, _provider
    _provider, _tracer = provider, None


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


def start_attempt(
    tracing: Tracer,
    *,
    operation: str,
    dialect: str,
    model: str,
    params: Mapping[str, Any],
    attempt: int,
    server: tuple[str | None, int | None],
) -> Span:
    """The CLIENT span of one attempt to send a request, its request attributes set when it
    records (a sampled-out attempt builds none). Not made current: nothing runs under it."""
    from opentelemetry.trace import SpanKind

    started = tracing.start_span(f"{operation} {model}", kind=SpanKind.CLIENT)
    if started.is_recording():
        max_tokens = params.get("max_tokens", params.get("max_completion_tokens"))
        host, port = server
        started.set_attributes(
            _present(
                {
                    "gen_ai.operation.name": operation,
                    "gen_ai.provider.name": PROVIDER_NAMES.get(dialect, dialect),
                    "gen_ai.request.model": model,
                    "gen_ai.request.max_tokens": _number(max_tokens),
                    "gen_ai.request.temperature": _number(params.get("temperature")),
                    "gen_ai.request.top_p": _number(params.get("top_p")),
                    "gen_ai.request.seed": _number(params.get("seed")),
                    "server.address": host,
                    "server.port": port,
                    "llm_ops.attempt": attempt,
                }
            )
        )
    return started


def end_attempt(
    span: Span,
    *,
    status: str,
    error_type: str | None = None,
    stop_reason: str | None = None,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    answer: str | None = None,
) -> None:
    """End an attempt's span with what became of it: ``status`` (a row status, or
    ``retryable``), ``error_type`` when it failed; ``answer`` is set only where the user opted
    in to content (see :func:`capture_content`)."""
    if span.is_recording():
        from opentelemetry.trace import StatusCode

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
        if answer is not None and capture_content():
            said = {"role": "assistant", "parts": [{"type": "text", "content": answer}]}
            span.set_attribute("gen_ai.output.messages", json.dumps([said]))
        if error_type is not None:
            span.set_status(StatusCode.ERROR, error_type)
    span.end()


def _number(value: Any) -> int | float | None:
    """A numeric request parameter as an attribute; anything else (absent, odd) is left out."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _present(attributes: Mapping[str, AttributeValue | None]) -> dict[str, AttributeValue]:
    return {name: value for name, value in attributes.items() if value is not None}
