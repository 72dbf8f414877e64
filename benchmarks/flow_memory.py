"""Table jobs at scale: peak memory and time of Parquet-in/Parquet-out runs.

Run: ``python benchmarks/flow_memory.py [--quick]``. Each measured run is its own process
against the local endpoint (zero latency) and prints one markdown row:

* ``run_table`` (the plan / chunk / write units the flow's tasks call) over 100k, 1M and
  (full mode) 10M rows made of a fixed 10,000 distinct prompts: memory should stay flat as
  rows grow;
* the ``enrich-table`` Prefect flow itself over 1M rows with 90% duplicates (100,000
  distinct requests); its peak RSS includes the temporary Prefect server it starts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent


def make_input(path: Path, rows: int, distinct: int) -> None:
    """A Parquet of ``rows`` review-like texts drawn from ``distinct`` prompts, 1M rows a group."""
    texts = pl.read_parquet(ROOT / "data/womens_clothing_reviews.parquet")["text"]
    base = pl.DataFrame({"text": [f"{texts[i % texts.len()]} (#{i})" for i in range(distinct)]})
    frames = []
    for start in range(0, rows, 1_000_000):
        size = min(1_000_000, rows - start)
        frames.append(
            base.sample(size, with_replacement=True, seed=start).with_row_index("id", offset=start)
        )
    pl.concat(frames).write_parquet(path, row_group_size=100_000)


def worker(kind: str, source: str, base_url: str, work: str) -> None:
    sys.path.insert(0, str(ROOT))
    started = time.perf_counter()
    out = Path(work) / "out.parquet"
    if kind == "table":
        from llm_ops import Client
        from llm_ops.tables import Table

        with Client(endpoint=base_url, cache=Path(work) / "cache.duckdb", concurrency=64) as client:
            report = Table(
                client, source, out, prompt="Summarize: {text}", model="sim", output="summary"
            ).run()
        sent, statuses = report.requests_sent, report.statuses
    else:
        from flows.enrich import EnrichConfig, enrich_table

        result = enrich_table(
            EnrichConfig(
                input=source,
                output=str(out),
                base_url=base_url,
                cache=str(Path(work) / "cache.duckdb"),
                prompt="Summarize: {text}",
                concurrency=64,
            )
        )
        sent, statuses = result["requests_sent"], result["statuses"]
    rows = pl.scan_parquet(out).select(pl.len()).collect().item()
    print(
        json.dumps(
            {
                "wall": time.perf_counter() - started,
                "sent": sent,
                "rows": rows,
                "ok": statuses.get("ok", 0),
                "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="100k and 1M rows only")
    parser.add_argument("--worker", nargs=4, metavar=("KIND", "INPUT", "BASE_URL", "WORK"))
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    from llm_ops.testing import LocalEndpoint

    runs = [("table", 100_000, 10_000), ("table", 1_000_000, 10_000)]
    if not args.quick:
        runs += [("table", 10_000_000, 10_000), ("flow", 1_000_000, 100_000)]
    print(
        "| run | rows | distinct | requests sent | rows written | wall s | rows/s | peak RSS MB |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
    with LocalEndpoint() as endpoint, tempfile.TemporaryDirectory() as scratch:
        for kind, rows, distinct in runs:
            source = Path(scratch) / f"in-{rows}-{distinct}.parquet"
            if not source.exists():
                make_input(source, rows, distinct)
            work = tempfile.mkdtemp(dir=scratch)
            env["PREFECT_HOME"] = work
            result = subprocess.run(
                [sys.executable, __file__, "--worker", kind, str(source), endpoint.base_url, work],
                capture_output=True,
                text=True,
                check=True,
                env=env,
                cwd=ROOT,
            )
            figures = json.loads(result.stdout.strip().splitlines()[-1])
            name = "run_table" if kind == "table" else "enrich-table flow"
            print(
                f"| {name} | {rows:,} | {distinct:,} | {figures['sent']:,} | "
                f"{figures['rows']:,} | {figures['wall']:.1f} | "
                f"{rows / figures['wall']:,.0f} | {figures['peak_mb']:,.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
