"""The arguments of a job on files (``run``, ``estimate``), and the options they make.

Every option of :class:`llm_ops.Options` that holds a number, a text or a choice is a flag,
with its help from :data:`._option_flags.OPTION_FLAGS`; prices, the semantic cache and a
cascade's escalation have flags of their own.
"""

from __future__ import annotations

import argparse
from typing import Any, Literal, get_args, get_origin, get_type_hints

from .._options import Options
from .._pricing import parse_pricing
from .._semantic import SemanticCache
from ._option_flags import OPTION_FLAGS
from ._parser import (
    add_api_key_env,
    add_connection_arguments,
    add_output_argument,
    api_key,
    connection_options,
)

# Options a flag can carry (a number or a text), under their own names; the rest have flags of
# their own below (prices, the semantic cache, the connection's), come from the environment
# (api_key, named by --api-key-env) or do not apply to files.
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


def flagged_options() -> dict[str, dict[str, Any]]:
    """The options that are flags, with how argparse reads each."""
    found = {}
    for name, hint in get_type_hints(Options).items():
        how = _flag(hint)
        if name not in _SKIPPED and how is not None:
            found[name] = how
    return found


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
    flagged = flagged_options()
    named = {}
    for name, flag in OPTION_FLAGS.items():  # in the table's order
        how = flagged[name]
        action = parser.add_argument(
            flag.flag or "--" + name.replace("_", "-"),
            **how,
            action="append" if name == "stop" else "store",
            metavar=flag.metavar,
            help=flag.help,
        )
        named[name] = action.dest  # output_column for output: --output is the file
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
    """The job's options from the flags, by their names (see :class:`llm_ops.Options`)."""
    options = {
        name: getattr(args, dest)
        for name, dest in args.option_flags.items()
        if getattr(args, dest) is not None
    }
    pricing = parse_pricing(args.pricing or [])
    if pricing is not None:
        options["pricing"] = pricing
    if args.semantic_cache:
        options["semantic_cache"] = SemanticCache(
            args.semantic_cache, threshold=args.semantic_cache_threshold
        )
    if args.escalate:
        options["escalate"] = args.escalate
    key = api_key(args)
    if key is not None:
        options["api_key"] = key
    return {**options, **connection_options(args)}
