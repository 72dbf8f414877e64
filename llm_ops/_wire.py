"""One HTTP exchange as the engine sees it: the request sent, the answer read, and what a
transport given to an endpoint (``Endpoint(transport=...)``, as httpx's ``transport=``) is."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class HttpRequest:
    """One HTTP request the engine sends: its method, URL (the query in it), headers (the
    dialect's and the endpoint's: the credentials among them), body (JSON, or ``None``), the
    seconds it may take in all, and the most bytes its answer's body may hold."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes | None
    timeout: float
    max_bytes: int


@dataclass(frozen=True)
class HttpAnswer:
    """An HTTP answer: its status, headers (case-insensitive) and body (inflated)."""

    status: int
    headers: Mapping[str, str]
    body: bytes


@runtime_checkable
class AsyncTransport(Protocol):
    """What ``Endpoint(transport=...)`` takes, as httpx's ``transport=``: an object that sends
    one :class:`HttpRequest` and gives back its :class:`HttpAnswer` (a status, headers that look
    names up in lower case, the body read), and closes what it holds when the client closes.

    A transport only sends: the engine decides the rest (retries, rate limits, concurrency,
    what an answer means), so a test can answer from memory, or a tracer wrap the default.
    :class:`OSError` raised is taken for a connection that could not be made and
    :class:`TimeoutError` for an answer that did not come in time: both are retried. A body
    larger than ``max_bytes`` fails its request."""

    async def handle_async_request(self, request: HttpRequest) -> HttpAnswer: ...

    async def aclose(self) -> None: ...
