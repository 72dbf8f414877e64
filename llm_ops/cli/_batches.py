"""``llm-ops batches``: the provider batches that jobs with ``--mode batch`` submitted, as the
cache recorded them: list them, ask the provider how they are doing, collect their answers,
cancel them."""

from __future__ import annotations

import argparse

import polars as pl

from .._client import Client
from ..exceptions import ConfigError
from ._parser import (
    Commands,
    add_api_key_env,
    add_client_arguments,
    add_connection_arguments,
    command,
    endpoint_of_args,
    print_table,
)


def add_commands(commands: Commands) -> None:
    batches = command(
        commands,
        "batches",
        manage_batches,
        summary="list, watch, collect and cancel provider batches",
        description="The provider batches that jobs with --mode batch submitted, as recorded "
        "in the cache: list them, ask the provider how they are doing, collect "
        "their answers into the cache, or cancel them.",
    )
    batches.add_argument("action", choices=["list", "status", "collect", "cancel"])
    batches.add_argument("--job", help="only this submission (its id, as listed)")
    add_client_arguments(batches)
    add_api_key_env(batches)
    add_connection_arguments(batches)


def manage_batches(args: argparse.Namespace) -> int:
    if args.action == "cancel" and not args.job:
        raise ConfigError("cancel needs --job ID: the submission to cancel (see 'batches list')")
    with Client(endpoint=endpoint_of_args(args), cache=args.cache) as client:
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
    print_table(rows, rows=len(parts), text_length=40)
    return 0
