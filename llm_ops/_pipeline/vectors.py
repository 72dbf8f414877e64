"""Vectors for distinct texts, from the embedding cache or the endpoint.

Shared by :func:`llm_ops.llm_embed` and the semantic cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import polars as pl

from .._engine.dispatcher import EmbeddingDispatcher
from .._in_place import in_place
from .._key import canonical_json
from .._outcome import Counters, EmbeddingsRequest, Outcome, Request
from .._progress import ProgressCallback, Tracker
from .._spec import EmbeddingSpec
from .._template import render
from .backend import Backend
from .persist import CacheSink, dispatch_durably
from .plan import group_and_key


@in_place
def distinct_texts(
    frame: pl.DataFrame, column: str, spec: EmbeddingSpec
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per-row embedding keys (null for null text) and the distinct texts (key, prompt, rows).

    ``column`` is rendered as a prompt's column is (:func:`~llm_ops._template.render`), so its
    keys do not depend on its time unit either.
    """
    texts = frame.select(
        render(column, frame.schema[column], used_by="llm_embed").alias("prompt"),
        pl.lit(None, dtype=pl.String).alias("system"),
    )
    expression, parameters = spec.key_sql()
    row_keys, grouped = group_and_key(texts, expression, parameters, spec)
    return row_keys, grouped.select("key", "prompt", "rows")


def _embedding_requests(misses: pl.DataFrame, spec: EmbeddingSpec, size: int) -> Iterator[Request]:
    for number, chunk in enumerate(misses.iter_slices(size)):
        texts = chunk["prompt"].to_list()
        yield EmbeddingsRequest(
            key=f"batch-{number}",
            messages=[],
            request_json="",
            rows=int(chunk["rows"].sum()),
            keys=tuple(chunk["key"].to_list()),
            inputs=tuple(texts),
            requests_json=tuple(canonical_json(spec.request(t)) for t in texts),
            input_rows=tuple(chunk["rows"].to_list()),
        )


@dataclass
class Embedded:
    """Vectors for distinct texts: one row per text (key, embedding, status, error)."""

    vectors: pl.DataFrame
    cache_hits: int
    counters: Counters
    stopped: BaseException | None


async def embed_distinct(
    distinct: pl.DataFrame,
    spec: EmbeddingSpec,
    backend: Backend,
    *,
    inputs_per_request: int,
    progress: ProgressCallback | None = None,
    rows: int | None = None,
    rows_after: int = 0,
) -> Embedded:
    """Vectors for ``distinct`` (key, prompt, rows): from the cache, else from the endpoint,
    ``inputs_per_request`` texts per request, written through to ``llm_embeddings``.

    ``rows`` (all the rows being embedded, for progress) turns on ``progress``;
    ``rows_after`` of them wait for later calls.
    """
    hits = pl.DataFrame(schema={"key": pl.String, "embedding": pl.List(pl.Float32)})
    if backend.cache is not None and distinct.height:
        found = pl.from_arrow(backend.cache.lookup_embeddings(distinct.select("key").to_arrow()))
        assert isinstance(found, pl.DataFrame)
        hits = found.select("key", pl.col("embedding").cast(pl.List(pl.Float32)))
    misses = distinct.join(hits.select("key"), on="key", how="anti")

    dispatcher = EmbeddingDispatcher(
        backend.engine, model=spec.model, params=spec.params, cached=backend.cache is not None
    )
    total = rows if rows is not None else int(distinct["rows"].sum())
    tracker = Tracker(
        rows=total,
        rows_settled=total - int(misses["rows"].sum()) - rows_after,
        requests=-(-misses.height // inputs_per_request),
        counters=dispatcher.counters,
        engine=backend.engine,
        phase="embedding",
    )
    answered: list[tuple[str, list[float] | None, str, str | None]] = []
    cache_writer = (
        None
        if backend.cache is None
        else CacheSink(backend.cache, merge_at_close=not backend.settles)
    )

    async def on_outcome(request: Request, outcome: Outcome) -> None:
        for sent, result in outcome.items or [(request, outcome)]:  # a split request: its halves
            assert isinstance(sent, EmbeddingsRequest)
            tracker.rows_done += sent.rows
            vectors = result.vectors or [None] * len(sent.keys)  # type: ignore[list-item]
            share = result.prompt_tokens // max(1, len(sent.keys)) if result.usage_known else None
            for key, vector, request_json in zip(
                sent.keys, vectors, sent.requests_json, strict=True
            ):
                answered.append((key, vector, result.status, result.error))
                if vector is not None and cache_writer is not None:
                    cache_writer.vector(
                        {
                            "key": key,
                            "model": spec.model,
                            "endpoint": spec.endpoint,
                            "request": request_json,
                            "dimensions": len(vector),
                            "embedding": vector,
                            "prompt_tokens": share,
                            "latency_ms": result.latency_ms,
                        }
                    )

    stopped = await dispatch_durably(
        dispatcher,
        _embedding_requests(misses, spec, inputs_per_request),
        on_outcome,
        cache_writer=cache_writer,
        tracker=tracker,
        progress=progress if rows is not None else None,
    )

    fresh = pl.DataFrame(
        answered,
        schema={
            "key": pl.String,
            "embedding": pl.List(pl.Float32),
            "status": pl.String,
            "error": pl.String,
        },
        orient="row",
    )
    vectors = pl.concat(
        [hits.with_columns(status=pl.lit("cached"), error=pl.lit(None, pl.String)), fresh]
    )
    return Embedded(
        vectors=vectors, cache_hits=hits.height, counters=dispatcher.counters, stopped=stopped
    )
