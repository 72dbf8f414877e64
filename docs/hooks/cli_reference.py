"""MkDocs hook: the command-line reference, generated from the ``llm-ops`` argparse parser.

``docs/reference/cli.md`` holds the marker ``<!-- cli-reference -->``; at build time it is
replaced by the ``--help`` of ``llm-ops`` and of every subcommand (and every ``cache``
action), as the installed parser prints it. Nothing here names a flag, so the page follows
the parser whatever its flags are called.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MARKER = "<!-- cli-reference -->"
WIDTH = "100"  # argparse wraps help to $COLUMNS - 2


class _Built(Exception):
    """Carries the parser out of :func:`llm_ops.cli.main` before it parses anything."""


def build_parser() -> argparse.ArgumentParser:
    """The parser ``llm-ops`` runs: :func:`llm_ops.cli.main` builds it, with whatever commands
    it adds, and hands it over here instead of parsing."""
    from llm_ops import cli

    build = cli.parser

    def hand_over(*groups: Any) -> argparse.ArgumentParser:
        raise _Built(build(*groups))

    cli.parser = hand_over
    try:
        cli.main([])
    except _Built as built:
        parser: argparse.ArgumentParser = built.args[0]
        return parser
    finally:
        cli.parser = build
    raise RuntimeError("llm_ops.cli.main() no longer builds its parser with cli.parser(...)")


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``parser`` and every subcommand under it, depth first, each with its words."""
    yield path, parser
    for action in parser._actions:  # argparse keeps no public list of subparsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def render() -> str:
    """Markdown: one section per command, its ``--help`` in a text block."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        sections = []
        for words, parser in commands(build_parser()):
            title = " ".join(("llm-ops", *words))
            text = parser.format_help().replace(str(Path.home()), "~")
            level = "#" * min(2 + len(words), 4)
            sections.append(f"{level} `{title}`\n\n```text\n{text.rstrip()}\n```\n")
        return "\n".join(sections)
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def on_config(config: Any, **kwargs: Any) -> Any:
    """Document the checkout being built, whichever llm-ops is installed."""
    root = str(Path(config.config_file_path).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return config


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())
