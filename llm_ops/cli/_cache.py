"""``llm-ops cache ...``: what people do with the cache file, through :class:`llm_ops.Cache`:
its stats, an export of its answers, pruning them, a snapshot, a vacuum, a merge of what
waits in its journal."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from .._cache import MERGE_WAIT, Cache
from ..exceptions import ConfigError
from ._parser import CACHE_HELP, Commands, Handler, cache_of, command, missing_cache, print_table


def add_commands(commands: Commands) -> None:
    # A group without a handler of its own: each action below names its own.
    cache = commands.add_parser(
        "cache",
        help="inspect, export and prune the cache",
        description="Inspect, export and prune the cache database.",
    )
    cache.add_argument("--cache", help=CACHE_HELP)
    # --cache also after the action (cache stats --cache x.duckdb); SUPPRESS keeps an action
    # without it from resetting the one given before.
    cache_path = argparse.ArgumentParser(add_help=False)
    cache_path.add_argument("--cache", default=argparse.SUPPRESS, help=CACHE_HELP)
    actions = cache.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(
        name: str, handler: Handler, summary: str, description: str
    ) -> argparse.ArgumentParser:
        return command(
            actions, name, handler, summary=summary, description=description, parents=[cache_path]
        )

    action(
        "stats", stats, "answers, tokens and runs per model", "Answers, tokens and runs per model."
    )
    export_parser = action(
        "export",
        export,
        "write cached answers to Parquet",
        "Write cached answers to a Parquet file.",
    )
    export_parser.add_argument("out", help="Parquet file to write")
    export_parser.add_argument("--model", help="only this model")
    prune_parser = action(
        "prune",
        prune,
        "delete cached answers",
        "Delete cached answers matching every filter given.",
    )
    prune_parser.add_argument("--model", help="only this model")
    prune_parser.add_argument("--older-than", type=float, metavar="DAYS", help="created before")
    prune_parser.add_argument("--status", choices=["ok", "truncated"], help="only this status")
    prune_parser.add_argument("--dry-run", action="store_true", help="count, do not delete")
    snapshot_parser = action(
        "snapshot",
        snapshot,
        "copy the cache into a new file to query while jobs write",
        "Copy the cache (and answers still in its journal) into a new DuckDB file, which you "
        "can keep open for as long as you like, in any tool, while jobs go on writing the "
        "original.",
    )
    snapshot_parser.add_argument("out", help="DuckDB file to create")
    vacuum_parser = action(
        "vacuum",
        vacuum,
        "rewrite the file to reclaim space",
        "Rewrite the cache file to reclaim the space of deleted rows. Safe while jobs run: "
        "their merges wait for it, and nothing they write is lost; it refuses to start while "
        "a job is merging into the file, unless --wait.",
    )
    vacuum_parser.add_argument(
        "--wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long to wait for running jobs to pause merging into the file "
        "(default: do not wait, refuse at once)",
    )
    merge_parser = action(
        "merge",
        merge,
        "merge answers waiting in the journal into the file",
        "Merge into the cache file what finished jobs left in its journal (say, because a "
        "reader held the file when they ended), so that every tool sees it; jobs still running "
        "merge their own. Exits 1 when some cannot be merged: the file stays held, or the "
        "merge fails (it says why).",
    )
    merge_parser.add_argument(
        "--wait",
        type=float,
        default=MERGE_WAIT,
        metavar="SECONDS",
        help=f"how long to wait for a reader to let go of the file (default {MERGE_WAIT:.0f})",
    )


def stats(args: argparse.Namespace) -> int:
    cache = _existing(args)
    per_model, runs = cache.stats()
    size = cache.path.stat().st_size
    print(f"cache {cache.path} ({size / 1e6:.1f} MB), {runs:,} run(s) recorded")
    print_table(pl.from_arrow(per_model))
    return 0


def export(args: argparse.Namespace) -> int:
    answers = _existing(args).export(model=args.model)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(answers, args.out)
    print(f"exported {answers.num_rows:,} answer(s) to {args.out}")
    return 0


def prune(args: argparse.Namespace) -> int:
    count = _existing(args).prune(
        model=args.model,
        older_than_days=args.older_than,
        status=args.status,
        dry_run=args.dry_run,
    )
    print(f"{'would delete' if args.dry_run else 'deleted'} {count:,} answer(s)")
    return 0


def snapshot(args: argparse.Namespace) -> int:
    cache = cache_of(args)  # which says itself when the target is taken or there is no cache
    out = cache.snapshot(args.out)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB), a copy of {cache.path}")
    return 0


def vacuum(args: argparse.Namespace) -> int:
    cache = _existing(args)
    if args.wait is not None and args.wait < 0:
        raise ConfigError(f"--wait must be 0 or more seconds, got {args.wait:g}")
    before, after = cache.vacuum(wait=args.wait)
    print(f"vacuumed {cache.path}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return 0


def merge(args: argparse.Namespace) -> int:
    cache = cache_of(args)
    if args.wait < 0:
        raise ConfigError(f"--wait must be 0 or more seconds, got {args.wait:g}")
    if not cache.path.exists() and not cache.journal.is_dir():
        raise missing_cache(cache.path)
    merged = cache.settle(wait=args.wait, warn=False)
    if merged.files:
        rows = ", ".join(f"{table} {count:,}" for table, count in sorted(merged.rows.items()))
        print(f"merged {merged.files:,} journal file(s) into {cache.path}: {rows or 'no new rows'}")
    elif merged.reason is None:
        print(f"nothing waits in the journal of {cache.path}")
    if merged.running:
        print(f"left {merged.running:,} journal file(s) of running jobs to them")
    if merged.reason is None:
        return 0
    waiting = f"{merged.waiting:,} answer(s)" if merged.waiting else "rows of finished jobs"
    if merged.held:
        print(
            f"llm-ops: {waiting} still wait in the journal: {cache.path} is held by another "
            "process; close it and run llm-ops cache merge again",
            file=sys.stderr,
        )
    else:
        # Not a lock: waiting does not help, and another merge fails the same way until
        # what DuckDB says is fixed.
        print(
            f"llm-ops: {waiting} still wait in the journal {cache.journal}: merging them "
            f"failed: {merged.reason}. They stay there until that is fixed and llm-ops cache "
            "merge runs again. If the message names a journal file, moving that file out of "
            "the journal lets the rest merge (what it holds is sent again when asked for)",
            file=sys.stderr,
        )
    return 1


def _existing(args: argparse.Namespace) -> Cache:
    cache = cache_of(args)
    if not cache.path.exists():
        raise missing_cache(cache.path)
    return cache
