"""Batch administration: the provider batches recorded in the cache, submitted without
waiting for them, listed, asked about, collected and cancelled (``Client.submit``,
``Client.batches`` and the rest, ``llm-ops batches``). A job in batch mode that waits for its
batches runs them through :mod:`llm_ops._pipeline.dispatch` instead."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import polars as pl

from .._cache import Cache
from .._config import BatchMode
from .._options import Job, make_job
from .._outcome import Outcome, Request
from .backend import Backend
from .batch import BatchRunner
from .batch_service import BatchPart
from .dispatch import requests_for
from .persist import AnswerSink
from .plan import plan_frame

PartAction = Callable[[BatchRunner, BatchPart], Awaitable[None]]


async def submit(frame: pl.DataFrame, job: Job, backend: Backend) -> list[BatchPart]:
    """Submit the job's distinct uncached requests as provider batches, recorded in the cache,
    without waiting for them; the parts submitted."""
    plan = await asyncio.to_thread(plan_frame, frame, job.spec, backend.cache)
    wanted = {request.key: request for request in requests_for(plan.misses, job)}

    async def not_sent(request: Request, outcome: Outcome) -> None:
        """A budget kept it from the batch; the rows say so when the job is collected."""

    runner = BatchRunner(job, backend)
    with runner.spans_ended():  # a part's span ends when submitted: nothing here waits for it
        return await runner.submit(wanted, not_sent)


def recorded(cache: Cache | None, *, job_id: str | None = None) -> list[BatchPart]:
    """The batch parts recorded in ``cache`` (of one submission, or all), as last seen."""
    if cache is None:
        return []
    return [BatchPart(**row) for row in cache.batch_parts(job_id=job_id)]


async def collect(parts: list[BatchPart], backend: Backend, *, poll_seconds: float) -> int:
    """Wait for ``parts`` and stream their answers into the cache, model by model; how many
    requests were collected."""
    collected = 0
    for model in sorted({part.model for part in parts}):
        same = [part for part in parts if part.model == model]
        runner = runner_for(model, same[0].endpoint, backend, poll_seconds=poll_seconds)
        answers = AnswerSink(runner.job, backend)

        async def keep(request: Request, outcome: Outcome, answers: AnswerSink = answers) -> None:
            answers.keep(request, outcome)

        try:
            await runner.resume(same, keep)
        finally:
            if answers.cache is not None:
                await answers.cache.close()
        collected += len(answers.outcomes)
    return collected


async def each(parts: list[BatchPart], endpoint: str, backend: Backend, action: PartAction) -> None:
    """Ask the provider to ``action`` (``BatchRunner.refresh``, ``BatchRunner.cancel``) each
    of ``parts``, its errors as one :class:`~llm_ops.JobAbortedError`."""
    runner = runner_for("any", endpoint, backend)
    with runner.provider_errors():
        for part in parts:
            await action(runner, part)


def runner_for(
    model: str, endpoint: str, backend: Backend, *, poll_seconds: float = 5.0
) -> BatchRunner:
    """A runner for batches made by any job: only the model and endpoint matter to
    collecting them (the requests are read back from the batches' input files)."""
    job = make_job(
        prompt="{unused}",
        model=model,
        endpoint=endpoint,
        cached=True,
        options={"batch": BatchMode(poll_seconds=poll_seconds), "progress": False},
    )
    return BatchRunner(job, backend)
