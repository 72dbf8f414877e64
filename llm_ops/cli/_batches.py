"""``llm-ops batches``: the provider batches that jobs with ``--mode batch`` submitted, as the
cache recorded them: list them, ask the provider how they are doing, collect their answers,
cancel them."""

from __future__ import annotations

import argparse

import polars as pl

from .._client import Client
from ..exceptions import ConfigError
from ._parser import CACHE_HELP, Commands, add_api_key_env, api_key


def add_commands(commands: Commands) -> None:
    batches = commands.add_parser(
        "batches",
        help="list, watch, collect and cancel provider batches",
        description="The provider batches that jobs with --mode batch submitted, as recorded "
        "in the cache: list them, ask the provider how they are doing, collect "
        "their answers into the cache, or cancel them.",
    )
    batches.set_defaults(handler=manage_batches)
    batches.add_argument("action", choices=["list", "status", "collect", "cancel"])
    batches.add_argument("--job", help="only this submission (its id, as listed)")
    batches.add_argument("--base-url", help="endpoint; default OPENAI_BASE_URL, then OpenAI")
    batches.add_argument("--cache", help=CACHE_HELP)
    add_api_key_env(batches)


def manage_batches(args: argparse.Namespace) -> int:
    if args.action == "cancel" and not args.job:
        raise ConfigError("cancel needs --job ID: the submission to cancel (see 'batches list')")
    with Client(base_url=args.base_url, cache=args.cache, api_key=api_key(args)) as client:
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
