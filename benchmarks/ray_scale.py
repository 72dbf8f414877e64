"""The same latency-bound table job in one process and on 1, 2 and 4 Ray workers, and the
goodput under a shared rate limit.

Run: ``python benchmarks/ray_scale.py [--rows N] [--latency S] [--concurrency C]``. Prints two
markdown tables. Every side runs the table API over one Parquet file of distinct review texts
against the local simulator (its own process), with a fresh cache; the single-process side is
``Table.run`` (what the flow does without ``ray_address``), the others ``run_on_ray`` on a local
Ray cluster with that many worker CPUs. On a 2-core machine the workers, the driver and the
endpoint share two cores: what more workers add is bounded by that, not by Ray.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import polars as pl

from llm_ops import Client, RateLimit
from llm_ops.tables import Table
from llm_ops.testing import LocalEndpoint, expected_reply


def _frame(rows: int) -> pl.DataFrame:
    texts = pl.read_parquet("data/womens_clothing_reviews.parquet")["text"].drop_nulls()
    repeated = (texts.to_list() * (rows // len(texts) + 1))[:rows]
    return pl.DataFrame({"text": [f"{t} (#{i})" for i, t in enumerate(repeated)]})


def _side(
    endpoint: LocalEndpoint,
    source: Path,
    work: Path,
    name: str,
    *,
    workers: int | None,
    concurrency: int,
    chunk_size: int,
    rpm: float | None = None,
) -> tuple[float, int, int]:
    """Wall seconds, rows answered correctly, requests the endpoint received."""
    from llm_ops.ray import run_on_ray

    endpoint.reset()
    out = work / f"{name}.parquet"
    started = time.perf_counter()
    with Client(
        endpoint=endpoint.base_url,
        rate_limit=RateLimit(rpm=rpm),
        cache=work / f"{name}.duckdb",
        concurrency=concurrency,
    ) as client:
        table = Table(
            client, source, out, prompt="{text}", model="sim", chunk_size=chunk_size, progress=False
        )
        if workers is None:
            table.run()
        else:
            run_on_ray(table, address="local", workers=workers)
    wall = time.perf_counter() - started
    texts = pl.read_parquet(source)["text"]
    answers = pl.read_parquet(out)["completion"]
    correct = sum(a == expected_reply(t, model="sim") for a, t in zip(answers, texts, strict=True))
    return wall, correct, endpoint.stats()["requests"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rpm", type=float, default=6_000)
    args = parser.parse_args()
    import ray

    from llm_ops.ray import connect

    frame = _frame(args.rows)
    chunk_size = max(1, args.rows // (2 * max(args.workers)))
    with LocalEndpoint(latency=args.latency) as endpoint, tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        source = work / "in.parquet"
        frame.write_parquet(source)
        print(
            f"### Ray scale-out: {args.rows:,} distinct rows, {args.latency * 1000:.0f} ms "
            f"latency, concurrency {args.concurrency} per worker, chunks of {chunk_size:,}\n"
        )
        print("| side | rows | requests | wall s | rows/s | speed-up | rows correct |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        wall, correct, sent = _side(
            endpoint,
            source,
            work,
            "single",
            workers=None,
            concurrency=args.concurrency,
            chunk_size=chunk_size,
        )
        single = args.rows / wall
        print(
            f"| one process (Table.run, the flow without Ray) | {args.rows:,} | {sent:,} | "
            f"{wall:.1f} | {single:,.0f} | 1.00x | {correct:,} |"
        )
        for workers in args.workers:
            connect("local", workers)
            wall, correct, sent = _side(
                endpoint,
                source,
                work,
                f"ray{workers}",
                workers=workers,
                concurrency=args.concurrency,
                chunk_size=chunk_size,
            )
            ray.shutdown()
            print(
                f"| Ray, {workers} worker(s) | {args.rows:,} | {sent:,} | {wall:.1f} | "
                f"{args.rows / wall:,.0f} | {args.rows / wall / single:.2f}x | {correct:,} |"
            )

        endpoint.configure(
            latency=args.latency, rpm=int(args.rpm), rate_window=1.0, rate_limit_headers=False
        )
        limited = min(args.rows, int(args.rpm / 2))  # about thirty seconds of the budget
        limited_source = work / "limited.parquet"
        frame.head(limited).write_parquet(limited_source)
        print(
            f"\n### One rate limit for the cluster: {limited:,} rows, the endpoint allows "
            f"{args.rpm:,.0f} requests a minute (429 beyond one second's burst), the client "
            f"asks for 95% of it\n"
        )
        print("| side | rows | requests | 429s | wall s | goodput % of the limit | rows correct |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for workers in [None, *args.workers[1:]]:
            if workers is not None:
                connect("local", workers)
            wall, correct, sent = _side(
                endpoint,
                limited_source,
                work,
                f"limited{workers}",
                workers=workers,
                concurrency=args.concurrency,
                chunk_size=max(1, limited // 4),
                rpm=args.rpm * 0.95,
            )
            rejected = endpoint.stats()["by_status"].get("429", 0)
            if workers is not None:
                ray.shutdown()
            side = "one process" if workers is None else f"Ray, {workers} workers"
            print(
                f"| {side} | {limited:,} | {sent:,} | {rejected:,} | {wall:.1f} | "
                f"{100 * limited / wall * 60 / args.rpm:.0f}% | {correct:,} |"
            )


if __name__ == "__main__":
    main()
