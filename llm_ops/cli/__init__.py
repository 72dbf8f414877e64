"""``llm-ops``: run and estimate jobs on files, query with SQL, serve the local endpoint,
manage the cache.

Every subcommand has ``--help``. Errors print one line and exit non-zero; ``--debug`` shows
the traceback instead.

Each group of commands is a module that adds its commands to the parser and names the
function that carries each out (``set_defaults(handler=...)``): :mod:`._jobs` (``run``,
``estimate``), :mod:`._sql`, :mod:`._serve`, :mod:`._batches`, :mod:`._cache`. What several
of them share is in :mod:`._parser`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import duckdb
import polars as pl

from ..exceptions import LlmOpsError
from . import _batches, _cache, _jobs, _serve, _sql
from ._parser import Handler, parser
from ._words import FLAG_WORDS

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``llm-ops`` command; returns the exit status."""
    args = parser(
        _jobs.add_commands,
        _sql.add_commands,
        _serve.add_commands,
        _batches.add_commands,
        _cache.add_commands,
    ).parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (LlmOpsError, OSError, duckdb.Error, pl.exceptions.PolarsError) as exc:
        if args.debug:
            raise
        said = exc.worded(FLAG_WORDS) if isinstance(exc, LlmOpsError) else str(exc)
        message = " ".join(said.split())
        print(f"llm-ops: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("llm-ops: interrupted; answers so far are cached", file=sys.stderr)
        return 130
