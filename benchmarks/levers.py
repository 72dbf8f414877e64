"""Cost levers: the semantic cache and a model cascade, against the hand-written loop.

    python benchmarks/levers.py [--rows N] [--hard-share 0.15] [--threshold 0.95]

Prints two markdown tables; requests and tokens are what the local endpoint received, and costs
use list prices: the simulator's "sim-small" is priced as gpt-4o-mini and "sim" as gpt-4o.

1. **Semantic cache** on real data: the review *titles* of ``data/``, where the same title
   often comes back with other casing or punctuation ("Love it!", "love it", "Love it!!").
   Yesterday's job (the first half of the rows) warmed a cache; today's job (the second half)
   runs against a copy of it with the exact cache only, and with the semantic cache on. The
   baseline sends every row of today's job.
2. **Cascade** on review texts, a share of them marked hard for the small model (its answer
   then starts with ``unsure:``, which the ``escalate`` rule catches). The baseline sends every
   row to the large model; llm_ops runs the large model alone, then the cascade.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
from baseline import complete_all

from llm_ops import PRICES, Price, RunReport, SemanticCache, llm_complete
from llm_ops.testing import LocalEndpoint

DATA = Path(__file__).resolve().parent.parent / "data" / "womens_clothing_reviews.parquet"
SMALL, LARGE = "sim-small", "sim"
PRICING = {SMALL: PRICES["gpt-4o-mini"], LARGE: PRICES["gpt-4o"]}


def _cost(price: Price, stats: dict[str, Any]) -> float:
    return price.cost(requests=stats["requests"], input_tokens=stats["prompt_tokens"],
                      output_tokens=stats["completion_tokens"])


def _baseline(endpoint: LocalEndpoint, prompts: list[str], model: str) -> tuple[float, float]:
    """Wall seconds and cost of the hand-written loop sending every prompt to ``model``."""
    endpoint.reset()
    started = time.perf_counter()
    asyncio.run(complete_all(prompts, base_url=endpoint.base_url, concurrency=32, model=model))
    return time.perf_counter() - started, _cost(PRICING[model], endpoint.stats())


def _timed(frame: pl.DataFrame, **options: Any) -> tuple[pl.DataFrame, RunReport, float]:
    started = time.perf_counter()
    out, report = llm_complete(frame, progress=False, pricing=PRICING, concurrency=32,
                               return_report=True, **options)
    return out, report, time.perf_counter() - started


def _row(cells: list[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def semantic(endpoint: LocalEndpoint, rows: int, threshold: float, work: Path) -> None:
    titles = pl.read_parquet(DATA).select("title").drop_nulls().head(rows)
    half = titles.height // 2
    yesterday, today = titles.head(half), titles.tail(titles.height - half)
    prompt = "Classify the sentiment of this review title: {title}"
    semantic_cache = SemanticCache("sim-embed", threshold=threshold)
    warm = work / "warm.duckdb"
    llm_complete(yesterday, prompt=prompt, model=LARGE, base_url=endpoint.base_url, cache=warm,
                 semantic_cache=semantic_cache, progress=False)

    wall, cost = _baseline(endpoint, [prompt.format(title=t) for t in today["title"]], LARGE)
    print(f"\n### Semantic cache: {today.height:,} review titles today, {yesterday.height:,} "
          f"yesterday, threshold {threshold}\n")
    print(_row(["side", "rows", "chat requests", "embedding requests", "rows similar",
                "of which same words", "cost $", "saved by cache $",
                "saved by semantic cache $", "wall s", "cost / baseline"]))
    print(_row(["---"] * 11))
    print(_row(["baseline (AsyncOpenAI loop)", f"{today.height:,}", f"{today.height:,}", 0, 0,
                "", f"{cost:.4f}", "", "", f"{wall:.2f}", "1.00x"]))
    for name, options in (("llm_ops, exact cache", {}),
                          ("llm_ops, + semantic cache", {"semantic_cache": semantic_cache})):
        cache = work / f"{name}.duckdb"
        shutil.copy(warm, cache)
        endpoint.reset()
        out, report, wall = _timed(today, prompt=prompt, model=LARGE, base_url=endpoint.base_url,
                                   cache=cache, **options)
        stats = endpoint.stats()
        similar = int((out["completion_status"] == "similar").sum())
        same = _same_words(out, cache) if similar else 0
        lever = report.savings.get("semantic_cache")
        print(_row([name, f"{today.height:,}", f"{stats['requests']:,}",
                    f"{stats['embedding_requests']:,}", f"{similar:,}",
                    f"{same:,} ({same / similar:.0%})" if similar else "", f"{report.cost:.4f}",
                    f"{report.savings['cache'].cost:.4f}",
                    f"{lever.cost:.4f}" if lever and lever.cost is not None else "",
                    f"{wall:.2f}", f"{(report.cost or 0) / cost:.2f}x"]))


def _same_words(out: pl.DataFrame, cache: Path) -> int:
    """Similar rows whose title has the same set of words as the reused one's, case,
    punctuation and order aside: a floor on how many reuses were right."""
    with duckdb.connect(str(cache), read_only=True) as con:
        reused = con.sql("SELECT key, request->>'$.messages[0].content' AS prompt "
                         "FROM llm_cache").pl()

    def words(text: pl.Expr) -> pl.Expr:
        return text.str.to_lowercase().str.extract_all(r"[a-z0-9]+").list.unique().list.sort()

    pairs = out.filter(pl.col("completion_status") == "similar").join(
        reused, left_on="completion_similar_to", right_on="key")
    same = words(pl.col("prompt").str.split(": ").list.last()) == words(pl.col("title"))
    return pairs.filter(same).height


def cascade(endpoint: LocalEndpoint, rows: int, hard_share: float, work: Path) -> None:
    texts = pl.read_parquet(DATA).select("text").drop_nulls().head(rows)
    every = max(1, round(1 / hard_share)) if hard_share > 0 else texts.height + 1
    frame = texts.with_row_index("i").select(
        pl.when(pl.col("i") % every == 0)
        .then(pl.col("text") + f" [[sim:unsure_for={SMALL}]]")
        .otherwise(pl.col("text")).alias("text"))
    prompt = "Summarize: {text}"
    hard = frame.filter(pl.col("text").str.contains("unsure_for")).height

    wall, cost = _baseline(endpoint, [prompt.format(text=t) for t in frame["text"]], LARGE)
    print(f"\n### Cascade: {frame.height:,} review texts, {hard:,} hard for {SMALL} "
          f"(priced as gpt-4o-mini; {LARGE} as gpt-4o)\n")
    print(_row(["side", "rows", f"requests to {SMALL}", f"requests to {LARGE}",
                f"rows answered by {LARGE}", "cost $", "saved by cascade $", "wall s",
                "cost / baseline"]))
    print(_row(["---"] * 9))
    print(_row(["baseline (AsyncOpenAI loop), all rows to the large model", f"{frame.height:,}",
                0, f"{frame.height:,}", f"{frame.height:,}", f"{cost:.4f}", "", f"{wall:.2f}",
                "1.00x"]))
    runs: list[tuple[str, Any]] = [
        (f"llm_ops, {LARGE} only", {"model": LARGE}),
        (f"llm_ops, cascade [{SMALL}, {LARGE}]",
         {"model": [SMALL, LARGE], "escalate": pl.col("completion").str.starts_with("unsure:")}),
    ]
    for name, options in runs:
        endpoint.reset()
        _, report, wall = _timed(frame, prompt=prompt, base_url=endpoint.base_url,
                                 cache=work / f"{name}.duckdb", **options)
        usage = report.models
        lever = report.savings.get("cascade")
        print(_row([name, f"{frame.height:,}",
                    f"{usage[SMALL].requests:,}" if SMALL in usage else 0,
                    f"{usage[LARGE].requests:,}" if LARGE in usage else 0,
                    f"{usage[LARGE].rows:,}" if LARGE in usage else 0, f"{report.cost:.4f}",
                    f"{lever.cost:.4f}" if lever and lever.cost is not None else "",
                    f"{wall:.2f}", f"{(report.cost or 0) / cost:.2f}x"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--hard-share", type=float, default=0.15)
    parser.add_argument("--threshold", type=float, default=0.95)
    args = parser.parse_args()
    with LocalEndpoint() as endpoint, tempfile.TemporaryDirectory() as work:
        semantic(endpoint, args.rows, args.threshold, Path(work))
        cascade(endpoint, min(args.rows, 5_000), args.hard_share, Path(work))


if __name__ == "__main__":
    main()
