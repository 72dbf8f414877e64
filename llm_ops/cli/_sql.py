"""``llm-ops sql``: a DuckDB query with the SQL functions of :mod:`llm_ops.sql`, and the cache
attached read-only as ``cache``."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa

from .._cache import DUCKDB_CONFIG, Cache
from .._config import Endpoint
from .._endpoint import ResolvedEndpoint
from ..exceptions import CacheError, ConfigError, MissingApiKeyError
from ..sql import register
from ._parser import (
    DEFAULT_KEY_ENV,
    Commands,
    add_api_key_env,
    add_client_arguments,
    add_connection_arguments,
    add_output_argument,
    api_key,
    cache_of,
    command,
    connection_options,
    missing_cache,
    output_format,
    print_table,
)


def add_commands(commands: Commands) -> None:
    sql = command(
        commands,
        "sql",
        run_query,
        summary="run a DuckDB query with llm_complete and the cache",
        description="Run a DuckDB query (in memory) with the SQL functions llm_complete, "
        "llm_complete_result and llm_request_key, and the cache attached read-only as "
        "'cache' (SELECT * FROM cache.llm_cache). Prints the result, or writes it with --output.",
    )
    sql.add_argument(
        "query", nargs="?", help='the query, e.g. "SELECT count(*) FROM cache.llm_cache"'
    )
    sql.add_argument("--file", metavar="FILE", help="read the query from this file instead")
    sql.add_argument(
        "--model",
        metavar="MODEL",
        help="llm_complete's model where a call names none (model := ...)",
    )
    add_client_arguments(sql)
    add_output_argument(
        sql, required=False, help="write the result to this .parquet or .csv file instead"
    )
    sql.add_argument(
        "--max-rows", type=int, default=100, metavar="N", help="rows printed (default 100)"
    )
    add_api_key_env(sql)
    add_connection_arguments(sql)


def run_query(args: argparse.Namespace) -> int:
    if (args.query is None) == (args.file is None):
        raise ConfigError("give the query, or --file with a file that holds it (not both)")
    query = args.query if args.file is None else Path(args.file).read_text()
    out = None if args.output is None else Path(args.output)
    out_format = None if out is None else output_format(out)
    key = api_key(args)
    cache = cache_of(args)
    path, attached = cache.path, cache.path.exists()
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
            raise missing_cache(path, so=", so no cache.llm_cache") from exc
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
        register(
            con,
            model=args.model,
            endpoint=Endpoint(args.base_url, api_key=key, **connection_options(args)),
            cache=cache,
        )
    except MissingApiKeyError:
        # A query of the cache needs no key: the functions fail only when a query calls them.
        endpoint = ResolvedEndpoint.resolve(args.base_url, need_key=False).identity
        message = (
            f"llm_complete needs an API key for {endpoint}: set {DEFAULT_KEY_ENV}, or name the "
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
    print_table(frame, rows=max(held, 1), text_length=80)
    if hidden:
        print(f"{hidden:,} more row(s) not shown; raise --max-rows, or write them with --output")
