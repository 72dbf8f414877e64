"""The hot path's HTTP: one aiohttp session for a client's life, posting pre-encoded bodies.

The ``openai`` SDK stays the source of configuration (base URL, auth and default headers) and
serves the paths that are not hot (provider batches, files). Per request, its option
transform, httpx-style request and response models and the httpx-to-aiohttp adapter cost
about 0.5 ms of CPU (see ``benchmarks/PROFILE.txt``), more than everything else a request
needs; here a request is one ``session.post`` of bytes and one read of bytes.

aiohttp's exceptions become ours (a :class:`~llm_ops._engine.boundary.TransportError`) at the one
boundary, :mod:`llm_ops._engine.boundary`, so the engine decides retries without knowing the HTTP
library.

Bodies are read with a bound: a server (or anything between) can send a body of any size, or a
small gzip body that inflates to gigabytes, and one answer must never take the client's memory.
We decompress ourselves, a chunk at a time, so the bound holds for the inflated bytes too.
"""

from __future__ import annotations

import functools
import urllib.request
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from .boundary import AIOHTTP_FAILURES, BadBody, no_answer

KEEPALIVE_SECONDS = 30.0
READ_CHUNK = 2**16
ACCEPT_ENCODING = "gzip, deflate"  # what we can inflate with a bound (see _Inflater)


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: its status, headers (case-insensitive) and body."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class Transport:
    """A connection pool of ``limit`` connections, made on first use on the running loop
    (aiohttp sessions belong to one loop) and closed with :meth:`close`."""

    def __init__(self, *, limit: int, headers: Mapping[str, str], base_url: str):
        self.limit = limit
        self.headers = CIMultiDict(headers)
        self.headers["Accept-Encoding"] = ACCEPT_ENCODING
        self.proxy = proxy_for(URL(base_url))
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.limit, limit_per_host=0, keepalive_timeout=KEEPALIVE_SECONDS
            )
            self._session = aiohttp.ClientSession(
                connector=connector, headers=self.headers, auto_decompress=False
            )
        return self._session

    async def get(self, url: URL, *, timeout: float, max_bytes: int) -> Answer:
        return await self.request("GET", url, None, timeout, max_bytes)

    async def request(
        self, method: str, url: URL, body: bytes | None, timeout: float, max_bytes: int
    ) -> Answer:
        """One attempt: its answer, its body read to at most ``max_bytes``."""
        session = self._open()
        try:
            async with session.request(
                method,
                url,
                data=body,
                allow_redirects=False,
                proxy=self.proxy,
                timeout=_timeout(timeout),
            ) as response:
                headers: CIMultiDictProxy[str] = response.headers
                payload = await _read(response, max_bytes)
                return Answer(response.status, headers, payload)
        except AIOHTTP_FAILURES as exc:
            raise no_answer(exc, timeout) from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


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
        return await response.read()  # the common case: aiohttp reads exactly Content-Length
    inflater = None if encoding in ("identity", "") else _Inflater(encoding, max_bytes)
    parts: list[bytes] = []
    read = 0
    async for chunk in response.content.iter_chunked(READ_CHUNK):
        read += len(chunk)
        if read > max_bytes:
            raise BadBody(_too_large(max_bytes))
        parts.append(chunk if inflater is None else inflater.inflate(chunk))
    return b"".join(parts)


class _Inflater:
    """gzip or (zlib-wrapped) deflate, inflated a chunk at a time to ``max_bytes`` in all."""

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


def proxy_for(url: URL) -> URL | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``, ``NO_PROXY``, ...), read
    once: aiohttp's ``trust_env`` reads the environment and ``.netrc`` on a worker thread for
    every request, which cost more CPU than the rest of the request."""
    if url.host is None or urllib.request.proxy_bypass(url.host):
        return None
    proxy = urllib.request.getproxies().get(url.scheme)
    return URL(proxy) if proxy else None
