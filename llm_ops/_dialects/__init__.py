"""API dialects: how one family of APIs spells requests, answers, errors, rate limits and batch
files, behind one interface the engine calls (:class:`Dialect`).

A dialect reads and writes neutral values and imports no other part of llm-ops. Which dialect an
endpoint speaks (``Endpoint(provider=...)``, or its host) is :mod:`llm_ops._endpoint`'s to pick:
:func:`llm_ops._endpoint.dialect_for`.
"""

from __future__ import annotations

from .base import (
    BatchResult,
    Dialect,
    ErrorKind,
    ErrorReading,
    HeardLimit,
    HeardLimits,
    MalformedAnswer,
    Reply,
    Stop,
    Usage,
    Vectors,
    parse_duration,
    path_of,
)
from .gemini import GEMINI
from .openai import OPENAI

__all__ = [
    "CANONICAL",
    "GEMINI",
    "OPENAI",
    "BatchResult",
    "Dialect",
    "ErrorKind",
    "ErrorReading",
    "HeardLimit",
    "HeardLimits",
    "MalformedAnswer",
    "Reply",
    "Stop",
    "Usage",
    "Vectors",
    "parse_duration",
    "path_of",
]

CANONICAL = OPENAI
"""The dialect whose spelling the canonical request (what a key hashes) uses for structured
output and media parts. Keys live in users' caches: this never changes."""
