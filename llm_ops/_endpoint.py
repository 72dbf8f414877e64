"""An endpoint as requests use it: :class:`ResolvedEndpoint` (the URL, from the environment when
none is given, and the credentials in effect; its :attr:`~ResolvedEndpoint.identity` is what
keys see) and :class:`Connection` (headers of one's own, TLS, a proxy, an injected transport),
never part of a key. :class:`~llm_ops.Endpoint`, the option a user writes, is in
:mod:`llm_ops._config` and resolves into these. No ``repr`` shows a secret.

Which API dialect an endpoint speaks is picked here too (:func:`dialect_for`):
``Endpoint(provider=...)`` names one of :data:`DIALECTS` (``"openai"``, the default), or is a
:class:`~llm_ops._dialects.Dialect` object (a test's, or a provider llm-ops does not ship).
Without one, the endpoint's host names it where it is a provider's own (:data:`HOSTS`), else it
is ``"openai"``: what most servers and gateways speak.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx2

from ._dialects import GEMINI, OPENAI, Dialect
from ._key import normalize_base_url
from ._wire import AsyncTransport
from .exceptions import ConfigError, MissingApiKeyError, setting, setting_to

DEFAULT_BASE_URL = "https://api.openai.com/v1"

DEFAULT = "openai"
DIALECTS: dict[str, Dialect] = {"openai": OPENAI, "gemini": GEMINI}
"""The dialects llm-ops ships, by the name ``provider=`` gives them."""
HOSTS: dict[str, str] = {
    "api.openai.com": "openai",
    "generativelanguage.googleapis.com": "gemini",
}
"""Hosts whose provider is known: their API's dialect is picked without ``provider=``. (Room
for ``api.anthropic.com`` once its dialect is written.)"""
HOMES: dict[str, str] = {"gemini": "https://generativelanguage.googleapis.com/v1beta"}
"""Where a provider's API is, as its SDK takes the base URL: an endpoint naming only
``provider=`` goes there (not to ``OPENAI_BASE_URL``)."""
KEY_VARIABLES: dict[str, tuple[str, ...]] = {"gemini": ("GOOGLE_API_KEY", "GEMINI_API_KEY")}
"""The environment variables a dialect's key is read from without ``api_key=``, in the order
the provider's SDK reads them; OpenAI's (and any other dialect's) is ``OPENAI_API_KEY``. An
OpenAI key is never sent to another provider."""


def dialect_for(provider: object, base_url: str | None = None) -> Dialect:
    """The dialect ``provider`` names or is; ``None``: the one ``base_url``'s host is known to
    speak, else OpenAI's. :class:`ConfigError` for a name no dialect has, or an object that
    is not one."""
    if provider is None:
        host = (urlsplit(base_url).hostname or "") if base_url else ""
        return DIALECTS[HOSTS.get(host.lower(), DEFAULT)]
    if isinstance(provider, str):
        if provider not in DIALECTS:
            known = ", ".join(repr(name) for name in sorted(DIALECTS))
            raise ConfigError(
                f"provider {provider!r} is not a dialect llm-ops speaks; it knows {known}, or "
                "pass a Dialect object"
            )
        return DIALECTS[provider]
    if not isinstance(provider, Dialect):
        raise ConfigError(
            "provider takes a provider's name such as 'openai', or a Dialect object, got "
            f"{type(provider).__name__}"
        )
    return provider


# An endpoint's own name in keys; never mistaken for a URL (no ':' or '/').
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


NO_KEY = "no-key-needed"  # what a loopback endpoint without a key is sent


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
        """``base_url``/``api_key``, else ``OPENAI_BASE_URL``/``OPENAI_API_KEY``, else OpenAI;
        for a provider of :data:`HOMES`, its own URL and :data:`KEY_VARIABLES` instead.
        Credentials in the URL are refused; a loopback endpoint needs no key, nor one whose
        credentials go in headers of the caller's (``keyed_by_headers``: then, without a key,
        no ``Authorization`` header is sent)."""
        if name is not None and not (isinstance(name, str) and _NAME.fullmatch(name)):
            raise ConfigError(
                "an endpoint's name must be a name of letters, digits, '.', '_' and '-' "
                f"(at most 100), like 'vllm-prod'; got {name!r}"
            )
        home = HOMES.get(provider) if isinstance(provider, str) else None
        url = base_url or home or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
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
        dialect = dialect_for(provider, endpoint.base_url)
        variables = KEY_VARIABLES.get(dialect.name, ("OPENAI_API_KEY",))
        key = api_key or next(filter(None, map(os.environ.get, variables)), None)
        if key:
            _check_api_key(key)
        elif keyed_by_headers:
            key = ""
        elif endpoint.local or not need_key:
            key = NO_KEY
        else:
            raise MissingApiKeyError(
                f"no API key for {endpoint.shown}: pass {setting_to('api_key')} or set "
                f"{' or '.join(variables)}, or send the credentials in "
                f"{setting_to('headers')} (e.g. Azure's api-key header); a local endpoint on "
                "127.0.0.1 needs none"
            )
        return dataclasses.replace(endpoint, api_key=key, dialect=dialect)


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


AUTHENTICATING = frozenset(("authorization", "api-key", "x-api-key", "x-goog-api-key"))
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
