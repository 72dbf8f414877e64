"""The hot path's HTTP: one aiohttp session for a client's life, posting pre-encoded bodies.

The ``openai`` SDK stays the source of configuration (base URL, auth and default headers) and
serves the paths that are not hot (provider batches, files). Per request, its option
transform, httpx-style request and response models and the httpx-to-aiohttp adapter cost
about 0.5 ms of CPU (see ``benchmarks/PROFILE.txt``), more than everything else a request
needs; here a request is one ``session.post`` of bytes and one read of bytes.

aiohttp's exceptions are mapped here, and only here, to three of ours, so the engine decides
retries without knowing the HTTP library:

- :class:`CouldNotConnect`: no connection was made (refused, unresolvable, connect timeout);
  nothing was sent, so retrying cannot duplicate work;
- :class:`TimedOut`: the attempt took longer than its timeout;
- :class:`ConnectionFailed`: the connection broke while sending or reading.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

KEEPALIVE_SECONDS = 30.0


class TransportError(Exception):
    """An attempt that got no HTTP answer."""


class CouldNotConnect(TransportError):
    """No connection could be made; nothing was sent."""


class TimedOut(TransportError):
    """The attempt took longer than its timeout."""


class ConnectionFailed(TransportError):
    """The connection broke while the request was sent or the answer read."""


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
        self.proxy = proxy_for(URL(base_url))
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.limit, limit_per_host=0, keepalive_timeout=KEEPALIVE_SECONDS
            )
            self._session = aiohttp.ClientSession(connector=connector, headers=self.headers)
        return self._session

    async def post(self, url: URL, body: bytes, *, timeout: float) -> Answer:
        return await self._request("POST", url, body, timeout)

    async def get(self, url: URL, *, timeout: float) -> Answer:
        return await self._request("GET", url, None, timeout)

    async def _request(self, method: str, url: URL, body: bytes | None, timeout: float) -> Answer:
        session = self._open()
        try:
            async with session.request(
                method,
                url,
                data=body,
                allow_redirects=False,
                proxy=self.proxy,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                payload = await response.read()
                headers: CIMultiDictProxy[str] = response.headers
                return Answer(response.status, headers, payload)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise CouldNotConnect(_describe(exc)) from exc
        except TimeoutError as exc:
            raise TimedOut(f"timed out after {timeout:g}s") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise ConnectionFailed(_describe(exc)) from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def proxy_for(url: URL) -> URL | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``, ``NO_PROXY``, ...), read
    once: aiohttp's ``trust_env`` reads the environment and ``.netrc`` on a worker thread for
    every request, which cost more CPU than the rest of the request."""
    if url.host is None or urllib.request.proxy_bypass(url.host):
        return None
    proxy = urllib.request.getproxies().get(url.scheme)
    return URL(proxy) if proxy else None


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
