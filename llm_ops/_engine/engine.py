"""The engine: one client's connection to its endpoint, and what it learned about it.

The dispatch engine is three modules: this one (the :class:`Engine`, which dispatches borrow),
:mod:`llm_ops._engine.dispatcher` (workers, retries, one attempt) and
:mod:`llm_ops._engine.answers` (what an answer says).

The endpoint's dialect (:mod:`llm_ops._dialects`) says what is sent where and with which
headers. On the hot path each request's JSON body is serialised once with ``orjson`` and
posted on one long-lived pool of keep-alive connections (:mod:`llm_ops._engine.transport`, or
the transport the endpoint was given), and only the fields used are read from the answer: the
``openai`` SDK's per-call option transform, request and response models cost more CPU per
request than everything else together (see ``benchmarks/``), which on a 2-core machine is the
difference between CPU-bound and latency-bound at high concurrency. The SDK serves the paths
that are not hot (provider batches, files), made on first use.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar, cast
from urllib.parse import urlencode

import openai
import orjson
from yarl import URL

from .._concurrency import Concurrency
from .._config import Limits
from .._dialects import MalformedAnswer
from .._endpoint import NO_KEY, Connection, ResolvedEndpoint
from .._limits import Limiter, RateLimiter
from ..exceptions import ConfigError, setting_to
from .answers import duration
from .boundary import TransportError, describe, redact, redact_in_logs
from .transport import Injected, Sender, Transport

T = TypeVar("T")

CONNECT_FAILURES_TO_ABORT = 16  # attempts in a row that could not connect, once connected
LONG_WAITS_TO_ABORT = 8  # answers in a row asking for a wait over max_retry_after
ANNOUNCED_PAUSE = 5.0  # seconds of Retry-After from which a pause is logged
PROBE_SECONDS = 5.0  # at most, for a question about the endpoint that has a fallback

_log = logging.getLogger("llm_ops")


class Engine:
    """The transport of one client, for its whole life: the connection pool, the rate limiter,
    the adaptive concurrency and what was learned about the endpoint (its limits, whether it
    can be reached). It lives on the event loop it is made on (the client's); dispatches
    borrow it, those on another loop through :meth:`hosted`.

    Its endpoint's dialect names its paths and headers; requests go through
    :class:`~llm_ops._engine.transport.Transport`, one pool of keep-alive connections for the
    engine's life, or through the transport the endpoint was given.
    """

    def __init__(
        self,
        endpoint: ResolvedEndpoint,
        limits: Limits,
        limiter: Limiter | None = None,
        connection: Connection | None = None,
    ):
        self.limits = limits
        # Its pool, limiter, concurrency and events work on this loop only (see hosted).
        self.loop = asyncio.get_running_loop()
        self.endpoint = endpoint.shown
        self.connection = connection = connection or Connection()
        self.concurrency = Concurrency(limits.most_in_flight, given=limits.concurrency is not None)
        self.limiter: Limiter = limiter or RateLimiter(rpm=limits.rpm, tpm=limits.tpm)
        self.secrets = (endpoint.api_key, *endpoint.query.values(), *connection.secrets)
        # Until one request got through, requests go one at a time (first_request).
        self.connected = asyncio.Event()
        self.alone = asyncio.Lock()
        self.connect_failures = 0  # attempts in a row that could not connect
        self.long_waits = 0  # answers in a row that asked for a wait over max_retry_after
        # Models that refused max_tokens for max_completion_tokens (OpenAI's reasoning models):
        # asked with the latter from then on, rather than refused row after row.
        self.max_completion_tokens_models: set[str] = set()
        self._announced_until = 0.0  # the end of the last pause logged
        self._listed: frozenset[str] | None = None  # the models the endpoint lists
        self._listing = asyncio.Lock()
        self.dialect = endpoint.dialect
        self.api_key = endpoint.api_key
        # as the SDK spells a base URL: with a trailing slash
        self.base_url = endpoint.base_url.rstrip("/") + "/"
        self._query = "?" + urlencode(endpoint.query) if endpoint.query else ""
        redact_in_logs((*endpoint.query.values(), *connection.secrets))
        headers = {**self.dialect.headers(endpoint.api_key), **connection.headers}
        self.http: Sender = (
            Injected(connection.transport, headers)
            if connection.transport is not None
            else Transport(
                base_url=self.base_url,
                limit=limits.most_in_flight,
                headers=headers,
                tls=connection.tls(),
                proxy=connection.proxy,
            )
        )

    @functools.cached_property
    def sdk(self) -> openai.AsyncOpenAI:
        """The SDK's client for provider batches and files, its own retries off (retrying is
        the caller's). Made on first use: its HTTP client loads TLS certificates and imports
        httpcore2, 70 ms of a job's start on a fresh process, which a job that sends only
        completions never needs. Without a key, the credentials are in the caller's headers:
        the SDK, which insists on a key, is given a placeholder and told (by its Omit) to send
        no Authorization of its own."""
        keyless = {} if self.api_key else {"Authorization": cast(str, openai.Omit())}
        return openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=self.api_key or NO_KEY,
            max_retries=0,
            timeout=self.limits.timeout,
            default_headers={**keyless, **self.connection.headers},
            http_client=openai.DefaultAioHttpClient(
                timeout=self.limits.timeout,
                verify=self.connection.tls(),
                proxy=self.connection.proxy,
            ),
        )

    def hosted(self, work: Coroutine[Any, Any, T]) -> Awaitable[T]:
        """``work`` (anything touching the pool, the limiter, the concurrency or the SDK), to
        await on any event loop: as it is on the engine's own loop, else run on the engine's
        loop (the ``llm`` expressions run on the thread Polars calls them on, with a loop of
        their own, and borrow their client's engine so). Cancelling the wait cancels it."""
        if self.loop is asyncio.get_running_loop():
            return work
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop))

    def url(self, path: str) -> URL:
        return join_url(self.base_url, path, self._query)

    async def first_request(self, send: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """``send()`` while no request got through yet: one at a time, each until it is
        answered, so a wrong key, an empty quota or an unreachable endpoint costs one request,
        not a wave of them, however slowly the endpoint answers. (Guessing from how fast
        ``/models`` answered when a refusal would be back let a wave go on a slow server.)"""
        async with self.alone:
            if not self.connected.is_set():
                return await send()
        return await send()

    async def check_models(self, models: Iterable[str]) -> None:
        """Raise :class:`ConfigError` for a model the endpoint does not list (``/models``),
        before anything is sent. An endpoint that lists none, or cannot say, is trusted."""
        async with self._listing:
            if self._listed is None:
                self._listed = await self._list_models()
        listed = self._listed
        if not listed or any("*" in name for name in listed):  # a gateway's wildcard route
            return
        for model in models:
            if model not in listed:
                closest = difflib.get_close_matches(model, sorted(listed), n=3, cutoff=0.5)
                names = sorted(listed)
                hint = (
                    f"did you mean {' or '.join(map(repr, closest))}?"
                    if closest
                    else f"it serves {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}"
                )
                raise ConfigError(
                    f"model {model!r} is not among the models {self.endpoint} lists; {hint}"
                )

    async def _list_models(self) -> frozenset[str]:
        path = self.dialect.models_path
        status, listed = await self._models_at(self.url(path))
        if status == 404 and not URL(self.base_url).path.rstrip("/").endswith("/v1"):
            with_v1 = join_url(self.base_url, f"v1/{path}", self._query)
            if (await self._models_at(with_v1))[0] == 200:
                shown = self.endpoint.rstrip("/") + "/v1"
                raise ConfigError(
                    f"{self.endpoint} answers 404 for /models, but {shown}/models answers: did "
                    f"you mean {setting_to('base_url', shown)}? (OpenAI-compatible servers "
                    "serve under /v1)"
                )
        return listed

    async def _models_at(self, url: URL) -> tuple[int | None, frozenset[str]]:
        """The HTTP status of ``GET url`` and the model ids it lists."""
        try:
            answer = await self.http.request(
                "GET", url, None, min(self.limits.timeout, 10.0), self.limits.max_response_bytes
            )
            ok = answer.status == 200
            return answer.status, self.dialect.read_models(answer.body) if ok else frozenset()
        except (TransportError, MalformedAnswer):
            # A failure here is the first request's to report, with its own message.
            return None, frozenset()

    async def slot_context(self) -> int | None:
        """The tokens one request may hold (its prompt and its answer), where the endpoint
        says so: llama.cpp's ``GET /props`` (at the server's root, beside ``/v1``), whose
        ``default_generation_settings.n_ctx`` is one slot's context. ``None`` where it does not
        say (a 404, as on OpenAI, an error or another shape): the caller falls back. Asked
        within :data:`PROBE_SECONDS`, as the other requests are (the endpoint's headers)."""
        root = URL(self.base_url)
        path = root.path.rstrip("/")
        path = path.removesuffix("/v1")
        url = join_url(str(root.with_path(path or "/", encoded=True)), "props", self._query)
        try:
            answer = await self.http.request(
                "GET", url, None, min(self.limits.timeout, PROBE_SECONDS), 1 << 20
            )
            if answer.status != 200:
                return None
            n_ctx = orjson.loads(answer.body)["default_generation_settings"]["n_ctx"]
        except (TransportError, OSError, TimeoutError, ValueError, KeyError, TypeError):
            return None
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx <= 0:
            return None
        return n_ctx

    def could_not_connect(self, exc: Exception) -> tuple[str, bool]:
        """Count a connection that could not be made: its message, and whether the run of
        such failures is long enough to stop the job."""
        self.connect_failures += 1
        limit = CONNECT_FAILURES_TO_ABORT if self.connected.is_set() else self.limits.max_attempts
        return redact(describe(exc), *self.secrets), self.connect_failures >= limit

    def asked_to_wait_too_long(self) -> bool:
        """Count an answer that asked for a wait over ``max_retry_after``: whether answers
        have asked so in a row long enough to stop the job rather than fail every row."""
        self.long_waits += 1
        return self.long_waits >= LONG_WAITS_TO_ABORT

    def pause(self, seconds: float, status: int) -> None:
        """Every sender waits ``seconds`` (a ``Retry-After``); a long pause is logged once."""
        self.limiter.pause(seconds)
        until = time.monotonic() + seconds
        if seconds >= ANNOUNCED_PAUSE and until > self._announced_until + 1:
            self._announced_until = until
            _log.warning(
                "llm-ops: %s asked to wait %s (HTTP %d, Retry-After): every request pauses "
                "until then (max_retry_after=%gs)",
                self.endpoint,
                duration(seconds),
                status,
                self.limits.max_retry_after,
            )

    async def close(self) -> None:
        await self.http.close()
        if "sdk" in self.__dict__:
            await self.sdk.close()


def join_url(base: str, path: str, query: str = "") -> URL:
    """``path`` under ``base``, whether ``base`` ends in a slash or not."""
    return URL(f"{base.rstrip('/')}/{path}{query}", encoded=True)
