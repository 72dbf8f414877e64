"""The typed parts of a job: where requests go, how hard to push, and what is asked.

* :class:`Endpoint`: where requests go and how (``endpoint=``), public; resolved against the
  environment into a :class:`ResolvedEndpoint`, whose :attr:`~ResolvedEndpoint.identity` is
  what keys see, and its :class:`Connection` (headers of one's own, TLS, a proxy), never part
  of a key.
* :class:`Retries` and :class:`RateLimit` (public), put together with the concurrency into
  :class:`Limits`: transport settings, never part of a key.
* :class:`Sampling` (public): the sampling parameters, part of the key.
* :class:`RequestSpec`: exactly what is keyed: endpoint identity, model, templates,
  output-affecting parameters and the output schema.

Each validates itself when made, so a bad argument is a :class:`~llm_ops.ConfigError` before
anything is sent. No ``repr`` shows a secret.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import math
import os
import re
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx2

from ._concurrency import DEFAULT_CAP
from ._dialects import CANONICAL, Dialect, dialect_for
from ._key import (
    build_embedding_request,
    build_request,
    embedding_key_sql,
    key_sql,
    messages_for,
    normalize_base_url,
    request_key,
)
from ._media import Media, keyed_parts
from ._schema import OutputSchema
from ._template import Template
from ._wire import AsyncTransport
from .exceptions import ConfigError, MissingApiKeyError, setting, setting_to

DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_CONCURRENCY = 4096
MAX_ATTEMPTS = 100
MAX_SECONDS = 24 * 3600.0
MAX_RESPONSE_BYTES = 2**31  # what one answer's body may be allowed to hold, at the most
# An endpoint's own name in keys; never mistaken for a URL (no ':' or '/').
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
ReasoningEffort = Literal["minimal", "low", "medium", "high"]
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
class ResolvedEndpoint:
    """An :class:`Endpoint` as requests use it: its base URL (without the query), from the
    environment when the endpoint names none, and the credentials in effect.

    Query parameters of the URL (some gateways take their key there) are sent with every
    request but are never part of a key, stored or shown.
    """

    base_url: str
    api_key: str = field(repr=False)
    query: Mapping[str, str] = field(default_factory=dict, repr=False)
    name: str | None = None
    # the API dialect spoken there: how requests are sent, never what is keyed
    dialect: Dialect = field(default_factory=lambda: dialect_for(None), repr=False, compare=False)

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
        keyed_by_headers: bool = False,
        provider: str | Dialect | None = None,
    ) -> ResolvedEndpoint:
        """``base_url``/``api_key``, else ``OPENAI_BASE_URL``/``OPENAI_API_KEY``, else OpenAI.
        Credentials in the URL are refused; a loopback endpoint needs no key, nor one whose
        credentials go in headers of the caller's (``keyed_by_headers``: then, without a key,
        no ``Authorization`` header is sent)."""
        if name is not None and not (isinstance(name, str) and _NAME.fullmatch(name)):
            raise ConfigError(
                "an endpoint's name must be a name of letters, digits, '.', '_' and '-' "
                f"(at most 100), like 'vllm-prod'; got {name!r}"
            )
        url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        if not isinstance(url, str):
            raise ConfigError(
                f"{setting('base_url')} must be a string URL, got {type(url).__name__}"
            )
        try:
            parts = urlsplit(url.strip())
            parts.port  # noqa: B018  (raises for a bad port)
        except ValueError as exc:
            raise ConfigError(
                f"{setting('base_url')} is not a valid URL ({exc}); write it like "
                "'http://127.0.0.1:8765/v1'"
            ) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"{setting('base_url')} must be an http(s) URL like 'http://127.0.0.1:8765/v1', "
                f"got {_shown(url)!r}"
            )
        if parts.username is not None or parts.password is not None:
            raise ConfigError(
                f"{setting('base_url')} must not hold credentials (user:password@host): they "
                f"would be sent and kept in the clear. Pass the key as {setting_to('api_key')} "
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
        elif keyed_by_headers:
            key = ""
        elif endpoint.local or not need_key:
            key = NO_KEY
        else:
            raise MissingApiKeyError(
                f"no API key for {endpoint.shown}: pass {setting_to('api_key')} or set "
                f"OPENAI_API_KEY, or send the credentials in {setting_to('headers')} (e.g. "
                "Azure's api-key header); a local endpoint on 127.0.0.1 needs none"
            )
        return dataclasses.replace(
            endpoint, api_key=key, dialect=dialect_for(provider, endpoint.base_url)
        )


def _check_api_key(key: object) -> None:
    if not isinstance(key, str):
        raise ConfigError(f"api_key must be a string, got {type(key).__name__}")
    if not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise ConfigError(
            "api_key holds a space, a line break or a non-ASCII character, which "
            "an HTTP header cannot carry; check for a stray newline or quote "
            "(the key is not shown)"
        )


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # what a header's name may be (RFC 9110)
_FRAMING = frozenset(
    ("host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "upgrade")
)
_CREDENTIAL = re.compile(r"auth|key|token|secret|passw|cookie|signature|credential|session", re.I)
"""Header names whose values are credentials: redacted wherever a message could show them."""
AUTHENTICATING = frozenset(("authorization", "api-key", "x-api-key"))
"""Headers that carry the credentials themselves (Azure's ``api-key``, a gateway's bearer):
with one of these, no API key is needed besides."""


@dataclass(frozen=True)
class Connection:
    """How requests reach the endpoint, besides its URL: transport settings, never part of a
    key, and never shown (no ``repr`` holds a header's value or a proxy's credentials).

    ``headers`` go with every request (Azure's ``api-key``, a gateway's tenant header); a
    caller's header replaces the SDK's of the same name. ``verify``: check the server's
    certificate against the system's authorities (``True``), a CA bundle file or folder, or
    an :class:`ssl.SSLContext` of one's own; ``False`` checks nothing. ``cert``: a client
    certificate for servers that ask for one (mutual TLS), a PEM file holding the key too or
    a ``(certificate, key)`` pair. ``proxy``: an ``http://`` or ``https://`` proxy (without a
    scheme, ``http://``); by default the one the environment names (``HTTPS_PROXY``,
    ``HTTP_PROXY``, ``ALL_PROXY``, ``NO_PROXY``), as httpx reads it.
    """

    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    verify: bool | str | os.PathLike[str] | ssl.SSLContext = True
    cert: str | os.PathLike[str] | tuple[str, str] | None = None
    proxy: str | None = field(default=None, repr=False)
    transport: AsyncTransport | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.transport is not None and not isinstance(self.transport, AsyncTransport):
            raise ConfigError(
                "transport takes an object with async handle_async_request(request) and "
                f"aclose() methods (see Endpoint), got {type(self.transport).__name__}"
            )
        if not isinstance(self.headers, Mapping):
            raise ConfigError(
                "headers must be a dict of header names to values, like {'api-key': '...'}"
            )
        for name, value in self.headers.items():
            _check_header(name, value)
        object.__setattr__(self, "headers", dict(self.headers))
        if not isinstance(self.verify, bool | str | os.PathLike | ssl.SSLContext):
            raise ConfigError(
                "verify must be True, False, a CA bundle's path or an ssl.SSLContext, got "
                f"{type(self.verify).__name__}"
            )
        if isinstance(self.verify, str | os.PathLike) and not Path(self.verify).exists():
            raise ConfigError(f"verify names a CA bundle that does not exist: {self.verify}")
        if self.cert is not None:
            files = _cert_files(self.cert)
            if len(files) not in (1, 2):
                raise ConfigError(
                    "cert must be a PEM file's path, or a (certificate, key) pair of paths"
                )
            for file in files:
                if not Path(file).is_file():
                    raise ConfigError(f"cert names a file that does not exist: {file}")
            if isinstance(self.verify, ssl.SSLContext):
                raise ConfigError(
                    "cert cannot be added to an ssl.SSLContext given as verify: load it into "
                    "that context (context.load_cert_chain(...)) and drop cert="
                )
        if self.proxy is not None:
            object.__setattr__(self, "proxy", _proxy_url(self.proxy))

    @property
    def authenticates(self) -> bool:
        """Whether a header carries the credentials (then no API key is needed)."""
        return any(name.lower() in AUTHENTICATING for name in self.headers)

    @property
    def secrets(self) -> tuple[str, ...]:
        """The values no message may show: credential-named headers', the proxy's password."""
        values = [v for name, v in self.headers.items() if _CREDENTIAL.search(name)]
        password = urlsplit(self.proxy).password if self.proxy else None
        return (*values, *([password] if password else []))

    def tls(self) -> ssl.SSLContext:
        """The TLS context of these settings (one per process for each: loading the system's
        certificates takes about 30 ms)."""
        if isinstance(self.verify, ssl.SSLContext):
            return self.verify
        verify = self.verify if isinstance(self.verify, bool) else os.fspath(self.verify)
        return _tls_context(verify, _cert_files(self.cert) or None)


def _cert_files(cert: object) -> tuple[str, ...]:
    """The paths of ``cert=`` (none when it holds something else than paths)."""
    files = cert if isinstance(cert, tuple) else () if cert is None else (cert,)
    if not all(isinstance(file, str | os.PathLike) for file in files):
        return ()
    return tuple(os.fspath(file) for file in files)


@functools.cache
def _tls_context(verify: bool | str, cert: tuple[str, ...] | None) -> ssl.SSLContext:
    if verify is True:  # the SDK's own choice of authorities, for both stacks
        context = httpx2.create_ssl_context()
    elif verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif os.path.isdir(verify):
        context = ssl.create_default_context(capath=verify)
    else:
        context = ssl.create_default_context(cafile=verify)
    if cert is not None:
        try:
            context.load_cert_chain(*cert)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"cert could not be loaded ({exc}); give a PEM certificate with its key, or a "
                "(certificate, key) pair"
            ) from None
    return context


def _check_header(name: object, value: object) -> None:
    if not isinstance(name, str) or not _TOKEN.fullmatch(name):
        raise ConfigError(f"{name!r} is not a header name HTTP can carry")
    if name.lower() in _FRAMING:
        raise ConfigError(f"the header {name!r} is set by the HTTP client; drop it from headers")
    if not isinstance(value, str):
        raise ConfigError(f"the header {name!r} must have a string value")
    if not value.isascii() or any((c < " " and c != "\t") or c == "\x7f" for c in value):
        raise ConfigError(
            f"the header {name!r} holds a line break or a character HTTP cannot carry "
            "(the value is not shown)"
        )


def _proxy_url(proxy: object) -> str:
    if not isinstance(proxy, str) or not proxy.strip():
        raise ConfigError(f"proxy must be a URL like 'http://proxy.example:3128', got {proxy!r}")
    url = proxy.strip() if "://" in proxy else f"http://{proxy.strip()}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises for a bad port)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            "proxy must be an http:// or https:// proxy's URL like 'http://proxy.example:3128'"
        )
    return url


@dataclass(frozen=True)
class Endpoint:
    """Where requests go and how they get there: ``endpoint=`` of every call and of
    :class:`~llm_ops.Client` (a URL alone stands for ``Endpoint(url)``).

    Parameters
    ----------
    base_url
        The OpenAI-compatible API's URL, e.g. ``"http://127.0.0.1:8000/v1"``; ``None``:
        ``OPENAI_BASE_URL``, then OpenAI's. Credentials in it are refused; query parameters
        (some gateways take their key there) are sent but never stored or shown.
    api_key
        ``None``: ``OPENAI_API_KEY``. A loopback endpoint needs none, nor one whose
        ``headers`` carry the credentials. Never stored, logged or put in a message.
    headers
        Sent with every request, such as Azure OpenAI's ``{"api-key": ...}`` or a gateway's
        tenant header. Never part of a cache key; values of headers named like a credential
        never appear in a message or log.
    verify, cert
        TLS: ``verify`` checks the server's certificate against the system's authorities
        (``True``), a CA bundle's path, or an :class:`ssl.SSLContext`; ``False`` checks
        nothing. ``cert`` is a client certificate for servers that ask for one (mutual TLS):
        a PEM file holding the key too, or a ``(certificate, key)`` pair of paths.
    proxy
        An ``http://`` or ``https://`` proxy (``user:password@`` in it for one that asks); by
        default the one ``HTTPS_PROXY``, ``HTTP_PROXY`` or ``ALL_PROXY`` names, unless
        ``NO_PROXY`` names the host.
    name
        The endpoint's name in cache keys instead of its URL, so one server reached under
        several URLs (a changing port, a load balancer and its replicas) shares its answers:
        letters, digits, ``.``, ``_`` and ``-``. The bundled simulator's is
        :attr:`llm_ops.testing.LocalEndpoint.name`.
    max_response_bytes
        Bytes one answer's body may hold, compressed and decompressed (default 8 MiB; an
        embeddings answer may hold 128 KiB more per input); a larger one fails its request.
    provider
        The API's dialect: how requests are written and answers read. ``"openai"``, the
        OpenAI-compatible API that most servers and gateways speak, or a dialect object
        (``llm_ops._dialects.Dialect``: a test's, or an API llm-ops does not ship). ``None``:
        the one the host is known for (``api.openai.com``), else ``"openai"``. The dialect
        changes what is sent, never a cache key.
    transport
        Sends each HTTP request instead of llm-ops' own pool of connections, as httpx's
        ``transport=``: an object with ``async handle_async_request(request)``, taking an
        ``HttpRequest`` (``method``, ``url``, ``headers``, ``body``, ``timeout``,
        ``max_bytes``) and returning an ``HttpAnswer`` (``status``, ``headers``, ``body``),
        and ``async aclose()``: an :class:`~llm_ops.AsyncTransport`. For tests, or to
        trace each request; the engine still retries, paces and reads every answer.
        ``verify``, ``cert`` and ``proxy`` are then the transport's to apply.

    Examples
    --------
    >>> from llm_ops import Endpoint
    >>> Endpoint("https://my-resource.openai.azure.com/openai/v1", headers={"api-key": "..."})
    Endpoint(base_url='https://my-resource.openai.azure.com/openai/v1', name=None)
    """

    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    verify: bool | str | os.PathLike[str] | ssl.SSLContext = field(default=True, repr=False)
    cert: str | os.PathLike[str] | tuple[str, str] | None = field(default=None, repr=False)
    proxy: str | None = field(default=None, repr=False)
    name: str | None = None
    max_response_bytes: int = field(default=8 * 2**20, repr=False)
    provider: str | Dialect | None = field(default=None, repr=False)
    transport: AsyncTransport | None = field(default=None, repr=False, compare=False)
    connection: Connection = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.base_url is not None and not isinstance(self.base_url, str):
            raise ConfigError(f"base_url must be a string URL, got {type(self.base_url).__name__}")
        if self.api_key is not None:
            _check_api_key(self.api_key)
        if self.name is not None and not (
            isinstance(self.name, str) and _NAME.fullmatch(self.name)
        ):
            raise ConfigError(
                "an endpoint's name must be of letters, digits, '.', '_' and '-' "
                f"(at most 100), like 'vllm-prod'; got {self.name!r}"
            )
        positive_int("max_response_bytes", self.max_response_bytes, most=MAX_RESPONSE_BYTES)
        if self.provider is not None:
            dialect_for(self.provider)  # a name no dialect has: ConfigError now, not later
        connection = Connection(self.headers, self.verify, self.cert, self.proxy, self.transport)
        object.__setattr__(self, "connection", connection)
        object.__setattr__(self, "headers", connection.headers)
        object.__setattr__(self, "proxy", connection.proxy)

    def resolve(self) -> ResolvedEndpoint:
        """The URL and credentials in effect (see :meth:`ResolvedEndpoint.resolve`)."""
        return ResolvedEndpoint.resolve(
            self.base_url,
            self.api_key,
            name=self.name,
            keyed_by_headers=self.connection.authenticates,
            provider=self.provider,
        )


def endpoint_of(endpoint: object) -> Endpoint:
    """``endpoint=``: an :class:`Endpoint`, a URL standing for one, or ``None`` (the
    environment's)."""
    if endpoint is None or isinstance(endpoint, str):
        return Endpoint(endpoint)
    if not isinstance(endpoint, Endpoint):
        raise ConfigError(
            "endpoint takes a URL such as 'http://127.0.0.1:8000/v1', or an Endpoint(url, "
            f"api_key=..., headers=...), got {type(endpoint).__name__}"
        )
    return endpoint


@dataclass(frozen=True)
class Retries:
    """How a request is tried again: ``retries=`` of every call and of
    :class:`~llm_ops.Client`.

    ``max_attempts``: attempts per request, the first included. ``timeout``: seconds per
    attempt. ``max_retry_after``: the seconds an endpoint may ask every sender to wait
    (``Retry-After``); a request asked to wait longer fails instead of stalling the job, and
    when every request is, the job stops with :class:`~llm_ops.JobAbortedError`.
    Asking again for an invalid structured answer is ``repair=`` of the call, beside
    ``schema=``.

    Examples
    --------
    >>> from llm_ops import Retries
    >>> Retries(max_attempts=3, timeout=20)
    Retries(max_attempts=3, timeout=20.0, max_retry_after=120.0)
    """

    max_attempts: int = 5
    timeout: float = 60.0
    max_retry_after: float = 120.0
    # repair was a field here, read from the client's limits (so never per call): given, it
    # names its new place, an option of the call.
    repair: InitVar[bool | None] = None

    def __post_init__(self, repair: bool | None) -> None:
        if repair is not None:
            raise ConfigError(
                "repair is an option beside schema= now: llm_complete(..., schema=..., repair=True)"
            )
        positive_int("max_attempts", self.max_attempts, most=MAX_ATTEMPTS)
        object.__setattr__(self, "timeout", seconds("timeout", self.timeout))
        object.__setattr__(
            self, "max_retry_after", seconds("max_retry_after", self.max_retry_after)
        )


@dataclass(frozen=True)
class RateLimit:
    """Requests (``rpm``) and tokens (``tpm``) per minute to stay under: ``rate_limit=`` of
    every call and of :class:`~llm_ops.Client`. The endpoint's rate-limit headers are followed
    too; the tighter limit wins.

    Examples
    --------
    >>> from llm_ops import RateLimit
    >>> RateLimit(rpm=500, tpm=200_000)
    RateLimit(rpm=500, tpm=200000)
    """

    rpm: float | None = None
    tpm: float | None = None

    def __post_init__(self) -> None:
        for name, limit in (("rpm", self.rpm), ("tpm", self.tpm)):
            if limit is not None and (not is_number(limit) or limit <= 0):
                raise ConfigError(f"{name} must be a positive number per minute, got {limit!r}")


@dataclass(frozen=True)
class Limits:
    """How hard to push an endpoint, put together from a client's checked options:
    transport settings, never part of a request key."""

    concurrency: int | None = None  # None: the knee the controller finds (llm_ops._concurrency)
    retries: Retries = Retries()
    rate_limit: RateLimit = RateLimit()
    max_response_bytes: int = 8 * 2**20
    backoff_base: float = 0.5
    backoff_max: float = 30.0

    def __post_init__(self) -> None:
        if self.concurrency is not None:
            positive_int("concurrency", self.concurrency, most=MAX_CONCURRENCY)

    @property
    def most_in_flight(self) -> int:
        """The cap on requests in flight: ``concurrency`` given, else the controller's."""
        return self.concurrency or DEFAULT_CAP

    @property
    def max_attempts(self) -> int:
        return self.retries.max_attempts

    @property
    def timeout(self) -> float:
        return self.retries.timeout

    @property
    def max_retry_after(self) -> float:
        return self.retries.max_retry_after

    @property
    def rpm(self) -> float | None:
        return self.rate_limit.rpm

    @property
    def tpm(self) -> float | None:
        return self.rate_limit.tpm


@dataclass(frozen=True)
class Sampling:
    """How the model samples its answer: ``sampling=`` of every completion call. Each field
    is sent to the endpoint when set, and is part of the cache key.

    ``max_tokens``: the most tokens per answer. ``temperature`` (0 to 2) and ``top_p``
    (0 to 1): the sampling's randomness. ``seed``: asks for reproducible sampling where the
    server offers it. ``stop``: a text, or texts, at which the answer stops.
    ``reasoning_effort`` (``"minimal"``, ``"low"``, ``"medium"`` or ``"high"``): how long a
    reasoning model (OpenAI's o-series, gpt-5) thinks before it answers.
    ``max_completion_tokens``: the most tokens per answer, thinking included, as reasoning
    models take it; a request with ``max_tokens`` that such a model refuses is resent with
    ``max_completion_tokens`` instead, under the same cache key.
    Keeping a reasoning model's thinking is ``keep_reasoning=`` of the call, beside
    ``output=``: it adds a column, and changes nothing that is asked.

    Examples
    --------
    >>> from llm_ops import Sampling
    >>> Sampling(temperature=0, max_tokens=200)  # doctest: +ELLIPSIS
    Sampling(max_tokens=200, temperature=0, top_p=None, seed=None, stop=None, ...)
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | Sequence[str] | None = None
    reasoning_effort: ReasoningEffort | None = None
    max_completion_tokens: int | None = None
    # keep_reasoning was a field here, the one neither sent nor keyed: given, it names its
    # new place, an option of the call.
    keep_reasoning: InitVar[bool | None] = None

    def __post_init__(self, keep_reasoning: bool | None) -> None:
        if keep_reasoning is not None:
            raise ConfigError(
                "keep_reasoning is an option beside output= now: "
                "llm_complete(..., output=..., keep_reasoning=True)"
            )
        if self.max_tokens is not None:
            positive_int("max_tokens", self.max_tokens)
        if self.max_completion_tokens is not None:
            positive_int("max_completion_tokens", self.max_completion_tokens)
        effort = self.reasoning_effort
        if effort is not None and effort not in get_args(ReasoningEffort):
            raise ConfigError(
                "reasoning_effort must be one of "
                f"{', '.join(map(repr, get_args(ReasoningEffort)))}, got {effort!r}"
            )
        for name, value, high in (
            ("temperature", self.temperature, 2.0),
            ("top_p", self.top_p, 1.0),
        ):
            if value is not None and (not is_number(value) or not 0 <= value <= high):
                raise ConfigError(f"{name} must be a number between 0 and {high:g}, got {value!r}")
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"seed must be an integer, got {seed!r}")
        stop = self.stop
        stops = [stop] if isinstance(stop, str) else stop
        if stop is not None and (
            not isinstance(stops, list | tuple)
            or not stops
            or not all(isinstance(s, str) and s for s in stops)
        ):
            raise ConfigError(f"stop must be a string or a list of non-empty strings, got {stop!r}")
        if stop is not None and not isinstance(stop, str):
            object.__setattr__(self, "stop", list(stop))

    @property
    def params(self) -> dict[str, Any]:
        """The fields that are set, as the request's parameters."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


@dataclass(frozen=True)
class RequestSpec:
    """Everything that changes the answer, and nothing else: what a request key hashes, with
    the texts rendered from each row."""

    endpoint: str  # ResolvedEndpoint.identity
    model: str
    prompt: Template
    system: Template | None = None
    params: Mapping[str, Any] = field(default_factory=dict)  # set ones only
    schema: OutputSchema | None = None
    media: Media | None = None  # image and PDF columns, keyed by their bytes' sha256

    @classmethod
    def build(
        cls,
        *,
        endpoint: str,
        model: str,
        prompt: Template,
        system: Template | None = None,
        sampling: Sampling = Sampling(),
        schema: OutputSchema | None = None,
        media: Media | None = None,
    ) -> RequestSpec:
        """The spec of these parts, with the sampling parameters that are set."""
        params = dict(sampling.params)
        if schema is not None:
            # in the canonical request's spelling, which keys hash
            params.update(CANONICAL.structured_output(schema.name, schema.json_schema))
        return cls(
            endpoint=endpoint,
            model=model,
            prompt=prompt,
            system=system,
            params=params,
            schema=schema,
            media=media,
        )

    def with_model(self, model: str) -> RequestSpec:
        return dataclasses.replace(self, model=model)

    def request(
        self, system: str | None, prompt: str, media: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, Any]:
        """The request of one row, with its media's descriptors (see :mod:`llm_ops._media`);
        its canonical JSON is what is hashed."""
        parts = keyed_parts(media, self.media) if media and self.media else ()
        return build_request(
            endpoint=self.endpoint,
            model=self.model,
            messages=messages_for(system, prompt, parts),
            params=self.params,
        )

    def key(self, system: str | None, prompt: str, media: Sequence[Mapping[str, Any]] = ()) -> str:
        return request_key(self.request(system, prompt, media))

    def key_sql(self) -> tuple[str, list[str]]:
        """The DuckDB expression computing keys over columns ``system`` and ``prompt`` (and
        ``media_key``, with media)."""
        return key_sql(
            endpoint=self.endpoint,
            model=self.model,
            params=self.params,
            with_system=self.system is not None,
            with_media=self.media is not None,
        )


@dataclass(frozen=True)
class EmbeddingSpec:
    """What an embedding request key hashes besides the text: endpoint identity, model and the
    vector size asked for."""

    endpoint: str  # ResolvedEndpoint.identity
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
