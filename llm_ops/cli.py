"""``llm-ops``: run and estimate jobs on files, serve the local endpoint, manage the cache.

Every subcommand has ``--help``. Errors print one line and exit non-zero; ``--debug`` shows
the traceback instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from . import _cache
from ._job import Job, ProgressOption, make_job
from ._pricing import Price, add_costs, cost_or_none, price_for
from ._semantic import SemanticCache
from ._tables import input_files, input_schema, plan_table, run_table
from .exceptions import ConfigError, LlmOpsError
from .testing import DEFAULT_PORT, FAULT_KINDS, SimulatorConfig, serve


def _add_job_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="Parquet or CSV file, or a glob like 'data/*.parquet'")
    parser.add_argument("--prompt", required=True, help="template, e.g. 'Summarize: {text}'")
    parser.add_argument("--model", required=True, action="append",
                        help="model name; give it again for a cascade, cheapest first "
                             "(--model small --model large)")
    parser.add_argument("--output", default="completion", help="answer column name")
    parser.add_argument("--system", help="system message template")
    parser.add_argument("--base-url", help="endpoint; default OPENAI_BASE_URL, then OpenAI "
                                           "(the API key comes from OPENAI_API_KEY)")
    parser.add_argument("--cache", help=f"cache file; default {_cache.CACHE_ENV}, then "
                                        f"{_cache.default_cache_path()}")
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rpm", type=float, help="requests per minute to stay under")
    parser.add_argument("--tpm", type=float, help="tokens per minute to stay under")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per attempt")
    parser.add_argument("--max-attempts", type=int, default=5)
    parser.add_argument("--price-input", type=float, metavar="USD",
                        help="$ per 1M input tokens (default: llm_ops.PRICES for the model)")
    parser.add_argument("--price-output", type=float, metavar="USD",
                        help="$ per 1M output tokens")
    parser.add_argument("--price-request", type=float, metavar="USD", help="$ per request")
    parser.add_argument("--max-cost", type=float, metavar="USD",
                        help="stop sending once the projected spend would pass this")
    parser.add_argument("--max-requests", type=int, help="stop sending after this many requests")
    parser.add_argument("--chunk-size", type=int, default=5_000,
                        help="distinct requests sent per chunk")
    parser.add_argument("--batch-rows", type=int, default=100_000,
                        help="rows read and written per batch")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-ops",
        description="Run and estimate LLM jobs on files, serve the local endpoint, manage the "
                    "cache. Errors print one line and exit non-zero; --debug shows tracebacks.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run a prompt over every row of a file",
                              description="Run a prompt over every row of a Parquet or CSV "
                                          "file and write the rows with their answers.")
    _add_job_arguments(run)
    run.add_argument("--out", required=True, help="output file (.parquet)")
    run.add_argument("--strict", action="store_true",
                     help="exit with status 1 when any row failed")
    run.add_argument("--no-progress", action="store_true", help="no progress line")
    run.add_argument("--escalate", metavar="SQL",
                     help="with a cascade: rows for the next model besides failed ones, a SQL "
                          "condition over the columns, e.g. \"completion LIKE 'unsure:%%'\"")
    run.add_argument("--semantic-cache", metavar="EMBEDDING_MODEL",
                     help="reuse answers of similar cached requests, compared with this "
                          "embedding model (rows get status 'similar')")
    run.add_argument("--similarity", type=float, default=0.95, metavar="COSINE",
                     help="with --semantic-cache: the similarity from which an answer is "
                          "reused (default 0.95)")

    estimate = commands.add_parser(
        "estimate", help="count what a job would send, without sending anything",
        description="Plan a job without sending anything: rows, distinct requests, cache hits, "
                    "requests and tokens to send.")
    _add_job_arguments(estimate)

    serve_parser = commands.add_parser(
        "serve", help="serve the local OpenAI-compatible simulator",
        description="Serve the local simulator (for development, demos and tests, not a model) "
                    "on 127.0.0.1.")
    serve_parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve_parser.add_argument("--latency", type=float, default=0.0, help="seconds per answer")
    serve_parser.add_argument("--rpm", type=int, help="requests per minute before 429s")
    serve_parser.add_argument("--tpm", type=int, help="tokens per minute before 429s")
    serve_parser.add_argument("--fault-rate", type=float, default=0.0,
                              help=f"share of attempts failing as one of {', '.join(FAULT_KINDS)}")
    serve_parser.add_argument("--hang-rate", type=float, default=0.0,
                              help="share of attempts that never answer")

    cache = commands.add_parser("cache", help="inspect, export and prune the cache",
                                description="Inspect, export and prune the cache database.")
    cache.add_argument("--cache", help=f"cache file; default {_cache.CACHE_ENV}, then "
                                       f"{_cache.default_cache_path()}")
    actions = cache.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("stats", help="answers, tokens and runs per model",
                       description="Answers, tokens and runs per model.")
    export = actions.add_parser("export", help="write cached answers to Parquet",
                                description="Write cached answers to a Parquet file.")
    export.add_argument("out", help="Parquet file to write")
    export.add_argument("--model", help="only this model")
    prune = actions.add_parser("prune", help="delete cached answers",
                               description="Delete cached answers matching every filter given.")
    prune.add_argument("--model", help="only this model")
    prune.add_argument("--older-than", type=float, metavar="DAYS", help="created before")
    prune.add_argument("--status", choices=["ok", "truncated"], help="only this status")
    prune.add_argument("--dry-run", action="store_true", help="count, do not delete")
    snapshot = actions.add_parser(
        "snapshot", help="copy the cache into a new file to query while jobs write",
        description="Copy the cache (and answers still in its journal) into a new DuckDB file, "
                    "which you can keep open for as long as you like, in any tool, while jobs "
                    "go on writing the original.")
    snapshot.add_argument("out", help="DuckDB file to create")
    actions.add_parser("vacuum", help="rewrite the file to reclaim space",
                       description="Rewrite the cache file to reclaim the space of deleted rows.")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``llm-ops`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    handlers = {"run": _run, "estimate": _estimate, "serve": _serve, "cache": _cache_command}
    try:
        return handlers[args.command](args)
    except (LlmOpsError, OSError, duckdb.Error, pl.exceptions.PolarsError) as exc:
        if args.debug:
            raise
        message = " ".join(str(exc).split())
        print(f"llm-ops: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("llm-ops: interrupted; answers so far are cached", file=sys.stderr)
        return 130


def _job(
    args: argparse.Namespace, schema: pl.Schema, *, progress: ProgressOption = False,
    api_key: str | None = None,
) -> Job:
    return make_job(
        schema, prompt=args.prompt, model=args.model if len(args.model) > 1 else args.model[0],
        output=args.output, system=args.system,
        base_url=args.base_url, api_key=api_key, cache=args.cache, concurrency=args.concurrency,
        max_tokens=args.max_tokens, temperature=args.temperature, max_attempts=args.max_attempts,
        timeout=args.timeout, rpm=args.rpm, tpm=args.tpm, progress=progress,
        pricing=_price(args), max_cost=args.max_cost, max_requests=args.max_requests,
        semantic_cache=_semantic_cache(args), escalate=getattr(args, "escalate", None),
    )


def _semantic_cache(args: argparse.Namespace) -> SemanticCache | None:
    model = getattr(args, "semantic_cache", None)
    return SemanticCache(model, threshold=args.similarity) if model else None


def _price(args: argparse.Namespace) -> Price | None:
    given = (args.price_input, args.price_output, args.price_request)
    if all(value is None for value in given):
        return None
    return Price(input_per_million=args.price_input or 0.0,
                 output_per_million=args.price_output or 0.0,
                 per_request=args.price_request or 0.0)


def _csv_as_parquet(files: list[Path], work: Path) -> list[Path]:
    """CSV inputs are converted once, streaming, so every job runs on Parquet."""
    if all(f.suffix.lower() != ".csv" for f in files):
        return files
    converted = []
    for number, file in enumerate(files):
        target = work / f"input-{number:05d}.parquet"
        pl.scan_csv(file).sink_parquet(target)
        converted.append(target)
    return converted


def _run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="llm-ops-csv-") as scratch:
        files = _csv_as_parquet(input_files(args.input), Path(scratch))
        if any(f.resolve() == out.resolve() for f in files):
            raise ConfigError(f"--out {out} is also an input; write somewhere else")
        job = _job(args, input_schema(files), progress=False if args.no_progress else None)
        report = run_table(job, files, out, batch_rows=args.batch_rows,
                           chunk_size=args.chunk_size)
    print(report)
    print(f"wrote {out}")
    if report.failed_rows:
        print(f"{report.failed_rows:,} row(s) failed; see the {job.status_column} and "
              f"{job.error_column} columns. A rerun sends only those.", file=sys.stderr)
        return 1 if args.strict else 0
    return 0


def _estimate(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="llm-ops-estimate-") as scratch:
        work = Path(scratch)
        files = _csv_as_parquet(input_files(args.input), work)
        first = argparse.Namespace(**{**vars(args), "model": args.model[:1]})  # sees every row
        job = _job(first, input_schema(files), api_key="not-needed-nothing-is-sent")
        plan = plan_table(job, files, work, batch_rows=args.batch_rows,
                          chunk_size=args.chunk_size)
        chars = 0
        if plan.chunks:
            chars = int(pl.scan_parquet(plan.chunks).select(
                (pl.col("prompt").str.len_chars() + pl.col("system").str.len_chars()
                 .fill_null(0)).sum()
            ).collect().item())
    input_tokens = chars // 4 + 4 * plan.misses * (2 if args.system else 1)
    output_max = plan.misses * args.max_tokens if args.max_tokens else None
    output_bound = (f"{output_max:,}" if output_max is not None
                    else "unbounded (set --max-tokens for a bound)")
    # From every row answered by the first model to every row sent to every model.
    prices = [price_for(model, _price(args)) for model in args.model]
    low = cost_or_none(prices[0], requests=plan.misses, input_tokens=input_tokens,
                       output_tokens=0)
    high: float | None = 0.0
    for price in prices:
        high = add_costs(high, None if output_max is None else cost_or_none(
            price, requests=plan.misses, input_tokens=input_tokens, output_tokens=output_max))
    print(f"rows                 {plan.rows:>12,}")
    print(f"rows skipped (null)  {plan.skipped:>12,}")
    print(f"distinct requests    {plan.distinct:>12,}")
    print(f"cache hits           {plan.cache_hits:>12,}")
    print(f"requests to send     {plan.misses:>12,}")
    print(f"input tokens (est.)  {input_tokens:>12,}   (about 4 characters a token)")
    print(f"output tokens (max)  {output_bound:>12}")
    print(f"cost                 {_money(low)} to {_money(high)}")
    return 0


def _money(amount: float | None) -> str:
    return "unknown" if amount is None else f"${amount:,.4f}"


def _serve(args: argparse.Namespace) -> int:
    config = SimulatorConfig(latency=args.latency, rpm=args.rpm, tpm=args.tpm,
                             fault_rate=args.fault_rate, hang_rate=args.hang_rate)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config, port=args.port))
    return 0


def _cache_command(args: argparse.Namespace) -> int:
    path = _cache.resolve_cache_path(args.cache)
    assert path is not None
    if args.action == "stats":
        return _stats(path)
    if args.action == "export":
        return _export(path, Path(args.out), args.model)
    if args.action == "prune":
        return _prune(path, args)
    if args.action == "snapshot":
        out = _cache.Cache(path).snapshot(args.out)
        print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB), a copy of {path}")
        return 0
    return _vacuum(path)


def _stats(path: Path) -> int:
    with _cache.open_cache(path) as con:
        rows = con.sql(
            "SELECT model, count(*) AS answers, sum(prompt_tokens) AS tokens_in, "
            "sum(completion_tokens) AS tokens_out, max(created_at) AS newest "
            "FROM llm_cache GROUP BY model ORDER BY answers DESC"
        ).pl()
        runs = con.sql("SELECT count(*) FROM llm_runs").fetchall()[0][0]
    print(f"cache {path} ({path.stat().st_size / 1e6:.1f} MB), {runs:,} run(s) recorded")
    with pl.Config(tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
        print(rows)
    return 0


def _filters(model: str | None, older_than: float | None = None,
             status: str | None = None) -> tuple[str, list[Any]]:
    clauses: list[str] = ["TRUE"]
    params: list[Any] = []
    if model:
        clauses.append("model = ?")
        params.append(model)
    if older_than is not None:
        clauses.append("created_at < now() - to_days(CAST(? AS INTEGER))")
        params.append(older_than)
    if status:
        clauses.append("status = ?")
        params.append(status)
    return " AND ".join(clauses), params


def _export(path: Path, out: Path, model: str | None) -> int:
    where, params = _filters(model)
    with _cache.open_cache(path) as con:
        frame = con.sql(f"SELECT * FROM llm_cache WHERE {where} ORDER BY created_at",
                        params=params).pl()
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(out)
    print(f"exported {frame.height:,} answer(s) to {out}")
    return 0


def _prune(path: Path, args: argparse.Namespace) -> int:
    where, params = _filters(args.model, args.older_than, args.status)
    if where == "TRUE":
        raise ConfigError("prune needs at least one of --model, --older-than, --status")
    with _cache.open_cache(path, read_only=args.dry_run) as con:
        count = con.execute(f"SELECT count(*) FROM llm_cache WHERE {where}", params).fetchall()
        if not args.dry_run:
            con.execute(f"DELETE FROM llm_cache WHERE {where}", params).fetchall()
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {count[0][0]:,} answer(s)")
    return 0


def _vacuum(path: Path) -> int:
    before = path.stat().st_size
    fresh = path.with_name(path.name + ".vacuum")
    fresh.unlink(missing_ok=True)
    with _cache.open_cache(path, read_only=False) as con:
        con.execute(f"ATTACH '{str(fresh).replace(chr(39), chr(39) * 2)}' AS fresh")
        con.execute(f"COPY FROM DATABASE {_database_name(con)} TO fresh")
        con.execute("DETACH fresh")
    fresh.replace(path)
    print(f"vacuumed {path}: {before / 1e6:.1f} MB -> {path.stat().st_size / 1e6:.1f} MB")
    return 0


def _database_name(con: duckdb.DuckDBPyConnection) -> str:
    return str(con.execute("SELECT current_database()").fetchall()[0][0])


if __name__ == "__main__":
    sys.exit(main())

