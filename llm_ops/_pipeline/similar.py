"""The semantic cache: a second tier that reuses the answer of a *similar* cached request.

A request that misses the exact cache is embedded with the embedding model of
:class:`SemanticCache` (vectors are cached in ``llm_embeddings``). What is embedded is the column
values rendered into the user prompt, not the template's own words: every row of a job shares
those, and with them in the text, "Classify this title: Love it" and "Classify this title: Love"
look 94% alike. The template is part of the request's *scope* instead, with the endpoint, model,
system message and every parameter. Cached answers are candidates when they were indexed in
``llm_semantic_index`` by an earlier job with the semantic cache on, share the scope and have a
vector from the same embedding model. The most similar candidate is reused when its cosine
similarity reaches the threshold. Misses left over are compared with each other too: one within
the threshold of an earlier miss that is sent (a *leader*) waits for the leader's answer, and
is sent itself if the leader got none (:func:`follow_leaders`).

Vectors live in the cache database; the search reads the candidates of the batch's scopes from
DuckDB in Arrow batches and scores every miss against them at once with one matrix product per
block (numpy), about 30 times faster than ``array_cosine_similarity`` over a cross join on this
machine, and with memory bounded by the block sizes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
import polars as pl

from .._options import Job
from .._outcome import Counters, Outcome
from .._pricing import SpendingCap
from .._semantic import MISS_BLOCK, normalised, scope_of
from .._spec import EmbeddingSpec
from .._status import RESULTS
from .backend import Backend
from .dispatch import DispatchResult, Send, rows_of
from .plan import lookup_answers
from .savings import embedding_cost
from .vectors import distinct_texts, embed_distinct

_SLICE = 8_192  # misses embedded and searched together


_FOLLOWERS = pl.DataFrame(
    schema={"key": pl.String, "similar_to": pl.String, "similarity": pl.Float64}
)


async def answer_by_similarity(
    misses: pl.DataFrame, job: Job, backend: Backend, *, send: Send, budget: SpendingCap | None
) -> DispatchResult:
    """The misses answered by the semantic cache where a similar answer is found, the rest
    handed to ``send`` (the line's dispatch): ``settled`` holds the similar answers.

    Misses that follow another miss of the job (see :func:`find_similar`) wait for its answer;
    if it got none, they are sent themselves. The embeddings are paid from ``budget``, as the
    completions are.
    """
    similar = await find_similar(misses, job, backend)
    counters = similar.counters
    if similar.stopped is not None:  # the embeddings were refused: completions would be too
        return DispatchResult([], counters, similar.stopped, settled=similar.results)
    if budget is not None:
        spent = embedding_cost(job, counters) or 0.0
        budget.charge(spent, counters.embedding_requests, counters.embedding_tokens)
    result = DispatchResult([], counters, None, settled=similar.results)
    done = await send(similar.misses, rows_of(similar.followers))
    result.absorb(done)
    followed, resend = follow_leaders(similar.followers, done.outcomes)
    result.settled = pl.concat([result.settled, followed])
    if not resend.is_empty() and result.stopped is None:  # their leaders got no answer
        result.absorb(await send(resend, 0))
    return result


@dataclass
class Similar:
    """What the semantic tier did with a job's misses."""

    results: pl.DataFrame  # RESULTS: status "similar", with similar_to and similarity
    misses: pl.DataFrame  # the misses to send now (key, system, prompt, rows)
    followers: pl.DataFrame  # misses like one being sent: key, system, prompt, rows,
    # similar_to (that one's key), similarity; see follow_leaders
    counters: Counters  # embedding_requests and embedding_tokens
    stopped: BaseException | None


async def find_similar(misses: pl.DataFrame, job: Job, backend: Backend) -> Similar:
    """Embed the misses, reuse answers of similar cached requests, index the rest.

    Works through the misses a slice at a time, so memory holds one slice's vectors. The
    misses that are sent are indexed before they are sent, so their answers become candidates
    for later jobs as soon as they are cached.
    """
    assert job.semantic is not None
    spec = job.spec
    scopes = {
        system: scope_of(
            endpoint=spec.endpoint,
            model=spec.model,
            params=spec.params,
            system=system,
            template=spec.prompt.source,
        )
        for system in misses["system"].unique().to_list()
    }
    found, following = [pl.DataFrame(schema=RESULTS)], [_FOLLOWERS.clear()]
    counters, stopped = Counters(), None
    rows = rows_after = int(misses["rows"].sum())
    for part in misses.iter_slices(_SLICE):
        rows_after -= int(part["rows"].sum())
        results, followers, used, stopped = await _find_in_slice(
            part, job, backend, scopes, progress=(rows, rows_after)
        )
        found.append(results)
        following.append(followers)
        counters.add(Counters(embedding_requests=used.sent, embedding_tokens=used.prompt_tokens))
        if stopped is not None:
            break
    results, followers = pl.concat(found), pl.concat(following)
    followers = misses.join(followers, on="key")
    remaining = misses.join(
        pl.concat([results.select("key"), followers.select("key")]), on="key", how="anti"
    )
    return Similar(results, remaining, followers, counters, stopped)


async def _find_in_slice(
    misses: pl.DataFrame,
    job: Job,
    backend: Backend,
    scopes: dict[str | None, str],
    *,
    progress: tuple[int, int],
) -> tuple[pl.DataFrame, pl.DataFrame, Counters, BaseException | None]:
    semantic = job.semantic
    assert semantic is not None
    embedding = EmbeddingSpec(job.spec.endpoint, semantic.model, semantic.dimensions)
    values = misses.select(job.spec.prompt.values_in(pl.col("prompt")).alias("values"))
    row_keys, texts = distinct_texts(values, "values", embedding)
    embedded = await embed_distinct(
        texts,
        embedding,
        backend,
        inputs_per_request=semantic.inputs_per_request,
        progress=job.progress,
        rows=progress[0],
        rows_after=progress[1],
    )
    with_vectors = misses.with_columns(
        embedding_key=row_keys["key"],
        scope=pl.col("system").replace_strict(scopes, return_dtype=pl.String),
    ).join(
        embedded.vectors.filter(pl.col("embedding").is_not_null()).select(
            pl.col("key").alias("embedding_key"), "embedding"
        ),
        on="embedding_key",
        maintain_order="left",
    )
    cache = backend.cache
    assert cache is not None  # make_job refuses the semantic cache without one
    best = cache.nearest(with_vectors, embedding_model=semantic.model)
    matched = best.filter(pl.col("similarity") >= semantic.threshold)
    reused = lookup_answers(cache, matched.select(pl.col("similar_to").alias("key")))
    results = _similar_results(matched, reused)
    unmatched = with_vectors.join(results.select("key"), on="key", how="anti")
    await asyncio.to_thread(
        cache.index_for_similarity, unmatched.select("key", "scope", "embedding_key").to_dicts()
    )
    return (results, _followers(unmatched, semantic.threshold), embedded.counters, embedded.stopped)


def _similar_results(matched: pl.DataFrame, reused: pl.DataFrame) -> pl.DataFrame:
    """Result rows for the matched misses, carrying the reused answers and their provenance."""
    return _as_similar(
        matched.join(
            reused.select("key", "text", "json", "prompt_tokens", "completion_tokens"),
            left_on="similar_to",
            right_on="key",
        )
    )


def _as_similar(answers: pl.DataFrame) -> pl.DataFrame:
    """Rows of :data:`RESULTS` with status ``similar`` from key, similar_to, similarity
    and the reused answer's text, json and tokens."""
    return (
        answers.with_columns(
            status=pl.lit("similar"),
            error=pl.lit(None, pl.String),
            # the reused answer's thinking was over another prompt: not this row's
            reasoning=pl.lit(None, pl.String),
        )
        .select(list(RESULTS))
        .cast(RESULTS)
    )


def _followers(misses: pl.DataFrame, threshold: float) -> pl.DataFrame:
    """Misses near enough to another miss of the same job to take its answer: key, similar_to
    (the other's key) and similarity.

    Greedy, in order: a miss follows the most similar earlier miss that is itself sent (a
    leader), so every follower is within the threshold of the answer it gets, with no chains.
    """
    if misses.height < 2:
        return _FOLLOWERS.clear()
    dimensions = len(misses["embedding"][0])
    vectors = normalised(misses["embedding"].list.to_array(dimensions).to_numpy())
    scopes = misses["scope"].cast(pl.Categorical).to_physical().to_numpy()
    near: list[list[tuple[float, int]]] = [[] for _ in range(misses.height)]
    for start in range(0, misses.height, MISS_BLOCK):
        scores = vectors[start : start + MISS_BLOCK] @ vectors.T
        rows = np.arange(start, start + len(scores))[:, None]
        earlier_alike = (
            (np.arange(misses.height)[None, :] < rows)
            & (scopes[start : start + len(scores), None] == scopes[None, :])
            & (scores >= threshold)
        )
        for i, j in zip(*np.nonzero(earlier_alike), strict=True):
            near[start + i].append((float(scores[i, j]), int(j)))
    leader = np.zeros(misses.height, dtype=bool)
    follows: dict[int, tuple[int, float]] = {}
    for i, candidates in enumerate(near):
        best = max(((score, j) for score, j in candidates if leader[j]), default=None)
        if best is None:
            leader[i] = True
        else:
            follows[i] = (best[1], best[0])
    keys = misses["key"]
    return pl.DataFrame(
        {
            "key": [keys[i] for i in follows],
            "similar_to": [keys[j] for j, _ in follows.values()],
            "similarity": [min(score, 1.0) for _, score in follows.values()],
        },
        schema=_FOLLOWERS.schema,
    )


def follow_leaders(
    followers: pl.DataFrame, outcomes: list[Outcome]
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Followers whose leader was answered take its answer (status ``similar``); the others
    are returned to be sent themselves (key, system, prompt, rows), never given a failure."""
    answers = pl.DataFrame(
        [
            (o.key, o.text, o.json, o.prompt_tokens, o.completion_tokens)
            for o in outcomes
            if o.status == "ok"
        ],
        schema={
            "similar_to": pl.String,
            "text": pl.String,
            "json": pl.String,
            "prompt_tokens": pl.Int64,
            "completion_tokens": pl.Int64,
        },
        orient="row",
    )
    settled = _as_similar(followers.join(answers, on="similar_to"))
    resend = followers.join(settled.select("key"), on="key", how="anti").select(
        "key", "system", "prompt", "rows"
    )
    return settled, resend
