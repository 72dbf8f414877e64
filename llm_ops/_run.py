"""Running one job in memory: dispatch the misses, persist answers, join back, report."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import polars as pl

from ._engine import STOPS, Counters, Dispatcher, Outcome, Request, make_pack
from ._job import Job, request_for
from ._key import canonical_json, normalize_base_url
from ._persist import CacheSink
from ._plan import ANSWERED, CACHEABLE, RESULT_SCHEMA, join_back, plan_frame, results_frame
from ._progress import TerminalDisplay, Tracker
from ._report import FAILED_STATUSES, STATUSES, RunReport
from ._savings import completion_cost, less_spent, tally, with_usage
from ._signals import graceful_sigterm
from ._similar import find_similar, follow_leaders
from .exceptions import JobAbortedError, RowsFailedError

T = TypeVar("T")


class AnswerSink:
    """Collects a dispatch's outcomes and writes its cacheable answers through to the cache."""

    def __init__(self, job: Job):
        self.job = job
        self.outcomes: list[Outcome] = []
        self.cache = None if job.cache is None else CacheSink(
            job.cache, merge_every=job.flush_every, merge_seconds=job.flush_seconds)
        self._endpoint = normalize_base_url(job.base_url)

    def add(self, request: Request, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if self.cache is None or outcome.status not in CACHEABLE:
            return
        self.cache.add("llm_cache", {
            "key": outcome.key, "model": self.job.model, "endpoint": self._endpoint,
            "request": request.request_json, "status": outcome.status,
            "response_text": outcome.text, "response_json": outcome.json,
            "finish_reason": outcome.finish_reason, "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
            "latency_ms": outcome.latency_ms, "attempts": outcome.attempts,
        })


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to completion from sync code, even inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        with graceful_sigterm():
            return asyncio.run(coroutine)
    # A notebook's loop is running in this thread: give the job a loop of its own.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="llm-ops") as pool:
        return pool.submit(asyncio.run, coroutine).result()


def requests_for(misses: pl.DataFrame, job: Job) -> Iterator[Request]:
    """One request per distinct miss, or packs of up to ``job.rows_per_request`` of them."""
    if job.rows_per_request > 1:  # packs share a system message
        misses = misses.sort("system", nulls_last=False)
    pack: list[Request] = []
    pack_system: str | None = None
    pack_chars = 0
    budget = (job.pack_tokens or 0) * 4  # about four characters a token
    for key, system, prompt, rows in misses.iter_rows():
        request = request_for(job, system, prompt)
        single = Request(key=key, messages=request["messages"],
                         request_json=canonical_json(request), rows=rows)
        if job.rows_per_request == 1:
            yield single
            continue
        full = len(pack) >= job.rows_per_request or (budget and pack_chars + len(prompt) > budget)
        if pack and (system != pack_system or full):
            yield make_pack(tuple(pack), pack_system)
            pack, pack_chars = [], 0
        pack.append(single)
        pack_system, pack_chars = system, pack_chars + len(prompt)
    if pack:
        yield make_pack(tuple(pack), pack_system)


@dataclass
class Dispatched:
    """What one dispatch produced: an outcome per request sent, the counters, and why it
    stopped early (one of :data:`~llm_ops._engine.STOPS`), if it did."""

    outcomes: list[Outcome]
    counters: Counters
    stopped: BaseException | None
    budget_stop: str | None = None


@dataclass
class Answered(Dispatched):
    """A dispatch behind the semantic cache: ``settled`` holds the misses answered by
    similarity (:data:`~llm_ops._plan.RESULT_SCHEMA`), ``outcomes`` the requests sent."""

    settled: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema=RESULT_SCHEMA))


async def answer_misses(misses: pl.DataFrame, job: Job, *, rows: int) -> Answered:
    """Answer the cache misses: by similarity where ``job.semantic`` allows, else by sending.

    Misses that follow another miss of the job (see :func:`~llm_ops._similar.find_similar`)
    wait for its answer; if it got none, they are sent themselves. ``rows`` is the job's row
    count, for progress.
    """
    if job.semantic is None:
        done = await dispatch(misses, job, rows=rows, rows_settled=rows - _rows(misses))
        return Answered(done.outcomes, done.counters, done.stopped, done.budget_stop)
    similar = await find_similar(misses, job)
    counters = similar.counters
    if similar.stopped is not None:  # the embeddings were refused: completions would be too
        return Answered([], counters, similar.stopped, settled=similar.results)
    done = await dispatch(similar.misses, less_spent(job, counters), rows=rows,
                          rows_settled=rows - _rows(similar.misses) - _rows(similar.followers))
    counters.add(done.counters)
    followed, resend = follow_leaders(similar.followers, done.outcomes)
    outcomes, stopped, budget_stop = done.outcomes, done.stopped, done.budget_stop
    if not resend.is_empty() and stopped is None:  # their leaders got no answer
        again = await dispatch(resend, less_spent(job, counters), rows=rows,
                               rows_settled=rows - _rows(resend))
        counters.add(again.counters)
        outcomes, stopped = outcomes + again.outcomes, again.stopped
        budget_stop = budget_stop or again.budget_stop
    return Answered(outcomes, counters, stopped, budget_stop,
                    settled=pl.concat([similar.results, followed]))


def _rows(requests: pl.DataFrame) -> int:
    return int(requests["rows"].sum())


async def dispatch(misses: pl.DataFrame, job: Job, *, rows: int, rows_settled: int) -> Dispatched:
    """Send ``misses`` (key, system, prompt, rows), writing answers through to the cache.

    ``rows`` and ``rows_settled`` are only for progress: the job's rows and those already final.
    """
    sink = AnswerSink(job)
    dispatcher = Dispatcher(
        base_url=job.base_url, api_key=job.api_key, model=job.model, params=job.params,
        settings=job.settings, validate=job.schema.validate if job.schema else None,
        repair=job.repair, budget=job.budget(), query=job.query,
    )
    tracker = Tracker(
        rows=rows, rows_settled=rows_settled, requests=misses.height, dispatcher=dispatcher
    )

    async def on_outcome(request: Request, outcome: Outcome) -> None:
        for member, answer in outcome.items or [(request, outcome)]:
            tracker.rows_done += member.rows
            sink.add(member, answer)

    helpers = [] if sink.cache is None else [asyncio.create_task(sink.cache.merge_periodically())]
    if job.progress is not None:
        helpers.append(asyncio.create_task(tracker.publish(job.progress)))
    stopped: BaseException | None = None
    try:
        await dispatcher.run(requests_for(misses, job), on_outcome)
    except STOPS as exc:
        # Refused or interrupted (Ctrl-C, SIGTERM): keep what was paid for; the caller reports.
        stopped = exc
    finally:
        for helper in helpers:
            helper.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        if isinstance(job.progress, TerminalDisplay):
            job.progress.close()
        if sink.cache is not None:
            await sink.cache.close()
    budget_stop = dispatcher.budget.exhausted if dispatcher.budget else None
    return Dispatched(outcomes=sink.outcomes, counters=dispatcher.counters, stopped=stopped,
                      budget_stop=budget_stop)


def make_report(
    job: Job, *, started_at: datetime, wall_seconds: float, rows: int, distinct: int,
    cache_hits: int, counters: Counters, statuses: dict[str, int], stopped: BaseException | None,
    budget_stop: str | None = None,
) -> RunReport:
    """The run report of a finished (or stopped) job; savings and models are added after."""
    if stopped is None:
        outcome = "completed"
    else:
        outcome = "aborted" if isinstance(stopped, JobAbortedError) else "interrupted"
    return RunReport(
        run_id=uuid.uuid4().hex[:12],
        started_at=started_at,
        finished_at=datetime.now(UTC),
        model=job.model,
        endpoint=normalize_base_url(job.base_url),
        rows=rows,
        distinct_requests=distinct,
        cache_hits=cache_hits,
        requests_sent=counters.sent,
        retries=counters.retries,
        statuses={s: statuses.get(s, 0) for s in STATUSES},
        prompt_tokens=counters.prompt_tokens,
        completion_tokens=counters.completion_tokens,
        wall_seconds=wall_seconds,
        outcome=outcome,
        error=str(stopped) if isinstance(stopped, JobAbortedError) else None,
        cost=completion_cost(job, counters),
        budget_stop=budget_stop,
    )


def status_counts(columns: pl.DataFrame, job: Job) -> dict[str, int]:
    counts = columns[job.status_column].value_counts()
    return {str(status): int(n) for status, n in counts.iter_rows()}


@dataclass
class Tier:
    """One model's pass over (some of) a job's rows: the new columns and what it took."""

    columns: pl.DataFrame
    report: RunReport  # not recorded: run_frame records the job's report
    row_keys: pl.DataFrame  # key per row
    results: pl.DataFrame  # RESULT_SCHEMA per distinct request
    stopped: BaseException | None


async def run_once(frame: pl.DataFrame, job: Job) -> Tier:
    """Plan, look up both cache tiers, send the misses and join back, for ``job.model``."""
    started_at = datetime.now(UTC)
    clock = time.perf_counter()
    plan = await asyncio.to_thread(plan_frame, frame, job)
    done = await answer_misses(plan.misses, job, rows=frame.height)
    results = results_frame([plan.hits, done.settled], done.outcomes)
    columns = await asyncio.to_thread(join_back, plan.row_keys, results, job)
    report = make_report(
        job, started_at=started_at, wall_seconds=time.perf_counter() - clock, rows=frame.height,
        distinct=plan.distinct.height, cache_hits=plan.hits.height, counters=done.counters,
        statuses=status_counts(columns, job), stopped=done.stopped,
        budget_stop=done.budget_stop,
    )
    answered = int(columns[job.status_column].cast(pl.String).is_in(ANSWERED).sum())
    report = with_usage(report, job, answered_rows=answered,
                        tallies=tally(plan.distinct, results, cache_hits=plan.hits["key"]),
                        counters=done.counters)
    return Tier(columns, report, plan.row_keys.select("key"), results, done.stopped)


def raise_failed_rows(columns: pl.DataFrame, job: Job) -> None:
    failed = (
        columns.with_row_index("row")
        .filter(pl.col(job.status_column).cast(pl.String).is_in(list(FAILED_STATUSES)))
    )
    raise RowsFailedError(
        failed["row"].to_list(),
        failed[job.error_column].fill_null("").to_list(),
        failed[job.status_column].cast(pl.String).to_list(),
    )


