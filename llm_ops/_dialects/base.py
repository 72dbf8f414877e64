"""What a dialect is: the interface the engine calls, and the neutral values it trades in.

The engine, the limiter and the batch runner speak of requests, answers, stop reasons, token
counts, rate limits and errors in these neutral terms; a :class:`Dialect` turns them into one
family of APIs' paths, bodies, headers and fields, and back. The request a dialect is given is
the canonical request, the one a cache key hashes (see :mod:`llm_ops._key`): a dialect changes
what is sent, never what is keyed, so every cached answer stays valid (only which provider was
asked is keyed, below).

The canonical request is spelled as the OpenAI-compatible dialect spells its bodies (its
structured-output format, its media parts: :data:`llm_ops._dialects.CANONICAL`), as keys were
before there were dialects; another dialect reads it in :meth:`Dialect.completion_body`. For a
dialect other than OpenAI's it holds ``"provider"`` too (the dialect's :attr:`Dialect.name`),
so the same prompt to another provider is another key: a dialect's body leaves it out.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import quote

import orjson

Stop = Literal["done", "length", "filtered", "unfinished"]
"""Why an answer stopped: ``done`` (it finished), ``length`` (cut at its token limit: the row
is ``truncated``), ``filtered`` (a content filter stopped it) or ``unfinished`` (anything else:
the attempt is made again)."""

ErrorKind = Literal["credentials", "quota", "rate_limited", "retryable", "rejected"]
"""What an error answer does to a job: ``credentials`` and ``quota`` refuse the whole job (it
stops); ``rate_limited`` slows every sender and is retried; ``retryable`` is retried;
``rejected`` refuses this request the same way every time (the row is ``rejected``)."""

Usage = tuple[int, int, int, int]
"""(prompt, completion, cached, reasoning) tokens an answer billed."""


@dataclass(slots=True)  # made for every answer: not frozen, whose __init__ costs twice as much
class Reply:
    """What a completion's answer says, in neutral terms.

    ``usage`` is ``None`` when the counts cannot be right (an answer without any bills none:
    zeros); ``stop_reason`` is the endpoint's own word for why it stopped, kept in the cache as
    it was said; ``error``, when ``failed``, is what the body said went wrong (a 200 that is no
    answer)."""

    text: object
    stop: Stop
    stop_reason: str | None
    usage: Usage | None
    reasoning: str | None = None
    failed: bool = False
    error: object = None
    cache_writes: int = 0
    """Of ``usage``'s prompt tokens, those written to the provider's prompt cache (Anthropic
    bills them above the input price); 0 where an API caches without a charge (OpenAI)."""
    response_model: str | None = None
    """The model that answered, as the answer names it (it may name a dated version of the
    model asked for); ``None`` where it names none."""
    response_id: str | None = None
    """The answer's own id, as the endpoint gave it; ``None`` where it gave none."""


def named(value: object) -> str | None:
    """A name or id an answer gave, when it is a string (an odd one is left out)."""
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Vectors:
    """What an embeddings answer says: its vectors, each with the index of its input."""

    vectors: list[Any]
    indexes: list[Any]
    usage: Usage | None


@dataclass(frozen=True)
class ErrorReading:
    """What an error answer (a status of 400 or more) says: its ``kind``, the endpoint's own
    message when it gave one, whether it refuses ``max_tokens`` for
    ``max_completion_tokens`` (reasoning models do: the request is sent again so), and the
    seconds its body asks to wait before another attempt (``retry_after``: Gemini's
    ``RetryInfo``; ``None`` when it names none, and then only a ``Retry-After`` header
    may)."""

    kind: ErrorKind
    message: str | None = None
    wants_max_completion_tokens: bool = False
    retry_after: float | None = None

    @property
    def retryable(self) -> bool:
        return self.kind in ("rate_limited", "retryable")


@dataclass(frozen=True)
class BatchResult:
    """One line of a provider batch's output or error file: the request key it answers (its
    ``custom_id``, ``None`` when it names none), the HTTP status and body of the answer, or the
    error that stood for it. ``unanswered`` (default ``False``): the line says its request was
    not answered (it expired, or was cancelled), so it is no outcome: the batch runner submits
    it again as a line the batch left out."""

    key: str | None
    status: int | None = None
    body: Any = None
    error: object = None
    unanswered: bool = False


@dataclass(slots=True)  # made for every answer: not frozen, whose __init__ costs twice as much
class HeardLimit:
    """What an answer said of one per-minute budget of the endpoint (its requests or its
    tokens): the limit, what ``remaining`` of it is readable (a non-negative number), whether
    it said none is left (``spent``), and then the seconds until it is full again (``reset``;
    read only when it is spent, the one time it is used)."""

    per_minute: float | None = None
    remaining: float | None = None
    spent: bool = False
    reset: float | None = None


@dataclass(slots=True)
class HeardLimits:
    """What an answer said of the endpoint's rate limits, as a dialect reads its headers
    (:meth:`Dialect.heard_limits`): nothing, when it named none."""

    requests: HeardLimit | None = None
    tokens: HeardLimit | None = None

    def of(self, kind: str) -> HeardLimit | None:
        return self.requests if kind == "requests" else self.tokens


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float | None:
    """A duration in seconds, or ``None`` when ``text`` is none: OpenAI's reset durations
    (``"1s"``, ``"6m0s"``, ``"20ms"``, ``"1.5"``) and the ``max_age`` a user writes (``"1d"``,
    ``"6h"``). Written here, not taken from a library (pytimeparse and the like), because this
    small grammar is all either needs and a dependency would not be smaller."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def path_of(template: str, model: str) -> str:
    """A dialect's path with ``{model}`` filled in (escaped: a model's name cannot reach
    another path), or the path as it is when it names no model."""
    if "{model}" not in template:
        return template
    return template.replace("{model}", quote(model, safe=""))


MAX_TOKENS_BELIEVED = 2**31 - 1
"""The most tokens a count of an answer's usage may hold and be believed."""


# What every dialect reads alike: counts, JSON bodies, error objects and header numbers.


def token_count(value: object) -> int | None:
    """A count of ``usage`` as the endpoint sent it, if it can be right: absent is 0; a
    negative, fractional or absurd number (at least 2**31), or not a number, is ``None``."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not value.is_integer():  # inf and nan too
            return None
        value = int(value)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int):
        return None
    return value if 0 <= value <= MAX_TOKENS_BELIEVED else None


def load(payload: bytes) -> Any:
    """JSON, as orjson reads it, or as the standard library does what orjson refuses (numbers
    beyond a double, NaN): an answer must not be lost to one odd number in it."""
    try:
        return orjson.loads(payload)
    except ValueError:
        return json.loads(payload)


def error_object(payload: bytes) -> dict[str, Any]:
    """The ``error`` object of an error answer, or an empty dict."""
    try:
        body = orjson.loads(payload)
    except ValueError:
        return {}
    inner = body.get("error", body) if isinstance(body, dict) else None
    return inner if isinstance(inner, dict) else {}


def header_number(text: str | None) -> float | None:
    """A number a header holds, else ``None``."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def header_count(text: str | None) -> float | None:
    """A non-negative number of an rate-limit header's remaining count, else ``None``."""
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


class MalformedAnswer(ValueError):
    """An answer whose body a dialect cannot read (torn JSON, fields missing); internal, never
    raised to a caller: the engine catches it where it asks a dialect to read an answer, and
    sends the request again once (its row ``failed`` after that, as any unreadable answer's)."""


@runtime_checkable
class Dialect(Protocol):
    """How one family of APIs is spoken: the one object the engine asks about paths, bodies,
    headers, answers, rate limits, errors and batch files.

    ``provider=`` of :class:`~llm_ops.Endpoint` names one (``"openai"``), or is one."""

    name: str
    """The provider's name, as ``provider=`` spells it."""
    stop_field: str
    """The field naming why an answer stopped, as messages quote it."""
    completions_path: str
    """The path of completions, under the base URL. Where the path names the model (as
    Gemini's does), it holds ``{model}``, which :func:`path_of` fills in; a path without it
    (OpenAI's) is used as it is."""
    embeddings_path: str
    """The path of embeddings, under the base URL (``{model}`` filled in as above)."""
    batch_path: str
    """The path each line of a provider batch names."""
    models_path: str
    """The path listing the models served, under the base URL."""
    # Optional members, read with getattr and these defaults (a dialect may leave them out):
    # ``embeddings: bool = True``, whether the API has embeddings at all (an embedding job
    # against one without is a ConfigError before anything is sent);
    # ``marks_prompt_cache: bool = False``, whether ``completion_body`` marks the shared prefix
    # (the system prompt) for the provider's prompt cache, which then bills its first use as a
    # cache write and later ones as cache reads (the estimate projects them so, for a prefix
    # of at least ``least_cached_tokens: int = 0``), and
    # ``unmarked() -> Dialect``, the same dialect marking nothing (``Endpoint(prompt_cache=
    # False)``).

    def headers(self, api_key: str) -> dict[str, str]:
        """The headers of every request: those the API asks for and those that carry
        ``api_key`` (none when it is empty: the caller's own headers carry the credentials).
        The caller's headers are sent too, and win."""
        ...

    def completion_body(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """The JSON body asking what ``request`` asks: the canonical request (``model``,
        ``messages``, set parameters, ``response_format``; media as content parts with their
        ``data:`` URLs) without its ``endpoint``."""
        ...

    def structured_output(self, name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
        """The body's fields asking for an answer matching the JSON ``schema``, named
        ``name``."""
        ...

    def image_part(self, url: str, detail: str | None = None) -> dict[str, Any]:
        """A message's content part holding an image by its URL (a ``data:`` URL, or a
        remote one), looked at as closely as ``detail`` says when it is set."""
        ...

    def file_part(self, data: str, filename: str | None = None) -> dict[str, Any]:
        """A message's content part holding a PDF as a ``data:`` URL, named ``filename``."""
        ...

    def embeddings_body(
        self, model: str, inputs: list[str], params: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The JSON body asking for the embeddings of ``inputs``."""
        ...

    def read_models(self, payload: bytes) -> frozenset[str]:
        """The models a listing names (none: any model is taken as served);
        :class:`MalformedAnswer` when it cannot be read."""
        ...

    def read_completion(self, payload: bytes) -> Reply:
        """A completion's answer; :class:`MalformedAnswer` when it cannot be read."""
        ...

    def read_embeddings(self, payload: bytes) -> Vectors:
        """An embeddings answer; :class:`MalformedAnswer` when it cannot be read."""
        ...

    def heard_limits(self, headers: Mapping[str, str]) -> HeardLimits:
        """The rate limits an answer's headers name (empty when they name none)."""
        ...

    def read_error(self, status: int, payload: bytes) -> ErrorReading:
        """What an error answer (status 400 or more) says."""
        ...

    def batch_line(self, key: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """One line of a batch's input file: ``body`` sent under ``key``."""
        ...

    def batch_request(self, line: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """A line of a batch's input file read back: its key and its body."""
        ...

    def batch_result(self, line: Mapping[str, Any]) -> BatchResult:
        """One line of a batch's output or error file."""
        ...
