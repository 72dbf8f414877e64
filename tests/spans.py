"""Helpers for reading the spans llm-ops emits in tests (the ``exporter`` fixture is in
``conftest.py``)."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def one(spans: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    (found,) = named(spans, name)
    return found


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id
