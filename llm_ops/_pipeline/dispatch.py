"""Dispatch: a job's uncached requests sent, and their answers written through to the cache.

Requests go out in the job's send order (:mod:`llm_ops._order`), built a distinct miss at a time
(:func:`requests_for`, packed when the packing lever is on), to a live
:class:`~llm_ops._engine.dispatcher.Dispatcher` or, in batch mode, a
:class:`~llm_ops._pipeline.batch.BatchRunner`; every answer is persisted as it arrives
(:mod:`llm_ops._pipeline.persist`). Requests another job sharing the cache claimed first are
waited for instead (:mod:`llm_ops._claims`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any

import polars as pl

from .._claims import Claims
from .._engine.dispatcher import Dispatcher
from .._in_place import in_place
from .._key import canonical_json
from .._media import Media, media_of, media_tokens, sent_bytes, sent_parts
from .._options import Job
from .._order import send_order
from .._outcome import Counters, InFlight, Outcome, Request, make_pack
from .._pricing import CHARS_PER_TOKEN, SpendingCap
from .._progress import Tracker
from .._status import RESULTS
from .backend import Backend
from .batch import BatchRunner
from .persist import AnswerSink, dispatch_durably
from .plan import lookup_answers


def requests_for(
    misses: pl.DataFrame,
    job: Job,
    claims: Claims | None = None,
    *,
    checked: frozenset[str] = frozenset(),
    refuse: Callable[[Request], bool] | None = None,
) -> Iterator[Request]:
    """One request per distinct miss, in the order given, or packs of up to
    ``rows_per_request`` of them (grouped by system message, which packs share). With
    ``claims``, only the misses this dispatch claimed (see :meth:`Claims.take`); with
    ``refuse``, only those it returns ``False`` for (it settles the others). A request with
    images or PDFs gets a :attr:`~llm_ops._outcome.Request.load` that reads them when it is
    sent (an estimate never calls it), and holds its bytes' share of one budget of media in
    flight (:class:`~llm_ops._outcome.InFlight`) while it is sent."""
    per_request = job.packing.rows_per_request
    if per_request > 1:
        misses = misses.sort("system", nulls_last=False, maintain_order=True)
    pack: list[Request] = []
    pack_system: str | None = None
    pack_chars = 0
    budget = (job.packing.pack_tokens or 0) * CHARS_PER_TOKEN
    distinct: Iterable[tuple[Any, ...]] = misses.iter_rows()
    if claims is not None:
        distinct = claims.take(distinct, key=itemgetter(0), checked=checked)
    spec = job.spec
    # the Binary media columns' values, where the plan attached them (see attach_bytes)
    carried = [int(c.rsplit("_", 1)[1]) for c in misses.columns if c.startswith("media_bytes_")]
    in_flight = InFlight() if spec.media else None
    for key, system, prompt, rows, *more in distinct:
        media = media_of(more[0]) if more and spec.media else []
        request = spec.request(system, prompt, media)
        single = Request(
            key=key,
            messages=request["messages"],
            request_json=canonical_json(request),
            rows=rows,
            media_tokens=media_tokens(media, spec.media, spec.model) if spec.media else 0,
        )
        if refuse is not None and refuse(single):
            continue
        if spec.media and media:
            inline = dict(zip(carried, more[1:], strict=True))
            single = replace(
                single,
                load=functools.partial(sent_messages, single.messages, media, spec.media, inline),
                media_bytes=sent_bytes(media, spec.media),
                in_flight=in_flight,
            )
        if per_request == 1:
            yield single
            continue
        full = len(pack) >= per_request or (budget and pack_chars + len(prompt) > budget)
        if pack and (system != pack_system or full):
            yield make_pack(tuple(pack), pack_system)
            pack, pack_chars = [], 0
        pack.append(single)
        pack_system, pack_chars = system, pack_chars + len(prompt)
    if pack:
        yield make_pack(tuple(pack), pack_system)


@in_place
def sent_messages(
    messages: list[dict[str, Any]],
    media: list[dict[str, Any]],
    spec: Media,
    inline: dict[int, bytes | None],
) -> list[dict[str, Any]]:
    """``messages`` as sent: the user message's keyed media parts (sha256 references) replaced
    by the parts that carry the bytes (see :func:`~llm_ops._media.sent_parts`)."""
    *before, user = messages
    text = user["content"][0]
    parts = sent_parts(media, spec, inline)
    return [*before, {**user, "content": [text, *parts]}]


@dataclass
class DispatchResult:
    """What one dispatch produced: an outcome per request sent, the counters, why it stopped
    early (one of :data:`~llm_ops._outcome.STOPS`), if it did, and in ``settled`` the misses
    answered without sending (:data:`~llm_ops._status.RESULTS`): by another job sharing the
    cache, which had claimed them first, or (see :class:`Answered`) by similarity."""

    outcomes: list[Outcome]
    counters: Counters
    stopped: BaseException | None
    budget_stop: str | None = None
    settled: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=RESULTS))

    def absorb(self, later: DispatchResult) -> None:
        """Take in what a later dispatch of the same job produced: its outcomes, counters and
        settled misses are added, and it says whether and why sending stopped."""
        self.outcomes += later.outcomes
        self.counters.add(later.counters)
        self.settled = pl.concat([self.settled, later.settled])
        self.stopped = later.stopped
        self.budget_stop = self.budget_stop or later.budget_stop


Send = Callable[[pl.DataFrame, int], Awaitable[DispatchResult]]
"""How a lever hands requests (``REQUESTS``) back to the line's dispatch, with the rows still
waiting on other requests (for progress): :func:`~llm_ops._pipeline.line.answer_misses` gives
one to the semantic cache."""


def rows_of(requests: pl.DataFrame) -> int:
    """The input rows waiting for ``requests`` (``REQUESTS``)."""
    return int(requests["rows"].sum())


async def dispatch(
    misses: pl.DataFrame,
    job: Job,
    backend: Backend,
    *,
    rows: int,
    rows_settled: int,
    budget: SpendingCap | None = None,
    checked: frozenset[str] = frozenset(),
) -> DispatchResult:
    """Send ``misses`` (``REQUESTS``) on the backend's engine, writing answers through to the
    cache, except those another job sharing the cache claimed first: their answers are
    waited for and taken from the cache, or sent here once that job is gone without one (see
    :mod:`llm_ops._claims`; ``checked``: keys looked up since their claimers went). ``rows``
    and ``rows_settled`` are only for progress: the job's rows and those already final;
    ``budget``: the job's, which every dispatch of it spends from (else the job's own)."""
    budget = job.budget() if budget is None else budget
    answers = AnswerSink(job, backend, claim=job.batching is None)
    try:
        done = await _send(misses, job, backend, answers, rows, rows_settled, budget, checked)
        if answers.claims is not None and answers.claims.deferred and done.stopped is None:
            await _settle_claimed_by_others(
                done, answers.claims, misses, job, backend, rows=rows, budget=budget
            )
    finally:
        if answers.claims is not None:
            answers.claims.close()
    return done


async def _settle_claimed_by_others(
    done: DispatchResult,
    claims: Claims,
    misses: pl.DataFrame,
    job: Job,
    backend: Backend,
    *,
    rows: int,
    budget: SpendingCap | None,
) -> None:
    """Wait for the misses other jobs claimed first: take their answers from the cache as they
    land, and send (into ``done``) those whose claimers went without answering."""
    assert backend.cache is not None
    pending = set(claims.deferred)
    delay = 0.05
    while pending and done.stopped is None:
        # who is gone first, then what landed: a claimer answers before it goes, if at all
        gone = pending - claims.held_by_others(pending)
        wanted = pl.DataFrame({"key": sorted(pending)}, schema={"key": pl.String})
        answered = await asyncio.to_thread(
            lookup_answers, backend.cache, wanted, reasoning=job.columns.reasoning
        )
        done.settled = pl.concat([done.settled, answered])
        pending.difference_update(answered["key"].to_list())
        free = frozenset(gone & pending)
        if free:
            pending -= free
            again = await dispatch(
                misses.filter(pl.col("key").is_in(pl.Series(list(free)).implode())),
                job,
                backend,
                rows=rows,
                rows_settled=rows - rows_of(misses),
                budget=budget,
                checked=free,
            )
            done.absorb(again)
        elif pending:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


async def _send(
    misses: pl.DataFrame,
    job: Job,
    backend: Backend,
    answers: AnswerSink,
    rows: int,
    rows_settled: int,
    budget: SpendingCap | None,
    checked: frozenset[str],
) -> DispatchResult:
    spec = job.spec
    sender: Dispatcher | BatchRunner
    if job.batching is not None:
        sender = BatchRunner(job, backend, budget=budget)
    else:
        sender = Dispatcher(
            backend.engine,
            model=spec.model,
            params=spec.params,
            validate=spec.schema.validate if spec.schema else None,
            repair=job.repair,
            budget=budget,
            # a row an earlier model of a cascade refuses goes on to the next one
            stop_when_refused_alike=spec.model == job.models[-1],
            cached=backend.cache is not None,
        )
    tracker = Tracker(
        rows=rows,
        rows_settled=rows_settled,
        requests=misses.height,
        counters=sender.counters,
        engine=backend.engine,
        phase="sending" if job.batching is None else "batch",
        price=job.price,
    )

    async def on_outcome(request: Request, outcome: Outcome) -> None:
        for member, answer in outcome.items or [(request, outcome)]:
            tracker.settled(member.rows, answer.status, answer.error)
            answers.keep(member, answer)

    def refuse(request: Request) -> bool:
        """Settle, unsent, a request whose answer the cache could not keep."""
        why = answers.unkeepable(request)
        if why is not None:
            tracker.settled(request.rows, "skipped", why)
            answers.keep(request, Outcome(key=request.key, status="skipped", error=why))
        return why is not None

    # Sorting a million misses takes seconds: not on the event loop. Packs take one run,
    # so members of a pack share a prefix too.
    lanes = 1 if job.packing.rows_per_request > 1 else backend.engine.concurrency.limit
    ordered = await asyncio.to_thread(send_order, misses, job.send_order, lanes=lanes)
    stopped = await dispatch_durably(
        sender,
        requests_for(ordered, job, answers.claims, checked=checked, refuse=refuse),
        on_outcome,
        cache_writer=answers.cache,
        tracker=tracker,
        progress=job.progress,
    )
    done = DispatchResult(
        outcomes=answers.outcomes,
        counters=sender.counters,
        stopped=stopped,
        budget_stop=sender.budget.exhausted if sender.budget else None,
    )
    if isinstance(sender, BatchRunner) and sender.remainder and stopped is None:
        # on_expired="live": what the expired batches did not answer is sent now
        keys = pl.Series([request.key for request in sender.remainder])
        live = await dispatch(
            misses.filter(pl.col("key").is_in(keys.implode())),
            replace(job, batching=None),
            backend,
            rows=rows,
            rows_settled=rows - int(misses["rows"].sum()),
            budget=None if budget is None else replace(budget, price=job.live_price),
        )
        done.absorb(live)
    return done
