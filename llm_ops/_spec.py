"""The typed parts of a job: where requests go, how hard to push, and what is asked.

* :class:`Endpoint`: base URL and credentials; its :attr:`~Endpoint.identity` is what keys see.
* :class:`Limits`: transport settings, never part of a key.
* :class:`RequestSpec`: exactly what is keyed: endpoint identity, model, templates,
  output-affecting parameters and the output schema.

Each validates itself when made, so a bad argument is a :class:`~llm_ops.ConfigError` before
anything is sent. No ``repr`` shows a secret.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ._key import (
    build_embedding_request,
    build_request,
    embedding_key_sql,
    key_sql,
    messages_for,
    normalize_base_url,
    request_key,
)
from ._schema import OutputSchema
from ._template import Template
from .exceptions import ConfigError, MissingApiKeyError

DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_CONCURRENCY = 4096
MAX_ATTEMPTS = 100
MAX_SECONDS = 24 * 3600.0
MAX_RESPONSE_BYTES = 2**31  # what one answer's body may be allowed to hold, at the most
# An endpoint's own name in keys; never mistaken for a URL (no ':' or '/').
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
NO_KEY = "no-key-needed"  # what a loopback endpoint without a key is sent


def positive_int(name: str, value: object, *, most: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if most is not None and value > most:
        raise ConfigError(f"{name} must be at most {most:,}, got {value:,}")
    return value


def is_number(value: object) -> bool:
    """A finite int or float (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def seconds(name: str, value: object) -> float:
    if not is_number(value) or not 0 < value <= MAX_SECONDS:  # type: ignore[operator]
        raise ConfigError(
            f"{name} must be a positive number of seconds (at most "
            f"{MAX_SECONDS:,.0f}), got {value!r}"
        )
    return float(value)  # type: ignore[arg-type]


def _shown(url: str) -> str:
    """A URL as it may appear in a message: no user info, query or fragment."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(not a URL)"
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}"


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible endpoint: its base URL (without the query) and credentials.

    Query parameters of the URL (some gateways take their key there) are sent with every
    request but are never part of a key, stored or shown.
    """

    base_url: str
    api_key: str = field(repr=False)
    query: Mapping[str, str] = field(default_factory=dict, repr=False)
    name: str | None = None

    @property
    def identity(self) -> str:
        """The endpoint as request keys, the cache and reports see it: its ``name`` when it
        was given one, else its normalised base URL."""
        return self.name or normalize_base_url(self.base_url)

    @property
    def url_with_query(self) -> str:
        """The base URL with its query (a gateway's key may be there): what is sent."""
        return self.base_url + ("?" + urlencode(self.query) if self.query else "")

    @property
    def shown(self) -> str:
        """The URL as a message may show it."""
        return _shown(self.base_url)

    @property
    def local(self) -> bool:
        host = urlsplit(self.base_url).hostname or ""
        try:
            return host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    @classmethod
    def resolve(
        cls,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        name: str | None = None,
        need_key: bool = True,
    ) -> Endpoint:
        """``base_url``/``api_key``, else ``OPENAI_BASE_URL``/``OPENAI_API_KEY``, else OpenAI.
        Credentials in the URL are refused; a loopback endpoint needs no key."""
        if name is not None and not (isinstance(name, str) and _NAME.fullmatch(name)):
            raise ConfigError(
                "endpoint_name must be a name of letters, digits, '.', '_' and '-' "
                f"(at most 100), like 'vllm-prod'; got {name!r}"
            )
        url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        if not isinstance(url, str):
            raise ConfigError(f"base_url must be a string URL, got {type(url).__name__}")
        try:
            parts = urlsplit(url.strip())
            parts.port  # noqa: B018  (raises for a bad port)
        except ValueError as exc:
            raise ConfigError(
                f"base_url is not a valid URL ({exc}); write it like 'http://127.0.0.1:8765/v1'"
            ) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                "base_url must be an http(s) URL like 'http://127.0.0.1:8765/v1', "
                f"got {_shown(url)!r}"
            )
        if parts.username is not None or parts.password is not None:
            raise ConfigError(
                "base_url must not hold credentials (user:password@host): they "
                "would be sent and kept in the clear. Pass the key as api_key= "
                "or OPENAI_API_KEY."
            )
        endpoint = cls(
            urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")),
            api_key="",
            query=dict(parse_qsl(parts.query, keep_blank_values=True)),
            name=name,
        )
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if key:
            _check_api_key(key)
        elif endpoint.local or not need_key:
            key = NO_KEY
        else:
            raise MissingApiKeyError(
                f"no API key for {endpoint.shown}: pass api_key=... or set OPENAI_API_KEY "
                "(a local endpoint on 127.0.0.1 needs none)"
            )
        return dataclasses.replace(endpoint, api_key=key)


def _check_api_key(key: object) -> None:
    if not isinstance(key, str):
        raise ConfigError(f"api_key must be a string, got {type(key).__name__}")
    if not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise ConfigError(
            "api_key holds a space, a line break or a non-ASCII character, which "
            "an HTTP header cannot carry; check for a stray newline or quote "
            "(the key is not shown)"
        )


@dataclass(frozen=True)
class Limits:
    """How hard to push an endpoint: transport settings, never part of a request key.

    ``max_retry_after`` bounds the wait an endpoint may demand (``Retry-After``): a longer one
    fails the request instead of stalling the job. ``max_response_bytes`` bounds one answer's
    body, compressed and decompressed (an embeddings answer may hold more, by its inputs).
    """

    concurrency: int = 32
    max_attempts: int = 5
    timeout: float = 60.0
    rpm: float | None = None
    tpm: float | None = None
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    max_retry_after: float = 120.0
    max_response_bytes: int = 8 * 2**20

    def __post_init__(self) -> None:
        positive_int("concurrency", self.concurrency, most=MAX_CONCURRENCY)
        positive_int("max_attempts", self.max_attempts, most=MAX_ATTEMPTS)
        positive_int("max_response_bytes", self.max_response_bytes, most=MAX_RESPONSE_BYTES)
        object.__setattr__(self, "timeout", seconds("timeout", self.timeout))
        object.__setattr__(
            self, "max_retry_after", seconds("max_retry_after", self.max_retry_after)
        )
        for name, limit in (("rpm", self.rpm), ("tpm", self.tpm)):
            if limit is not None and (not is_number(limit) or limit <= 0):
                raise ConfigError(f"{name} must be a positive number per minute, got {limit!r}")


@dataclass(frozen=True)
class RequestSpec:
    """Everything that changes the answer, and nothing else: what a request key hashes, with
    the texts rendered from each row."""

    endpoint: str  # Endpoint.identity
    model: str
    prompt: Template
    system: Template | None = None
    params: Mapping[str, Any] = field(default_factory=dict)  # set ones only
    schema: OutputSchema | None = None

    @classmethod
    def build(
        cls,
        *,
        endpoint: str,
        model: str,
        prompt: Template,
        system: Template | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        schema: OutputSchema | None = None,
    ) -> RequestSpec:
        """Check the output-affecting parameters and keep those that are set."""
        if max_tokens is not None:
            positive_int("max_tokens", max_tokens)
        for name, value, high in (("temperature", temperature, 2.0), ("top_p", top_p, 1.0)):
            if value is not None and (not is_number(value) or not 0 <= value <= high):
                raise ConfigError(f"{name} must be a number between 0 and {high:g}, got {value!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"seed must be an integer, got {seed!r}")
        stops = [stop] if isinstance(stop, str) else stop
        if stop is not None and (
            not isinstance(stops, list | tuple)
            or not stops
            or not all(isinstance(s, str) and s for s in stops)
        ):
            raise ConfigError(f"stop must be a string or a list of non-empty strings, got {stop!r}")
        params = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed,
            "stop": stop if isinstance(stop, str | None) else list(stop),
            "response_format": schema.response_format() if schema else None,
        }
        return cls(
            endpoint=endpoint,
            model=model,
            prompt=prompt,
            system=system,
            params={k: v for k, v in params.items() if v is not None},
            schema=schema,
        )

    def with_model(self, model: str) -> RequestSpec:
        return dataclasses.replace(self, model=model)

    def request(self, system: str | None, prompt: str) -> dict[str, Any]:
        """The request of one row (its canonical JSON is what is hashed)."""
        return build_request(
            endpoint=self.endpoint,
            model=self.model,
            messages=messages_for(system, prompt),
            params=self.params,
        )

    def key(self, system: str | None, prompt: str) -> str:
        return request_key(self.request(system, prompt))

    def key_sql(self) -> tuple[str, list[str]]:
        """The DuckDB expression computing keys over columns ``system`` and ``prompt``."""
        return key_sql(
            endpoint=self.endpoint,
            model=self.model,
            params=self.params,
            with_system=self.system is not None,
        )


@dataclass(frozen=True)
class EmbeddingSpec:
    """What an embedding request key hashes besides the text: endpoint identity, model and the
    vector size asked for."""

    endpoint: str  # Endpoint.identity
    model: str
    dimensions: int | None = None

    def __post_init__(self) -> None:
        if self.dimensions is not None:
            positive_int("dimensions", self.dimensions)

    @property
    def params(self) -> dict[str, Any]:
        return {"dimensions": self.dimensions} if self.dimensions is not None else {}

    def request(self, text: str) -> dict[str, Any]:
        return build_embedding_request(
            endpoint=self.endpoint, model=self.model, text=text, params=self.params
        )

    def key(self, system: str | None, text: str) -> str:
        return request_key(self.request(text))

    def key_sql(self) -> tuple[str, list[str]]:
        return embedding_key_sql(endpoint=self.endpoint, model=self.model, params=self.params)
