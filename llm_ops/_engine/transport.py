"""The hot path's HTTP: one aiohttp session for a client's life, posting pre-encoded bodies.

The endpoint's dialect names the paths and headers; the ``openai`` SDK serves the paths that
are not hot (provider batches, files). Per request, its option transform and request and
response models cost more CPU than everything else a request needs; here a request is one
``session.request`` of bytes and one bounded read of bytes. An endpoint given a transport of
its own (``Endpoint(transport=)``) sends through it instead (:class:`Injected`).

Why aiohttp and not our own HTTP/1.1 (which this module was in December 2026, for 0.1 ms of
CPU a request): an HTTP parser is security surface. Ours turned a negative chunk size into an
``ok`` answer, failed a chunked answer whose last bytes came in a later read, and knew no
happy eyeballs. aiohttp's C parser (llhttp) frames answers as every server and proxy expects;
on real endpoints the server, not the client's CPU, is the limit (``benchmarks/RESULTS.md``).

What is ours, and why:

- **bounded reads**: a server (or anything between) can send a body of any size, or a small
  gzip body that inflates to gigabytes; one answer must never take the client's memory. We
  read the body in pieces and inflate it ourselves (``auto_decompress=False``), so the bound
  holds for the inflated bytes too;
- **proxies read from the environment as httpx reads them** (:func:`proxy_for`), once per
  client: aiohttp's ``trust_env`` reads the environment (and ``.netrc``) on a worker thread
  for every request, and takes neither a scheme-less proxy nor ``NO_PROXY=host:port``;
- **a reset on a reused keep-alive connection is sent again once, on a new connection**: the
  server may have closed the idle connection as the request left. aiohttp does that only for
  idempotent methods; a completion is a POST, but one whose connection broke before any byte
  of the answer was not answered (:class:`_Connector` tells a reused connection from a new
  one);
- **an answer is read only from a connection that sent nothing unasked**: a server (or a
  proxy) that writes an answer twice leaves the copy on the kept-alive connection, where
  aiohttp reads it as the answer to the next request sent on it, and every later answer on it
  one request late: another prompt's answer, ``ok``. A connection that holds bytes while idle
  is closed instead of reused (:class:`_Connector`); a copy that comes after the connection
  was taken is known by its bytes, those of an answer already read in the dispatch
  (:class:`RecentAnswers`): that connection is closed and the request sent again on a new one,
  where the first answer read is the answer to it. Not by the answer's ``id``: some servers
  (Ollama) repeat them.

Redirects are never followed, cookies never kept. aiohttp's exceptions become ours (a
:class:`~llm_ops._engine.boundary.TransportError`) at the one boundary,
:mod:`llm_ops._engine.boundary`.
"""

from __future__ import annotations

import functools
import ssl
import urllib.request
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Protocol

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from .._wire import AsyncTransport, HttpAnswer, HttpRequest
from ..exceptions import ConfigError
from .boundary import (
    AIOHTTP_FAILURES,
    BadBody,
    CouldNotConnect,
    TimedOut,
    TransportError,
    is_reset_before_answer,
    no_answer,
    proxy_refused,
    shown_proxy,
)

RECENT_ANSWERS = 2**14
"""Answers a dispatch remembers (by hash, 1.9 MiB) to know a copy of one. A copy that came while
its connection was idle closes it (see :class:`_Connector`); this is for one that comes after
the connection was taken, moments after its original: seconds of answers at thousands a
second."""
KEEPALIVE_SECONDS = 30.0  # an idle connection older than this is closed, not reused
DNS_SECONDS = 60  # a host's addresses are looked up again after this long
READ_CHUNK = 2**16
ACCEPT_ENCODING = "gzip, deflate"  # what we can inflate with a bound (see _Inflater)
PROXY_SCHEMES = ("http", "https")

_reused: ContextVar[bool] = ContextVar("llm_ops_reused_connection", default=False)
_protocol: ContextVar[aiohttp.client_proto.ResponseHandler | None] = ContextVar(
    "llm_ops_connection", default=None
)  # the request's connection: once its answer is read aiohttp holds it no more


class Sender(Protocol):
    """How the engine sends: :class:`Transport`, or an injected :class:`AsyncTransport`
    (through :class:`Injected`)."""

    async def request(
        self,
        method: str,
        url: URL,
        body: bytes | None,
        timeout: float,
        max_bytes: int,
        *,
        recent: RecentAnswers | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpAnswer: ...

    async def close(self) -> None: ...


class Injected:
    """An :class:`AsyncTransport` the endpoint was given, as the engine sends through it:
    every request with ``headers``. (Copies of answers on a reused connection are the
    transport's to care about: ``recent`` is not used.)"""

    def __init__(self, transport: AsyncTransport, headers: Mapping[str, str]):
        self.transport = transport
        self.headers = dict(headers)

    async def request(
        self,
        method: str,
        url: URL,
        body: bytes | None,
        timeout: float,
        max_bytes: int,
        *,
        recent: RecentAnswers | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpAnswer:
        sent = self.headers if headers is None else {**self.headers, **headers}
        request = HttpRequest(method, str(url), sent, body, timeout, max_bytes)
        try:
            answer = await self.transport.handle_async_request(request)
        except TransportError:
            raise
        except TimeoutError as exc:
            raise TimedOut(f"no answer within {timeout:g} s") from exc
        except OSError as exc:
            raise CouldNotConnect(str(exc) or type(exc).__name__) from exc
        if len(answer.body) > max_bytes:
            raise BadBody(_too_large(max_bytes))
        return answer

    async def close(self) -> None:
        await self.transport.aclose()


class RecentAnswers:
    """The bodies of the last ``size`` successful answers one dispatch read, by hash: an answer
    read again on a reused connection is a copy the server wrote twice, never the answer to the
    request that read it (see :meth:`Transport.request`).

    Only answers with an ``id`` are remembered: two requests of a dispatch are distinct, and
    answers that carry an id (and a time) are not byte for byte the same unless one is a copy;
    a server whose are (its ids repeat, as Ollama's may) has the second request sent again, on
    a new connection, whose answer is taken. Answers without one (a mock server's fixed reply)
    may well repeat, and are not taken for copies."""

    def __init__(self, size: int = RECENT_ANSWERS):
        self.size = size
        # in the order read, the oldest forgotten first: an OrderedDict pops its first in
        # O(1), where a dict scans the holes its deletions left (174 us an answer at 2**16)
        self._hashes: OrderedDict[int, None] = OrderedDict()

    @staticmethod
    def remembered(body: bytes) -> bool:
        """Whether ``body`` carries an ``id`` (a JSON string's quotes are escaped: only a key
        reads ``"id"``)."""
        return b'"id"' in body

    def __contains__(self, body: bytes) -> bool:
        return hash(body) in self._hashes

    def add(self, body: bytes) -> None:
        self._hashes[hash(body)] = None
        if len(self._hashes) > self.size:
            self._hashes.popitem(last=False)


class Transport:
    """One aiohttp session, made on first use on the running loop (a session belongs to one
    loop) and closed with :meth:`close`: a pool of at most ``limit`` keep-alive connections,
    ``headers`` on every request, TLS by ``tls``, through ``proxy`` (else the proxy the
    environment names for ``base_url``)."""

    def __init__(
        self,
        *,
        limit: int,
        headers: Mapping[str, str],
        base_url: str,
        tls: ssl.SSLContext | None = None,
        proxy: str | None = None,
    ):
        self.limit = limit
        # Given with each request, not as the session's defaults: aiohttp sends a session's
        # default headers to the proxy too (the API key in a CONNECT to it, as
        # Proxy-Authorization), where an https:// endpoint's key must never go.
        self.headers = CIMultiDict({**headers, "Accept-Encoding": ACCEPT_ENCODING})
        self.tls = tls
        self.proxy = URL(proxy) if proxy else proxy_for(URL(base_url))
        if self.proxy is not None and self.proxy.scheme not in PROXY_SCHEMES:
            raise ConfigError(
                f"the proxy {shown_proxy(self.proxy)} is not an http:// or https:// proxy, the "
                "kinds llm-ops speaks to; name another one (proxy= or HTTPS_PROXY)"
            )
        self._session: aiohttp.ClientSession | None = None
        # for a request sent again: each of its connections is new and closed after it
        self._new_connections: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self._make_session(keep_alive=True)
        return self._session

    def _open_new(self) -> aiohttp.ClientSession:
        if self._new_connections is None or self._new_connections.closed:
            self._new_connections = self._make_session(keep_alive=False)
        return self._new_connections

    def _make_session(self, *, keep_alive: bool) -> aiohttp.ClientSession:
        connector = _Connector(
            limit=self.limit,
            limit_per_host=0,
            keepalive_timeout=KEEPALIVE_SECONDS if keep_alive else None,
            force_close=not keep_alive,
            ttl_dns_cache=DNS_SECONDS,
            ssl=self.tls if self.tls is not None else True,
            # the system's resolver, on a thread: what every other client of the host uses
            resolver=aiohttp.ThreadedResolver(),
        )
        return aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent",),  # the dialect's is among ``headers``
        )

    async def get(self, url: URL, *, timeout: float, max_bytes: int) -> HttpAnswer:
        return await self.request("GET", url, None, timeout, max_bytes)

    async def request(
        self,
        method: str,
        url: URL,
        body: bytes | None,
        timeout: float,
        max_bytes: int,
        *,
        recent: RecentAnswers | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpAnswer:
        """One attempt: its answer, its body read to at most ``max_bytes`` (``headers``: sent
        besides the client's, for this request only). A reused
        connection that broke before any byte of the answer came, or whose answer was a copy
        of one of ``recent`` (the dispatch's answers so far, which this one joins), is
        replaced once, by a new connection."""
        try:
            answer = await self._exchange(
                self._open(), method, url, body, timeout, max_bytes, recent, headers
            )
            if answer is not None:
                return answer
        except AIOHTTP_FAILURES as exc:
            if not (_reused.get() and is_reset_before_answer(exc)):
                raise no_answer(exc, timeout, self.proxy) from exc
        try:  # on a new connection, the first answer read is the answer to this request
            answer = await self._exchange(
                self._open_new(), method, url, body, timeout, max_bytes, recent, headers
            )
        except AIOHTTP_FAILURES as exc:
            raise no_answer(exc, timeout, self.proxy) from exc
        assert answer is not None
        return answer

    async def _exchange(
        self,
        session: aiohttp.ClientSession,
        method: str,
        url: URL,
        body: bytes | None,
        timeout: float,
        max_bytes: int,
        recent: RecentAnswers | None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpAnswer | None:
        """The answer, or ``None`` when it was a copy of one of ``recent`` read on a reused
        connection (which is closed)."""
        _reused.set(False)
        _protocol.set(None)
        async with session.request(
            method,
            url,
            data=body,
            headers=self.headers if headers is None else CIMultiDict({**self.headers, **headers}),
            allow_redirects=False,
            proxy=self.proxy,
            timeout=_timeout(timeout),
        ) as response:
            if response.status == 407 and self.proxy is not None:
                raise proxy_refused(self.proxy, 407)
            read = await _read(response, max_bytes)
            if recent is not None and 200 <= response.status < 300 and recent.remembered(read):
                if _reused.get() and read in recent:
                    _close(_protocol.get())  # the answer to this request may be on its way
                    return None
                recent.add(read)
            return HttpAnswer(response.status, response.headers, read)

    async def close(self) -> None:
        for session in (self._session, self._new_connections):
            if session is not None:
                await session.close()
        self._session = self._new_connections = None


class _Connector(aiohttp.TCPConnector):
    """aiohttp's connector, telling the request (by :data:`_reused`) whether its connection
    served a request before, and never handing out an idle connection that holds bytes: no
    request asked for them, so they are no answer to the next one (a copy of an answer the
    server wrote twice, a 408 before it closes); aiohttp looks for them only as a connection
    is released, not as it is taken."""

    def __init__(self, **options: Any):
        super().__init__(**options)
        self._served: weakref.WeakSet[object] = weakref.WeakSet()

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Any], timeout: aiohttp.ClientTimeout
    ) -> aiohttp.connector.Connection:
        connection = await super().connect(req, traces, timeout)
        while connection.protocol in self._served and _holds_bytes(connection.protocol):
            connection.close()
            connection = await super().connect(req, traces, timeout)
        protocol = connection.protocol
        _reused.set(protocol in self._served)
        _protocol.set(protocol)
        if protocol is not None:
            self._served.add(protocol)
        return connection


def _close(protocol: aiohttp.client_proto.ResponseHandler | None) -> None:
    """Close a connection, in the pool by now (the answer was read to its end): it is no longer
    connected, so the pool hands it out no more."""
    if protocol is not None:
        protocol.close()


def _holds_bytes(protocol: aiohttp.client_proto.ResponseHandler | None) -> bool:
    """Whether an idle connection read bytes (or broke) since its last answer: aiohttp's own
    test of a connection not to keep (``should_close``), made as it is taken."""
    return protocol is not None and protocol.should_close


@functools.lru_cache(maxsize=8)  # the same one or two, for every request
def _timeout(seconds: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=seconds)


async def _read(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body, inflated, of at most ``max_bytes`` either way; :class:`BadBody` beyond."""
    length = response.content_length
    if length is not None and length > max_bytes:
        raise BadBody(_too_large(max_bytes, f"it announced {length:,}"))
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding in ("identity", "") and length is not None:
        return await response.read()  # the common case: exactly Content-Length bytes
    inflater = None if encoding in ("identity", "") else _Inflater(encoding, max_bytes)
    body = bytearray()
    read = 0
    while chunk := await response.content.read(READ_CHUNK):
        read += len(chunk)
        if read > max_bytes:
            raise BadBody(_too_large(max_bytes))
        body += chunk if inflater is None else inflater.inflate(chunk)
    return bytes(body)


class _Inflater:
    """gzip or deflate, inflated a chunk at a time to ``max_bytes`` in all.

    ``deflate`` is zlib-wrapped by the standard (RFC 9110), but some servers send it raw (no
    zlib header), as early IIS did; aiohttp and httpx read both, so we do: the first bytes
    tell which (see :meth:`_raw_deflate`)."""

    def __init__(self, encoding: str, max_bytes: int):
        if encoding in ("gzip", "x-gzip"):
            self.wbits = 16 + zlib.MAX_WBITS
        elif encoding == "deflate":
            self.wbits = zlib.MAX_WBITS
        else:
            raise BadBody(
                f"the answer is in Content-Encoding {encoding!r}, which was not asked for "
                f"(Accept-Encoding: {ACCEPT_ENCODING})"
            )
        self.encoding = encoding
        self.max_bytes = max_bytes
        self.room = max_bytes
        self._decoder = zlib.decompressobj(self.wbits)
        self._started = False  # whether deflate's first bytes have been read

    def inflate(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        data = chunk
        if self.encoding == "deflate" and not self._started and data:
            self._started = True
            if self._raw_deflate(data):
                self.wbits = -zlib.MAX_WBITS
                self._decoder = zlib.decompressobj(self.wbits)
        while data:
            try:
                # never more than one byte past the limit, however well the data compresses
                piece = self._decoder.decompress(data, self.room + 1)
            except zlib.error as exc:
                raise BadBody(f"the answer's {self.encoding} body is corrupt ({exc})") from exc
            self.room -= len(piece)
            if self.room < 0:
                raise BadBody(_too_large(self.max_bytes, "inflated"))
            out.append(piece)
            data = self._decoder.unconsumed_tail
            if self._decoder.eof and self._decoder.unused_data:  # another gzip member
                data = self._decoder.unused_data + data
                self._decoder = zlib.decompressobj(self.wbits)
        return b"".join(out)

    @staticmethod
    def _raw_deflate(first: bytes) -> bool:
        """Whether a deflate body starting with ``first`` lacks its zlib header (RFC 1950:
        method 8, a window of at most 32 KiB, the two bytes a multiple of 31), as aiohttp
        (the method) and httpx (whether zlib refuses the header) decide. Only a raw stream
        opening with an uncompressed, non-final block can pass for a header; it then fails
        as a corrupt body, as in both."""
        method, window = first[0] & 0x0F, first[0] >> 4
        if method != 8 or window > 7:
            return True
        return len(first) > 1 and (first[0] << 8 | first[1]) % 31 != 0


def _too_large(max_bytes: int, detail: str = "") -> str:
    suffix = f" ({detail})" if detail else ""
    return (
        f"response larger than {max_bytes:,} bytes{suffix}; not read to its end. Raise "
        "max_response_bytes if such answers are expected"
    )


def proxy_for(url: URL) -> URL | None:
    """The proxy the environment names for ``url``, as httpx reads it: ``HTTPS_PROXY`` or
    ``HTTP_PROXY`` by the URL's scheme, else ``ALL_PROXY`` (lower-case names first); a proxy
    without a scheme is an ``http://`` one; none where ``NO_PROXY`` names the host, the host
    and port, a parent domain, or is ``*``."""
    proxies = urllib.request.getproxies()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if not proxy or url.host is None:
        return None
    excluded = [name.strip() for name in proxies.get("no", "").split(",")]
    if "*" in excluded:
        return None
    host = f"[{url.host}]" if ":" in url.host else url.host
    if urllib.request.proxy_bypass(f"{host}:{url.port}"):  # NO_PROXY, by host or host:port
        return None
    try:
        return URL(proxy if "://" in proxy else f"http://{proxy}")
    except ValueError:
        raise ConfigError(
            "the proxy the environment names (HTTPS_PROXY, HTTP_PROXY or ALL_PROXY) is not a "
            "URL; write it like http://proxy.example:3128"
        ) from None
