"""``llm-ops cache ...``: what people do with the cache file, through :class:`llm_ops.Cache`:
its stats, an export of its answers, pruning them, a snapshot, a vacuum, a merge of what
waits in its journal."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from .._cache import CACHE_ENV, MERGE_WAIT, Cache, resolve_cache_path
from ..exceptions import ConfigError
from ._parser import CACHE_HELP, Commands


def add_commands(commands: Commands) -> None:
    cache = commands.add_parser(
        "cache",
        help="inspect, export and prune the cache",
        description="Inspect, export and prune the cache database.",
    )
    cache.set_defaults(handler=cache_command)
    cache.add_argument("--cache", help=CACHE_HELP)
    # --cache also after the action (cache stats --cache x.duckdb); SUPPRESS keeps an action
    # without it from resetting the one given before.
    cache_path = argparse.ArgumentParser(add_help=False)
    cache_path.add_argument("--cache", default=argparse.SUPPRESS, help=CACHE_HELP)
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


def cache_command(args: argparse.Namespace) -> int:
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
