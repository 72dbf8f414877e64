"""Cost levers: the semantic cache and a model cascade, against the hand-written loop.

    python benchmarks/levers.py [--rows N] [--hard-share 0.15] [--threshold 0.95]

Prints two markdown tables; requests and tokens are what the local endpoint received, and costs
use list prices, passed as ``pricing=`` (the simulator's models are free by default): "sim-small"
is priced as gpt-4o-mini, "sim" as gpt-4o and "sim-embed" as text-embedding-3-small.

1. **Semantic cache** on real data: the review *titles* of ``data/``, where the same title
   often comes back with other casing or punctuation ("Love it!", "love it", "Love it!!").
   Yesterday's job takes the first half of the rows and today's job the second, on one cache
   file: with the exact cache only, then (on a fresh file) with the semantic cache on, which
   also sends near-duplicates within a job once. The baseline sends every row of both days.
2. **Cascade** on review texts, a share of them marked hard for the small model (its answer
   then starts with ``unsure:``, which the ``escalate`` rule catches). The baseline sends every
   row to the large model; llm_ops runs the large model alone, then the cascade.
3. **Similarity search at scale**: random vectors for cached answers and misses in one scope,
   searched by llm_ops (candidates read from DuckDB in batches, scored by blocked matrix
   products), and, for the smaller sizes, by DuckDB's ``array_cosine_similarity`` over a
   cross join, the plain-SQL alternative.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
from baseline import complete_all

from llm_ops import PRICES, Cache, Cascade, Price, RunReport, SemanticCache, llm_complete
from llm_ops.testing import LocalEndpoint

DATA = Path(__file__).resolve().parent.parent / "data" / "womens_clothing_reviews.parquet"
SMALL, LARGE = "sim-small", "sim"
# The simulator's models are free by default: list prices are passed, explicitly.
PRICING = {
    SMALL: PRICES["gpt-4o-mini"],
    LARGE: PRICES["gpt-4o"],
    "sim-embed": PRICES["text-embedding-3-small"],
}


def _cost(price: Price, stats: dict[str, Any]) -> float:
    return price.cost(
        requests=stats["requests"],
        input_tokens=stats["prompt_tokens"],
        output_tokens=stats["completion_tokens"],
    )


def _baseline(endpoint: LocalEndpoint, prompts: list[str], model: str) -> tuple[float, float]:
    """Wall seconds and cost of the hand-written loop sending every prompt to ``model``."""
    endpoint.reset()
    started = time.perf_counter()
    asyncio.run(complete_all(prompts, base_url=endpoint.base_url, concurrency=32, model=model))
    return time.perf_counter() - started, _cost(PRICING[model], endpoint.stats())


def _timed(frame: pl.DataFrame, **options: Any) -> tuple[pl.DataFrame, RunReport, float]:
    started = time.perf_counter()
    out, report = llm_complete(
        frame, progress=False, pricing=PRICING, concurrency=32, return_report=True, **options
    )
    return out, report, time.perf_counter() - started


def _row(cells: list[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def semantic(endpoint: LocalEndpoint, rows: int, threshold: float, work: Path) -> None:
    titles = pl.read_parquet(DATA).select("title").drop_nulls().head(rows)
    half = titles.height // 2
    days = [titles.head(half), titles.tail(titles.height - half)]
    prompt = "Classify the sentiment of this review title: {title}"
    semantic_cache = SemanticCache("sim-embed", threshold=threshold)

    wall, cost = _baseline(endpoint, [prompt.format(title=t) for t in titles["title"]], LARGE)
    print(
        f"\n### Semantic cache: {titles.height:,} review titles, {days[0].height:,} "
        f"yesterday and {days[1].height:,} today, threshold {threshold}\n"
    )
    print(
        _row(
            [
                "side",
                "rows",
                "requests yesterday",
                "requests today",
                "embedding requests",
                "rows similar",
                "of which same words",
                "cost $",
                "saved by cache $",
                "saved by semantic cache $",
                "wall s",
                "cost / baseline",
            ]
        )
    )
    print(_row(["---"] * 12))
    print(
        _row(
            [
                "baseline (AsyncOpenAI loop)",
                f"{titles.height:,}",
                f"{days[0].height:,}",
                f"{days[1].height:,}",
                0,
                0,
                "",
                f"{cost:.4f}",
                "",
                "",
                f"{wall:.2f}",
                "1.00x",
            ]
        )
    )
    for name, options in (
        ("llm_ops, exact cache", {}),
        ("llm_ops, + semantic cache", {"semantic_cache": semantic_cache}),
    ):
        cache = work / f"{name}.duckdb"
        requests, embeddings, similar, same, reports, wall = [], 0, 0, 0, [], 0.0
        for day in days:
            endpoint.reset()
            out, report, seconds = _timed(
                day, prompt=prompt, model=LARGE, endpoint=endpoint.base_url, cache=cache, **options
            )
            stats = endpoint.stats()
            requests.append(stats["requests"])
            embeddings += stats["embedding_requests"]
            similar += int((out["completion_status"] == "similar").sum())
            same += _same_words(out, cache)
            reports.append(report)
            wall += seconds
        spent = sum(r.cost or 0.0 for r in reports)
        by_cache = sum(r.savings["cache"].cost or 0.0 for r in reports)
        by_semantic = sum(
            r.savings["semantic_cache"].cost or 0.0
            for r in reports
            if "semantic_cache" in r.savings
        )
        print(
            _row(
                [
                    name,
                    f"{titles.height:,}",
                    f"{requests[0]:,}",
                    f"{requests[1]:,}",
                    f"{embeddings:,}",
                    f"{similar:,}",
                    f"{same:,} ({same / similar:.0%})" if similar else "",
                    f"{spent:.4f}",
                    f"{by_cache:.4f}",
                    f"{by_semantic:.4f}" if options else "",
                    f"{wall:.2f}",
                    f"{spent / cost:.2f}x",
                ]
            )
        )


def _same_words(out: pl.DataFrame, cache: Path) -> int:
    """Similar rows whose title has the same set of words as the reused one's, case,
    punctuation and order aside: a floor on how many reuses were right."""
    if not (out["completion_status"] == "similar").any():
        return 0
    answers = pl.from_arrow(Cache(cache).export())
    assert isinstance(answers, pl.DataFrame)
    reused = answers.select(
        "key", pl.col("request").str.json_path_match("$.messages[0].content").alias("prompt")
    )

    def words(text: pl.Expr) -> pl.Expr:
        return text.str.to_lowercase().str.extract_all(r"[a-z0-9]+").list.unique().list.sort()

    pairs = out.filter(pl.col("completion_status") == "similar").join(
        reused, left_on="completion_similar_to", right_on="key"
    )
    same = words(pl.col("prompt").str.split(": ").list.last()) == words(pl.col("title"))
    return pairs.filter(same).height


def cascade(endpoint: LocalEndpoint, rows: int, hard_share: float, work: Path) -> None:
    texts = pl.read_parquet(DATA).select("text").drop_nulls().head(rows)
    every = max(1, round(1 / hard_share)) if hard_share > 0 else texts.height + 1
    frame = texts.with_row_index("i").select(
        pl.when(pl.col("i") % every == 0)
        .then(pl.col("text") + f" [[sim:unsure_for={SMALL}]]")
        .otherwise(pl.col("text"))
        .alias("text")
    )
    prompt = "Summarize: {text}"
    hard = frame.filter(pl.col("text").str.contains("unsure_for")).height

    wall, cost = _baseline(endpoint, [prompt.format(text=t) for t in frame["text"]], LARGE)
    print(
        f"\n### Cascade: {frame.height:,} review texts, {hard:,} hard for {SMALL} "
        f"(priced as gpt-4o-mini; {LARGE} as gpt-4o)\n"
    )
    print(
        _row(
            [
                "side",
                "rows",
                f"requests to {SMALL}",
                f"requests to {LARGE}",
                f"rows answered by {LARGE}",
                "cost $",
                "saved by cascade $",
                "wall s",
                "cost / baseline",
            ]
        )
    )
    print(_row(["---"] * 9))
    print(
        _row(
            [
                "baseline (AsyncOpenAI loop), all rows to the large model",
                f"{frame.height:,}",
                0,
                f"{frame.height:,}",
                f"{frame.height:,}",
                f"{cost:.4f}",
                "",
                f"{wall:.2f}",
                "1.00x",
            ]
        )
    )
    runs: list[tuple[str, Any]] = [
        (f"llm_ops, {LARGE} only", {"model": LARGE}),
        (
            f"llm_ops, cascade [{SMALL}, {LARGE}]",
            {
                "model": Cascade(
                    [SMALL, LARGE], escalate=pl.col("completion").str.starts_with("unsure:")
                )
            },
        ),
    ]
    for name, options in runs:
        endpoint.reset()
        _, report, wall = _timed(
            frame,
            prompt=prompt,
            endpoint=endpoint.base_url,
            cache=work / f"{name}.duckdb",
            **options,
        )
        usage = report.models
        lever = report.savings.get("cascade")
        print(
            _row(
                [
                    name,
                    f"{frame.height:,}",
                    f"{usage[SMALL].requests:,}" if SMALL in usage else 0,
                    f"{usage[LARGE].requests:,}" if LARGE in usage else 0,
                    f"{usage[LARGE].rows:,}" if LARGE in usage else 0,
                    f"{report.cost:.4f}",
                    f"{lever.cost:.4f}" if lever and lever.cost is not None else "",
                    f"{wall:.2f}",
                    f"{(report.cost or 0) / cost:.2f}x",
                ]
            )
        )


def _fill_index(path: Path, vectors: np.ndarray[Any, Any]) -> None:
    """A cache whose answers k0, k1, ... are indexed with ``vectors`` in scope "s"."""
    count, dimensions = vectors.shape
    keys = [f"k{i}" for i in range(count)]
    tables = {
        "llm_cache": pa.table(
            {
                "key": keys,
                "model": ["m"] * count,
                "endpoint": ["x"] * count,
                "request": ["{}"] * count,
                "status": ["ok"] * count,
            }
        ),
        "llm_embeddings": pa.table(
            {
                "key": keys,
                "model": ["emb"] * count,
                "endpoint": ["x"] * count,
                "request": ["{}"] * count,
                "dimensions": [dimensions] * count,
                "embedding": pa.FixedSizeListArray.from_arrays(
                    pa.array(vectors.ravel()), dimensions
                ).cast(pa.list_(pa.float32())),
            }
        ),
        "llm_semantic_index": pa.table(
            {"key": keys, "scope": ["s"] * count, "embedding_key": keys}
        ),
    }
    cache = Cache(path)
    for table, rows in tables.items():
        cache.insert(table, rows)


def _vectors(matrix: np.ndarray[Any, Any]) -> pa.Table:
    count, dimensions = matrix.shape
    return pa.table(
        {
            "id": range(count),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(matrix.ravel()), dimensions),
        }
    )


def search_scale(work: Path, sizes: list[tuple[int, int, int]]) -> None:
    print("\n### Similarity search: one batch of misses against the indexed answers of its scope\n")
    print(
        _row(
            [
                "misses",
                "candidates",
                "dimensions",
                "llm_ops search s",
                "M pairs/s",
                "DuckDB array_cosine_similarity s",
                "llm_ops / DuckDB",
            ]
        )
    )
    print(_row(["---"] * 7))
    rng = np.random.default_rng(0)
    for misses, candidates, dimensions in sizes:
        path = work / f"search-{misses}-{candidates}-{dimensions}.duckdb"
        candidates_vectors = rng.standard_normal((candidates, dimensions), dtype=np.float32)
        _fill_index(path, candidates_vectors)
        queries = rng.standard_normal((misses, dimensions), dtype=np.float32)
        frame = pl.DataFrame(
            {
                "key": [f"q{i}" for i in range(misses)],
                "scope": ["s"] * misses,
                "embedding": queries.tolist(),
            }
        )
        started = time.perf_counter()
        Cache(path).nearest(frame, embedding_model="emb")
        ours = time.perf_counter() - started
        sql = ""
        ratio = ""
        if misses * candidates * dimensions <= 1.1e10:  # the cross join takes minutes beyond
            with duckdb.connect() as con:  # the same vectors, in DuckDB's own tables
                con.register("q", _vectors(queries))
                con.register("e", _vectors(candidates_vectors))
                started = time.perf_counter()
                con.execute(
                    "SELECT q.id, max(array_cosine_similarity(q.embedding, e.embedding)) "
                    "FROM q, e GROUP BY q.id"
                ).fetchall()
                duck = time.perf_counter() - started
            sql, ratio = f"{duck:.2f}", f"{ours / duck:.2f}x"
        print(
            _row(
                [
                    f"{misses:,}",
                    f"{candidates:,}",
                    dimensions,
                    f"{ours:.2f}",
                    f"{misses * candidates / ours / 1e6:.0f}",
                    sql,
                    ratio,
                ]
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--hard-share", type=float, default=0.15)
    parser.add_argument("--threshold", type=float, default=0.95)
    args = parser.parse_args()
    with LocalEndpoint() as endpoint, tempfile.TemporaryDirectory() as work:
        semantic(endpoint, args.rows, args.threshold, Path(work))
        cascade(endpoint, min(args.rows, 5_000), args.hard_share, Path(work))
        scale = max(1, args.rows // 1000)
        search_scale(
            Path(work),
            [
                (100 * scale, 1_000 * scale, 256),
                (250 * scale, 5_000 * scale, 256),
                (250 * scale, 5_000 * scale, 1536),
            ],
        )


if __name__ == "__main__":
    main()
