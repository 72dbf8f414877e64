"""The dispatch engine: sends distinct requests concurrently and classifies every outcome.

The official ``openai`` SDK configures the endpoint (base URL, auth and default headers, its
own retries off, so retrying is owned here, in :meth:`Dispatcher._attempt_loop`). On the hot
path each request's JSON body is serialised once with ``orjson`` and posted through one
long-lived aiohttp session (:mod:`llm_ops._transport`) with the headers the SDK computed, and
only the fields we use are read from the answer: the SDK's per-call option transform, request
and response models cost more CPU per request than everything else together (see
``benchmarks/``), which on a 2-core machine is the difference between CPU-bound and
latency-bound at high concurrency.
"""

from __future__ import annotations

import asyncio
import difflib
import email.utils
import functools
import json
import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

import httpx2
import numpy as np
import openai
import orjson
from yarl import URL

from ._boundary import (
    BadBody,
    ConnectionFailed,
    CouldNotConnect,
    TimedOut,
    TransportError,
    one_line,
    redact,
    redact_in_logs,
)
from ._limits import AdaptiveConcurrency, Limiter, RateLimiter
from ._outcome import TRUNCATED_MESSAGE, Batch, Counters, Outcome, Pack, Request, Sent
from ._pack import PACK_FORMAT, unpack
from ._pricing import Budget, approx_tokens
from ._schema import InvalidOutput
from ._signals import stopped_by_signals
from ._spec import Endpoint, Limits
from ._transport import Transport
from .exceptions import ConfigError, JobAbortedError, JobInterruptedError

RETRYABLE_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))
ABORT_STATUS = frozenset({401, 403})
FINISHED = frozenset({"stop", "tool_calls", "function_call"})
"""``finish_reason`` values of a finished answer. ``length`` is ``truncated``,
``content_filter`` is ``filtered``; anything else (``error``, ``abort``, missing) did not
finish and is retried."""
CONNECT_FAILURES_TO_ABORT = 16  # attempts in a row that could not connect, once connected
REFUSAL_ROUND_TRIPS = 4  # a refusal comes back within so many /models round trips
REFUSAL_FLOOR = 0.05  # seconds, at least: a local server answers /models in a millisecond
LONG_WAITS_TO_ABORT = 8  # answers in a row asking for a wait over max_retry_after
ANNOUNCED_PAUSE = 5.0  # seconds of Retry-After from which a pause is logged
MAX_TOKENS_BELIEVED = 2**31 - 1
"""Above this, a token count in ``usage`` cannot be right (nor fit the cache's INTEGER)."""
EMBEDDING_BYTES_PER_INPUT = 128 * 1024  # room for one vector of up to ~6,000 floats as JSON
DRAIN_SECONDS = 10.0  # after SIGTERM, what is in flight may finish for this long
DEFAULT_COMPLETION_TOKENS = 256  # admission estimate when max_tokens is not set
REPAIR_PROMPT = (
    "That answer did not match the required JSON schema ({}). Reply again with "
    "only JSON that matches the schema."
)


_log = logging.getLogger("llm_ops")


def _duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``24 h``: a wait as a person reads it."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h".replace(".0 h", " h")


class _Retryable(Exception):
    def __init__(
        self, message: str, retry_after: float | None = None, http_status: int | None = None
    ):
        super().__init__(message)
        self.retry_after = retry_after
        self.http_status = http_status


class _Final(Exception):
    def __init__(self, status: Sent, message: str, http_status: int | None = None):
        super().__init__(message)
        self.status = status
        self.http_status = http_status


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds an answer asks to wait: ``retry-after-ms``, else ``Retry-After`` in seconds or
    as an HTTP date; ``None`` when absent or unreadable (a date in the past is 0)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        wait = _number(millis)
        if wait is not None:
            return wait / 1000
    text = headers.get("retry-after")
    if text is None:
        return None
    wait = _number(text)
    if wait is not None:
        return wait
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:  # HTTP dates are GMT
        return None
    return max(0.0, moment.timestamp() - time.time())


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value >= 0 and value == value and value != float("inf") else None


def token_count(value: object) -> int | None:
    """A count of ``usage`` as the endpoint sent it, if it can be right: absent is 0; a
    negative, fractional or absurd number (at least 2**31), or not a number, is ``None``."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not value.is_integer():  # inf and nan too
            return None
        value = int(value)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int):
        return None
    return value if 0 <= value <= MAX_TOKENS_BELIEVED else None


def read_usage(usage: object) -> tuple[int, int, int] | None:
    """(prompt, completion, cached) tokens of an answer's ``usage``, or ``None`` when they
    cannot be right. No usage is none billed; cached tokens that make no sense are none."""
    if usage is None:
        return 0, 0, 0
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens", 0) if type(details) is dict else 0
    if (  # the common shape, checked without a call per count
        type(prompt) is int
        and type(completion) is int
        and type(cached) is int
        and 0 <= cached <= prompt <= MAX_TOKENS_BELIEVED
        and 0 <= completion <= MAX_TOKENS_BELIEVED
    ):
        return prompt, completion, cached
    prompt = token_count(usage.get("prompt_tokens"))
    completion = token_count(usage.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    details = usage.get("prompt_tokens_details")
    cached = token_count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return prompt, completion, min(prompt, cached or 0)


def _finite_vectors(vectors: list[Any]) -> bool:
    """Vectors of one width, of finite numbers only: what the cache can store and search."""
    try:
        values = np.asarray(vectors, dtype=np.float64)
    except (ValueError, TypeError):
        return False
    return values.ndim == 2 and values.shape[1] > 0 and bool(np.isfinite(values).all())


def _load(payload: bytes) -> Any:
    """JSON, as orjson reads it, or as the standard library does what orjson refuses (numbers
    beyond a double, NaN): an answer must not be lost to one odd number in it."""
    try:
        return orjson.loads(payload)
    except ValueError:
        return json.loads(payload)


def _error_body(payload: bytes) -> dict[str, Any]:
    """The ``error`` object of an OpenAI-style error answer, or an empty dict."""
    try:
        body = orjson.loads(payload)
    except ValueError:
        return {}
    inner = body.get("error", body) if isinstance(body, dict) else None
    return inner if isinstance(inner, dict) else {}


def _preview(payload: bytes, limit: int = 80) -> str:
    return one_line(payload[:limit].decode("utf-8", "replace"), limit) or "(empty body)"


def join_url(base: str, path: str, query: str = "") -> URL:
    """``path`` under ``base``, whether ``base`` ends in a slash or not."""
    return URL(f"{base.rstrip('/')}/{path}{query}", encoded=True)


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context per process: loading the certificates took about 30 ms of every new
    client, ``http://`` endpoints included."""
    return httpx2.create_ssl_context()


class Engine:
    """The transport of one client, for its whole life: the connection pool, the rate limiter,
    the adaptive concurrency and what was learned about the endpoint (its limits, whether it
    can be reached). It lives on the client's event loop; dispatches borrow it.

    The official ``openai`` SDK configures it (base URL, auth and default headers); requests go
    through :class:`~llm_ops._transport.Transport`, one aiohttp session for the engine's life.
    """

    def __init__(self, endpoint: Endpoint, limits: Limits, limiter: Limiter | None = None):
        self.limits = limits
        self.endpoint = endpoint.shown
        self.concurrency = AdaptiveConcurrency(limits.concurrency)
        self.limiter: Limiter = limiter or RateLimiter(rpm=limits.rpm, tpm=limits.tpm)
        self.secrets = (endpoint.api_key, *endpoint.query.values())
        # Until one request got through, requests go one at a time: a wrong key, an empty
        # quota or an unreachable endpoint then costs one request, not a wave of them.
        self.connected = asyncio.Event()
        self.alone = asyncio.Lock()
        # How long a refusal takes to come back: a few times what /models took to answer.
        # A first request still unanswered after that was accepted and is being answered.
        self.refusal_seconds: float | None = None
        self.connect_failures = 0  # attempts in a row that could not connect
        self.long_waits = 0  # answers in a row that asked for a wait over max_retry_after
        self._announced_until = 0.0  # the end of the last pause logged
        self._listed: frozenset[str] | None = None  # the models the endpoint lists
        self._listing = asyncio.Lock()
        # The SDK: configuration, and the paths that are not hot (provider batches, files).
        self.client = openai.AsyncOpenAI(
            base_url=endpoint.base_url,
            api_key=endpoint.api_key,
            max_retries=0,
            timeout=limits.timeout,
            http_client=openai.DefaultAioHttpClient(timeout=limits.timeout, verify=_tls()),
        )
        self._query = "?" + urlencode(endpoint.query) if endpoint.query else ""
        redact_in_logs(endpoint.query.values())
        self.http = Transport(
            base_url=str(self.client.base_url),
            limit=limits.concurrency,
            headers={
                **{k: v for k, v in self.client.default_headers.items() if isinstance(v, str)},
                **self.client.auth_headers,
            },
        )

    def url(self, path: str) -> URL:
        return join_url(str(self.client.base_url), path, self._query)

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
        status, listed = await self._models_at(self.url("models"))
        if status == 404 and not URL(str(self.client.base_url)).path.rstrip("/").endswith("/v1"):
            with_v1 = join_url(str(self.client.base_url), "v1/models", self._query)
            if (await self._models_at(with_v1))[0] == 200:
                shown = self.endpoint.rstrip("/") + "/v1"
                raise ConfigError(
                    f"{self.endpoint} answers 404 for /models, but {shown}/models answers: did "
                    f"you mean base_url={shown!r}? (OpenAI-compatible servers serve under /v1)"
                )
        return listed

    async def _models_at(self, url: URL) -> tuple[int | None, frozenset[str]]:
        """The HTTP status of ``GET url`` and the model ids it lists."""
        try:
            started = time.perf_counter()
            answer = await self.http.get(
                url,
                timeout=min(self.limits.timeout, 10.0),
                max_bytes=self.limits.max_response_bytes,
            )
            body = orjson.loads(answer.body) if answer.status == 200 else {}
            listed = frozenset(
                str(item["id"])
                for item in body.get("data", ())
                if isinstance(item, dict) and "id" in item
            )
            if listed:  # it answered, and took the credentials
                took = time.perf_counter() - started
                self.refusal_seconds = max(REFUSAL_FLOOR, REFUSAL_ROUND_TRIPS * took)
            return answer.status, listed
        except (TransportError, ValueError, AttributeError, TypeError):
            # A failure here is the first request's to report, with its own message.
            return None, frozenset()

    def could_not_connect(self, exc: Exception) -> tuple[str, bool]:
        """Count a connection that could not be made: its message, and whether the run of
        such failures is long enough to stop the job."""
        self.connect_failures += 1
        limit = CONNECT_FAILURES_TO_ABORT if self.connected.is_set() else self.limits.max_attempts
        return (
            redact(str(exc) or type(exc).__name__, *self.secrets),
            self.connect_failures >= limit,
        )

    async def close(self) -> None:
        await self.http.close()
        await self.client.close()


class Dispatcher:
    """One dispatch of chat requests over an :class:`Engine`; reports each :class:`Outcome`.

    Every attempt waits for a rate budget (:class:`RateLimiter`) and a concurrency slot
    (:class:`AdaptiveConcurrency`), both the engine's; retrying is decided in one place,
    :meth:`_request_loop`.
    """

    path = "chat/completions"

    def __init__(
        self,
        engine: Engine,
        *,
        model: str,
        params: Mapping[str, Any],
        validate: Callable[[str], str] | None = None,
        repair: bool = False,
        budget: Budget | None = None,
    ):
        self.engine = engine
        self.settings = engine.limits
        self.budget = budget
        self.validate = validate
        self.repair = repair
        self.model = model
        self.params = {k: v for k, v in params.items() if v is not None}
        self.counters = Counters()
        self._aborted: JobAbortedError | None = None
        self._stopping = False  # SIGTERM: finish what is in flight, send nothing new
        self._drained = False
        self._workers: list[asyncio.Task[None]] = []
        self._completion_budget = int(self.params.get("max_tokens") or DEFAULT_COMPLETION_TOKENS)
        self.url = engine.url(self.path)

    async def run(
        self,
        requests: Iterable[Request],
        on_outcome: Callable[[Request, Outcome], Awaitable[None]],
    ) -> None:
        """Send every request, calling ``on_outcome(request, outcome)`` as answers arrive.

        Raises :class:`JobAbortedError` once in-flight requests settle if the endpoint refused
        the job (credentials, quota); requests not yet started are then never sent.
        """
        await self.engine.check_models((self.model,))
        work = iter(requests)
        workers = self._workers = [
            asyncio.create_task(self._worker(work, on_outcome))
            for _ in range(self.settings.concurrency)
        ]
        with stopped_by_signals(self):
            try:
                await asyncio.gather(*workers)
            except asyncio.CancelledError:
                if not self._drained:
                    raise
            finally:
                for worker in workers:
                    worker.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
        if self._aborted is not None:
            raise self._aborted
        if self._stopping:
            raise JobInterruptedError(
                "the job was stopped by SIGTERM; what was in flight was answered and every "
                "answer is cached, so a rerun sends only the rest"
            )

    def stop(self) -> None:
        """Send nothing new; give what is in flight up to :data:`DRAIN_SECONDS` (or the
        timeout, if shorter) to be answered, then cancel it."""
        if self._stopping:
            return
        self._stopping = True
        asyncio.get_running_loop().call_later(
            min(DRAIN_SECONDS, self.settings.timeout), self._drain_timeout
        )

    def _drain_timeout(self) -> None:
        if any(not worker.done() for worker in self._workers):
            self._drained = True
            for worker in self._workers:
                worker.cancel()

    async def _worker(
        self, work: Iterator[Request], on_outcome: Callable[[Request, Outcome], Awaitable[None]]
    ) -> None:
        for request in work:
            if self._aborted is not None or self._stopping:
                return
            outcome = await self._attempt_loop(request)
            if outcome.status == "aborted":
                return
            self.counters.done += 1
            self.counters.by_status[outcome.status] = (
                self.counters.by_status.get(outcome.status, 0) + 1
            )
            await on_outcome(request, outcome)

    def estimate_tokens(self, request: Request) -> int:
        """Admission cost: the prompt's approximate tokens, plus the completion budget."""
        chars = sum(len(m["content"]) for m in request.messages)
        answers = len(request.members) if isinstance(request, Pack) else 1
        return approx_tokens(chars, len(request.messages)) + self._completion_budget * answers

    async def _attempt_loop(self, request: Request) -> Outcome:
        if isinstance(request, Pack):
            return await self._pack_loop(request)
        return await self._request_loop(request)

    async def _pack_loop(self, pack: Pack) -> Outcome:
        """Send a pack; when its ids do not come back exactly once, split it and retry."""
        outcome = await self._request_loop(pack)
        if outcome.items is not None or outcome.status == "aborted":
            return outcome
        if outcome.status in ("ok", "truncated", "invalid"):  # answered, but not one per id
            self.counters.splits += 1
            items = []
            for half in pack.split():
                answer = await self._attempt_loop(half)
                items += answer.items if answer.items is not None else [(half, answer)]
            return Outcome(key=pack.key, status="ok", items=items)
        return Outcome(
            key=pack.key,
            status=outcome.status,
            items=[
                (
                    member,
                    Outcome(
                        key=member.key,
                        status=outcome.status,
                        error=outcome.error,
                        attempts=outcome.attempts,
                    ),
                )
                for member in pack.members
            ],
        )

    async def _request_loop(self, request: Request, *, split_on_status: bool = False) -> Outcome:
        """Attempts until an outcome; ``split_on_status``: stop at the first failure the
        endpoint answered with an HTTP error (not a 429), for the caller to split."""
        started = time.perf_counter()
        estimate = self.estimate_tokens(request)
        last_error, last_status = "no attempt made", None
        attempt = 0
        if self.engine.limiter.too_large(estimate):
            outcome = Outcome(
                key=request.key,
                status="failed",
                attempts=0,
                error=f"the request needs about {estimate:,} tokens (prompt + max_tokens), more "
                f"than the whole tokens-per-minute budget ({self.engine.limiter.tpm:,.0f}); "
                "shorten the prompt or lower max_tokens",
            )
            return outcome
        messages, repaired = request.messages, False
        for attempt in range(1, self.settings.max_attempts + 1):
            if self._aborted is not None or (self._stopping and attempt > 1):
                return Outcome(key=request.key, status="aborted")
            if attempt > 1:
                self.counters.retries += 1
            expected = (0, 0) if self.budget is None else self._expected_tokens(request, estimate)
            if self.budget is not None and not self.budget.reserve(*expected):
                self.counters.over_budget += 1
                return Outcome(
                    key=request.key,
                    status="skipped",
                    attempts=attempt - 1,
                    error=f"not sent: the budget stopped the job ({self.budget.exhausted})",
                )
            try:
                outcome = await self._attempt(request, messages, estimate)
                if self.budget is not None and outcome.usage_known:
                    self.budget.settle(
                        expected,
                        (outcome.prompt_tokens, outcome.completion_tokens),
                        cached_input_tokens=outcome.cached_tokens,
                    )  # unknown usage keeps the reservation: a budget holds whatever is said
                if (
                    outcome.status == "invalid"
                    and self.repair
                    and not repaired
                    and attempt < self.settings.max_attempts
                ):
                    # One repair round: show the model its answer and what was wrong with it.
                    messages = [
                        *messages,
                        {"role": "assistant", "content": outcome.text or ""},
                        {"role": "user", "content": REPAIR_PROMPT.format(outcome.error)},
                    ]
                    repaired = True
                    continue
            except _Retryable as exc:
                if self.budget is not None:  # failed attempts bill no tokens
                    self.budget.settle(expected, (0, 0))
                last_error, last_status = str(exc), exc.http_status
                if split_on_status and last_status not in (None, 429):
                    break  # the caller splits the request instead
                if attempt < self.settings.max_attempts:
                    await asyncio.sleep(self._backoff(attempt, exc.retry_after))
                continue
            except _Final as exc:
                if self.budget is not None:
                    self.budget.settle(expected, (0, 0))
                outcome = Outcome(
                    key=request.key, status=exc.status, error=str(exc), http_status=exc.http_status
                )
            outcome.attempts = attempt
            outcome.latency_ms = (time.perf_counter() - started) * 1000
            return outcome
        return Outcome(
            key=request.key,
            status="failed",
            error=f"gave up after {attempt} attempt{'s' * (attempt > 1)}: {last_error}",
            attempts=attempt,
            latency_ms=(time.perf_counter() - started) * 1000,
            http_status=last_status,
        )

    def _expected_tokens(self, request: Request, estimate: int) -> tuple[int, int]:
        """(input, output) tokens a request is projected to cost, for budgets."""
        answers = len(request.members) if isinstance(request, Pack) else 1
        if "max_tokens" in self.params or not self.counters.answered:
            output = self._completion_budget * answers
        else:  # what answers have cost so far
            output = answers * self.counters.completion_tokens // self.counters.answered
        return max(0, estimate - self._completion_budget * answers), output

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        ceiling = min(self.settings.backoff_max, self.settings.backoff_base * 2 ** (attempt - 1))
        delay = random.uniform(0, ceiling)  # full jitter
        return max(delay, retry_after) if retry_after is not None else delay

    def _body(self, request: Request, messages: list[dict[str, str]]) -> dict[str, Any]:
        body = {"model": self.model, "messages": messages, **self.params}
        if isinstance(request, Pack):
            body["response_format"] = PACK_FORMAT
            if "max_tokens" in body:  # room for every member's answer, plus the JSON around it
                body["max_tokens"] = body["max_tokens"] * len(request.members) + 16
        return body

    async def _attempt(
        self, request: Request, messages: list[dict[str, str]], estimate: int
    ) -> Outcome:
        body = orjson.dumps(self._body(request, messages))
        engine = self.engine
        if engine.connected.is_set():
            return await self._send(request, body, estimate)
        async with engine.alone:
            if self._aborted is not None:
                raise _Final("aborted", str(self._aborted))
            if engine.connected.is_set():
                first = None
            else:
                first = asyncio.ensure_future(self._send(request, body, estimate))
                if engine.refusal_seconds is not None:
                    try:
                        await asyncio.wait((first,), timeout=engine.refusal_seconds)
                    except asyncio.CancelledError:
                        first.cancel()  # wait() leaves what it waits for running
                        raise
                if first.done() or engine.refusal_seconds is None:
                    return await first
                # Not refused as fast as a refusal comes back: the others may go now, while
                # this one is being answered.
                engine.connected.set()
        return await (self._send(request, body, estimate) if first is None else first)

    async def _send(self, request: Request, body: bytes, estimate: int) -> Outcome:
        engine = self.engine
        await engine.limiter.admit(estimate)
        await engine.concurrency.acquire()
        self.counters.sent += 1
        try:
            answer = await engine.http.request(
                "POST", self.url, body, self.settings.timeout, self.max_bytes(request)
            )
        except BadBody as exc:
            raise _Final("failed", redact(str(exc), *engine.secrets)) from exc
        except CouldNotConnect as exc:
            detail, give_up = engine.could_not_connect(exc)
            if give_up:
                self._abort(
                    f"could not connect to {engine.endpoint} ({engine.connect_failures} attempts "
                    f"in a row failed: {one_line(detail)}); the job was stopped. Check "
                    "base_url and that the server is running, then rerun: answers so far are "
                    "cached."
                )
            raise _Retryable(f"could not connect: {detail}") from exc
        except TimedOut as exc:
            self.counters.timeouts += 1
            engine.concurrency.on_congestion()
            raise _Retryable(str(exc)) from exc
        except ConnectionFailed as exc:
            raise _Retryable(redact(f"connection error: {exc}", *engine.secrets)) from exc
        finally:
            engine.concurrency.release()
        engine.connect_failures = 0
        if answer.status in ABORT_STATUS:
            engine.connected.clear()  # the next job tries one request first again
        elif answer.status not in RETRYABLE_STATUS:
            engine.connected.set()  # reachable, and the credentials are accepted
        engine.limiter.observe(answer.headers)
        if answer.status >= 400:
            raise self._classify_status(answer.status, answer.body, answer.headers)
        if answer.status >= 300:
            raise self._redirected(answer.status, answer.headers)
        outcome = self._parse(request, answer.body)
        engine.concurrency.on_success()
        engine.long_waits = 0
        used = outcome.prompt_tokens + outcome.completion_tokens
        engine.limiter.settle(estimate, used if outcome.usage_known else estimate)
        return outcome

    def max_bytes(self, request: Request) -> int:
        """The most an answer to ``request`` may hold (``max_response_bytes``)."""
        return self.settings.max_response_bytes

    def _classify_status(
        self, status: int, payload: bytes, headers: Mapping[str, str]
    ) -> Exception:
        error = _error_body(payload)
        message = one_line(
            redact(
                f"HTTP {status}: {error.get('message') or _preview(payload)}", *self.engine.secrets
            )
        )
        if status in ABORT_STATUS:
            self._abort(
                f"the endpoint refused the credentials ({message}); the job was stopped and "
                "nothing more was sent. Check the API key (api_key= or OPENAI_API_KEY) and "
                "its permissions for this model."
            )
            return _Final("aborted", message)
        if status == 429 and "insufficient_quota" in (error.get("code"), error.get("type")):
            self._abort(
                f"the account is out of quota ({message}); the job was stopped and nothing more "
                "was sent. Add credit or raise the quota, then rerun: answers so far are cached."
            )
            return _Final("aborted", message)
        if status in RETRYABLE_STATUS:
            wait = retry_after(headers)
            if status == 429:
                self.counters.rate_limited += 1
            if wait is not None and wait > self.settings.max_retry_after:
                return self._too_long_a_wait(status, wait, message)
            if status == 429:
                if wait is not None:
                    self.engine.concurrency.on_overload()
                    self._pause(wait, status)
                else:
                    self.engine.concurrency.on_congestion()
            return _Retryable(message, wait, http_status=status)
        return _Final("rejected", message, http_status=status)

    def _pause(self, seconds: float, status: int) -> None:
        """Every sender waits ``seconds`` (a ``Retry-After``); a long pause is logged once."""
        engine = self.engine
        engine.limiter.pause(seconds)
        until = time.monotonic() + seconds
        if seconds >= ANNOUNCED_PAUSE and until > engine._announced_until + 1:
            engine._announced_until = until
            _log.warning(
                "llm-ops: %s asked to wait %s (HTTP %d, Retry-After): every request pauses "
                "until then (max_retry_after=%gs)",
                engine.endpoint,
                _duration(seconds),
                status,
                self.settings.max_retry_after,
            )

    def _too_long_a_wait(self, status: int, wait: float, message: str) -> _Final:
        """A wait over ``max_retry_after``: this request fails, and when answers keep asking
        for one, the job stops rather than fail every row."""
        engine, cap = self.engine, self.settings.max_retry_after
        engine.long_waits += 1
        if engine.long_waits >= LONG_WAITS_TO_ABORT:
            self._abort(
                f"{engine.endpoint} asks every request to wait {_duration(wait)} (HTTP {status}, "
                f"Retry-After), more than max_retry_after={cap:g}s; the job was stopped and "
                "nothing more was sent. Rerun after that time (answers so far are cached), or "
                "raise max_retry_after."
            )
        return _Final(
            "failed",
            f"the endpoint asked to wait {_duration(wait)} before a retry (HTTP {status}, "
            f"Retry-After), more than max_retry_after={cap:g}s; not retried ({message})",
            http_status=status,
        )

    def _usage(self, usage: object) -> tuple[int, int, int] | None:
        """Count an answer (billed, whatever becomes of it) and its tokens, when they can be
        right; tokens that cannot (negative, absurd) are counted as unknown instead."""
        tokens = read_usage(usage)
        self.counters.answered += 1
        if tokens is None:
            self.counters.usage_unknown += 1
            return None
        self.counters.prompt_tokens += tokens[0]
        self.counters.completion_tokens += tokens[1]
        self.counters.cached_tokens += tokens[2]
        return tokens

    def _redirected(self, status: int, headers: Mapping[str, str]) -> _Final:
        """A 3xx is never followed (it could carry the key to another host): the job stops,
        naming where the endpoint points, since every request would be sent there too."""
        target = headers.get("location")
        where = "without a Location"
        if target:
            try:
                to = URL(str(self.engine.client.base_url)).join(URL(target))
                where = f"to {to.origin()}{to.path}"  # no credentials, no query
            except ValueError:
                where = "to an address that is not a URL"
        message = f"HTTP {status}: the endpoint redirects {where}"
        self._abort(
            f"{message}; redirects are not followed (they could carry the API key elsewhere), "
            "so the job was stopped and nothing more was sent. Set base_url to the address "
            "it points to, then rerun."
        )
        return _Final("aborted", message, http_status=status)

    def _abort(self, message: str) -> None:
        if self._aborted is None:
            self._aborted = JobAbortedError(message)

    def _parse(self, request: Request, payload: bytes) -> Outcome:
        key = request.key
        try:
            body = _load(payload)
            choice = body["choices"][0]
            text = choice["message"]["content"]
            finish_reason = choice.get("finish_reason")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise _Retryable(f"malformed response body: {_preview(payload)!r}") from exc
        usage = self._usage(body.get("usage"))
        prompt_tokens, completion_tokens, cached_tokens = usage or (0, 0, 0)
        if body.get("error"):
            error = body["error"]
            detail = error.get("message") if isinstance(error, dict) else error
            raise _Retryable(
                one_line(
                    redact(f"the endpoint answered with an error: {detail}", *self.engine.secrets)
                )
            )
        if finish_reason == "content_filter":
            raise _Final(
                "filtered",
                "the endpoint's content filter stopped the answer (finish_reason 'content_filter')",
            )
        if finish_reason != "length" and finish_reason not in FINISHED:
            raise _Retryable(f"the answer did not finish (finish_reason {finish_reason!r})")
        if not isinstance(text, str):
            raise _Final(
                "rejected", f"the answer has no text content (finish_reason {finish_reason!r})"
            )
        truncated = finish_reason == "length"
        outcome = Outcome(
            key=key,
            status="truncated" if truncated else "ok",
            text=text,
            error=TRUNCATED_MESSAGE if truncated else None,
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            usage_known=usage is not None,
        )
        if isinstance(request, Pack):
            answers = None if truncated else unpack(text, len(request.members))
            if answers is not None:
                share = len(request.members)
                outcome.items = [
                    (
                        member,
                        Outcome(
                            key=member.key,
                            status="ok",
                            text=answer,
                            finish_reason=finish_reason,
                            prompt_tokens=prompt_tokens // share,
                            completion_tokens=completion_tokens // share,
                            cached_tokens=cached_tokens // share,
                            usage_known=outcome.usage_known,
                        ),
                    )
                    for member, answer in zip(request.members, answers, strict=True)
                ]
            return outcome
        if self.validate is not None and not truncated:
            try:
                outcome.json = self.validate(text)
            except InvalidOutput as exc:
                outcome.status = "invalid"
                outcome.error = one_line(f"the answer does not match the schema: {exc}")
        return outcome


class EmbeddingDispatcher(Dispatcher):
    """Sends :class:`Batch` requests to ``/embeddings``; an outcome carries one vector per input."""

    path = "embeddings"

    def estimate_tokens(self, request: Request) -> int:
        inputs = request.inputs if isinstance(request, Batch) else ()
        return approx_tokens(sum(len(text) for text in inputs)) + len(inputs)

    def _body(self, request: Request, messages: list[dict[str, str]]) -> dict[str, Any]:
        inputs = list(request.inputs) if isinstance(request, Batch) else []
        return {"model": self.model, "input": inputs, **self.params}

    async def _attempt_loop(self, request: Request) -> Outcome:
        """Send a batch; when the endpoint refuses it (say, one input is too long for it),
        split it in halves and send each, down to single inputs, so only a bad input fails."""
        if not isinstance(request, Batch) or len(request.inputs) < 2:
            return await self._request_loop(request)
        outcome = await self._request_loop(request, split_on_status=True)
        if outcome.status not in ("failed", "rejected") or outcome.http_status in (None, 429):
            return outcome
        self.counters.splits += 1
        items: list[tuple[Request, Outcome]] = []
        for half in request.split():
            answer = await self._attempt_loop(half)
            items += answer.items if answer.items is not None else [(half, answer)]
        return Outcome(key=request.key, status="ok", items=items)

    def _parse(self, request: Request, payload: bytes) -> Outcome:
        expected = len(request.inputs) if isinstance(request, Batch) else 0
        try:
            body = _load(payload)
            items = sorted(body["data"], key=lambda item: item["index"])
            vectors = [item["embedding"] for item in items]
        except (ValueError, KeyError, TypeError) as exc:
            raise _Retryable(f"malformed response body: {_preview(payload)!r}") from exc
        if len(vectors) != expected or [i["index"] for i in items] != list(range(expected)):
            raise _Retryable(
                f"the endpoint returned {len(vectors)} embeddings for {expected} inputs"
            )
        if not _finite_vectors(vectors):
            raise _Retryable("the endpoint returned embeddings that are not lists of numbers")
        usage = self._usage(body.get("usage"))
        prompt_tokens = 0 if usage is None else usage[0]
        wanted = self.params.get("dimensions")
        if wanted is not None and any(len(vector) != wanted for vector in vectors):
            raise _Final(
                "rejected",
                f"asked for dimensions={wanted}, the endpoint returned "
                f"{len(vectors[0])}: it ignores dimensions=; drop it for "
                "this endpoint",
            )
        return Outcome(
            key=request.key,
            status="ok",
            vectors=vectors,
            prompt_tokens=prompt_tokens,
            usage_known=usage is not None,
        )

    def max_bytes(self, request: Request) -> int:
        inputs = len(request.inputs) if isinstance(request, Batch) else 1
        return self.settings.max_response_bytes + EMBEDDING_BYTES_PER_INPUT * inputs
