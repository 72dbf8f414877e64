"""The main job: summarise the sample reviews in ``data/`` against the local endpoint.

Run it from the repository root::

    python -m llm_ops.demo            # all 22,625 reviews
    python -m llm_ops.demo --rows 500

It starts the local simulator on a free port of 127.0.0.1, enriches
``data/womens_clothing_reviews.parquet`` with a one-sentence summary per review, writes
``output/reviews_summarized.parquet``, caches answers in the default cache (``LLM_OPS_CACHE``,
else ``~/.cache/llm-ops/cache.duckdb``, the one ``llm-ops cache stats`` reads) and prints the
run report. Run it twice: the second run is answered from the cache and sends nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import polars as pl

from . import Endpoint, llm_complete
from .testing import LocalEndpoint

PROMPT = "Summarize this customer review in one sentence:\n\n{text}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m llm_ops.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--input", type=Path, default=Path("data/womens_clothing_reviews.parquet"))
    parser.add_argument("--output", type=Path, default=Path("output/reviews_summarized.parquet"))
    parser.add_argument("--cache", type=Path, help="cache file (default: the default cache)")
    parser.add_argument("--rows", type=int, default=None, help="only the first N rows")
    args = parser.parse_args(argv)

    reviews = pl.read_parquet(args.input, n_rows=args.rows)
    with LocalEndpoint() as server:
        enriched, report = reviews.pipe(
            llm_complete,
            prompt=PROMPT,
            model="sim",
            output="summary",
            endpoint=Endpoint(server.base_url, name=server.name),  # hits on any port
            cache=args.cache,
            concurrency=64,
            return_report=True,
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    enriched.write_parquet(args.output)
    print(enriched.select("id", "text", "summary", "summary_status").head(5))
    print(report)
    print(f"wrote {args.output} ({enriched.height:,} rows)")


if __name__ == "__main__":
    main()
