"""One pass of a job over a frame, for one model: the pipeline.

::

    plan ─▶ cache lookup ─▶ dispatch ─▶ persist ─▶ join back ─▶ report
    (_plan)  (_cache)       (_engine)   (_persist) (_join)      (_report)

Levers sit beside the path: packing shapes the requests (:mod:`llm_ops._pack`), the semantic
cache answers misses by similarity before they are sent (:mod:`llm_ops._similar`), budgets
stop sending (:mod:`llm_ops._pricing`), and a cascade runs passes model after model
(:mod:`llm_ops._cascade`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

import polars as pl

from ._backend import Backend
from ._batch import BatchRunner
from ._claims import Claims
from ._dispatcher import Dispatcher
from ._join import join_back, results_frame, status_counts
from ._key import canonical_json
from ._options import Job
from ._order import send_order
from ._outcome import Counters, Outcome, Request, make_pack
from ._persist import CacheSink, dispatch_durably
from ._plan import lookup_answers, plan_frame
from ._pricing import CHARS_PER_TOKEN
from ._progress import Tracker
from ._report import RunReport, make_report
from ._savings import completion_cost, spent_by, tally, with_usage
from ._similar import find_similar, follow_leaders
from ._status import ANSWERED, CACHEABLE, RESULTS


class AnswerSink:
    """Collects a dispatch's outcomes and writes its cacheable answers through to the cache;
    with ``claim``, it claims each request before it is sent (see :mod:`llm_ops._claims`)."""

    def __init__(self, job: Job, backend: Backend, *, claim: bool = False):
        self.model = job.spec.model
        self.endpoint = job.spec.endpoint
        self.outcomes: list[Outcome] = []
        self.cache = (
            None
            if backend.cache is None
            else CacheSink(backend.cache, merge_at_close=not backend.settles)
        )
        self.claims = (
            Claims(backend.cache.journal, self.cache.writer.id)
            if claim and self.cache is not None and backend.cache is not None
            else None
        )

    def add(self, request: Request, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if self.cache is None or outcome.status not in CACHEABLE:
            return
        self.cache.answer(
            {
                "key": outcome.key,
                "model": self.model,
                "endpoint": self.endpoint,
                "request": request.request_json,
                "status": outcome.status,
                "response_text": outcome.text,
                "response_json": outcome.json,
                "finish_reason": outcome.finish_reason,
                # unknown usage (tokens the endpoint reported that cannot be right): NULL
                "prompt_tokens": outcome.prompt_tokens if outcome.usage_known else None,
                "completion_tokens": outcome.completion_tokens if outcome.usage_known else None,
                "cached_tokens": outcome.cached_tokens if outcome.usage_known else None,
                "latency_ms": outcome.latency_ms,
                "attempts": outcome.attempts,
            }
        )


def requests_for(
    misses: pl.DataFrame,
    job: Job,
    claims: Claims | None = None,
    *,
    checked: frozenset[str] = frozenset(),
) -> Iterator[Request]:
    """One request per distinct miss, in the order given, or packs of up to
    ``rows_per_request`` of them (grouped by system message, which packs share). With
    ``claims``, only the misses this dispatch claimed (see :meth:`Claims.take`)."""
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
    for key, system, prompt, rows in distinct:
        request = job.spec.request(system, prompt)
        single = Request(
            key=key, messages=request["messages"], request_json=canonical_json(request), rows=rows
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


@dataclass
class Dispatched:
    """What one dispatch produced: an outcome per request sent, the counters, why it stopped
    early (one of :data:`~llm_ops._outcome.STOPS`), if it did, and in ``settled`` the misses
    answered without sending (:data:`~llm_ops._status.RESULTS`): by another job sharing the
    cache, which had claimed them first, or (see :class:`Answered`) by similarity."""

    outcomes: list[Outcome]
    counters: Counters
    stopped: BaseException | None
    budget_stop: str | None = None
    settled: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=RESULTS))


@dataclass
class Answered(Dispatched):
    """A dispatch behind the semantic cache."""


async def answer_misses(misses: pl.DataFrame, job: Job, backend: Backend, *, rows: int) -> Answered:
    """Answer the cache misses: by similarity where ``job.semantic`` allows, else by sending.

    Misses that follow another miss of the job (see :func:`~llm_ops._similar.find_similar`)
    wait for its answer; if it got none, they are sent themselves. ``rows`` is the job's row
    count, for progress.
    """
    if not misses.is_empty():  # every model a miss may reach, before the first is sent
        semantic = () if job.semantic is None else (job.semantic.model,)
        await backend.engine.check_models((*job.models, *semantic))
    if job.semantic is None:
        done = await dispatch(misses, job, backend, rows=rows, rows_settled=rows - _rows(misses))
        return Answered(done.outcomes, done.counters, done.stopped, done.budget_stop, done.settled)
    similar = await find_similar(misses, job, backend)
    counters = similar.counters
    if similar.stopped is not None:  # the embeddings were refused: completions would be too
        return Answered([], counters, similar.stopped, settled=similar.results)
    done = await dispatch(
        similar.misses,
        job.after(spent_by(job, counters)),
        backend,
        rows=rows,
        rows_settled=rows - _rows(similar.misses) - _rows(similar.followers),
    )
    counters.add(done.counters)
    followed, resend = follow_leaders(similar.followers, done.outcomes)
    outcomes, stopped, budget_stop = done.outcomes, done.stopped, done.budget_stop
    settled = [similar.results, followed, done.settled]
    if not resend.is_empty() and stopped is None:  # their leaders got no answer
        again = await dispatch(
            resend,
            job.after(spent_by(job, counters)),
            backend,
            rows=rows,
            rows_settled=rows - _rows(resend),
        )
        counters.add(again.counters)
        outcomes, stopped = outcomes + again.outcomes, again.stopped
        budget_stop = budget_stop or again.budget_stop
        settled.append(again.settled)
    return Answered(outcomes, counters, stopped, budget_stop, settled=pl.concat(settled))


def _rows(requests: pl.DataFrame) -> int:
    return int(requests["rows"].sum())


async def dispatch(
    misses: pl.DataFrame,
    job: Job,
    backend: Backend,
    *,
    rows: int,
    rows_settled: int,
    checked: frozenset[str] = frozenset(),
) -> Dispatched:
    """Send ``misses`` (``REQUESTS``) on the backend's engine, writing answers through to the
    cache, except those another job sharing the cache claimed first: their answers are
    waited for and taken from the cache, or sent here once that job is gone without one (see
    :mod:`llm_ops._claims`; ``checked``: keys looked up since their claimers went). ``rows``
    and ``rows_settled`` are only for progress: the job's rows and those already final."""
    sink = AnswerSink(job, backend, claim=job.batching is None)
    try:
        done = await _send(misses, job, backend, sink, rows, rows_settled, checked)
        if sink.claims is not None and sink.claims.deferred and done.stopped is None:
            await _after_others(done, sink.claims, misses, job, backend, rows=rows)
    finally:
        if sink.claims is not None:
            sink.claims.close()
    return done


async def _after_others(
    done: Dispatched, claims: Claims, misses: pl.DataFrame, job: Job, backend: Backend, *, rows: int
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
        answered = await asyncio.to_thread(lookup_answers, backend.cache, wanted)
        done.settled = pl.concat([done.settled, answered])
        pending.difference_update(answered["key"].to_list())
        free = frozenset(gone & pending)
        if free:
            pending -= free
            again = await dispatch(
                misses.filter(pl.col("key").is_in(pl.Series(list(free)).implode())),
                job.after(spent_by(job, done.counters)),
                backend,
                rows=rows,
                rows_settled=rows - _rows(misses),
                checked=free,
            )
            done.outcomes += again.outcomes
            done.counters.add(again.counters)
            done.settled = pl.concat([done.settled, again.settled])
            done.stopped = again.stopped
            done.budget_stop = done.budget_stop or again.budget_stop
        elif pending:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


async def _send(
    misses: pl.DataFrame,
    job: Job,
    backend: Backend,
    sink: AnswerSink,
    rows: int,
    rows_settled: int,
    checked: frozenset[str],
) -> Dispatched:
    spec = job.spec
    sender: Dispatcher | BatchRunner
    if job.batching is not None:
        sender = BatchRunner(job, backend)
    else:
        sender = Dispatcher(
            backend.engine,
            model=spec.model,
            params=spec.params,
            validate=spec.schema.validate if spec.schema else None,
            repair=job.repair,
            budget=job.budget(),
        )
    tracker = Tracker(
        rows=rows,
        rows_settled=rows_settled,
        requests=misses.height,
        counters=sender.counters,
        engine=backend.engine,
        phase="sending" if job.batching is None else "batch",
    )

    async def on_outcome(request: Request, outcome: Outcome) -> None:
        for member, answer in outcome.items or [(request, outcome)]:
            tracker.rows_done += member.rows
            sink.add(member, answer)

    # Sorting a million misses takes seconds: not on the event loop. Packs take one run,
    # so members of a pack share a prefix too.
    lanes = 1 if job.packing.rows_per_request > 1 else backend.engine.limits.concurrency
    ordered = await asyncio.to_thread(send_order, misses, job.send_order, lanes=lanes)
    stopped = await dispatch_durably(
        sender,
        requests_for(ordered, job, sink.claims, checked=checked),
        on_outcome,
        sink=sink.cache,
        tracker=tracker,
        progress=job.progress,
    )
    done = Dispatched(
        outcomes=sink.outcomes,
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
        )
        done.outcomes += live.outcomes
        done.counters.add(live.counters)
        done.stopped = live.stopped
    return done


@dataclass
class Tier:
    """One model's pass over (some of) a job's rows: the new columns and what it took."""

    columns: pl.DataFrame
    report: RunReport  # not recorded: the caller records the job's report
    row_keys: pl.DataFrame  # key per row
    results: pl.DataFrame  # RESULTS per distinct request
    stopped: BaseException | None


async def run_once(frame: pl.DataFrame, job: Job, backend: Backend) -> Tier:
    """Plan, look up both cache tiers, send the misses and join back, for ``job.spec.model``."""
    started_at = datetime.now(UTC)
    clock = time.perf_counter()
    plan = await asyncio.to_thread(plan_frame, frame, job.spec, backend.cache)
    done = await answer_misses(plan.misses, job, backend, rows=frame.height)
    results = results_frame([plan.hits, done.settled], done.outcomes)
    # answers another job sharing the cache sent while this one waited are cache hits too
    hits = pl.concat([plan.hits, done.settled.filter(pl.col("status") != "similar")])
    columns = await asyncio.to_thread(
        join_back, plan.groups, results, job.columns, job.spec.schema, row_group=plan.row_group
    )
    statuses = status_counts(columns, job.columns)
    report = make_report(
        model=job.spec.model,
        endpoint=job.spec.endpoint,
        started_at=started_at,
        wall_seconds=time.perf_counter() - clock,
        rows=frame.height,
        distinct=plan.distinct.height,
        cache_hits=hits.height,
        counters=done.counters,
        statuses=statuses,
        stopped=done.stopped,
        cost=completion_cost(job, done.counters),
        budget_stop=done.budget_stop,
        cache=backend.cache.path if backend.cache else None,
    )
    answered = sum(n for status, n in statuses.items() if status in ANSWERED)
    report = with_usage(
        report,
        job,
        answered_rows=answered,
        cached=backend.cache is not None,
        tallies=tally(plan.distinct, results, cache_hits=hits["key"]),
        counters=done.counters,
    )
    row_keys = plan.groups.select("key").gather(plan.row_group)
    return Tier(columns, report, row_keys, results, done.stopped)
