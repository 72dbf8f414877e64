"""Provider batch mode (``batch=True``): the distinct uncached requests through the provider's
batch API, at the batch price, answered within 24 hours.

The provider's calls are its :class:`~llm_ops._pipeline.batch_service.BatchService`, picked by
the endpoint dialect's name (:data:`SERVICES`): OpenAI's Files and Batches API, Anthropic's
Message Batches, Gemini's ``batchGenerateContent``. Everything else is here, the same for each.

A submission (a ``job_id``) is cut into parts of at most ``requests_per_batch`` lines and
``bytes_per_batch`` (by default the provider's own limits); each part is its lines kept (an
uploaded JSONL file, ``custom_id`` = the request key, or a local one) and one batch. Every
provider object is recorded in the cache database (``llm_batches`` and
``llm_batch_requests``, through the journal, so durably) before and after the call that makes
it::

    preparing ─upload─▶ uploaded ─create─▶ submitted ─poll─▶ validating ▶ in_progress ▶ ...
        ▶ completed | expired | cancelled | failed ─collect─▶ collected

A rerun finds the parts that carry its keys and picks each up where it stopped: a part that
never got its file is given up (nothing was paid); one whose batch may have been created
without being recorded is looked up in the provider's batch list (by its metadata, or what the
service can tell it by); the rest are
polled. Only keys in no live part and not cached are submitted, so nothing is paid twice. A
create whose answer is lost (a timeout, a 5xx) is not blindly sent again either: the batch
list is asked first, and when it cannot answer the job stops.

When a batch ends, its output and error files are read whole before any answer is kept, since
a provider may be wrong in ways only the whole file shows:

- a ``custom_id`` answered twice the same way is taken once; answered twice differently,
  neither answer is trusted: the row is ``failed`` and says so (a rerun asks again);
- a line whose ``custom_id`` names no request of that batch is ignored, never cached under any
  key, and counted in one warning;
- the requests a batch did not answer (it expired, was cancelled, or said ``completed`` and
  left lines out) are submitted again, or sent live (``on_expired="live"``); a request is put
  in at most :data:`BATCH_ROUNDS` batches by one run, then its row is ``failed``;
- a batch that ended ``failed`` (the provider refused its file; nothing was paid) gives each
  of its rows the provider's reason, ``rejected`` when it named a line of the file as invalid,
  else ``failed``; it is not resubmitted by the same run;
- a line a reasoning model refused for its ``max_tokens`` (HTTP 400, asking for
  ``max_completion_tokens``, as a live request is refused) is submitted once more with
  ``max_completion_tokens`` instead, under the same key, and the model is remembered so that
  the job's later lines, and live requests, are built so from the start.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
)
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict
from typing import Any, TypeVar, cast

from .._cache import Cache
from .._dialects import BatchResult
from .._engine.answers import CompletionReader, Final, Retryable
from .._engine.boundary import one_line, redact
from .._engine.dispatcher import Dispatcher
from .._engine.engine import Engine
from .._key import build_request, canonical_json
from .._media import Unusable, unsent
from .._options import Job
from .._outcome import Outcome, Request
from .._pricing import SpendingCap
from .._schema import output_schema
from .._signals import stopped_by_signals
from .._telemetry import BatchSpans
from ..exceptions import ConfigError, JobInterruptedError
from .backend import Backend
from .batch_anthropic import AnthropicBatches
from .batch_gemini import GeminiBatches
from .batch_openai import OpenAIBatches
from .batch_service import (
    AnswerMayBeLost,
    BatchPart,
    BatchService,
    BatchView,
    LocalInputs,
    part_limits,
)

POLL_MAX = 60.0  # seconds between polls at the most
TERMINAL = ("completed", "expired", "cancelled", "failed")
BATCH_ROUNDS = 3  # batches one run puts a request in before its row fails unanswered
CREATE_ATTEMPTS = 4  # creates of one batch whose answer was lost, each after a lookup
OnOutcome = Callable[[Request, Outcome], Awaitable[None]]
T = TypeVar("T")

__all__ = ["BATCH_ROUNDS", "TERMINAL", "BatchPart", "BatchRunner", "service_for"]
Line = dict[str, Any]  # one line of a part's input, as its batch service keeps it

_log = logging.getLogger("llm_ops")


ServiceMaker = Callable[[Engine, LocalInputs], BatchService]
SERVICES: dict[str, ServiceMaker] = {
    "openai": lambda engine, _: OpenAIBatches(engine, engine.dialect),
    "anthropic": lambda engine, inputs: AnthropicBatches(engine, engine.dialect, inputs),
    "gemini": lambda engine, inputs: GeminiBatches(engine, engine.dialect, inputs),
}
"""The batch API of each dialect that has one, by the dialect's name."""


def service_for(engine: Engine, cache: Cache) -> BatchService:
    """The batch API the engine's endpoint speaks; :class:`ConfigError` when its dialect has
    none."""
    make = SERVICES.get(engine.dialect.name)
    if make is None:
        known = ", ".join(repr(name) for name in SERVICES)
        raise ConfigError(
            f"the {engine.dialect.name!r} dialect has no provider batches (batch mode speaks "
            f"{known}): use batch=False"
        )
    return make(engine, LocalInputs(cache.path))


class BatchRunner:
    """Sends one dispatch's requests as batches and collects their answers; it stands where a
    live :class:`~llm_ops._engine.dispatcher.Dispatcher` would (same ``run``, ``counters``,
    ``stop``)."""

    def __init__(self, job: Job, backend: Backend, *, budget: SpendingCap | None = None):
        """``budget``: the job's, shared with its other dispatches (else the job's own)."""
        assert job.batching is not None and backend.cache is not None
        self.job = job
        self.settings = job.batching
        self.cache: Cache = backend.cache
        self.engine = backend.engine
        self.service = service_for(backend.engine, backend.cache)
        # BatchMode's limits, or the provider's own (a ConfigError above them, before sending)
        self.requests_per_batch, self.bytes_per_batch = part_limits(self.settings, self.service)
        # The bodies, token projections and budget a live dispatch would have; answers are
        # read as a live dispatch reads them.
        self.live = Dispatcher(
            backend.engine,
            model=job.spec.model,
            params=job.spec.params,
            budget=job.budget() if budget is None else budget,
        )
        self.counters = self.live.counters
        self.budget = self.live.budget
        self.dialect = backend.engine.dialect
        self.reader = CompletionReader(
            self.counters,
            backend.engine.secrets,
            self.dialect,
            validate=job.spec.schema.validate if job.spec.schema else None,
        )
        self.remainder: list[Request] = []  # what an expired batch left, for live requests
        self.rounds: dict[str, int] = {}  # batches this runner put each request key in
        self.stray_lines = 0  # output lines naming no request of their batch, ignored
        # keys whose line the model refused for max_tokens, asking for max_completion_tokens
        self._refused_max_tokens: set[str] = set()
        self._stopping = False
        # a span per part, submitted (or resumed) to collected
        self.spans = BatchSpans(dialect=self.dialect.name, model=job.spec.model)

    def stop(self) -> None:
        """SIGTERM: stop waiting (the batches go on at the provider; a rerun collects them)."""
        self._stopping = True

    async def run(self, requests: Iterable[Request], on_outcome: OnOutcome) -> None:
        """Submit what no live batch carries, then wait for every batch carrying these
        requests and collect their answers, calling ``on_outcome`` for each."""
        wanted = {request.key: request for request in requests}
        with stopped_by_signals(self), self.provider_errors(), self.spans_ended():
            parts = await self.submit(wanted, on_outcome)
            await self.wait(parts, wanted, on_outcome)

    @contextmanager
    def spans_ended(self) -> Iterator[None]:
        """End the spans of the parts not collected when the block ends: submitted without
        waiting (``Client.submit``), or stopped (SIGTERM, an error; with the exception's name
        as ``error.type``). The batches go on at the provider; what collects them has spans
        of its own."""
        try:
            yield
        except BaseException as exc:
            self.spans.end_all(type(exc).__qualname__)
            raise
        self.spans.end_all(None)

    def provider_errors(self) -> AbstractContextManager[None]:
        """The batch API's errors, as one :class:`JobAbortedError` whose message hides the
        key (see :meth:`BatchService.errors`)."""
        return cast(AbstractContextManager[None], self.service.errors())

    # -- submitting ---------------------------------------------------------------------------

    async def submit(self, wanted: dict[str, Request], on_outcome: OnOutcome) -> list[BatchPart]:
        """The parts to wait for: those that already carry some of ``wanted`` (resumed where
        they stopped), and new ones for the rest."""
        recorded = await asyncio.to_thread(self.cache.batch_parts, keys=list(wanted))
        parts, covered = [], set()
        for row in recorded:
            part = BatchPart(**row)
            if part.state == "collected":
                continue
            if await self._resume(part):
                parts.append(part)
                covered.update(
                    await asyncio.to_thread(self.cache.batch_keys, part.job_id, part.part)
                )
        fresh = [request for key, request in wanted.items() if key not in covered]
        return parts + await self._submit(fresh, on_outcome)

    async def _submit(
        self,
        requests: list[Request],
        on_outcome: OnOutcome,
        *,
        again: Mapping[str, Line] | None = None,
        reserved: bool = False,
    ) -> list[BatchPart]:
        """New parts for ``requests``; those in ``again`` are sent as the lines they were
        first sent as (what their keys say), not rebuilt from this runner's job. ``reserved``:
        the budget counts them already (their first line was refused, not answered)."""
        lines: list[tuple[str, bytes, int]] = []  # key, line kept, bytes it sends
        for request in requests:
            line = (again or {}).get(request.key)
            if line is None:
                try:
                    messages = await request.sent_messages()
                except Unusable as exc:  # a file changed or went since the plan keyed it
                    why = f"{exc}; row not sent"
                    await on_outcome(request, Outcome(request.key, "rejected", error=why))
                    continue
                line = self.service.line(request.key, self.live.canonical(request, messages))
            encoded = json.dumps(line, ensure_ascii=False).encode() + b"\n"
            sent = self.service.sent_bytes(line, encoded)
            if sent > self.bytes_per_batch:  # no batch file could hold it
                why = (
                    f"its batch line is {sent:,} bytes, over a batch file's "
                    f"{self.bytes_per_batch:,} (BatchMode(bytes_per_batch=), or the provider's "
                    "limit); row not sent"
                )
                await on_outcome(request, Outcome(request.key, "rejected", error=why))
                continue
            expected = self.live.expected_tokens(request, self.live.estimate_tokens(request))
            if not reserved and self.budget is not None and not self.budget.reserve(*expected):
                self.counters.over_budget += 1
                await on_outcome(
                    request,
                    Outcome(
                        key=request.key,
                        status="skipped",
                        error=f"not sent: the budget stopped the job ({self.budget.exhausted})",
                    ),
                )
                continue
            self.rounds[request.key] = self.rounds.get(request.key, 0) + 1
            lines.append((request.key, encoded, sent))
        job_id = f"llmops-{uuid.uuid4().hex[:16]}"
        parts = []
        for number, chunk in enumerate(self._files(lines)):
            part = BatchPart(
                job_id, number, self.job.spec.endpoint, self.job.spec.model, len(chunk)
            )
            await self._record(part, keys=[key for key, _, _ in chunk])  # before it is paid
            content = b"".join(b for _, b, _ in chunk)
            self.spans.start(
                part.label,
                {
                    "llm_ops.batch.job_id": part.job_id,
                    "llm_ops.batch.part": part.part,
                    "llm_ops.batch.requests": part.requests,
                    "llm_ops.batch.bytes": sum(sent for _, _, sent in chunk),
                    "llm_ops.batch.resubmitted": again is not None,
                },
            )
            part.input_file_id = await self.engine.hosted(self.service.upload(part, content))
            part.state = "uploaded"
            await self._record(part)
            await self._create(part)
            self.counters.sent += part.requests
            parts.append(part)
        return parts

    def _files(self, lines: list[tuple[str, bytes, int]]) -> Iterator[list[tuple[str, bytes, int]]]:
        """``lines`` cut into batches within the provider's limits, by the bytes each sends."""
        chunk: list[tuple[str, bytes, int]] = []
        size = 0
        for key, line, sent in lines:
            if chunk and (
                len(chunk) >= self.requests_per_batch or size + sent > self.bytes_per_batch
            ):
                yield chunk
                chunk, size = [], 0
            chunk.append((key, line, sent))
            size += sent
        if chunk:
            yield chunk

    async def _create(self, part: BatchPart) -> None:
        """Create ``part``'s batch. When the answer is lost (a timeout, a dropped connection,
        a 5xx) the provider may have made the batch anyway: it is looked up by its metadata
        before the create is tried again, so it is never made (and paid for) twice; a lookup
        that fails stops the job."""
        assert part.input_file_id is not None
        for attempt in range(1, CREATE_ATTEMPTS + 1):
            try:
                part.batch_id = await self.engine.hosted(self.service.create(part))
                break
            except AnswerMayBeLost:
                part.batch_id = await self._find(part)
                if part.batch_id is not None:
                    break
                if attempt == CREATE_ATTEMPTS:
                    raise
                await asyncio.sleep(random.uniform(0.5, 1.0) * 2 ** (attempt - 1))
        part.state = "submitted"
        await self._record(part)
        self.spans.record(part.label, {"llm_ops.batch.id": part.batch_id})
        self.spans.event(part.label, "llm_ops.batch.submitted", {"llm_ops.batch.creates": attempt})

    async def _resume(self, part: BatchPart) -> bool:
        """Bring a recorded part to where it can be polled; ``False`` when it never got its
        file (nothing was paid for it; its keys are submitted again)."""
        self.spans.start(
            part.label,
            {
                "llm_ops.batch.job_id": part.job_id,
                "llm_ops.batch.part": part.part,
                "llm_ops.batch.requests": part.requests,
                "llm_ops.batch.id": part.batch_id,
                "llm_ops.batch.resumed": True,
            },
        )
        if part.batch_id is not None:
            return True
        found = await self._find(part)  # created, but the process died before recording it
        if found is not None:
            part.batch_id, part.state = found, "submitted"
            await self._record(part)
            self.spans.record(part.label, {"llm_ops.batch.id": found})
            return True
        if part.input_file_id is None:
            part.state = "collected"
            await self._record(part)
            self.spans.end(part.label, {"llm_ops.batch.state": "abandoned"})
            return False
        await self._create(part)
        return True

    async def _find(self, part: BatchPart) -> str | None:
        """The provider's batch for ``part``, by what it was created with."""
        recorded = await asyncio.to_thread(self.cache.batch_parts)
        taken = frozenset(
            str(row["batch_id"])
            for row in recorded
            if row["batch_id"] is not None
            and (row["job_id"], row["part"]) != (part.job_id, part.part)
        )
        return await self.engine.hosted(self.service.find(part, taken))

    async def _record(self, part: BatchPart, *, keys: list[str] | None = None) -> None:
        await asyncio.to_thread(self.cache.record_batch, asdict(part), keys=keys or ())

    async def resume(self, parts: list[BatchPart], on_outcome: OnOutcome) -> None:
        """Pick ``parts`` up where they stopped and collect them (with no job's frame at
        hand: answers go to the cache under the requests read back from the input files)."""
        with stopped_by_signals(self), self.provider_errors(), self.spans_ended():
            live = [p for p in parts if p.state != "collected" and await self._resume(p)]
            await self.wait(live, {}, on_outcome)

    async def refresh(self, part: BatchPart) -> None:
        """Ask the provider how ``part`` is doing (its counts), recording a new state."""
        if part.batch_id is None or part.state == "collected":
            return
        view = await self.engine.hosted(self.service.poll(part.batch_id))
        part.completed, part.failed = view.completed, view.failed
        if view.state != part.state and part.state not in TERMINAL:
            part.state = view.state
            part.output_file_id, part.error_file_id = view.output_file_id, view.error_file_id
            await self._record(part)

    async def cancel(self, part: BatchPart) -> None:
        """Cancel ``part``'s batch at the provider; what it answered is kept when collected."""
        if part.batch_id is not None and part.state not in (*TERMINAL, "collected"):
            view = await self.engine.hosted(self.service.cancel(part.batch_id))
            part.state = view.state
            await self._record(part)

    # -- waiting and collecting ---------------------------------------------------------------

    async def wait(
        self, parts: list[BatchPart], wanted: dict[str, Request], on_outcome: OnOutcome
    ) -> None:
        """Poll until every part is collected, backing off from ``poll_seconds`` to a
        minute; answers are collected as soon as their batch ends."""
        pending = [part for part in parts if part.state != "collected"]
        delay = self.settings.poll_seconds
        progressed: dict[str, int] = {}  # lines each part has answered, for progress
        while pending:
            if self._stopping:
                raise JobInterruptedError(
                    "the job was stopped by SIGTERM while its batches ran; they go on at the "
                    "provider, and a rerun collects them without submitting anything again"
                )
            for part in list(pending):
                assert part.batch_id is not None
                view = await self.engine.hosted(self.service.poll(part.batch_id))
                self.spans.polled(part.label)
                progressed[part.label] = view.completed + view.failed
                self.counters.done = sum(progressed.values())
                if view.state != part.state:
                    part.state = view.state
                    part.output_file_id = view.output_file_id
                    part.error_file_id = view.error_file_id
                    await self._record(part)
                    self.spans.event(
                        part.label,
                        "llm_ops.batch.state_changed",
                        {
                            "llm_ops.batch.state": view.state,
                            "llm_ops.batch.completed": view.completed,
                            "llm_ops.batch.failed": view.failed,
                        },
                    )
                if part.state in TERMINAL:
                    pending.remove(part)
                    pending += await self._collect(part, view, wanted, on_outcome)
            if pending:
                await asyncio.sleep(delay)
                delay = min(delay * 1.5, POLL_MAX)

    async def _collect(
        self, part: BatchPart, view: BatchView, wanted: dict[str, Request], on_outcome: OnOutcome
    ) -> list[BatchPart]:
        """Turn the part's output and error files into outcomes; what the batch did not
        answer is submitted again, kept for live requests, or failed (see the module's
        notes). Returns the parts submitted again."""
        lines = await self._lines_of(part)
        requests = {key: request for key, (request, _) in lines.items()}
        if self.reader.validate is None and requests:
            self.reader.validate = _validator(next(iter(requests.values())))
        outcomes = await self._results(part, requests)
        switched = self._with_max_completion_tokens(outcomes, lines)
        for key, outcome in outcomes.items():
            await self._settle(wanted.get(key, requests[key]), outcome, on_outcome)
        rest = [
            request
            for key, request in requests.items()
            if key not in outcomes and key not in switched
        ]
        again: list[BatchPart] = []
        if rest and part.state == "failed":  # the provider refused the file itself
            status, reason = view.failure or ("failed", "no reason given")
            reason = self._quoted(reason)
            hint = "fix the request and rerun" if status == "rejected" else "rerun to submit again"
            for request in rest:
                await self._settle(
                    wanted.get(request.key, request),
                    Outcome(
                        key=request.key,
                        status=status,
                        attempts=self.rounds.get(request.key, 1),
                        error=f"the batch {part.batch_id} failed ({reason}); nothing was paid "
                        f"for it: {hint}",
                    ),
                    on_outcome,
                )
        elif rest:
            again = await self._unanswered(part, rest, lines, wanted, on_outcome)
        if switched:
            again += await self._resend(switched, wanted, on_outcome)
        ended = part.state
        part.state = "collected"
        await self._record(part)
        await self.engine.hosted(self.service.discard(part))  # nothing reads its lines again
        answered = sum(outcome.status in ("ok", "truncated") for outcome in outcomes.values())
        self.spans.end(
            part.label,
            {
                "llm_ops.batch.state": ended,
                "llm_ops.batch.answered": answered,
                "llm_ops.batch.failed_lines": len(outcomes) - answered,
                "llm_ops.batch.unanswered": len(rest),
                "llm_ops.batch.resubmitted_requests": sum(p.requests for p in again),
            },
            error_type="failed" if ended == "failed" else None,
        )
        return again

    async def _results(self, part: BatchPart, requests: dict[str, Request]) -> dict[str, Outcome]:
        """The outcome of each request the part's files answer, read whole first: a request
        answered twice differently is failed, and lines for no request are only counted."""
        outcomes: dict[str, Outcome] = {}
        ambiguous: set[str] = set()
        stray = read = 0
        async for result in self._paged(self.service.results(part)):
            read += 1
            request = requests.get(result.key) if result.key is not None else None
            if request is None:
                stray += 1
                continue
            if result.unanswered:  # expired or cancelled: left for another batch
                continue
            outcome = self._outcome(request, result)
            outcome.attempts = self.rounds.get(request.key, 1)
            first = outcomes.setdefault(request.key, outcome)
            if first is not outcome and _answer(first) != _answer(outcome):
                ambiguous.add(request.key)
        for key in ambiguous:
            outcomes[key] = Outcome(
                key=key,
                status="failed",
                attempts=outcomes[key].attempts,
                error=f"the batch {part.batch_id} returned two different answers for this "
                "request, so neither was kept: rerun to ask again",
            )
        self.spans.record(part.label, {"llm_ops.batch.lines_read": read})
        self.spans.event(
            part.label,
            "llm_ops.batch.read_back",
            {"llm_ops.batch.lines_read": read, "llm_ops.batch.stray_lines": stray},
        )
        if stray:
            self.stray_lines += stray
            _log.warning(
                "the batch %s returned %d line(s) that name no request it was sent (an unknown "
                "custom_id, or not JSON); they were ignored",
                part.batch_id,
                stray,
            )
        return outcomes

    def _with_max_completion_tokens(
        self, outcomes: dict[str, Outcome], lines: dict[str, tuple[Request, Line]]
    ) -> dict[str, tuple[Request, Line]]:
        """Of ``outcomes``, those whose line the model refused for ``max_tokens`` and that
        carried it, taken out (they are not answers yet): each with its line rewritten to ask
        ``max_completion_tokens`` instead, as the live path resends one. The model is noted on
        the engine, so every body built from now on asks so (``Dispatcher.body``). A line
        already without ``max_tokens`` is not rewritten: its refusal stands, so a model that
        refuses both is not asked for ever."""
        switched = {}
        for key in [k for k in outcomes if k in self._refused_max_tokens]:
            self._refused_max_tokens.discard(key)
            request, line = lines[key]
            _, body = self.service.read_line(line)
            if "max_tokens" not in body:
                continue
            body.setdefault("max_completion_tokens", body["max_tokens"])
            del body["max_tokens"]
            self.engine.max_completion_tokens_models.add(str(body["model"]))
            del outcomes[key]
            switched[key] = (request, self.service.line(key, body))
        return switched

    async def _resend(
        self,
        switched: dict[str, tuple[Request, Line]],
        wanted: dict[str, Request],
        on_outcome: OnOutcome,
    ) -> list[BatchPart]:
        """A new part for the lines :meth:`_with_max_completion_tokens` rewrote. Not another
        send of the same request: nothing was answered, nor paid for."""
        requests = [wanted.get(key, request) for key, (request, _) in switched.items()]
        parts = await self._submit(
            requests,
            on_outcome,
            again={key: line for key, (_, line) in switched.items()},
            reserved=True,
        )
        self.counters.sent -= sum(part.requests for part in parts)
        for key in switched:  # nor another round: the rows' attempts stay what they were
            self.rounds[key] -= 1
        return parts

    async def _unanswered(
        self,
        part: BatchPart,
        rest: list[Request],
        lines: dict[str, tuple[Request, Line]],
        wanted: dict[str, Request],
        on_outcome: OnOutcome,
    ) -> list[BatchPart]:
        """What a batch that ended without answering ``rest`` leaves: they are submitted
        again (or kept for live requests, ``on_expired="live"``), unless they have been in
        :data:`BATCH_ROUNDS` batches already: then their rows fail, so a provider that never
        answers a line cannot keep a job going for ever."""
        how = {
            "expired": "expired",
            "cancelled": "was cancelled",
        }.get(part.state, "ended without answering it")
        retry = []
        for request in rest:
            rounds = self.rounds.get(request.key, 1)
            if rounds < BATCH_ROUNDS or self.settings.on_expired == "live":
                retry.append(request)
                continue
            await self._settle(
                wanted.get(request.key, request),
                Outcome(
                    key=request.key,
                    status="failed",
                    attempts=rounds,
                    error=f"no answer after {rounds} batches (the last, {part.batch_id}, {how}): "
                    "rerun to ask again, or pass on_expired='live' to send it live",
                ),
                on_outcome,
            )
        if self.settings.on_expired == "live":
            self.remainder += [wanted.get(r.key, r) for r in retry]
            return []
        if not retry:
            return []
        for request in retry:  # a part resumed from another run was this run's first round
            self.rounds.setdefault(request.key, 1)
        return await self._submit(retry, on_outcome, again={r.key: lines[r.key][1] for r in retry})

    def _quoted(self, message: str) -> str:
        """What the provider said, on one line and without the key, as the live path quotes
        an endpoint."""
        return one_line(redact(message, *self.engine.secrets))

    async def _settle(self, request: Request, outcome: Outcome, on_outcome: OnOutcome) -> None:
        self.counters.by_status[outcome.status] = self.counters.by_status.get(outcome.status, 0) + 1
        await on_outcome(request, outcome)

    async def _paged(self, pages: AsyncGenerator[list[T], None]) -> AsyncIterator[T]:
        """The items of ``pages`` (a generator of the batch service, reading on the engine's
        loop), fetched there a page at a time."""

        async def next_page() -> list[T] | None:
            return await anext(pages, None)

        try:
            while (page := await self.engine.hosted(next_page())) is not None:
                for item in page:
                    yield item
        finally:
            await self.engine.hosted(pages.aclose())

    async def _lines_of(self, part: BatchPart) -> dict[str, tuple[Request, Line]]:
        """The part's requests and their lines, read back from its input file, in its order:
        collecting needs nothing else, so it works in any process, for any job's batches."""
        assert part.input_file_id is not None
        requests = {}
        async for line in self._paged(self.service.input_lines(part.input_file_id)):
            item = json.loads(line)
            key, body = self.service.read_line(item)
            model, messages = body.pop("model"), body.pop("messages")
            request = build_request(
                endpoint=part.endpoint, model=model, messages=unsent(messages), params=body
            )
            requests[key] = (
                Request(key=key, messages=messages, request_json=canonical_json(request)),
                item,
            )
        return requests

    def _outcome(self, request: Request, result: BatchResult) -> Outcome:
        """One line of an output or error file, classified as a live answer would be."""
        status, body = result.status, result.body
        if status is None:
            message = result.error
            return Outcome(
                key=request.key,
                status="failed",
                attempts=1,
                error=self._quoted(f"the batch could not answer it: {message}"),
            )
        if status != 200:
            error = self.dialect.read_error(status, json.dumps(body).encode())
            if error.wants_max_completion_tokens:
                self._refused_max_tokens.add(request.key)
            return Outcome(
                key=request.key,
                status="rejected" if error.kind in ("credentials", "rejected") else "failed",
                error=self._quoted(f"HTTP {status}: {error.message or body}"),
                attempts=1,
                http_status=status,
            )
        try:
            outcome = self.reader.read(request, json.dumps(body).encode())
        except Retryable as exc:
            outcome = Outcome(key=request.key, status="failed", error=str(exc))
        except Final as exc:
            outcome = Outcome(key=request.key, status=exc.status, error=str(exc))
        outcome.attempts = 1
        return outcome


def _validator(request: Request) -> Callable[[str], str] | None:
    """Structured output's check, from a request's own ``response_format`` (collecting with
    no job at hand, say from the command line)."""
    response_format = json.loads(request.request_json).get("response_format") or {}
    if response_format.get("type") != "json_schema":
        return None
    return output_schema(response_format["json_schema"]["schema"]).validate


def _answer(outcome: Outcome) -> tuple[Any, ...]:
    """What two outcomes of one request must share to be the same answer."""
    return (outcome.status, outcome.text, outcome.json, outcome.stop_reason, outcome.error)
