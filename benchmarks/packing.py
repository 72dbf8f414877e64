"""Multi-row requests: requests and tokens sent for 10k rows at k = 1, 8, 32.

Run: ``python benchmarks/packing.py [--rows N]``. Prints a markdown table. The local endpoint
counts what it received; tokens are its usage figures (one word is one token there).
"""

from __future__ import annotations

import argparse
import time

import polars as pl

from llm_ops import Packing, llm_complete
from llm_ops.testing import LocalEndpoint, expected_reply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000)
    args = parser.parse_args()
    texts = pl.read_parquet("data/womens_clothing_reviews.parquet")["text"].head(args.rows)
    frame = pl.DataFrame({"text": [f"{text} (#{i})" for i, text in enumerate(texts)]})
    expected = [expected_reply(f"Summarize: {t}", model="sim") for t in frame["text"]]
    print(
        "| rows per request | rows | requests | requests per row | prompt tokens | "
        "completion tokens | wall s | rows with their own answer |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    baseline_requests = None
    with LocalEndpoint() as endpoint:
        for k in (1, 8, 32):
            endpoint.reset()
            started = time.perf_counter()
            out = frame.pipe(
                llm_complete,
                prompt="Summarize: {text}",
                model="sim",
                endpoint=endpoint.base_url,
                packing=Packing(rows_per_request=k),
                cache=False,
                concurrency=32,
                progress=False,
            )
            wall = time.perf_counter() - started
            stats = endpoint.stats()
            baseline_requests = baseline_requests or stats["requests"]
            correct = sum(a == b for a, b in zip(out["completion"], expected, strict=True))
            print(
                f"| {k} | {frame.height:,} | {stats['requests']:,} "
                f"({stats['requests'] / baseline_requests:.3f}x) | "
                f"{stats['requests'] / frame.height:.3f} | {stats['prompt_tokens']:,} | "
                f"{stats['completion_tokens']:,} | {wall:.1f} | {correct:,} |"
            )


if __name__ == "__main__":
    main()
