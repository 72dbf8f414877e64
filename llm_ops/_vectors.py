"""Vectors for distinct texts, from the embedding cache or the endpoint.

Shared by :func:`llm_ops.llm_embed` and the semantic cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import polars as pl

from ._engine import STOPS, Batch, Counters, EmbeddingDispatcher, Outcome, Request
from ._job import Job
from ._key import (
    build_embedding_request,
    canonical_json,
    embedding_key_sql,
    normalize_base_url,
    request_key,
)
from ._persist import CacheSink
from ._plan import group_and_key
from ._progress import TerminalDisplay, Tracker


def distinct_texts(frame: pl.DataFrame, job: Job, column: str,
                   params: dict[str, Any]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per-row embedding keys (null for null text) and the distinct texts (key, prompt, rows)."""
    texts = frame.select(pl.col(column).cast(pl.String).alias("prompt"),
                         pl.lit(None, dtype=pl.String).alias("system"))
    expression, parameters = embedding_key_sql(endpoint=job.base_url, model=job.model,
                                               params=params)
    row_keys, grouped = group_and_key(
        texts, expression, parameters,
        lambda _, text: request_key(_request(job, text, params)), with_system=False,
    )
    return row_keys, grouped.select("key", "prompt", "rows")


def _request(job: Job, text: str, params: dict[str, Any]) -> dict[str, Any]:
    return build_embedding_request(endpoint=job.base_url, model=job.model, text=text,
                                   params=params)


def _batches(misses: pl.DataFrame, job: Job, params: dict[str, Any],
             size: int) -> Iterator[Request]:
    for number, chunk in enumerate(misses.iter_slices(size)):
        texts = chunk["prompt"].to_list()
        yield Batch(
            key=f"batch-{number}", messages=[], request_json="", rows=int(chunk["rows"].sum()),
            keys=tuple(chunk["key"].to_list()), inputs=tuple(texts),
            requests_json=tuple(canonical_json(_request(job, t, params)) for t in texts),
            input_rows=tuple(chunk["rows"].to_list()),
        )


@dataclass
class Embedded:
    """Vectors for distinct texts: one row per text (key, embedding, status, error)."""

    vectors: pl.DataFrame
    cache_hits: int
    counters: Counters
    stopped: BaseException | None


async def embed_distinct(distinct: pl.DataFrame, job: Job, params: dict[str, Any],
                         batch_size: int, *, rows: int | None = None,
                         rows_after: int = 0) -> Embedded:
    """Vectors for ``distinct`` (key, prompt, rows): from the cache, else from the endpoint,
    ``batch_size`` texts per request, written through to ``llm_embeddings``.

    ``rows`` (all the rows being embedded, for progress) turns on ``job.progress``;
    ``rows_after`` of them wait for later calls.
    """
    hits = pl.DataFrame(schema={"key": pl.String, "embedding": pl.List(pl.Float32)})
    if job.cache is not None and distinct.height:
        found = pl.from_arrow(job.cache.lookup_embeddings(distinct.select("key").to_arrow()))
        assert isinstance(found, pl.DataFrame)
        hits = found.select("key", pl.col("embedding").cast(pl.List(pl.Float32)))
    misses = distinct.join(hits.select("key"), on="key", how="anti")

    dispatcher = EmbeddingDispatcher(base_url=job.base_url, api_key=job.api_key, model=job.model,
                                     params=params, settings=job.settings, query=job.query)
    total = rows if rows is not None else int(distinct["rows"].sum())
    tracker = Tracker(rows=total, rows_settled=total - int(misses["rows"].sum()) - rows_after,
                      requests=-(-misses.height // batch_size), dispatcher=dispatcher,
                      phase="embedding")
    answered: list[tuple[str, list[float] | None, str, str | None]] = []
    sink = None if job.cache is None else CacheSink(
        job.cache, merge_every=job.flush_every, merge_seconds=job.flush_seconds)
    endpoint = normalize_base_url(job.base_url)

    async def on_outcome(request: Request, outcome: Outcome) -> None:
        for batch, result in outcome.items or [(request, outcome)]:  # split batches: halves
            assert isinstance(batch, Batch)
            tracker.rows_done += batch.rows
            vectors = result.vectors or [None] * len(batch.keys)  # type: ignore[list-item]
            share = result.prompt_tokens // max(1, len(batch.keys))
            for key, vector, request_json in zip(batch.keys, vectors, batch.requests_json,
                                                 strict=True):
                answered.append((key, vector, result.status, result.error))
                if vector is not None and sink is not None:
                    sink.add("llm_embeddings", {
                        "key": key, "model": job.model, "endpoint": endpoint,
                        "request": request_json, "dimensions": len(vector), "embedding": vector,
                        "prompt_tokens": share, "latency_ms": result.latency_ms})

    progress = job.progress if rows is not None else None
    helpers = [] if sink is None else [asyncio.create_task(sink.merge_periodically())]
    if progress is not None:
        helpers.append(asyncio.create_task(tracker.publish(progress)))
    stopped: BaseException | None = None
    try:
        await dispatcher.run(_batches(misses, job, params, batch_size), on_outcome)
    except STOPS as exc:
        stopped = exc
    finally:
        for helper in helpers:
            helper.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        if isinstance(progress, TerminalDisplay):
            progress.close()
        if sink is not None:
            await sink.close()

    fresh = pl.DataFrame(answered, schema={"key": pl.String, "embedding": pl.List(pl.Float32),
                                           "status": pl.String, "error": pl.String},
                         orient="row")
    vectors = pl.concat([hits.with_columns(status=pl.lit("cached"),
                                           error=pl.lit(None, pl.String)), fresh])
    return Embedded(vectors=vectors, cache_hits=hits.height, counters=dispatcher.counters,
                    stopped=stopped)
