"""Request keys: the identity of a request in the cache.

A request key is ``"v1:" + sha256(canonical_json(request)).hexdigest()``.

``request`` is a JSON object holding everything that can change the answer, and nothing else::

    {
      "endpoint": "http://127.0.0.1:8765/v1",   # normalised base URL, never credentials
      "messages": [{"content": "...", "role": "system"}, {"content": "...", "role": "user"}],
      "model": "gpt-4o-mini",
      "max_tokens": 64, "temperature": 0.0, ...  # output-affecting parameters that were set
      "provider": "anthropic",                   # only for a dialect other than OpenAI's
    }

Canonical JSON: keys sorted at every level, separators ``,`` and ``:`` (no whitespace), UTF-8,
non-ASCII characters written as themselves (no ``\\u`` escapes except for control characters,
which use Python's ``json`` spelling): by definition, what
``json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` writes.
Parameters left at their default (``None``) are omitted, so adding a new optional parameter
never invalidates existing keys. API keys, timeouts, concurrency and retry settings are never
part of the request.

The base URL is normalised: scheme and host lower-cased, user info and query dropped (either
may hold a key; llm-ops refuses the first and sends the second without keeping it), default
ports (80 for http, 443 for https) dropped, trailing slashes removed.

:func:`request_key` is the reference implementation. For whole tables the same keys are
computed vectorised in DuckDB (:func:`key_sql`); a test holds the two to agreement.

**Media.** A request with image or PDF columns (``images=``, ``documents=``) has a list for its
user message's content: the text part first, then one part per image or document, in the order
of the columns, each keyed by the sha256 of its bytes rather than by its base64 text::

    {"content": [{"text": "...", "type": "text"},
                 {"image_url": {"detail": "low", "url": "sha256:9f86d08..."}, "type": "image_url"},
                 {"file": {"file_data": "sha256:2c26b46..."}, "type": "file"}],
     "role": "user"}

So the same photo read from a path, from bytes or from a data URL is one key, and a changed
file is a new one. A remote image URL, passed through as it is, is keyed by the URL, its query
(which may hold a presigned URL's signature) as ``sha256=<hex of the query>``. A PDF sent as
page images (``send_as="pages"``) is keyed by ``"sha256:<pdf>#page=<n>"`` per page. A file name
is not part of the key. Requests without media keep a string content, so their keys never change.
(:mod:`llm_ops._media` makes the parts.)

Keys are stored in users' caches, so these bytes must never change. :func:`canonical_json`
writes them with ``orjson`` (from a half to an eighth of ``json``'s CPU per request, checks
included; see ``benchmarks/keys.py``), but only where orjson's bytes are known to be json's:
values made only of ``str``, ``bool``, ``None``, 64-bit ``int``, ``float`` whose text orjson
writes as ``repr`` does, and ``dict`` (``str`` keys), ``list`` and ``tuple`` of those, exact
types all. Anything else goes to ``json`` itself: floats orjson spells otherwise (``1e-7`` and
``0.00001`` for ``1e-07`` and ``1e-05``, ``null`` for ``NaN``), larger ints, other key types,
subclasses and the types orjson writes but json refuses (enums, UUIDs, dataclasses, datetimes),
lone surrogates, deep nesting. Whether the installed orjson still escapes strings, orders keys
and writes integers as json does is checked once at import; if it does not, every value goes
to json.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

KEY_VERSION = "v1"

# Placeholders for the per-row message texts when the request is split around them.
_SYSTEM_SLOT = "\x00llm-ops:system\x00"
_PROMPT_SLOT = "\x00llm-ops:prompt\x00"
_MEDIA_SLOT = "\x00llm-ops:media\x00"
# Characters whose JSON escape DuckDB writes in upper-case hex (\u001F), Python in lower case.
UPPERCASE_ESCAPE_PATTERN = "[\x0b\x0e\x0f\x1a-\x1f]"


def canonical_json(value: Any) -> str:
    """Serialise ``value`` in the canonical form described in this module's docstring."""
    fast = _orjson_canonical(value)
    return _json_canonical(value) if fast is None else fast.decode()


def _json_canonical(value: Any) -> str:
    """The canonical form by definition: what every key so far was hashed from."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _orjson_canonical(value: Any) -> bytes | None:
    """The canonical form's UTF-8 bytes by orjson, or ``None`` where they might not be json's."""
    if _ORJSON_AGREES and _orjson_writes_as_json(value, 0):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:  # a lone surrogate, nesting orjson refuses
            pass
    return None


_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what orjson writes; it refuses larger ints
_MAX_DEPTH = 64  # deeper (or circular) values go to json, which has its own limits and errors


def _orjson_writes_as_json(value: Any, depth: int) -> bool:
    """Whether orjson writes ``value`` byte for byte as json does: exact types only, since json
    and orjson treat subclasses (enums, ``numpy.float64``, ``OrderedDict``...) differently.
    Strings, the bulk of a request, are taken without a call."""
    kind = type(value)
    if kind is dict:
        if depth >= _MAX_DEPTH:
            return False
        for name, item in value.items():
            if type(name) is not str:
                return False
            if type(item) is not str and not _orjson_writes_as_json(item, depth + 1):
                return False
        return True
    if kind is list or kind is tuple:
        if depth >= _MAX_DEPTH:
            return False
        for item in value:
            if type(item) is not str and not _orjson_writes_as_json(item, depth + 1):
                return False
        return True
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return bool(_INT_MIN <= value <= _INT_MAX)
    if kind is float:
        agrees = _FLOATS_AGREE.get(value)
        if agrees is None:
            agrees = _float_agrees(value)
            if len(_FLOATS_AGREE) < 1024 and math.isfinite(value):
                _FLOATS_AGREE[value] = agrees
        return agrees
    return False


def _float_agrees(value: float) -> bool:
    return orjson.dumps(value) == float.__repr__(value).encode()


# The same few floats (temperature, top_p) come back in every request. 0.0 == -0.0, so their
# one entry must hold for both.
_FLOATS_AGREE = {0.0: _float_agrees(0.0) and _float_agrees(-0.0)}


def _orjson_agrees() -> bool:
    """Whether the installed orjson escapes strings, orders keys and writes ints and nesting as
    json does. The tests check every code point against the orjson they run with; this cheap
    probe keeps a later orjson that changed its spelling from ever changing a key."""
    text = (
        "".join(map(chr, range(0x800))) + "\u2028\u2029\ufeff\uffff\U00010000\U0001f600\U0010ffff"
    )
    probe = {
        text: [text, (0, -1, _INT_MIN, _INT_MAX), {}, [], True, False, None],
        "keys": {"b": 1, "B": 2, "é": 3, "e": 4, "\uffff": 5, "\U0001f600": 6, "": 7, "a b": 8},
    }
    try:
        return orjson.dumps(probe, option=orjson.OPT_SORT_KEYS) == _json_canonical(probe).encode()
    except orjson.JSONEncodeError:
        return False


_ORJSON_AGREES = _orjson_agrees()


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


def messages_for(
    system: str | None, prompt: str, media: Sequence[Any] = ()
) -> list[dict[str, Any]]:
    """The chat messages of one row; with ``media`` (content parts), the user message's content
    is the text part and then those parts."""
    content: Any = [{"type": "text", "text": prompt}, *media] if media else prompt
    if system is None:
        return [{"role": "user", "content": content}]
    return [{"role": "system", "content": system}, {"role": "user", "content": content}]


def request_key(request: Mapping[str, Any]) -> str:
    """``"v1:" + sha256(canonical_json(request))``.

    Examples
    --------
    >>> request_key({"model": "m", "messages": [{"role": "user", "content": "hi"}]})[:11]
    'v1:6d139f14'
    """
    canonical = _orjson_canonical(request)
    if canonical is None:
        canonical = _json_canonical(request).encode("utf-8")
    digest = hashlib.sha256(canonical).hexdigest()
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
    *,
    endpoint: str,
    model: str,
    params: Mapping[str, Any],
    with_system: bool,
    with_media: bool = False,
) -> tuple[str, list[str]]:
    """A DuckDB expression over columns ``system`` and ``prompt`` (and ``media_key``: the
    canonical JSON of a row's media parts, joined by commas) computing the request key.

    Returns the SQL text and its parameters. The canonical JSON of a request with placeholder
    texts is split around the placeholders; each row's texts are JSON-encoded by ``to_json``
    and spliced back in, its media parts as they are. Rows with a character matching
    :data:`UPPERCASE_ESCAPE_PATTERN` get a different hash than :func:`request_key` and must be
    recomputed by the caller.
    """
    system = _SYSTEM_SLOT if with_system else None
    skeleton = canonical_json(
        build_request(
            endpoint=endpoint,
            model=model,
            messages=messages_for(system, _PROMPT_SLOT, [_MEDIA_SLOT] if with_media else ()),
            params=params,
        )
    )
    pieces: list[str] = []
    columns: list[str] = []
    rest = skeleton
    for slot, column in (
        (_SYSTEM_SLOT, "to_json(system)"),
        (_PROMPT_SLOT, "to_json(prompt)"),
        (_MEDIA_SLOT, "media_key"),
    ):
        if json.dumps(slot) in rest:
            before, rest = rest.split(json.dumps(slot))
            pieces.append(before)
            columns.append(column)
    spliced = " || ".join(f"? || {column}" for column in columns)
    return f"'v1:' || sha256({spliced} || ?)", [*pieces, rest]
