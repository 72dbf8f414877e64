"""``llm-ops``: run and estimate jobs on files, query with SQL, serve the local endpoint,
manage the cache.

Every subcommand has ``--help``. Errors print one line and exit non-zero; ``--debug`` shows
the traceback instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ._cache import (
    CACHE_ENV,
    DUCKDB_CONFIG,
    MERGE_WAIT,
    Cache,
    default_cache_path,
    resolve_cache_path,
)
from ._client import Client
from ._operator import llm_complete
from ._options import Options, split_options
from ._pricing import Price
from ._semantic import SemanticCache
from ._spec import Endpoint
from .exceptions import CacheError, ConfigError, LlmOpsError, MissingApiKeyError
from .sql import register
from .tables import Table, input_files
from .testing import DEFAULT_PORT, FAULT_KINDS, SimulatorConfig, serve

_DEFAULT_KEY_ENV = "OPENAI_API_KEY"
_CACHE_HELP = f"cache file; default {CACHE_ENV}, then {default_cache_path()}"
# Options a flag can carry (a number or a text), under their own names; the rest have flags of
# their own below (prices, the semantic cache), come from the environment (api_key, named by
# --api-key-env) or do not apply to files.
_SKIPPED = {
    "api_key",
    "on_error",
    "progress",
    "schema",
    "repair",
    "pricing",
    "escalate",
    "semantic_cache",
    "model",
}


def _flag(hint: object) -> dict[str, Any] | None:
    """How argparse reads an option that holds one number, text or choice (or None)."""
    if get_origin(hint) is Literal:
        return {"choices": list(get_args(hint))}
    kinds = {arg for arg in (get_args(hint) or (hint,)) if arg is not type(None)}
    for kind in (int, float, str):
        if kind in kinds:
            return {"type": kind}
    return None


def _option_help() -> dict[str, str]:
    """Each option's first sentence, from llm_complete's docstring: one text for both."""
    doc = inspect.getdoc(llm_complete) or ""
    section = doc.split("Parameters\n----------\n", 1)[-1].split("\n\nExamples", 1)[0]
    found: dict[str, str] = {}
    for block in re.split(r"\n(?=\S)", section):
        names, _, text = block.partition("\n")
        sentence = " ".join(text.split()).split(". ")[0].rstrip(".")
        for name in names.split(","):
            found[name.strip()] = sentence.replace("%", "%%").replace("``", "")
    return found


def _add_job_arguments(parser: argparse.ArgumentParser) -> list[str]:
    """The arguments of a job on files; returns the option names given as flags."""
    parser.add_argument("input", help="Parquet or CSV file, or a glob like 'data/*.parquet'")
    parser.add_argument("--prompt", required=True, help="template, e.g. 'Summarize: {text}'")
    parser.add_argument(
        "--model",
        required=True,
        action="append",
        help="model name; give it again for a cascade, cheapest first "
        "(--model small --model large)",
    )
    helps = _option_help()
    named = []
    for name, hint in get_type_hints(Options).items():
        how = _flag(hint)
        if name in _SKIPPED or how is None:
            continue
        flag = "--" + name.replace("_", "-")
        if name == "stop":
            parser.add_argument(flag, action="append", help=helps.get(name))
        else:
            parser.add_argument(flag, **how, help=helps.get(name))
        named.append(name)
    parser.add_argument(
        "--batch", action="store_const", const="batch", dest="mode", help="the same as --mode batch"
    )
    parser.add_argument(
        "--price-input",
        type=float,
        metavar="USD",
        help="$ per 1M input tokens (default: llm_ops.PRICES for the model)",
    )
    parser.add_argument("--price-output", type=float, metavar="USD", help="$ per 1M output tokens")
    parser.add_argument("--price-request", type=float, metavar="USD", help="$ per request")
    parser.add_argument(
        "--price",
        action="append",
        type=_model_price,
        metavar="MODEL=IN,OUT",
        help="$ per 1M input and output tokens of one model, e.g. sim-small=0.15,0.60; once "
        "per model of a cascade (instead of --price-input/--price-output)",
    )
    parser.add_argument(
        "--chunk-size", type=int, default=5_000, help="distinct requests sent per chunk"
    )
    parser.add_argument(
        "--batch-rows", type=int, default=100_000, help="rows read and written per batch"
    )
    parser.add_argument(
        "--escalate",
        metavar="SQL",
        help="with a cascade: rows for the next model besides failed ones, a SQL "
        "condition over the columns, e.g. \"completion LIKE 'unsure:%%'\"",
    )
    parser.add_argument(
        "--semantic-cache",
        metavar="EMBEDDING_MODEL",
        help="reuse answers of similar cached requests, compared with this "
        "embedding model (rows get status 'similar')",
    )
    parser.add_argument(
        "--similarity",
        type=float,
        default=0.95,
        metavar="COSINE",
        help="with --semantic-cache: the similarity from which an answer is reused (default 0.95)",
    )
    _add_api_key_env(parser)
    return named


def _add_api_key_env(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-key-env",
        metavar="NAME",
        help=f"environment variable that holds the API key (default {_DEFAULT_KEY_ENV})",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-ops",
        description="Run and estimate LLM jobs on files, query with SQL, serve the local "
        "endpoint, manage the cache. Errors print one line and exit non-zero; --debug shows "
        "tracebacks.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="run a prompt over every row of a file",
        description="Run a prompt over every row of a Parquet or CSV "
        "file and write the rows with their answers.",
    )
    run.set_defaults(option_flags=_add_job_arguments(run))
    run.add_argument("--out", required=True, help="output file, .parquet or .csv")
    run.add_argument("--strict", action="store_true", help="exit with status 1 when any row failed")
    run.add_argument("--no-progress", action="store_true", help="no progress line")
    run.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="send the chunks on a Ray cluster: 'local' (started here), 'auto' or "
        "'ray://host:10001' (pip install 'llm-ops[ray]')",
    )
    run.add_argument(
        "--ray-workers",
        type=int,
        metavar="N",
        help="with --ray: chunks sent at once (a local cluster's CPUs)",
    )

    estimate = commands.add_parser(
        "estimate",
        help="count what a job would send, without sending anything",
        description="Plan a job without sending anything: rows, distinct requests, cache hits, "
        "requests and tokens to send.",
    )
    estimate.set_defaults(option_flags=_add_job_arguments(estimate))

    sql = commands.add_parser(
        "sql",
        help="run a DuckDB query with llm_complete and the cache",
        description="Run a DuckDB query (in memory) with the SQL functions llm_complete, "
        "llm_complete_result and llm_request_key, and the cache attached read-only as "
        "'cache' (SELECT * FROM cache.llm_cache). Prints the result, or writes it with --out.",
    )
    sql.add_argument(
        "query", nargs="?", help='the query, e.g. "SELECT count(*) FROM cache.llm_cache"'
    )
    sql.add_argument("--file", help="read the query from this file instead")
    sql.add_argument("--model", help="llm_complete's model where a call names none (model := ...)")
    sql.add_argument("--base-url", help="endpoint; default OPENAI_BASE_URL, then OpenAI")
    sql.add_argument("--cache", help=_CACHE_HELP)
    sql.add_argument("--out", help="write the result to this .parquet or .csv file instead")
    sql.add_argument(
        "--max-rows", type=int, default=100, metavar="N", help="rows printed (default 100)"
    )
    _add_api_key_env(sql)

    serve_parser = commands.add_parser(
        "serve",
        help="serve the local OpenAI-compatible simulator",
        description="Serve the local simulator (for development, demos and tests, not a model) "
        "on 127.0.0.1.",
    )
    serve_parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve_parser.add_argument("--latency", type=float, default=0.0, help="seconds per answer")
    serve_parser.add_argument("--rpm", type=int, help="requests per minute before 429s")
    serve_parser.add_argument("--tpm", type=int, help="tokens per minute before 429s")
    serve_parser.add_argument(
        "--fault-rate",
        type=float,
        default=0.0,
        help=f"share of attempts failing as one of {', '.join(FAULT_KINDS)}",
    )
    serve_parser.add_argument(
        "--hang-rate", type=float, default=0.0, help="share of attempts that never answer"
    )

    batches = commands.add_parser(
        "batches",
        help="list, watch, collect and cancel provider batches",
        description="The provider batches that jobs with --mode batch submitted, as recorded "
        "in the cache: list them, ask the provider how they are doing, collect "
        "their answers into the cache, or cancel them.",
    )
    batches.add_argument("action", choices=["list", "status", "collect", "cancel"])
    batches.add_argument("--job", help="only this submission (its id, as listed)")
    batches.add_argument("--base-url", help="endpoint; default OPENAI_BASE_URL, then OpenAI")
    batches.add_argument("--cache", help=_CACHE_HELP)
    _add_api_key_env(batches)

    cache = commands.add_parser(
        "cache",
        help="inspect, export and prune the cache",
        description="Inspect, export and prune the cache database.",
    )
    cache.add_argument("--cache", help=_CACHE_HELP)
    # --cache also after the action (cache stats --cache x.duckdb); SUPPRESS keeps an action
    # without it from resetting the one given before.
    cache_path = argparse.ArgumentParser(add_help=False)
    cache_path.add_argument("--cache", default=argparse.SUPPRESS, help=_CACHE_HELP)
    actions = cache.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser(
        "stats",
        parents=[cache_path],
        help="answers, tokens and runs per model",
        description="Answers, tokens and runs per model.",
    )
    export = actions.add_parser(
        "export",
        parents=[cache_path],
        help="write cached answers to Parquet",
        description="Write cached answers to a Parquet file.",
    )
    export.add_argument("out", help="Parquet file to write")
    export.add_argument("--model", help="only this model")
    prune = actions.add_parser(
        "prune",
        parents=[cache_path],
        help="delete cached answers",
        description="Delete cached answers matching every filter given.",
    )
    prune.add_argument("--model", help="only this model")
    prune.add_argument("--older-than", type=float, metavar="DAYS", help="created before")
    prune.add_argument("--status", choices=["ok", "truncated"], help="only this status")
    prune.add_argument("--dry-run", action="store_true", help="count, do not delete")
    snapshot = actions.add_parser(
        "snapshot",
        parents=[cache_path],
        help="copy the cache into a new file to query while jobs write",
        description="Copy the cache (and answers still in its journal) into a new DuckDB file, "
        "which you can keep open for as long as you like, in any tool, while jobs "
        "go on writing the original.",
    )
    snapshot.add_argument("out", help="DuckDB file to create")
    actions.add_parser(
        "vacuum",
        parents=[cache_path],
        help="rewrite the file to reclaim space",
        description="Rewrite the cache file to reclaim the space of deleted rows.",
    )
    merge = actions.add_parser(
        "merge",
        parents=[cache_path],
        help="merge answers waiting in the journal into the file",
        description="Merge into the cache file what finished jobs left in its journal (say, "
        "because a reader held the file when they ended), so that every tool sees it; jobs "
        "still running merge their own. Exits 1 when the file stays held.",
    )
    merge.add_argument(
        "--wait",
        type=float,
        default=MERGE_WAIT,
        metavar="SECONDS",
        help=f"how long to wait for a reader to let go of the file (default {MERGE_WAIT:.0f})",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``llm-ops`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    handlers = {
        "run": _run,
        "estimate": _estimate,
        "sql": _sql,
        "serve": _serve,
        "cache": _cache_command,
        "batches": _batches,
    }
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


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The job's options from the flags, by their names (see :class:`llm_ops.Options`)."""
    options = {
        name: getattr(args, name) for name in args.option_flags if getattr(args, name) is not None
    }
    price = Price.given(args.price_input, args.price_output, args.price_request)
    if price is not None and args.price:
        raise ConfigError(
            "give prices per model (--price MODEL=IN,OUT) or for every model "
            "(--price-input/--price-output/--price-request), not both"
        )
    if price is not None:
        options["pricing"] = price
    if args.price:
        options["pricing"] = dict(args.price)
    if args.semantic_cache:
        options["semantic_cache"] = SemanticCache(args.semantic_cache, threshold=args.similarity)
    if args.escalate:
        options["escalate"] = args.escalate
    key = _api_key(args)
    if key is not None:
        options["api_key"] = key
    return options


def _model_price(text: str) -> tuple[str, Price]:
    """``MODEL=IN,OUT`` (dollars per million input and output tokens) → (model, price)."""
    model, _, rates = text.partition("=")
    try:
        given, taken = (float(rate) for rate in rates.split(","))
    except ValueError:
        model = ""
    if not model:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not MODEL=IN,OUT, e.g. gpt-4o-mini=0.15,0.60"
        )
    return model, Price(input_per_million=given, output_per_million=taken)


def _api_key(args: argparse.Namespace) -> str | None:
    """The key in the variable ``--api-key-env`` names; ``None`` without the flag (the client
    then reads OPENAI_API_KEY itself)."""
    if args.api_key_env is None:
        return None
    key = os.environ.get(args.api_key_env)
    if not key:
        raise ConfigError(
            f"the environment variable {args.api_key_env} is not set: set it to your API key "
            "(--api-key-env names the variable that holds it)"
        )
    return key


def _output_format(out: Path) -> Literal["parquet", "csv"]:
    suffix = out.suffix.lower()
    if suffix == ".parquet":
        return "parquet"
    if suffix == ".csv":
        return "csv"
    raise ConfigError(f"cannot write {out}: name a .parquet or a .csv file")


def _check_csv_columns(table: Table) -> None:
    """CSV cannot hold nested values: refuse before anything is paid for, not at the end."""
    schema = pl.scan_parquet(table.files).collect_schema()
    nested = [name for name, dtype in schema.items() if dtype.is_nested()]
    if nested:
        raise ConfigError(
            f"CSV cannot hold the nested column(s) {', '.join(nested)}; write a .parquet "
            "file instead"
        )


def _parquet_to_csv(parquet: Path, out: Path) -> None:
    partial = out.with_name(out.name + ".partial")
    pl.scan_parquet(parquet).sink_csv(partial)
    partial.replace(out)
    parquet.unlink()


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


@contextlib.contextmanager
def _table(args: argparse.Namespace, out: Path, options: dict[str, Any]) -> Iterator[Table]:
    made, call = split_options(options)
    files = input_files(args.input)
    with tempfile.TemporaryDirectory(prefix="llm-ops-csv-") as scratch, Client(**made) as client:
        converted = _csv_as_parquet(files, Path(scratch))
        source = args.input if converted == files else str(Path(scratch) / "input-*.parquet")
        model = args.model if len(args.model) > 1 else args.model[0]
        yield Table(
            client,
            source,
            out,
            prompt=args.prompt,
            model=model,
            batch_rows=args.batch_rows,
            chunk_size=args.chunk_size,
            **call,
        )


def _run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    csv = _output_format(out) == "csv"
    # (the table checks this too, but sees CSV inputs only as their Parquet copies)
    if any(f.resolve() == out.resolve() for f in input_files(args.input)):
        raise ConfigError(f"output {args.out!r} is also an input; write somewhere else")
    # The job writes Parquet, converted to CSV at the end; next to the CSV, so that a rerun
    # after a crash finds the job's work directory.
    written = out.with_name(out.name + ".parquet") if csv else out
    options = _options(args)
    options["progress"] = False if args.no_progress else None
    with _table(args, written, options) as table:
        if csv:
            _check_csv_columns(table)
        if args.ray:
            from .ray import run_on_ray

            report = run_on_ray(table, address=args.ray, workers=args.ray_workers)
        else:
            report = table.run()
        status, error = table.job.columns.status, table.job.columns.error
    if csv:
        _parquet_to_csv(written, out)
    print(report)
    print(f"wrote {out}")
    if report.failed_rows:
        print(
            f"{report.failed_rows:,} row(s) failed; see the {status} and {error} columns. A "
            "rerun sends only those.",
            file=sys.stderr,
        )
        return 1 if args.strict else 0
    return 0


def _estimate(args: argparse.Namespace) -> int:
    options = _options(args)
    # Nothing is sent, so no key is needed; the endpoint still names the cache keys.
    options.setdefault("api_key", os.environ.get(_DEFAULT_KEY_ENV) or "unused")
    with (
        tempfile.TemporaryDirectory(prefix="llm-ops-estimate-") as scratch,
        _table(args, Path(scratch) / "unused.parquet", options) as table,
    ):
        print(table.estimate())
    return 0


def _batches(args: argparse.Namespace) -> int:
    if args.action == "cancel" and not args.job:
        raise ConfigError("cancel needs --job ID: the submission to cancel (see 'batches list')")
    with Client(base_url=args.base_url, cache=args.cache, api_key=_api_key(args)) as client:
        if args.action == "collect":
            collected = client.collect_batches(job_id=args.job)
            print(f"collected {collected:,} answer(s)")
            return 0
        if args.action == "cancel":
            parts = client.cancel_batches(job_id=args.job)
        elif args.action == "status":
            parts = client.refresh_batches(job_id=args.job)
        else:
            parts = client.batches(job_id=args.job)
    if not parts:
        print("no batches recorded")
        return 0
    rows = pl.DataFrame(
        [
            {
                "job": p.job_id,
                "part": p.part,
                "batch": p.batch_id,
                "state": p.state,
                "model": p.model,
                "requests": p.requests,
                **({"answered": p.completed + p.failed} if args.action == "status" else {}),
            }
            for p in parts
        ]
    )
    with pl.Config(
        tbl_hide_dataframe_shape=True,
        tbl_hide_column_data_types=True,
        tbl_rows=len(parts),
        fmt_str_lengths=40,
    ):
        print(rows)
    return 0


def _sql(args: argparse.Namespace) -> int:
    if (args.query is None) == (args.file is None):
        raise ConfigError("give the query, or --file with a file that holds it (not both)")
    query = args.query if args.file is None else Path(args.file).read_text()
    out = None if args.out is None else Path(args.out)
    out_format = None if out is None else _output_format(out)
    key = _api_key(args)
    path = resolve_cache_path(args.cache)
    assert path is not None
    cache, attached = Cache(path), path.exists()
    with contextlib.ExitStack() as stack:
        con = stack.enter_context(duckdb.connect(config=DUCKDB_CONFIG))
        if attached:
            _merge_journal(cache)  # so that cache.llm_cache holds finished jobs' answers
            stack.callback(_merge_journal, cache)  # this query's, once the cache is detached
            stack.enter_context(cache.attached(con, alias="cache"))
        _register_functions(con, args, key, path)
        try:
            result = con.sql(query)
        except duckdb.CatalogException as exc:
            if attached or '"cache"' not in str(exc):
                raise
            raise ConfigError(
                f"there is no cache at {path} yet, so no cache.llm_cache; run a job first, "
                f"or pass the path of an existing cache (--cache or {CACHE_ENV})"
            ) from exc
        if out is None:
            _print_result(result, args.max_rows)
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            if out_format == "csv":
                result.write_csv(str(out))
            else:
                result.write_parquet(str(out))
            print(f"wrote {out}")
    return 0


def _merge_journal(cache: Cache) -> None:
    with contextlib.suppress(CacheError):  # else the next job or query merges them
        cache.merge_orphans(wait=2.0)


def _register_functions(
    con: duckdb.DuckDBPyConnection, args: argparse.Namespace, key: str | None, cache: Path
) -> None:
    try:
        register(con, model=args.model, base_url=args.base_url, api_key=key, cache=cache)
    except MissingApiKeyError:
        # A query of the cache needs no key: the functions fail only when a query calls them.
        endpoint = Endpoint.resolve(args.base_url, need_key=False).identity
        message = (
            f"llm_complete needs an API key for {endpoint}: set {_DEFAULT_KEY_ENV}, or name the "
            "variable that holds it with --api-key-env"
        ).replace("'", "''")
        signature = "prompt, model := NULL, system := NULL, max_tokens := NULL, temperature := NULL"
        for name in ("llm_complete", "llm_complete_result", "llm_request_key"):
            con.execute(f"CREATE TEMP MACRO {name}({signature}) AS error('{message}')")


def _print_result(result: duckdb.DuckDBPyRelation, max_rows: int) -> None:
    """The first ``max_rows`` rows as a table, and how many more there were."""
    shown: list[pa.RecordBatch] = []
    held = hidden = 0
    reader = result.to_arrow_reader(max(1, min(max_rows, 10_000)))
    for batch in reader:  # the rest is only counted, so a big result is never held
        kept = batch.slice(0, max(0, max_rows - held))
        if kept.num_rows:
            shown.append(kept)
        held += kept.num_rows
        hidden += batch.num_rows - kept.num_rows
    frame = pl.from_arrow(pa.Table.from_batches(shown, schema=reader.schema))
    with pl.Config(
        tbl_hide_dataframe_shape=True,
        tbl_hide_column_data_types=True,
        tbl_rows=max(held, 1),
        fmt_str_lengths=80,
    ):
        print(frame)
    if hidden:
        print(f"{hidden:,} more row(s) not shown; raise --max-rows, or write them with --out")


def _serve(args: argparse.Namespace) -> int:
    config = SimulatorConfig(
        latency=args.latency,
        rpm=args.rpm,
        tpm=args.tpm,
        fault_rate=args.fault_rate,
        hang_rate=args.hang_rate,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config, port=args.port))
    return 0


def _merge(cache: Cache, wait: float) -> int:
    if wait < 0:
        raise ConfigError(f"--wait must be 0 or more seconds, got {wait:g}")
    if not cache.path.exists() and not cache.journal.is_dir():
        raise ConfigError(
            f"there is no cache at {cache.path} yet; run a job first, or pass the path "
            f"of an existing cache (--cache or {CACHE_ENV})"
        )
    merged = cache.settle(wait=wait, warn=False)
    if merged.files:
        rows = ", ".join(f"{table} {count:,}" for table, count in sorted(merged.rows.items()))
        print(f"merged {merged.files:,} journal file(s) into {cache.path}: {rows or 'no new rows'}")
    elif not merged.waiting:
        print(f"nothing waits in the journal of {cache.path}")
    if merged.running:
        print(f"left {merged.running:,} journal file(s) of running jobs to them")
    if merged.waiting:
        print(
            f"llm-ops: {merged.waiting:,} answer(s) still wait in the journal: {cache.path} "
            "is held by another process; close it and run llm-ops cache merge again",
            file=sys.stderr,
        )
        return 1
    return 0


def _cache_command(args: argparse.Namespace) -> int:
    path = resolve_cache_path(args.cache)
    assert path is not None
    cache = Cache(path)
    if args.action == "merge":
        return _merge(cache, args.wait)
    if args.action != "snapshot" and not path.exists():
        raise ConfigError(
            f"there is no cache at {path} yet; run a job first, or pass the path "
            f"of an existing cache (--cache or {CACHE_ENV})"
        )
    if args.action == "stats":
        per_model, runs = cache.stats()
        print(f"cache {path} ({path.stat().st_size / 1e6:.1f} MB), {runs:,} run(s) recorded")
        with pl.Config(tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
            print(pl.from_arrow(per_model))
    elif args.action == "export":
        answers = cache.export(model=args.model)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(answers, args.out)
        print(f"exported {answers.num_rows:,} answer(s) to {args.out}")
    elif args.action == "prune":
        count = cache.prune(
            model=args.model,
            older_than_days=args.older_than,
            status=args.status,
            dry_run=args.dry_run,
        )
        print(f"{'would delete' if args.dry_run else 'deleted'} {count:,} answer(s)")
    elif args.action == "snapshot":
        out = cache.snapshot(args.out)
        print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB), a copy of {path}")
    else:
        before, after = cache.vacuum()
        print(f"vacuumed {path}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
