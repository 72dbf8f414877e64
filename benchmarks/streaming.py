"""Polars expressions on the streaming engine: peak memory, time and requests as rows grow.

Run: ``python benchmarks/streaming.py [--quick] [--write]``. Each size runs in a process of
its own (so its peak RSS is its own) against the local endpoint (zero latency), with a fresh
cache::

    pl.scan_parquet(input)
      .with_columns(pl.col("text").llm.complete("Summarize: {}", model="sim", ...).alias("summary"))
      .sink_parquet(output)

The input holds a fixed number of distinct prompts repeated (10,000 over 1M and 10M rows), so
the requests stay fixed while the rows grow: memory should stay flat (peak RSS at 10M at most
1.2x the one at 1M) and every distinct prompt should be sent once, whichever batch of the
stream it is in. The same query with a batch function that sends nothing ("Polars alone")
shows what Polars' streaming engine itself holds at each size. It prints a markdown table of
the median of ``--reps`` runs per size; ``--write`` puts it in ``benchmarks/RESULTS.md`` under
its own section (replacing an earlier one; ``benchmarks/run.py`` rewrites that file, so run
this after it).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
SECTION = "## streaming: llm expressions from scan_parquet to sink_parquet"
QUERIES = {"llm": "`.llm.complete`", "polars": "Polars alone"}


def make_input(path: Path, rows: int, distinct: int) -> None:
    """A Parquet of ``rows`` review-like texts drawn from ``distinct`` prompts, written 1M
    rows at a time (row groups of 100k), so making it stays flat in memory too."""
    texts = pl.read_parquet(ROOT / "data/womens_clothing_reviews.parquet")["text"].drop_nulls()
    base = pl.DataFrame({"text": [f"{texts[i % texts.len()]} (#{i})" for i in range(distinct)]})
    parts = []
    for start in range(0, rows, 1_000_000):
        size = min(1_000_000, rows - start)
        part = path.with_name(f"{path.stem}.{start // 1_000_000:04d}.parquet")
        base.sample(size, with_replacement=True, seed=start).with_row_index(
            "id", offset=start
        ).write_parquet(part, row_group_size=100_000)
        parts.append(part)
    pl.scan_parquet(parts).sink_parquet(path, row_group_size=100_000)
    for part in parts:
        part.unlink()


def worker(kind: str, source: str, base_url: str, work: str) -> None:
    sys.path.insert(0, str(ROOT))
    import llm_ops  # registers the namespace

    out = Path(work) / "out.parquet"
    if kind == "llm":
        answer = pl.col("text").llm.complete(
            "Summarize: {}",
            model="sim",
            endpoint=base_url,
            cache=Path(work) / "cache.duckdb",
            concurrency=64,
            progress=False,
        )
    else:  # Polars alone: the same query with a batch function that calls nothing
        answer = pl.col("text").map_batches(
            lambda texts: "Summary: " + texts, return_dtype=pl.String, is_elementwise=True
        )
    started = time.perf_counter()
    pl.scan_parquet(source).with_columns(answer.alias("summary")).sink_parquet(out)
    wall = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report = llm_ops.last_report() if kind == "llm" else None
    written = pl.scan_parquet(out).select(pl.len(), pl.col("summary").null_count()).collect()
    print(
        json.dumps(
            {
                "wall": wall,
                "rows": written.item(0, 0),
                "nulls": written.item(0, 1),
                "reported_rows": report.rows if report else None,
                "peak_mb": peak_mb,
            }
        )
    )


def table(runs: list[tuple[str, int, int, list[dict[str, float]]]]) -> str:
    lines = [
        "| query | rows | distinct | requests sent | per distinct | rows written | null answers "
        "| wall s | rows/s | peak RSS MB | peak vs 1st size |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    first: dict[str, float] = {}
    for kind, rows, distinct, reps in runs:
        figures = {
            name: statistics.median(rep[name] for rep in reps)
            for name, value in reps[0].items()
            if value is not None
        }
        first.setdefault(kind, figures["peak_mb"])
        sent = f"{figures['sent']:,.0f}" if kind == "llm" else "-"
        per = f"{figures['sent'] / distinct:.2f}" if kind == "llm" else "-"
        lines.append(
            f"| {QUERIES[kind]} | {rows:,} | {distinct:,} | {sent} | {per} | "
            f"{figures['rows']:,.0f} | {figures['nulls']:,.0f} | {figures['wall']:.1f} | "
            f"{rows / figures['wall']:,.0f} | {figures['peak_mb']:,.0f} | "
            f"{figures['peak_mb'] / first[kind]:.2f}x |"
        )
    return "\n".join(lines)


def write_section(markdown: str) -> None:
    text = RESULTS.read_text() if RESULTS.exists() else ""
    if SECTION in text:
        before, _, after = text.partition(SECTION)
        rest = after.split("\n## ", 1)
        text = before + (("## " + rest[1]) if len(rest) > 1 else "")
    RESULTS.write_text(text.rstrip("\n") + "\n\n" + markdown + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="20k and 100k rows, 500 distinct")
    parser.add_argument("--reps", type=int, default=None, help="runs per size (median)")
    parser.add_argument("--write", action="store_true", help=f"write the table to {RESULTS}")
    parser.add_argument("--worker", nargs=4, metavar=("KIND", "INPUT", "BASE_URL", "WORK"))
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    from llm_ops.testing import LocalEndpoint

    if args.quick:
        sizes, reps, kinds = [(20_000, 500), (100_000, 500)], args.reps or 1, ["llm"]
    else:
        sizes, reps = [(1_000_000, 10_000), (10_000_000, 10_000)], args.reps or 3
        kinds = ["llm", "polars"]
    runs = []
    with LocalEndpoint() as endpoint, tempfile.TemporaryDirectory() as scratch:
        inputs = {}
        for rows, distinct in sizes:
            inputs[rows] = Path(scratch) / f"in-{rows}.parquet"
            make_input(inputs[rows], rows, distinct)
        for kind in kinds:
            for rows, distinct in sizes:
                done = []
                for _ in range(reps):
                    work = tempfile.mkdtemp(dir=scratch)
                    endpoint.reset()
                    result = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--worker",
                            kind,
                            str(inputs[rows]),
                            endpoint.base_url,
                            work,
                        ],
                        capture_output=True,
                        text=True,
                        check=False,
                        cwd=ROOT,
                    )
                    if result.returncode != 0:
                        raise SystemExit(f"the {rows:,}-row run failed:\n{result.stderr[-3000:]}")
                    figures = json.loads(result.stdout.strip().splitlines()[-1])
                    figures["sent"] = endpoint.stats()["requests"]
                    done.append(figures)
                    shutil.rmtree(work)
                runs.append((kind, rows, distinct, done))
    body = (
        f"{SECTION}\n\n"
        '`benchmarks/streaming.py`: `pl.scan_parquet(...).with_columns(pl.col("text")'
        '.llm.complete("Summarize: {}", ...)).sink_parquet(...)` on Polars\' streaming engine, '
        "each run in a fresh process with a fresh cache, zero-latency local endpoint, "
        "concurrency 64. Rows are a fixed set of distinct review texts (about 300 characters) "
        "repeated, so the requests stay fixed while the rows grow; peak = ru_maxrss of the "
        f'process when the sink has finished. Median of {reps} run(s) per size. "Polars '
        "alone\" is the same query with a batch function that sends nothing, for what Polars' "
        "streaming engine itself holds.\n\n" + table(runs)
    )
    print(body, flush=True)
    if args.write:
        write_section(body)
        print(f"\nwritten to {RESULTS}", flush=True)


if __name__ == "__main__":
    main()
