"""The ``llm-ops`` parser, and what several commands share: how a command is added, the
endpoint and the cache file they use (``--base-url``, ``--cache``, ``--api-key-env``), the
output file (``--output``) and its format, how a table is printed."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeAlias

import polars as pl

from .. import __version__
from .._cache import CACHE_ENV, Cache, default_cache_path, resolve_cache_path
from .._config import Endpoint
from .._parameters import flag_of, help_text
from ..exceptions import ConfigError

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""Where a group adds its commands: what ``add_subparsers`` returns."""
Handler: TypeAlias = Callable[[argparse.Namespace], int]
"""What carries a command out: its parsed arguments in, the exit status out."""

DEFAULT_KEY_ENV = "OPENAI_API_KEY"
CACHE_HELP = f"cache file (default: ${CACHE_ENV}, then {default_cache_path()})"


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are one line saying where the flags are listed,
    instead of under the whole usage (30 lines for ``run``), where the error is lost. Its
    subcommands' parsers are of its class too (``add_subparsers``' default)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser(*groups: Callable[[Commands], None]) -> argparse.ArgumentParser:
    """``llm-ops``, with the commands each of ``groups`` adds, in that order."""
    top: argparse.ArgumentParser = _Parser(  # its subcommands are _Parser too
        prog="llm-ops",
        description="Run and estimate LLM jobs on files, query with SQL, serve the local "
        "endpoint, manage the cache. Errors print one line and exit non-zero; --debug shows "
        "tracebacks.",
    )
    top.add_argument("--version", action="version", version=f"llm-ops {__version__}")
    top.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_commands in groups:
        add_commands(commands)
    return top


def command(
    commands: Commands,
    name: str,
    handler: Handler,
    *,
    summary: str,
    description: str,
    parents: Sequence[argparse.ArgumentParser] = (),
) -> argparse.ArgumentParser:
    """Add the command ``name``, carried out by ``handler`` (as ``args.handler``, the way the
    argparse documentation suggests for subcommands); ``summary`` is its line in the list of
    commands, ``description`` the top of its ``--help``."""
    added = commands.add_parser(name, parents=list(parents), help=summary, description=description)
    added.set_defaults(handler=handler)
    return added


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """``--base-url`` and ``--cache``: where a command's client sends, and its cache file."""
    base_url = flag_of("base_url")  # declared with the settings
    assert base_url is not None
    parser.add_argument(base_url.flag_name, metavar=base_url.metavar, help=help_text(base_url))
    parser.add_argument("--cache", metavar="FILE", help=CACHE_HELP)


def add_output_argument(parser: argparse.ArgumentParser, *, required: bool, help: str) -> None:
    """``--output FILE``, the file a command writes (``--out`` before 0.2: now ambiguous with
    ``--output-column``, so argparse refuses it and names both)."""
    parser.add_argument("--output", required=required, metavar="FILE", help=help)


def add_api_key_env(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-key-env",
        metavar="NAME",
        help=f"environment variable that holds the API key (default: {DEFAULT_KEY_ENV})",
    )


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """How a command's client reaches its endpoint besides its URL: headers, TLS, a proxy."""
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="a header sent with every request, e.g. 'X-Tenant: acme'; again for another "
        "(a credential goes in --header-env)",
    )
    parser.add_argument(
        "--header-env",
        action="append",
        default=[],
        metavar="NAME=VARIABLE",
        help="a header whose value is in an environment variable, e.g. "
        "api-key=AZURE_OPENAI_API_KEY (Azure OpenAI), so it stays out of the shell history",
    )
    for name in ("verify", "cert", "proxy"):  # declared with the settings
        declared = flag_of(name)
        assert declared is not None
        parser.add_argument(declared.flag_name, metavar=declared.metavar, help=help_text(declared))
        if name == "cert":
            parser.add_argument(
                "--cert-key", metavar="PEM", help="its key, if not in the --cert file"
            )


def connection_options(args: argparse.Namespace) -> dict[str, Any]:
    """The client options of :func:`add_connection_arguments`' flags that were given."""
    headers = {}
    for given in args.header:
        name, colon, value = given.partition(":")
        if not colon:
            raise ConfigError(f"--header takes 'NAME: VALUE', got {given!r}")
        headers[name.strip()] = value.strip()
    for given in args.header_env:
        name, equals, variable = given.partition("=")
        value = os.environ.get(variable.strip()) if equals else None
        if not value:
            raise ConfigError(f"--header-env takes NAME=VARIABLE with VARIABLE set, got {given!r}")
        headers[name.strip()] = value
    options: dict[str, Any] = {"headers": headers} if headers else {}
    if args.verify is not None:
        options["verify"] = False if args.verify.lower() == "false" else args.verify
    if args.cert_key is not None and args.cert is None:
        raise ConfigError("--cert-key goes with --cert, the certificate it is the key of")
    if args.cert is not None:
        options["cert"] = args.cert if args.cert_key is None else (args.cert, args.cert_key)
    if args.proxy is not None:
        options["proxy"] = args.proxy
    return options


def endpoint_of_args(args: argparse.Namespace) -> Endpoint:
    """The endpoint ``--base-url``, ``--api-key-env`` and the connection's flags name."""
    return Endpoint(args.base_url, api_key=api_key(args), **connection_options(args))


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


def cache_of(args: argparse.Namespace) -> Cache:
    """The cache ``--cache`` names, else the one of ``LLM_OPS_CACHE``, else the default."""
    path = resolve_cache_path(args.cache)
    assert path is not None
    return Cache(path)


def missing_cache(path: Path, *, so: str = "") -> ConfigError:
    """The error for a command that needs a cache where there is none (yet)."""
    return ConfigError(
        f"there is no cache at {path} yet{so}; run a job first, or pass the path "
        f"of an existing cache (--cache or {CACHE_ENV})"
    )


def output_format(out: Path) -> Literal["parquet", "csv"]:
    suffix = out.suffix.lower()
    if suffix == ".parquet":
        return "parquet"
    if suffix == ".csv":
        return "csv"
    raise ConfigError(f"cannot write {out}: name a .parquet or a .csv file")


def print_table(
    frame: pl.DataFrame | pl.Series, *, rows: int | None = None, text_length: int | None = None
) -> None:
    """``frame`` as a table, without its shape and column types: up to ``rows`` rows, texts cut
    at ``text_length`` characters (else Polars' own settings)."""
    with pl.Config(tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True) as config:
        if rows is not None:
            config.set_tbl_rows(rows)
        if text_length is not None:
            config.set_fmt_str_lengths(text_length)
        print(frame)
