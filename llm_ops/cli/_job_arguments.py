"""The arguments of a job on files (``run``, ``estimate``), and the options they make.

Every setting (an option of :class:`llm_ops.Options`, or a field of its object, see
:data:`llm_ops.SETTINGS`) that holds a number, a text, a choice or a switch is a flag made
from its declaration (:mod:`llm_ops._settings`); the connection's (headers, TLS, a proxy) are
shared with other commands (:mod:`._parser`). :func:`llm_ops.options_from_settings` makes the
options from them, as the flow does from its parameters.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from .._options import RENAMED_SETTINGS
from .._parameters import add_setting_flags, cli_settings, flag_of
from .._settings import DECLARED, Setting
from ._parser import (
    add_api_key_env,
    add_connection_arguments,
    add_output_argument,
    api_key,
    connection_options,
)


def flagged_settings(declared: Sequence[Setting] = DECLARED) -> set[str]:
    """The settings that are flags of a job on files."""
    return {setting.name for setting in cli_settings(declared)}


class _Renamed(argparse.Action):
    """A former flag: refused, naming the flag it is now."""

    def __init__(self, option_strings: list[str], dest: str, *, now: str, **kwargs: Any):
        super().__init__(option_strings, argparse.SUPPRESS, nargs="?", **kwargs)
        self.now = now

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        parser.error(f"{option_string} is {self.now} now")


def add_job_arguments(
    parser: argparse.ArgumentParser,
    *,
    output: str | None = None,
    declared: Sequence[Setting] = DECLARED,
) -> None:
    """The arguments of a job on files, and ``--output FILE`` with the help ``output`` for a
    job that writes one; a flag per setting of ``declared`` that is one. The settings given
    as flags are kept as ``args.option_flags`` (the flag's ``dest`` to its setting) for
    :func:`job_options`."""
    parser.add_argument("input", help="Parquet or CSV file, or a glob like 'data/*.parquet'")
    parser.add_argument(
        "--prompt",
        required=True,
        metavar="TEMPLATE",
        help="the prompt, with {column} for a column's value, e.g. 'Summarize: {text}'",
    )
    parser.add_argument(
        "--model",
        required=True,
        action="append",
        metavar="MODEL",
        help="model name; give it again for a cascade, cheapest first "
        "(--model small --model large)",
    )
    if output is not None:
        add_output_argument(parser, required=True, help=output)
    named = add_setting_flags(parser, cli_settings(declared))  # output_column for output
    for former, now in RENAMED_SETTINGS.items():  # not listed in --help
        renamed = flag_of(now, declared)
        parser.add_argument(
            "--" + former.replace("_", "-"),
            action=_Renamed,
            now=renamed.flag_name if renamed else "--" + now.replace("_", "-"),
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )
    parser.add_argument(
        "--chunk-size",
        type=int,
        default=5_000,
        metavar="N",
        help="distinct requests sent per chunk (default: 5000)",
    )
    parser.add_argument(
        "--rows-per-read",
        type=int,
        default=100_000,
        metavar="N",
        help="rows read and written at a time (default: 100000)",
    )
    add_api_key_env(parser)
    add_connection_arguments(parser)
    parser.set_defaults(option_flags=named)


def job_options(args: argparse.Namespace) -> dict[str, Any]:
    """The job's settings from the flags, by their names (see :data:`llm_ops.SETTINGS`), for
    :func:`llm_ops.options_from_settings`."""
    settings = {
        name: getattr(args, dest)
        for dest, name in args.option_flags.items()
        if getattr(args, dest) is not None
    }
    settings["api_key"] = api_key(args)
    return {**settings, **connection_options(args)}
