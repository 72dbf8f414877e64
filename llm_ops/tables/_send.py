"""Sending a table job's chunks: each through the pipeline (or as provider batches), its
answers to the cache as they arrive and every outcome to the chunk's results file."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import polars as pl

from .._cache import Cache
from .._client import Client
from .._options import Job
from .._outcome import Counters, Outcome, Request
from .._pipeline.batch import BatchPart, BatchRunner
from .._pipeline.dispatch import requests_for
from .._pipeline.line import answer_misses
from .._pipeline.plan import lookup_answers
from .._pipeline.savings import spent_by
from .._progress import ChunkedProgress
from .._status import CACHEABLE
from .._telemetry import record, span
from ._plan import OUTCOME_SCHEMA, TablePlan, chunk_sizes, results_path


def send_chunks(client: Client, job: Job, cache: Cache, plan: TablePlan) -> Counters:
    """Send every chunk of ``plan`` in this process, one after the other, under one progress
    line; returns what they took. In batch mode every chunk's batches are submitted first,
    so that they run at once."""
    if job.batching is not None:
        for chunk in plan.chunks:
            submit_chunk(client, job, cache, chunk)
    counters = Counters()
    progress = None
    if job.progress is not None and plan.chunks:
        progress = ChunkedProgress(job.progress, rows=plan.rows, chunks=chunk_sizes(plan.chunks))
        job = replace(job, progress=progress)
    try:
        for chunk in plan.chunks:
            taken = send_chunk(client, job, cache, chunk, spent=counters)
            counters.add(taken)
            if progress is not None:
                progress.chunk_done(taken)
    finally:
        if progress is not None:
            progress.close()
    return counters


def send_chunk(
    client: Client,
    job: Job,
    cache: Cache,
    chunk: str | os.PathLike[str],
    *,
    spent: Counters | None = None,
) -> Counters:
    """:meth:`Table.run_chunk`, with answers written through ``cache`` (a cluster worker's
    passes a store that only appends to the work directory: see :mod:`llm_ops.ray`).

    See the example of :class:`llm_ops.tables.WorkerStore`: a chunk sent as a worker sends it.
    """
    with span("llm_ops.chunk", {"llm_ops.chunk": Path(chunk).name}) as traced:
        misses = pl.read_parquet(Path(chunk))
        # Answered by an earlier attempt of this chunk: they count as answered in this run.
        earlier = lookup_answers(cache, misses).with_columns(
            pl.col("status").replace({"cached": "ok"})
        )
        remaining = misses.join(earlier.select("key"), on="key", how="anti")
        job = job.after(spent_by(job, spent)) if spent else job
        outcomes, counters = client.run(
            _answer(client, job, remaining, cache, rows=int(misses["rows"].sum()))
        )
        earlier = earlier.select("key", "status", "error").cast(pl.String)
        pl.concat([earlier, outcomes], how="diagonal_relaxed").select(
            list(OUTCOME_SCHEMA)
        ).write_parquet(results_path(chunk))
        record(
            traced,
            {
                "llm_ops.requests": misses.height,
                "llm_ops.cache_hits": earlier.height,  # answered by an earlier attempt
                "llm_ops.requests_sent": counters.sent,
                "llm_ops.retries": counters.retries,
                "llm_ops.rate_limited": counters.rate_limited,
                "llm_ops.concurrency": counters.concurrency,
            },
        )
        return counters


def submit_chunk(
    client: Client, job: Job, cache: Cache, chunk: str | os.PathLike[str]
) -> list[BatchPart]:
    """:meth:`Table.submit`: the chunk's requests that ``cache`` lacks, as provider batches."""
    misses = pl.read_parquet(Path(chunk))
    remaining = misses.join(lookup_answers(cache, misses).select("key"), on="key", how="anti")
    return client.run(_submit(client, job, remaining))


async def _answer(
    client: Client, job: Job, misses: pl.DataFrame, cache: Cache, *, rows: int
) -> tuple[pl.DataFrame, Counters]:
    """Answer ``misses`` (by similarity or by sending); outcomes as in a results file, and
    the counters."""
    backend = replace(await client.prepare(), cache=cache)
    with span("llm_ops.dispatch", {"llm_ops.requests": misses.height}):
        done = await answer_misses(misses, job, backend, rows=rows)
    if done.stopped is not None:
        raise done.stopped
    # Answers are read back from the cache; only what the cache does not keep is kept here.
    fresh = pl.DataFrame(
        {
            "key": [o.key for o in done.outcomes],
            "status": [o.status for o in done.outcomes],
            "error": [o.error for o in done.outcomes],
            "text": [None if o.status in CACHEABLE else o.text for o in done.outcomes],
        },
        schema={name: OUTCOME_SCHEMA[name] for name in ("key", "status", "error", "text")},
    )
    similar = done.settled.select(list(OUTCOME_SCHEMA))
    return pl.concat([similar, fresh], how="diagonal_relaxed"), done.counters


async def _submit(client: Client, job: Job, misses: pl.DataFrame) -> list[BatchPart]:
    wanted = {request.key: request for request in requests_for(misses, job)}

    async def not_sent(request: Request, outcome: Outcome) -> None:
        """A budget kept it from the batch; run_chunk says so in the results file."""

    return await BatchRunner(job, await client.prepare()).submit(wanted, not_sent)
