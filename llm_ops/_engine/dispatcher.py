"""Dispatch: distinct requests sent concurrently over the :class:`~llm_ops._engine.engine.Engine`,
retried in one place, each reported as one :class:`~llm_ops._outcome.Outcome`.

A dispatch runs ``concurrency`` workers over one iterator of requests. Each request goes
through :meth:`Dispatcher._request_loop`, which alone decides retries: every attempt is
admitted by the engine's rate limiter and concurrency, posted once, and its answer read
(:mod:`llm_ops._engine.answers`); a pack whose ids did not come back, or an embeddings batch the
endpoint refused, is split in halves and each half sent again. ``stop()`` (SIGTERM) sends
nothing new and lets what is in flight finish for :data:`DRAIN_SECONDS`.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any

import orjson

from .._dialects import CANONICAL, ErrorReading, path_of
from .._endpoint import KEY_VARIABLES
from .._media import Unusable
from .._outcome import Counters, EmbeddingsRequest, Outcome, Pack, Request, text_of
from .._pack import PACK_OUTPUT, PACK_SCHEMA
from .._pricing import SpendingCap, approx_tokens
from .._signals import stopped_by_signals
from .._telemetry import attempts
from .._wire import HttpAnswer
from ..exceptions import ConfigError, JobAbortedError, JobInterruptedError, setting
from .answers import (
    CompletionReader,
    EmbeddingReader,
    Final,
    Reader,
    Retryable,
    base_url_hint,
    duration,
    redirection,
    refusal,
    rejection_hint,
    retry_after,
)
from .boundary import (
    BadBody,
    CouldNotConnect,
    Malformed,
    Refused,
    TimedOut,
    TransportError,
    one_line,
    redact,
)
from .engine import Engine
from .transport import RecentAnswers

OnOutcome = Callable[[Request, Outcome], Awaitable[None]]
DRAIN_SECONDS = 10.0  # after SIGTERM, what is in flight may finish for this long
MALFORMED_RETRIES = 1  # a malformed answer is sent again once (see answers.Retryable)
DEFAULT_COMPLETION_TOKENS = 256  # admission estimate when max_tokens is not set
ANSWER_LIMITS = ("max_tokens", "max_completion_tokens")  # the most tokens of an answer
EMBEDDING_BYTES_PER_INPUT = 128 * 1024  # room for one vector of up to ~6,000 floats as JSON
REFUSED_ALIKE_TO_STOP = 8
"""A job whose first answers are this many refusals alike (one status, one reason: a model
that takes no images, a wrong path) stops, rather than be refused row after row."""
REPAIR_PROMPT = (
    "That answer did not match the required JSON schema ({}). Reply again with "
    "only JSON that matches the schema."
)


class Dispatcher:
    """One dispatch of chat requests over an :class:`Engine`; reports each :class:`Outcome`.

    Every attempt waits for a rate budget (:class:`~llm_ops._limits.RateLimiter`) and a
    concurrency slot (:class:`~llm_ops._concurrency.Concurrency`), both the engine's;
    retrying is decided in one place, :meth:`_request_loop`. ``stop_when_refused_alike``:
    stop the job when its first answers are all refusals alike (see :meth:`_watch`); not for
    an earlier model of a cascade, whose refused rows go on to the next one.
    """

    operation = "chat"  # gen_ai.operation.name of its attempts' spans

    def __init__(
        self,
        engine: Engine,
        *,
        model: str,
        params: Mapping[str, Any],
        validate: Callable[[str], str] | None = None,
        repair: bool = False,
        budget: SpendingCap | None = None,
        stop_when_refused_alike: bool = True,
        cached: bool = True,
    ):
        self.engine = engine
        self.cached = cached  # whether the job has a cache: what its stop messages may promise
        self.kept = (
            "answers so far are cached"
            if cached
            else "the cache is off, so answers so far are not kept for a rerun"
        )
        self.settings = engine.limits
        self.budget = budget
        self.repair = repair
        self.model = model
        self.params = {k: v for k, v in params.items() if v is not None}
        self.counters = Counters()
        self.reader = self._reader(validate)
        self._aborted: JobAbortedError | None = None
        # the first answers, all refusals alike (see _watch); -1: not watched
        self._refused_alike = 0 if stop_when_refused_alike else -1
        self._first_refusal: str | None = None  # the first refusal's message, while watched
        self._stopping = False  # SIGTERM: finish what is in flight, send nothing new
        self._workers: set[asyncio.Task[Any]] = set()  # running
        self._busy: set[asyncio.Task[Any]] = set()  # running and drawing requests
        self._failure: BaseException | None = None  # what a worker raised, if one did
        self._drawn = False  # every request was drawn
        self._work: Iterator[Request] = iter(())
        self._on_outcome: OnOutcome = _nothing
        self._completion_budget = int(
            self.params.get("max_tokens")
            or self.params.get("max_completion_tokens")
            or DEFAULT_COMPLETION_TOKENS
        )
        self.url = engine.url(self.path())
        self.recent = RecentAnswers()  # a copy of one of them is no answer (see transport)
        # None: no span or metric, and no work for one, on the hot path
        self._telemetry = attempts(
            operation=self.operation,
            dialect=engine.dialect.name,
            model=model,
            params=self.params,
            server=(self.url.host, self.url.port),
        )

    def path(self) -> str:
        """Where requests go, under the base URL: the dialect's completions (of the model,
        where its path names it)."""
        return path_of(self.engine.dialect.completions_path, self.model)

    def _reader(self, validate: Callable[[str], str] | None) -> Reader:
        return CompletionReader(self.counters, self.engine.secrets, self.engine.dialect, validate)

    # -- scheduling ---------------------------------------------------------------------------

    async def run(self, requests: Iterable[Request], on_outcome: OnOutcome) -> None:
        """Send every request, calling ``on_outcome(request, outcome)`` as answers arrive.

        Raises :class:`JobAbortedError` once in-flight requests settle if the endpoint refused
        the job (credentials, quota); requests not yet started are then never sent.
        """
        await self.engine.hosted(self.engine.check_models((self.model,)))
        self._work, self._on_outcome = iter(requests), on_outcome
        if self._telemetry is not None:
            self._telemetry.watch(self.engine.concurrency)
        self._staff()
        with stopped_by_signals(self):
            try:
                await self._until_done()
            finally:
                leftover = list(self._workers)
                for worker in leftover:
                    worker.cancel()
                await asyncio.gather(*leftover, return_exceptions=True)
                concurrency = self.engine.concurrency
                self.counters.concurrency = concurrency.limit
                self.counters.concurrency_why = concurrency.why
        if self._aborted is not None:
            raise self._aborted
        if self._stopping:
            raise JobInterruptedError(
                "the job was stopped by SIGTERM; what was in flight was answered and "
                + (
                    "every answer is cached, so a rerun sends only the rest"
                    if self.cached
                    else "the cache is off, so a rerun sends every row again"
                )
            )

    def _staff(self) -> None:
        """As many workers as requests may be in flight now: the engine's concurrency moves
        while the job runs, and a worker holds its request from the first attempt to the
        last, budget reservations included, so no more are drawn than can be sent."""
        while len(self._busy) < self.engine.concurrency.limit and not self._drawn:
            worker = asyncio.create_task(self._worker())
            worker.add_done_callback(self._finished)
            self._workers.add(worker)
            self._busy.add(worker)

    def _finished(self, worker: asyncio.Task[Any]) -> None:
        self._workers.discard(worker)
        if self._failure is None and not worker.cancelled():
            self._failure = worker.exception()

    async def _until_done(self) -> None:
        """Wait for the workers. A cancelled job (``task.cancel()``, Ctrl-C) stops as SIGTERM
        stops it: nothing new is sent, what is in flight may be answered (see :meth:`stop`)
        and every answer is kept; then the cancellation goes on. A second one stops at once."""
        try:
            await self._all_done()
        except asyncio.CancelledError:
            self.stop()
            await self._all_done()
            raise

    async def _all_done(self) -> None:
        """Wait for every worker, those started meanwhile too, without cancelling them when
        this wait is (as ``gather`` would); the first exception one raised is raised."""
        while self._workers and self._failure is None:
            await asyncio.wait(set(self._workers), return_when=asyncio.FIRST_EXCEPTION)
        if self._failure is not None:
            raise self._failure

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
        for worker in list(self._workers):
            worker.cancel()

    def _abort(self, message: str) -> None:
        """Stop the job: nothing new is sent, and :meth:`run` raises
        :class:`JobAbortedError` with the first such message once what is in flight settled."""
        if self._aborted is None:
            self._aborted = JobAbortedError(message)

    async def _worker(self) -> None:
        me = asyncio.current_task()
        assert me is not None
        try:
            for request in self._work:
                if self._aborted is not None or self._stopping:
                    return
                outcome = await self._attempt_loop(request)
                if outcome.status == "aborted":
                    return
                self.counters.done += 1
                self.counters.by_status[outcome.status] = (
                    self.counters.by_status.get(outcome.status, 0) + 1
                )
                await self._on_outcome(request, outcome)
                if len(self._busy) > self.engine.concurrency.limit:
                    return  # the concurrency fell: one worker fewer
                self._staff()
            self._drawn = True
        finally:
            self._busy.discard(me)

    # -- the retry loop -----------------------------------------------------------------------

    async def _attempt_loop(self, request: Request) -> Outcome:
        if isinstance(request, Pack):
            return await self._pack_loop(request)
        async with request.holding():  # its images' and PDFs' bytes, read until it is done
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
        if self.engine.limiter.too_large(estimate):
            return self._too_large(request, estimate)
        try:
            messages = await request.sent_messages()
        except Unusable as exc:  # a file changed or went since the plan keyed it
            return Outcome(key=request.key, status="rejected", error=f"{exc}; row not sent")
        repaired, failure, malformed = False, None, 0
        attempt, last = 0, self.settings.max_attempts
        for attempt in range(1, last + 1):
            if self._aborted is not None or (self._stopping and attempt > 1):
                return Outcome(key=request.key, status="aborted")
            if attempt > 1:
                self.counters.retries += 1
            expected = (0, 0) if self.budget is None else self.expected_tokens(request, estimate)
            if self.budget is not None and not self.budget.reserve(*expected):
                return self._over_budget(request, attempt - 1, self.budget)
            try:
                outcome = await (
                    self._attempt(request, messages, estimate)
                    if self._telemetry is None
                    else self._traced_attempt(request, messages, estimate, attempt)
                )
            except Retryable as exc:
                self._bill(expected, None)
                failure = exc
                malformed += exc.malformed
                if split_on_status and exc.http_status not in (None, 429):
                    break  # the caller splits the request instead
                if malformed > MALFORMED_RETRIES:
                    break
                if attempt < last:
                    await asyncio.sleep(self._backoff(attempt, exc.retry_after))
                continue
            except Final as exc:
                self._bill(expected, None)
                if exc.status == "rejected" and exc.http_status and not split_on_status:
                    self._watch(str(exc))  # a batch refused is split, not a refusal of the job
                outcome = Outcome(
                    key=request.key, status=exc.status, error=str(exc), http_status=exc.http_status
                )
            else:
                self._bill(expected, outcome)
                if outcome.status == "invalid" and self.repair and not repaired and attempt < last:
                    messages, repaired = self._repair(messages, outcome), True
                    continue
            outcome.attempts = attempt
            outcome.latency_ms = (time.perf_counter() - started) * 1000
            return outcome
        return self._gave_up(request, attempt, failure, started)

    def _too_large(self, request: Request, estimate: int) -> Outcome:
        """A request that could never be admitted: more than a minute of the token budget."""
        return Outcome(
            key=request.key,
            status="failed",
            attempts=0,
            error=f"the request needs about {estimate:,} tokens (prompt + max_tokens), more "
            f"than the whole tokens-per-minute budget ({self.engine.limiter.tpm:,.0f}); "
            "shorten the prompt or lower max_tokens",
        )

    def _over_budget(self, request: Request, attempts: int, budget: SpendingCap) -> Outcome:
        self.counters.over_budget += 1
        return Outcome(
            key=request.key,
            status="skipped",
            attempts=attempts,
            error=f"not sent: the budget stopped the job ({budget.exhausted})",
        )

    def _bill(self, expected: tuple[int, int], outcome: Outcome | None) -> None:
        """Settle the budget's reservation for an attempt: an answer's tokens, none for an
        attempt that failed. Unknown usage keeps the reservation: a budget holds whatever is
        said."""
        if self.budget is None:
            return
        if outcome is None:
            self.budget.settle(expected, (0, 0))
        elif outcome.usage_known:
            self.budget.settle(
                expected,
                (outcome.prompt_tokens, outcome.completion_tokens),
                cached_input_tokens=outcome.cached_tokens,
                cache_write_tokens=outcome.cache_write_tokens,
            )

    @staticmethod
    def _repair(messages: list[dict[str, str]], outcome: Outcome) -> list[dict[str, str]]:
        """One repair round: show the model its answer and what was wrong with it."""
        return [
            *messages,
            {"role": "assistant", "content": outcome.text or ""},
            {"role": "user", "content": REPAIR_PROMPT.format(outcome.error)},
        ]

    @staticmethod
    def _gave_up(
        request: Request, attempts: int, failure: Retryable | None, started: float
    ) -> Outcome:
        return Outcome(
            key=request.key,
            status="failed",
            error=f"gave up after {attempts} attempt{'s' * (attempts > 1)}: "
            f"{'no attempt made' if failure is None else failure}",
            attempts=attempts,
            latency_ms=(time.perf_counter() - started) * 1000,
            http_status=None if failure is None else failure.http_status,
        )

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        ceiling = min(self.settings.backoff_max, self.settings.backoff_base * 2 ** (attempt - 1))
        delay = random.uniform(0, ceiling)  # full jitter
        return max(delay, retry_after) if retry_after is not None else delay

    # -- requests: their cost and their body --------------------------------------------------

    def estimate_tokens(self, request: Request) -> int:
        """Admission cost: the prompt's approximate tokens, plus the completion budget."""
        chars = sum(len(text_of(m["content"])) for m in request.messages)
        answers = len(request.members) if isinstance(request, Pack) else 1
        prompt = approx_tokens(chars, len(request.messages)) + request.media_tokens
        return prompt + self._completion_budget * answers

    def expected_tokens(self, request: Request, estimate: int) -> tuple[int, int]:
        """(input, output) tokens a request is projected to cost, for budgets."""
        answers = len(request.members) if isinstance(request, Pack) else 1
        if any(name in self.params for name in ANSWER_LIMITS) or not self.counters.answered:
            output = self._completion_budget * answers
        else:  # what answers have cost so far
            output = answers * self.counters.completion_tokens // self.counters.answered
        return max(0, estimate - self._completion_budget * answers), output

    def body(self, request: Request, messages: list[dict[str, str]]) -> dict[str, Any]:
        """The JSON body of ``request``, asking with ``messages``, as the endpoint's dialect
        writes it; ``max_tokens`` is asked as ``max_completion_tokens`` of a model that
        refused it (unless that is set too)."""
        return self.engine.dialect.completion_body(self.canonical(request, messages))

    def canonical(self, request: Request, messages: list[dict[str, str]]) -> dict[str, Any]:
        """What ``request`` asks, in the canonical request's terms (what a key hashes, less
        its endpoint): a pack asks for its members' answers by the pack's format."""
        body = {"model": self.model, "messages": messages, **self.params}
        if isinstance(request, Pack):
            body.update(CANONICAL.structured_output(PACK_OUTPUT, PACK_SCHEMA))
            for name in ANSWER_LIMITS:  # room for every member's answer, and the JSON around
                if name in body:
                    body[name] = body[name] * len(request.members) + 16
        if self.model in self.engine.max_completion_tokens_models and "max_tokens" in body:
            body.setdefault("max_completion_tokens", body["max_tokens"])
            del body["max_tokens"]
        return body

    def max_bytes(self, request: Request) -> int:
        """The most an answer to ``request`` may hold (``max_response_bytes``)."""
        return self.settings.max_response_bytes

    # -- one attempt --------------------------------------------------------------------------

    def _attempt(
        self, request: Request, messages: list[dict[str, str]], estimate: int
    ) -> Awaitable[Outcome]:
        """One attempt, to await: its body serialised once, sent at once, or through the
        engine's first-request gate while no request got through; on the engine's loop (see
        :meth:`Engine.hosted`), the rest of the dispatch on its own."""
        body = orjson.dumps(self.body(request, messages))
        if self.engine.connected.is_set():
            return self.engine.hosted(self._send(request, body, estimate))
        return self.engine.hosted(
            self.engine.first_request(
                functools.partial(self._send_unless_aborted, request, body, estimate)
            )
        )

    async def _traced_attempt(
        self, request: Request, messages: list[dict[str, str]], estimate: int, attempt: int
    ) -> Outcome:
        """:meth:`_attempt` in a CLIENT span of its own (GenAI conventions), started here, on
        the dispatch's loop, so that its parent is the dispatch's span."""
        telemetry = self._telemetry
        assert telemetry is not None
        prompt = [(m["role"], text_of(m["content"])) for m in messages] if telemetry.capture else ()
        span = telemetry.start(attempt, prompt)
        try:
            outcome = await self._attempt(request, messages, estimate)
        except Retryable as exc:
            why = "malformed" if exc.malformed else "retryable"
            telemetry.end(
                span, status="retryable", error_type=_error_type(exc, exc.http_status, why)
            )
            raise
        except Final as exc:
            error_type = _error_type(exc, exc.http_status, exc.status)
            telemetry.end(span, status=exc.status, error_type=error_type)
            raise
        except BaseException as exc:  # cancelled (Ctrl-C, SIGTERM's drain) or a bug
            telemetry.end(span, status="aborted", error_type=type(exc).__qualname__)
            raise
        answered, known = outcome.status in ("ok", "truncated"), outcome.usage_known
        telemetry.end(
            span,
            status=outcome.status,
            error_type=None if answered else outcome.status,
            stop_reason=outcome.stop_reason,
            input_tokens=outcome.prompt_tokens if known else None,
            output_tokens=outcome.completion_tokens if known else None,
            cache_read_tokens=outcome.cached_tokens if known else None,
            cache_write_tokens=outcome.cache_write_tokens if known else None,
            reasoning_tokens=outcome.reasoning_tokens if known else None,
            answer=outcome.text,
            response_model=outcome.response_model,
            response_id=outcome.response_id,
        )
        return outcome

    async def _send_unless_aborted(self, request: Request, body: bytes, estimate: int) -> Outcome:
        if self._aborted is not None:  # the request that went first was refused
            raise Final("aborted", str(self._aborted))
        return await self._send(request, body, estimate)

    async def _send(self, request: Request, body: bytes, estimate: int) -> Outcome:
        """Admission, a concurrency slot, one POST, and its answer read."""
        engine = self.engine
        await engine.limiter.admit(estimate)
        setting = await engine.concurrency.acquire()
        self.counters.sent += 1
        sent_at = time.monotonic()
        try:
            answer = await engine.http.request(
                "POST",
                self.url,
                body,
                self.settings.timeout,
                self.max_bytes(request),
                recent=self.recent,
            )
        except TransportError as exc:
            raise self._no_answer(exc) from exc
        finally:
            engine.concurrency.release()
        engine.connect_failures = 0
        dialect = engine.dialect
        error = dialect.read_error(answer.status, answer.body) if answer.status >= 400 else None
        if error is not None and error.kind == "credentials":
            engine.connected.clear()  # the next job tries one request first again
        elif error is None or not error.retryable:
            engine.connected.set()  # reachable, and the credentials are accepted
        engine.limiter.observe(dialect.heard_limits(answer.headers))
        if error is not None and error.wants_max_completion_tokens:
            resent = self._with_max_completion_tokens(body)
            if resent is not None:  # not an attempt of its own: the request was not refused
                return await self._send(request, resent, estimate)
        if answer.status >= 300:
            raise self._refused(answer, error)
        self._watch(None)
        outcome = self.reader.read(request, answer.body)
        tokens = outcome.completion_tokens if outcome.usage_known else None
        engine.concurrency.observe(setting, time.monotonic() - sent_at, tokens)
        engine.long_waits = 0
        used = outcome.prompt_tokens + outcome.completion_tokens
        engine.limiter.settle(estimate, used if outcome.usage_known else estimate)
        return outcome

    def _with_max_completion_tokens(self, body: bytes) -> bytes | None:
        """``body`` with ``max_tokens`` as ``max_completion_tokens``, and the model noted so
        that every later body is sent so (see :meth:`body`); ``None`` when ``body`` had no
        ``max_tokens``, so that a model refusing both is not asked forever. The request's
        key is unchanged: it is the request as it was asked for."""
        sent = orjson.loads(body)
        if "max_tokens" not in sent:
            return None
        self.engine.max_completion_tokens_models.add(self.model)
        sent.setdefault("max_completion_tokens", sent["max_tokens"])
        del sent["max_tokens"]
        return orjson.dumps(sent)

    def _no_answer(self, exc: TransportError) -> Retryable | Final:
        """An attempt that got no answer is retried, but for a body too large to read; a
        run of connections that could not be made stops the job."""
        engine = self.engine
        if isinstance(exc, BadBody):
            return Final("failed", redact(str(exc), *engine.secrets))
        if isinstance(exc, Refused):
            message = redact(str(exc), *engine.secrets)
            self._abort(
                f"{message}; the job was stopped and nothing more was sent. Rerun once that is "
                f"fixed: {self.kept}."
            )
            return Final("aborted", message)
        if isinstance(exc, Malformed):
            return Retryable(redact(str(exc), *engine.secrets), malformed=True)
        if isinstance(exc, CouldNotConnect):
            detail, give_up = engine.could_not_connect(exc)
            if give_up:
                self._abort(
                    f"could not connect to {engine.endpoint} ({engine.connect_failures} attempts "
                    f"in a row failed: {one_line(detail)}); the job was stopped. Check "
                    f"{setting('base_url')} and that the server is running, then rerun: answers "
                    "so far are cached."
                )
            return Retryable(f"could not connect: {detail}")
        if isinstance(exc, TimedOut):
            self.counters.timeouts += 1
            engine.concurrency.on_timeout()
            return Retryable(str(exc))
        return Retryable(redact(f"connection error: {exc}", *engine.secrets))

    def _refused(self, answer: HttpAnswer, error: ErrorReading | None) -> Retryable | Final:
        """A redirect or an error status (as the dialect reads it: ``error``): what it does
        to the job (stops it, or slows every sender down) and the exception that ends this
        attempt."""
        status = answer.status
        if error is None:
            message, stop = redirection(status, answer.headers, self.engine.base_url)
            self._abort(stop)
            return Final("aborted", message, http_status=status)
        variables = KEY_VARIABLES.get(self.engine.dialect.name, ("OPENAI_API_KEY",))
        variable = " or ".join(variables)
        message, refused = refusal(
            status, error, answer.body, self.engine.secrets, kept=self.kept, key_variable=variable
        )
        if refused is not None:
            self._abort(refused)
            return Final("aborted", message)
        if not error.retryable:
            hint = base_url_hint(status, message, self.engine.base_url)
            message = message if hint is None else f"{message}; {hint}"
            return Final("rejected", message, http_status=status)
        wait = retry_after(answer.headers)  # else the body's (Gemini's RetryInfo)
        limited = error.kind == "rate_limited"  # a 429, or an overload (Anthropic's 529)
        wait = error.retry_after if wait is None else wait
        return self._retry_later(status, wait, message, limited)

    def _watch(self, refused: str | None) -> None:
        """Follow the job's first answers: when the first :data:`REFUSED_ALIKE_TO_STOP` are
        all ``refused`` alike (same status, same reason), every row would be, so the job
        stops with the endpoint's reason. An answer (``None``), or a refusal of another
        kind, ends the watch; answers to be retried (a 429, a 503) are not followed."""
        if self._refused_alike < 0:
            return
        if refused is None or self._first_refusal not in (None, refused):
            self._refused_alike = -1
            return
        self._first_refusal = refused
        self._refused_alike += 1
        if self._refused_alike == REFUSED_ALIKE_TO_STOP:
            self._abort(
                f"the endpoint refused the first {REFUSED_ALIKE_TO_STOP} requests alike "
                f"({refused}); the job was stopped and nothing more was sent. "
                f"{rejection_hint(refused)}"
            )

    def _retry_later(
        self, status: int, wait: float | None, message: str, limited: bool = False
    ) -> Retryable | Final:
        """A status worth another attempt: a 429 (or what the dialect reads as a rate limit,
        ``limited``) slows every sender down, and pauses them all when it says for how long;
        a wait over ``max_retry_after`` is not waited for."""
        engine = self.engine
        limited = limited or status == 429
        if limited:
            self.counters.rate_limited += 1
            if self._telemetry is not None:
                self._telemetry.rate_limited(status)
        if wait is not None and wait > self.settings.max_retry_after:
            return self._too_long_a_wait(status, wait, message)
        if limited:
            if wait is not None:
                engine.concurrency.on_overload("429s")
                engine.pause(wait, status)
            else:
                engine.concurrency.on_congestion("429s")
        return Retryable(message, wait, http_status=status)

    def _too_long_a_wait(self, status: int, wait: float, message: str) -> Final:
        """A wait over ``max_retry_after``: this request fails, and when answers keep asking
        for one, the job stops rather than fail every row."""
        engine, cap = self.engine, self.settings.max_retry_after
        if engine.asked_to_wait_too_long():
            self._abort(
                f"{engine.endpoint} asks every request to wait {duration(wait)} (HTTP {status}, "
                f"Retry-After), more than max_retry_after={cap:g}s; the job was stopped and "
                f"nothing more was sent. Rerun after that time ({self.kept}), or raise "
                "max_retry_after."
            )
        return Final(
            "failed",
            f"the endpoint asked to wait {duration(wait)} before a retry (HTTP {status}, "
            f"Retry-After), more than max_retry_after={cap:g}s; not retried ({message})",
            http_status=status,
        )


def _error_type(exc: Exception, http_status: int | None, otherwise: str) -> str:
    """``error.type`` of a failed attempt: the HTTP status the endpoint answered with, else
    the transport's failure (``TimedOut``, ``CouldNotConnect``), else ``otherwise``."""
    if http_status is not None:
        return str(http_status)
    return otherwise if exc.__cause__ is None else type(exc.__cause__).__qualname__


async def _nothing(request: Request, outcome: Outcome) -> None:
    """No one to tell of an outcome (before :meth:`Dispatcher.run` names someone)."""


class EmbeddingDispatcher(Dispatcher):
    """Sends :class:`EmbeddingsRequest` requests to the dialect's embeddings; an outcome
    carries one vector per input."""

    operation = "embeddings"

    def __init__(self, engine: Engine, **options: Any) -> None:
        # a dialect whose API has none says so (Dialect.embeddings): before anything is sent
        if not getattr(engine.dialect, "embeddings", True):
            raise ConfigError(
                f"the {engine.dialect.name} API has no embeddings; embed with an endpoint that "
                "has (an OpenAI-compatible one)"
            )
        super().__init__(engine, **options)

    def path(self) -> str:
        return path_of(self.engine.dialect.embeddings_path, self.model)

    def _reader(self, validate: Callable[[str], str] | None) -> Reader:
        return EmbeddingReader(
            self.counters, self.engine.secrets, self.engine.dialect, self.params.get("dimensions")
        )

    def estimate_tokens(self, request: Request) -> int:
        inputs = request.inputs if isinstance(request, EmbeddingsRequest) else ()
        return approx_tokens(sum(len(text) for text in inputs)) + len(inputs)

    def body(self, request: Request, messages: list[dict[str, str]]) -> dict[str, Any]:
        inputs = list(request.inputs) if isinstance(request, EmbeddingsRequest) else []
        return self.engine.dialect.embeddings_body(self.model, inputs, self.params)

    def max_bytes(self, request: Request) -> int:
        inputs = len(request.inputs) if isinstance(request, EmbeddingsRequest) else 1
        return self.settings.max_response_bytes + EMBEDDING_BYTES_PER_INPUT * inputs

    async def _attempt_loop(self, request: Request) -> Outcome:
        """Send a batch; when the endpoint refuses it (say, one input is too long for it),
        split it in halves and send each, down to single inputs, so only a bad input fails."""
        if not isinstance(request, EmbeddingsRequest) or len(request.inputs) < 2:
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
