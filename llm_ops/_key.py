"""Request keys: the identity of a request in the cache.

A request key is ``"v1:" + sha256(canonical_json(request)).hexdigest()``.

``request`` is a JSON object holding everything that can change the answer, and nothing else::

    {
      "endpoint": "http://127.0.0.1:8765/v1",   # normalised base URL, never credentials
      "messages": [{"content": "...", "role": "system"}, {"content": "...", "role": "user"}],
      "model": "gpt-4o-mini",
      "max_tokens": 64, "temperature": 0.0, ...  # output-affecting parameters that were set
    }

Canonical JSON: keys sorted at every level, separators ``,`` and ``:`` (no whitespace), UTF-8,
non-ASCII characters written as themselves (no ``\\u`` escapes except for control characters,
which use Python's ``json`` spelling). Parameters left at their default (``None``) are omitted,
so adding a new optional parameter never invalidates existing keys. API keys, timeouts,
concurrency and retry settings are never part of the request.

The base URL is normalised: scheme and host lower-cased, user info and query dropped (either
may hold a key; llm-ops refuses the first and sends the second without keeping it), default
ports (80 for http, 443 for https) dropped, trailing slashes removed.

:func:`request_key` is the reference implementation. For whole tables the same keys are
computed vectorised in DuckDB (:func:`key_sql`); a test holds the two to agreement.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

KEY_VERSION = "v1"

# Placeholders for the per-row message texts when the request is split around them.
_SYSTEM_SLOT = "\x00llm-ops:system\x00"
_PROMPT_SLOT = "\x00llm-ops:prompt\x00"
# Characters whose JSON escape DuckDB writes in upper-case hex (\u001F), Python in lower case.
UPPERCASE_ESCAPE_PATTERN = "[\x0b\x0e\x0f\x1a-\x1f]"


def canonical_json(value: Any) -> str:
    """Serialise ``value`` in the canonical form described in this module's docstring."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@functools.lru_cache(maxsize=64)  # once per request otherwise: the same few URLs, every key
def normalize_base_url(url: str) -> str:
    """The endpoint identity used in keys: ``"HTTP://Host:80/v1/"`` becomes ``"http://host/v1"``."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    port = parts.port
    if port is not None and (scheme, port) not in {("http", 80), ("https", 443)}:
        host = f"{host}:{port}"
    return urlunsplit((scheme, host, parts.path.rstrip("/"), "", ""))


def build_request(
    *,
    endpoint: str,
    model: str,
    messages: Sequence[Mapping[str, str]],
    params: Mapping[str, Any],
) -> dict[str, Any]:
    """The request object whose canonical JSON is hashed; ``None`` parameters are omitted."""
    request: dict[str, Any] = {k: v for k, v in params.items() if v is not None}
    request.update(endpoint=normalize_base_url(endpoint), model=model, messages=list(messages))
    return request


def messages_for(system: str | None, prompt: str) -> list[dict[str, str]]:
    """The chat messages of one row."""
    if system is None:
        return [{"role": "user", "content": prompt}]
    return [{"role": "system", "content": system}, {"role": "user", "content": prompt}]


def request_key(request: Mapping[str, Any]) -> str:
    """``"v1:" + sha256(canonical_json(request))``.

    Examples
    --------
    >>> request_key({"model": "m", "messages": [{"role": "user", "content": "hi"}]})[:11]
    'v1:6d139f14'
    """
    digest = hashlib.sha256(canonical_json(request).encode("utf-8")).hexdigest()
    return f"{KEY_VERSION}:{digest}"


def build_embedding_request(
    *, endpoint: str, model: str, text: str, params: Mapping[str, Any]
) -> dict[str, Any]:
    """An embedding request: ``{"endpoint", "input", "model", ...}``; keys never collide with
    chat requests, which have ``messages`` instead of ``input``."""
    request: dict[str, Any] = {k: v for k, v in params.items() if v is not None}
    request.update(endpoint=normalize_base_url(endpoint), model=model, input=text)
    return request


def embedding_key_sql(
    *, endpoint: str, model: str, params: Mapping[str, Any]
) -> tuple[str, list[str]]:
    """Like :func:`key_sql`, for embedding requests over a column ``prompt``."""
    skeleton = canonical_json(
        build_embedding_request(endpoint=endpoint, model=model, text=_PROMPT_SLOT, params=params)
    )
    before, after = skeleton.split(json.dumps(_PROMPT_SLOT))
    return "'v1:' || sha256(? || to_json(prompt) || ?)", [before, after]


def key_sql(
    *, endpoint: str, model: str, params: Mapping[str, Any], with_system: bool
) -> tuple[str, list[str]]:
    """A DuckDB expression over columns ``system`` and ``prompt`` computing the request key.

    Returns the SQL text and its parameters. The canonical JSON of a request with placeholder
    texts is split around the placeholders; each row's texts are JSON-encoded by ``to_json``
    and spliced back in. Rows with a character matching :data:`UPPERCASE_ESCAPE_PATTERN` get a
    different hash than :func:`request_key` and must be recomputed by the caller.
    """
    system = _SYSTEM_SLOT if with_system else None
    skeleton = canonical_json(
        build_request(
            endpoint=endpoint,
            model=model,
            messages=messages_for(system, _PROMPT_SLOT),
            params=params,
        )
    )
    before_prompt, after_prompt = skeleton.split(json.dumps(_PROMPT_SLOT))
    if not with_system:
        sql = "'v1:' || sha256(? || to_json(prompt) || ?)"
        return sql, [before_prompt, after_prompt]
    before_system, between = before_prompt.split(json.dumps(_SYSTEM_SLOT))
    sql = "'v1:' || sha256(? || to_json(system) || ? || to_json(prompt) || ?)"
    return sql, [before_system, between, after_prompt]
