"""The hot path's HTTP: HTTP/1.1 on asyncio's own sockets, a pool of keep-alive connections.

The ``openai`` SDK stays the source of configuration (base URL, auth and default headers) and
serves the paths that are not hot (provider batches, files). A request here is one write of
bytes, its head built once per URL, and one read of bytes.

Why not aiohttp, which this module used until December 2026: at 1,024 requests in flight its
client session cost 0.14 ms of CPU per request (0.07 at 64): URL and header objects, cookie
jar, tracing, timers and the connector's bookkeeping for every request. This module costs
0.03 ms for the same requests against the same server (see ``benchmarks/RESULTS.md``,
latency-bound). On a machine whose cores are shared with the endpoint, or busy merging
answers into the cache, that CPU is the difference between reaching C / latency and not.

What it speaks, and no more: requests with a ``Content-Length`` body (or none); answers
framed by ``Content-Length``, chunked, or by the server closing the connection; informational
(1xx) answers skipped; connections kept alive unless the server says ``Connection: close``;
TLS through :mod:`ssl`; the proxy the environment names (absolute-form requests to it for
``http://``, a ``CONNECT`` tunnel for ``https://``). It follows no redirect (the dispatcher
refuses them), keeps no cookies and speaks no HTTP/2.

Bodies are read with a bound: a server (or anything between) can send a body of any size, or
a small gzip body that inflates to gigabytes, and one answer must never take the client's
memory. We decompress ourselves, so the bound holds for the inflated bytes too. What the
operating system raises becomes ours (a :class:`~llm_ops._engine.boundary.TransportError`) at
the one boundary, :mod:`llm_ops._engine.boundary`.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
import ssl
import urllib.request
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

from yarl import URL

from ..exceptions import ConfigError
from .boundary import BadBody, ConnectionFailed, CouldNotConnect, TimedOut, no_answer, refused

KEEPALIVE_SECONDS = 30.0  # an idle connection older than this is closed, not reused
DNS_SECONDS = 60.0  # a host's addresses are looked up again after this long
MAX_HEAD_BYTES = 64 * 1024  # status line and headers of one answer
ACCEPT_ENCODING = "gzip, deflate"  # what we can inflate with a bound (see _Inflater)
_NO_BODY = frozenset((204, 304))


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: its status, headers (names in lower case; repeated ones joined with
    ``", "``) and body (inflated)."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class Transport:
    """Connection pools (one per origin: scheme, host and port), made on first use on the
    running loop and closed with :meth:`close`; at most ``limit`` idle connections are kept
    per origin. ``headers`` go with every request."""

    def __init__(
        self,
        *,
        limit: int,
        headers: Mapping[str, str],
        base_url: str,
        tls: Callable[[], ssl.SSLContext] = ssl.create_default_context,
    ):
        self.limit = limit
        fields = {**headers, "Accept-Encoding": ACCEPT_ENCODING}
        for name, value in fields.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ConfigError(f"the header {name!r} holds a line break; remove it")
            if not f"{name}{value}".isascii():
                raise ConfigError(f"the header {name!r} holds characters HTTP cannot carry")
        self._fields = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
        self.proxy = proxy_for(URL(base_url))
        if self.proxy is not None and self.proxy.scheme != "http":
            raise ConfigError(
                f"the proxy {self.proxy.with_user(None)} that the environment names is not an "
                "http:// proxy, the only kind llm-ops speaks to"
            )
        self._tls = tls
        self._pools: dict[tuple[str, str, int], _Pool] = {}
        self._heads: dict[tuple[str, URL], tuple[_Pool, bytes]] = {}

    async def get(self, url: URL, *, timeout: float, max_bytes: int) -> Answer:
        return await self.request("GET", url, None, timeout, max_bytes)

    async def request(
        self, method: str, url: URL, body: bytes | None, timeout: float, max_bytes: int
    ) -> Answer:
        """One attempt: its answer, its body read to at most ``max_bytes``."""
        pool, head = self._route(method, url)
        message = head if body is None else b"%b%d\r\n\r\n%b" % (head, len(body), body)
        connection = None
        try:
            async with asyncio.timeout(timeout):
                connection = await pool.connection()
                answer = await connection.exchange(message, max_bytes)
        except TimeoutError as exc:
            if connection is None:
                raise CouldNotConnect(f"no connection within {timeout:g}s") from exc
            raise TimedOut(f"timed out after {timeout:g}s") from exc
        except OSError as exc:
            raise no_answer(exc) from exc
        finally:
            if connection is not None:
                pool.release(connection)
        encoding = answer.headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity"):
            inflated = _Inflater(encoding, max_bytes).inflate(answer.body)
            return Answer(answer.status, answer.headers, inflated)
        return answer

    def _route(self, method: str, url: URL) -> tuple[_Pool, bytes]:
        """The pool for ``url``'s origin and the request's head, up to a body's length."""
        known = self._heads.get((method, url))
        if known is not None:
            return known
        if url.scheme not in ("http", "https") or not url.raw_host:
            raise ValueError(f"cannot send to {url}: only http:// and https:// URLs are served")
        port = url.port or (443 if url.scheme == "https" else 80)
        origin = (url.scheme, url.raw_host, port)
        pool = self._pools.get(origin)
        if pool is None:
            pool = self._pools[origin] = _Pool(
                origin, limit=self.limit, proxy=self.proxy, tls=self._tls
            )
        direct = self.proxy is None or url.scheme == "https"  # https: through a tunnel
        target = url.raw_path_qs if direct else str(url.with_user(None).with_fragment(None))
        fields = self._fields if direct else self._fields + _proxy_auth(self.proxy)
        head = f"{method} {target} HTTP/1.1\r\nHost: {_host_field(url, port)}\r\n{fields}"
        head += "\r\n" if method == "GET" else "Content-Length: "
        self._heads[(method, url)] = route = (pool, head.encode("ascii"))
        return route

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self._heads.clear()
        await asyncio.sleep(0)  # the transports finish closing before the loop may end


class _Pool:
    """The keep-alive connections to one origin; a connection is either lent out or idle."""

    def __init__(
        self,
        origin: tuple[str, str, int],
        *,
        limit: int,
        proxy: URL | None,
        tls: Callable[[], ssl.SSLContext],
    ):
        self.scheme, self.host, self.port = origin
        self.limit = limit
        self.proxy = proxy
        self.tls = tls
        self.idle: list[_Connection] = []
        self._addresses: list[tuple[str, int]] = []
        self._resolved_at = -DNS_SECONDS
        self._resolving: asyncio.Future[list[tuple[str, int]]] | None = None

    async def connection(self) -> _Connection:
        """The most recently used idle connection that is still open, else a new one
        (:class:`CouldNotConnect` if none can be made)."""
        now = asyncio.get_running_loop().time()
        while self.idle:
            connection = self.idle.pop()
            if connection.open and now - connection.idle_since < KEEPALIVE_SECONDS:
                return connection
            connection.close()
        try:
            return await self._connect()
        except OSError as exc:  # refused, unresolvable, TLS failed, the proxy said no
            raise refused(exc) from exc

    def release(self, connection: _Connection) -> None:
        if connection.reusable and connection.open and len(self.idle) < self.limit:
            connection.idle_since = asyncio.get_running_loop().time()
            self.idle.append(connection)
        else:
            connection.close()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        via = self.proxy
        host, port = (self.host, self.port) if via is None else (via.host or "", via.port or 80)
        tls = self.tls() if self.scheme == "https" else None
        direct_tls = tls if via is None else None
        last = OSError(f"{host} has no address")
        for address in await self._resolve(host, port):
            try:
                transport, connection = await loop.create_connection(
                    _Connection,
                    *address,
                    ssl=direct_tls,
                    server_hostname=self.host if direct_tls else None,
                )
                break
            except OSError as exc:
                last = exc
        else:
            raise last
        if tls is not None and via is not None:
            try:
                await connection.tunnel(self.host, self.port, _proxy_auth(via))
                tunnelled = await loop.start_tls(
                    transport, connection, tls, server_hostname=self.host
                )
            except BaseException:  # a refusal, a failed handshake, the attempt's timeout
                connection.close()
                raise
            if tunnelled is None:
                raise ConnectionResetError(f"{self.host} closed the connection during TLS")
            connection.transport = tunnelled
        return connection

    async def _resolve(self, host: str, port: int) -> list[tuple[str, int]]:
        """``host``'s addresses, looked up once a :data:`DNS_SECONDS` for all connections
        opened meanwhile: a thousand connections at a job's start are one lookup."""
        if _is_address(host):
            return [(host, port)]
        loop = asyncio.get_running_loop()
        if self._addresses and loop.time() - self._resolved_at < DNS_SECONDS:
            return self._addresses
        if self._resolving is None or self._resolving.done():
            self._resolving = asyncio.ensure_future(self._look_up(host, port))
        return await asyncio.shield(self._resolving)

    async def _look_up(self, host: str, port: int) -> list[tuple[str, int]]:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        self._addresses = [(str(info[4][0]), int(info[4][1])) for info in infos]
        self._resolved_at = loop.time()
        return self._addresses

    def close(self) -> None:
        for connection in self.idle:
            connection.close()
        self.idle.clear()


class _Connection(asyncio.Protocol):
    """One connection: it sends a request and parses the answer as bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.open = False
        self.reusable = True
        self.idle_since = 0.0
        self._buffer = bytearray()
        self._answer: asyncio.Future[Answer] | None = None
        self._max_bytes = 0
        self._connect = False  # the answer to a CONNECT: a 2xx has no body
        self._status = 0
        self._headers: dict[str, str] = {}
        self._framing: str | None = None  # None (the head), "length", "chunked" or "close"
        self._length = 0
        self._chunks: list[bytes] = []
        self._received = 0

    # -- asyncio's side -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.open = True

    def data_received(self, data: bytes) -> None:
        if self._answer is None or self._answer.done():
            self.reusable = False  # bytes nobody asked for: this connection is out of step
            self.close()
            return
        self._buffer += data
        try:
            self._parse()
        except (BadBody, ConnectionFailed) as exc:
            self._fail(exc)

    def eof_received(self) -> bool | None:
        if self._framing == "close" and self._answer is not None and not self._answer.done():
            self._done(bytes(self._buffer))
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self._answer is not None and not self._answer.done():
            if self._framing == "close" and exc is None:
                self._done(bytes(self._buffer))
                return
            where = "before answering" if self._status == 0 else "in the middle of its answer"
            problem = ConnectionResetError(f"the server closed the connection {where}")
            if exc is not None:
                problem.__cause__ = exc
            self._answer.set_exception(problem)

    # -- our side -----------------------------------------------------------------------------

    async def exchange(self, message: bytes, max_bytes: int) -> Answer:
        """Send ``message`` and return the answer; on any failure the connection is closed."""
        self._answer = asyncio.get_running_loop().create_future()
        self._max_bytes = max_bytes
        self._status, self._headers, self._framing = 0, {}, None
        self.reusable = False  # until the answer is read to its end
        assert self.transport is not None
        self.transport.write(message)
        try:
            return await self._answer
        finally:
            if not self.reusable:
                self.close()

    async def tunnel(self, host: str, port: int, auth: str) -> None:
        """Ask the proxy for a tunnel to ``host:port`` (``CONNECT``), for TLS through it."""
        self._connect = True
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        request = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{auth}\r\n"
        answer = await self.exchange(request.encode("ascii"), MAX_HEAD_BYTES)
        self._connect = False
        if not 200 <= answer.status < 300:
            raise ConnectionRefusedError(
                f"the proxy refused a tunnel to {host}:{port} (HTTP {answer.status})"
            )

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: BadBody | ConnectionFailed) -> None:
        self.reusable = False
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(exc)
        self.close()

    def _done(self, body: bytes) -> None:
        assert self._answer is not None
        self.reusable = self.reusable and not self._buffer
        # an idle connection holds nothing of its last answer (a bytearray keeps its size)
        self._buffer, self._chunks = bytearray(), []
        self._answer.set_result(Answer(self._status, self._headers, body))

    # -- parsing ------------------------------------------------------------------------------

    def _parse(self) -> None:
        while self._framing is None:
            if not self._parse_head():
                return
        if self._framing == "length":
            if len(self._buffer) >= self._length:
                body = bytes(self._buffer[: self._length])
                del self._buffer[: self._length]
                self._done(body)
        elif self._framing == "chunked":
            self._parse_chunks()
        elif len(self._buffer) > self._max_bytes:  # "close": the body ends with the connection
            raise BadBody(_too_large(self._max_bytes))

    def _parse_head(self) -> bool:
        """Read the status line and headers, if all arrived; whether they did (an
        informational answer is read past, and leaves the head to read again)."""
        buffer = self._buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                raise ConnectionFailed(f"the answer's head is longer than {MAX_HEAD_BYTES:,} bytes")
            return False
        lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
        del buffer[: end + 4]
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit() or rest[3:4] not in ("", " "):
            raise ConnectionFailed(f"not an HTTP answer: {lines[0][:80]!r}")
        status = int(code)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name[-1] in " \t":
                raise ConnectionFailed(f"a malformed header line: {line[:80]!r}")
            name, value = name.lower(), value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        if 100 <= status < 200:
            return True  # 100 Continue, 103 Early Hints: the answer follows
        self._status, self._headers = status, headers
        keep = headers.get("connection", "").lower()
        self.reusable = "close" not in keep and (version != "HTTP/1.0" or "keep-alive" in keep)
        if status in _NO_BODY or (self._connect and 200 <= status < 300):
            self._framing, self._length = "length", 0
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._framing, self._chunks, self._received, self._length = "chunked", [], 0, -1
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                raise ConnectionFailed(f"a malformed Content-Length: {length[:40]!r}")
            self._framing, self._length = "length", int(length)
            if self._length > self._max_bytes:
                raise BadBody(_too_large(self._max_bytes, f"it announced {self._length:,}"))
        else:
            self._framing, self.reusable = "close", False
        return True

    def _parse_chunks(self) -> None:
        """Chunks as they arrive: ``size CRLF data CRLF``, ending with a zero size and
        (ignored) trailers."""
        buffer = self._buffer
        while True:
            if self._length < 0:  # the next chunk's size line
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD_BYTES:
                        raise ConnectionFailed("a chunk size line that does not end")
                    return
                size = bytes(buffer[:end]).split(b";", 1)[0].strip()
                try:
                    self._length = int(size, 16)
                except ValueError:
                    raise ConnectionFailed(f"a malformed chunk size: {size[:20]!r}") from None
                del buffer[: end + 2]
                if self._length == 0:
                    self._length = -2  # the trailers, up to an empty line
            if self._length == -2:
                if buffer.startswith(b"\r\n"):
                    del buffer[:2]
                    self._done(b"".join(self._chunks))
                    return
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                del buffer[: end + 4]
                self._done(b"".join(self._chunks))
                return
            if len(buffer) < self._length + 2:
                if self._received + len(buffer) > self._max_bytes:
                    raise BadBody(_too_large(self._max_bytes))
                return
            self._received += self._length
            if self._received > self._max_bytes:
                raise BadBody(_too_large(self._max_bytes))
            self._chunks.append(bytes(buffer[: self._length]))
            del buffer[: self._length + 2]
            self._length = -1


class _Inflater:
    """gzip or (zlib-wrapped) deflate, inflated to ``max_bytes`` in all."""

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

    def inflate(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        data = chunk
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


def _too_large(max_bytes: int, detail: str = "") -> str:
    suffix = f" ({detail})" if detail else ""
    return (
        f"response larger than {max_bytes:,} bytes{suffix}; not read to its end. Raise "
        "max_response_bytes if such answers are expected"
    )


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _host_field(url: URL, port: int) -> str:
    host = url.raw_host or ""
    host = f"[{host}]" if ":" in host else host
    return host if port == (443 if url.scheme == "https" else 80) else f"{host}:{port}"


def _proxy_auth(proxy: URL | None) -> str:
    """The ``Proxy-Authorization`` header line for a proxy URL with credentials, else ''."""
    if proxy is None or proxy.user is None:
        return ""
    token = base64.b64encode(f"{proxy.user}:{proxy.password or ''}".encode()).decode()
    return f"Proxy-Authorization: Basic {token}\r\n"


def proxy_for(url: URL) -> URL | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``, ``NO_PROXY``, ...), read
    once per client."""
    if url.host is None or urllib.request.proxy_bypass(url.host):
        return None
    proxy = urllib.request.getproxies().get(url.scheme)
    return URL(proxy) if proxy else None
