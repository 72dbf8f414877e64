"""The ``llm-ops`` parser, and what several commands share: the cache file (``--cache``), the
variable that holds the API key (``--api-key-env``), the format of an ``--out`` file."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeAlias

from .._cache import CACHE_ENV, default_cache_path
from ..exceptions import ConfigError

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""Where a group adds its commands: what ``add_subparsers`` returns."""

DEFAULT_KEY_ENV = "OPENAI_API_KEY"
CACHE_HELP = f"cache file; default {CACHE_ENV}, then {default_cache_path()}"


def parser(*groups: Callable[[Commands], None]) -> argparse.ArgumentParser:
    """``llm-ops``, with the commands each of ``groups`` adds, in that order."""
    top = argparse.ArgumentParser(
        prog="llm-ops",
        description="Run and estimate LLM jobs on files, query with SQL, serve the local "
        "endpoint, manage the cache. Errors print one line and exit non-zero; --debug shows "
        "tracebacks.",
    )
    top.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_commands in groups:
        add_commands(commands)
    return top


def add_api_key_env(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-key-env",
        metavar="NAME",
        help=f"environment variable that holds the API key (default {DEFAULT_KEY_ENV})",
    )


def api_key(args: argparse.Namespace) -> str | None:
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


def output_format(out: Path) -> Literal["parquet", "csv"]:
    suffix = out.suffix.lower()
    if suffix == ".parquet":
        return "parquet"
    if suffix == ".csv":
        return "csv"
    raise ConfigError(f"cannot write {out}: name a .parquet or a .csv file")
