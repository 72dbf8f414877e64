"""The semantic cache's search: the nearest cached answer of each query, by cosine similarity
over the cached embeddings, read a block at a time."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import polars as pl

from .._semantic import CANDIDATE_BLOCK, MISS_BLOCK, normalised
from . import _reads
from ._connection import Place


def nearest(
    place: Place,
    queries: pl.DataFrame,
    *,
    embedding_model: str,
    since: datetime | None = None,
) -> pl.DataFrame:
    """The most similar indexed answer of each query in its scope, of those that came from
    ``since`` on (an older one is no answer to reuse: see ``Cache.max_age``).

    ``queries`` has ``key``, ``scope`` and ``embedding`` (a list of floats from
    ``embedding_model``); the result has ``key``, ``similar_to`` and ``similarity``, no
    threshold applied: the search a semantic cache runs for a job's misses."""
    schema = {"key": pl.String, "similar_to": pl.String, "similarity": pl.Float64}
    if queries.is_empty():
        return pl.DataFrame(schema=schema)
    dimensions = len(queries["embedding"][0])
    vectors = normalised(queries["embedding"].list.to_array(dimensions).to_numpy())
    codes = {scope: code for code, scope in enumerate(queries["scope"].unique().to_list())}
    query_scopes = np.asarray([codes[s] for s in queries["scope"].to_list()])
    best = np.full(len(vectors), -np.inf, dtype=np.float32)
    best_key = np.full(len(vectors), None, dtype=object)
    for batch in _reads.similar_candidates(
        place,
        list(codes),
        embedding_model=embedding_model,
        dimensions=dimensions,
        batch_rows=CANDIDATE_BLOCK,
        since=since,
    ):
        keys = np.asarray(batch.column("key").to_pylist(), dtype=object)
        scopes = np.asarray([codes[s] for s in batch.column("scope").to_pylist()])
        flat = batch.column("embedding").flatten().to_numpy(zero_copy_only=False)
        candidates = normalised(flat.reshape(len(keys), dimensions).astype(np.float32))
        for start in range(0, len(vectors), MISS_BLOCK):
            block = slice(start, start + MISS_BLOCK)
            scores = vectors[block] @ candidates.T
            scores[query_scopes[block, None] != scopes[None, :]] = -np.inf
            top = scores.argmax(axis=1)
            top_score = scores[np.arange(len(top)), top]
            better = top_score > best[block]
            best[block] = np.where(better, top_score, best[block])
            best_key[block] = np.where(better, keys[top], best_key[block])
    found = np.isfinite(best)
    return pl.DataFrame(
        {
            "key": queries["key"].filter(pl.Series(found)),
            "similar_to": best_key[found].tolist(),
            "similarity": np.minimum(best[found], 1.0).astype(np.float64),
        },
        schema=schema,
    )
