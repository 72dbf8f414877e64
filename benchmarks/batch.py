"""Live requests vs the provider's Batch API for the same job, side by side with the
hand-written loop.

Run: ``python benchmarks/batch.py [--rows N] [--batch-seconds S]``. Prints a markdown table:
requests (live HTTP requests, or lines in batch files), batches, cost at list prices (the
simulator's ``sim`` is priced as gpt-4o-mini; batch lines at half the price), wall time and
rows with their own answer. The simulator's batches take ``--batch-seconds`` (a real provider
takes minutes to 24 h): the batch side's wall time is the simulated one.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import polars as pl
from baseline import baseline_complete

from llm_ops import PRICES, BatchMode, llm_complete
from llm_ops.testing import LocalEndpoint, expected_reply

PROMPT = "Summarize: {text}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--batch-seconds", type=float, default=10.0)
    args = parser.parse_args()
    texts = pl.read_parquet("data/womens_clothing_reviews.parquet")["text"].drop_nulls()
    frame = pl.DataFrame({"text": [f"{t} (#{i})" for i, t in enumerate(texts.head(args.rows))]})
    expected = [expected_reply(f"Summarize: {t}", model="sim") for t in frame["text"]]
    price = PRICES["gpt-4o-mini"]  # the simulator is free: its list price is passed
    print(
        f"### Live vs batch: {frame.height:,} distinct review texts, model sim (priced as "
        f"gpt-4o-mini), batches taking {args.batch_seconds:g} s\n"
    )
    print("| side | rows | requests | batches | cost $ | wall s | rows correct | cost / baseline |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with (
        LocalEndpoint(batch_seconds=args.batch_seconds) as endpoint,
        tempfile.TemporaryDirectory() as work,
    ):
        started = time.perf_counter()
        prompts = frame.select(pl.format("Summarize: {}", "text").alias("prompt"))
        answers = baseline_complete(
            prompts, column="prompt", base_url=endpoint.base_url, concurrency=64
        )["completion"].to_list()
        wall = time.perf_counter() - started
        stats = endpoint.stats()
        cost = price.cost(
            requests=stats["requests"],
            input_tokens=stats["prompt_tokens"],
            output_tokens=stats["completion_tokens"],
        )
        correct = sum(a == b for a, b in zip(answers, expected, strict=True))
        print(
            f"| baseline (AsyncOpenAI loop) | {frame.height:,} | {stats['requests']:,} | 0 | "
            f"{cost:.4f} | {wall:.1f} | {correct:,} | 1.00x |"
        )
        for mode in ("live", "batch"):
            endpoint.reset()
            started = time.perf_counter()
            out, report = frame.pipe(
                llm_complete,
                prompt=PROMPT,
                model="sim",
                endpoint=endpoint.base_url,
                cache=Path(work) / f"{mode}.duckdb",
                concurrency=64,
                batch=BatchMode(poll_seconds=1.0) if mode == "batch" else False,
                pricing={"sim": price},
                progress=False,
                return_report=True,
            )
            wall = time.perf_counter() - started
            stats = endpoint.stats()
            sent = stats["requests"] if mode == "live" else stats["lines_uploaded"]
            correct = sum(a == b for a, b in zip(out["completion"], expected, strict=True))
            print(
                f"| llm_ops, {mode} | {frame.height:,} | {sent:,} | {stats['batches']} | "
                f"{report.cost:.4f} | {wall:.1f} | {correct:,} | "
                f"{(report.cost or 0) / cost:.2f}x |"
            )


if __name__ == "__main__":
    main()
