"""The arguments of a job on files (``run``, ``estimate``), and the options they make.

Every setting (an option of :class:`llm_ops.Options`, or a field of its object, see
:data:`llm_ops.SETTINGS`) that holds a number, a text, a choice or a switch is a flag of its
name, with its help from :data:`._option_flags.OPTION_FLAGS`; prices, the semantic cache and a
cascade's escalation have flags of their own. :func:`llm_ops.options_from_settings` makes the
options from them, as the flow does from its parameters.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal, get_args, get_origin

from .._cache import parse_duration
from .._options import RENAMED_SETTINGS, setting_names, setting_type
from ..exceptions import ConfigError
from ._option_flags import OPTION_FLAGS
from ._parser import (
    add_api_key_env,
    add_connection_arguments,
    add_output_argument,
    api_key,
    connection_options,
)

# Settings with flags of their own below (prices, the semantic cache, a cascade's escalation,
# the connection's), from the environment (api_key, named by --api-key-env), or that do not
# apply to files.
_SKIPPED = {
    "api_key",
    "headers",
    "verify",
    "cert",
    "proxy",
    "on_error",
    "progress",
    "schema",
    "repair",
    "pricing",
    "escalate",
    "semantic_cache",
    "semantic_cache_threshold",
}


def flagged_settings() -> set[str]:
    """The settings that are flags: those holding a number, a text, a choice or a switch."""
    return {
        name
        for name in setting_names()
        if name not in _SKIPPED and _flag(setting_type(name)) is not None
    }


def _flag(hint: object) -> dict[str, Any] | None:
    """How argparse reads a setting that holds one number, text, choice or switch."""
    if get_origin(hint) is Literal:
        return {"choices": list(get_args(hint))}
    kinds = {arg for arg in (get_args(hint) or (hint,)) if arg is not type(None)}
    if timedelta in kinds:  # max_age: 1d, 6h, 30m, 45s or seconds
        return {"type": _duration}
    if len(kinds) == 1 and get_origin(choice := next(iter(kinds))) is Literal:
        return {"choices": list(get_args(choice))}  # an optional choice: reasoning_effort
    for kind in (int, float, str):
        if kind in kinds:
            return {"type": kind}
    if bool in kinds:  # batch: bool | BatchMode
        return {"action": "store_true", "default": None}
    return None


def _duration(text: str) -> timedelta:
    """A duration flag's value; argparse shows the message of an ``ArgumentTypeError`` (the
    units a duration takes), where for a ``ValueError`` it names only the function."""
    try:
        return parse_duration(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


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


def _flag_of(name: str) -> str:
    declared = OPTION_FLAGS[name]
    return declared.flag or "--" + name.replace("_", "-")


def add_job_arguments(parser: argparse.ArgumentParser, *, output: str | None = None) -> None:
    """The arguments of a job on files, and ``--output FILE`` with the help ``output`` for a
    job that writes one; the names of the options given as flags are kept as
    ``args.option_flags`` (option to the flag's ``dest``) for :func:`job_options`."""
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
    named = {}
    for name, flag in OPTION_FLAGS.items():  # in the table's order
        how = {
            "action": "append"
            if name in ("stop", "images", "documents", "media_folders")
            else "store",
            **(_flag(setting_type(name)) or {}),
        }
        if how["action"] != "store_true":
            how["metavar"] = flag.metavar
        action = parser.add_argument(_flag_of(name), **how, help=flag.help)
        named[name] = action.dest  # output_column for output: --output is the file
    for former, now in RENAMED_SETTINGS.items():  # not listed in --help
        parser.add_argument(
            "--" + former.replace("_", "-"),
            action=_Renamed,
            now=_flag_of(now),
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )
    parser.add_argument(
        "--pricing",
        action="append",
        metavar="MODEL=IN,OUT",
        help="$ per 1M input and output tokens of a model, e.g. gpt-4o-mini=0.15,0.60 (a third "
        "number: $ per request); once per model of a cascade; IN,OUT for every model; 'free' "
        "for models you host (default: the built-in price of a known model)",
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
        "--semantic-cache-threshold",
        type=float,
        default=0.95,
        metavar="COSINE",
        help="with --semantic-cache: the cosine similarity from which an answer is reused "
        "(default: 0.95)",
    )
    add_api_key_env(parser)
    add_connection_arguments(parser)
    parser.set_defaults(option_flags=named)


def job_options(args: argparse.Namespace) -> dict[str, Any]:
    """The job's settings from the flags, by their names (see :data:`llm_ops.SETTINGS`), for
    :func:`llm_ops.options_from_settings`."""
    settings = {
        name: getattr(args, dest)
        for name, dest in args.option_flags.items()
        if getattr(args, dest) is not None
    }
    settings["pricing"] = args.pricing
    settings["escalate"] = args.escalate
    if args.semantic_cache:
        settings["semantic_cache"] = args.semantic_cache
        settings["semantic_cache_threshold"] = args.semantic_cache_threshold
    settings["api_key"] = api_key(args)
    return {**settings, **connection_options(args)}
