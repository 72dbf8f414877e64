"""Failed rows speak up: their errors counted by reason, one warning per job, and a note in the
progress line when the first rows all fail the same way.

A row's error names its own numbers (``needs about 9,120 tokens``, ``after 3 attempts``), so
rows that failed for one reason would each count apart: :func:`reason` writes every number
as ``N`` but an HTTP status, so they count together. Errors are redacted where they are made
(:mod:`llm_ops._engine.boundary`): no key reaches a reason, a warning or a report.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import FrameType
from typing import Protocol

import polars as pl

from ._status import FAILED
from .exceptions import RowsFailedWarning


class Failures(Protocol):
    """What :func:`warn_report` reads of a :class:`~llm_ops.RunReport`."""

    @property
    def rows(self) -> int: ...
    @property
    def failed_rows(self) -> int: ...
    @property
    def errors(self) -> dict[str, int]: ...


TOP_REASONS = 3
"""Reasons a warning (and the CLI) names, most common first."""
KEPT_REASONS = 10
"""Reasons a :class:`~llm_ops.RunReport` keeps in ``errors``, most common first."""
EARLY_ROWS = 20
"""The progress line's early note looks at the first rows a job settles by sending..."""
EARLY_SHARE = 0.9
"""...and speaks up when at least this share of them failed with the same reason: 18 of the
first 20 rows is not bad luck but a prompt, a model or an endpoint that will fail the rest."""
SHOWN_CHARS = 100
"""A reason longer than this is cut, with an ellipsis, where it is shown."""

_NUMBER = re.compile(r"(?<!HTTP )(?<![\w.])\d(?:[\d,]*\d)?(?:\.\d+)?(?![\w])")
# Frames of llm_ops (and of the libraries that call its batch functions) are passed over, so
# that a warning points at the user's line.
_INTERNAL = tuple(
    str(Path(module.__file__).parent) + os.sep
    for module in (sys.modules[__package__], pl)
    if module.__file__ is not None
)


def reason(error: str | None) -> str:
    """``error`` with its numbers as ``N`` (an HTTP status kept), so that rows failing the
    same way count together.

    >>> reason("gave up after 3 attempts: HTTP 500: upstream busy (id 4821)")
    'gave up after N attempts: HTTP 500: upstream busy (id N)'
    >>> reason("the request needs about 9,120 tokens, more than 1.5 minutes of budget")
    'the request needs about N tokens, more than N minutes of budget'
    """
    return _NUMBER.sub("N", error) if error else "no error message"


def count_reasons(errors: Iterable[tuple[str | None, int]]) -> dict[str, int]:
    """Rows per reason from (error, rows) pairs, most common first."""
    counts: Counter[str] = Counter()
    for error, rows in errors:
        counts[reason(error)] += rows
    return dict(counts.most_common())


def failure_reasons(added: pl.DataFrame, status: str, error: str) -> dict[str, int]:
    """Failed rows of ``added`` (a job's status and error columns) per reason, most common
    first, the :data:`KEPT_REASONS` most common only."""
    failed = added.filter(pl.col(status).cast(pl.String).is_in(list(FAILED)))
    if failed.is_empty():
        return {}
    errors = failed[error].value_counts()
    return keep(count_reasons(errors.iter_rows()))


def add_reasons(*parts: Mapping[str, int]) -> dict[str, int]:
    """Reasons of several parts of a job added up, the most common kept."""
    counts: Counter[str] = Counter()
    for part in parts:
        counts.update(part)
    return keep(dict(counts.most_common()))


def keep(reasons: Mapping[str, int]) -> dict[str, int]:
    return dict(list(reasons.items())[:KEPT_REASONS])


def shown(text: str) -> str:
    """A reason as a warning or the CLI shows it: quoted, cut at :data:`SHOWN_CHARS`."""
    return repr(text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…")


def top_reasons(reasons: Mapping[str, int], failed: int) -> str:
    """``30 with 'HTTP 400: …', 7 with 'HTTP 500: …'``: the :data:`TOP_REASONS` most common,
    and how many rows failed otherwise."""
    top = list(reasons.items())[:TOP_REASONS]
    text = ", ".join(f"{n:,} with {shown(why)}" for why, n in top)
    rest = failed - sum(n for _, n in top)
    return text + (f", {rest:,} otherwise" if rest > 0 and top else "")


def failed_message(rows: int, failed: int, reasons: Mapping[str, int], where: str) -> str:
    """The warning's text: how many rows failed, why, and where to see each row's error."""
    return f"{failed:,} of {rows:,} rows failed: {top_reasons(reasons, failed)}; see {where}"


def warn_failed(rows: int, failed: int, reasons: Mapping[str, int], where: str) -> None:
    """Warn (:class:`~llm_ops.RowsFailedWarning`) that ``failed`` of ``rows`` rows failed,
    pointing at the first frame outside llm_ops: the user's call. Nothing when none did."""
    if failed:
        warnings.warn(
            failed_message(rows, failed, reasons, where),
            RowsFailedWarning,
            stacklevel=_user_stacklevel(),
        )


def warn_report(report: Failures, where: str) -> None:
    """:func:`warn_failed` from a job's report: the one warning of a finished job."""
    warn_failed(report.rows, report.failed_rows, report.errors, where)


def warn_columns(added: pl.DataFrame, status: str, error: str, where: str) -> None:
    """:func:`warn_failed` from a job's added columns (``status`` and ``error``)."""
    failed = int(added[status].cast(pl.String).is_in(list(FAILED)).sum())
    if failed:
        warn_failed(added.height, failed, failure_reasons(added, status, error), where)


def early_note(first: Iterable[str]) -> str | None:
    """The progress line's note when at least :data:`EARLY_SHARE` of the reasons the first
    :data:`EARLY_ROWS` settled rows failed with (``first``, one per failed row) are one."""
    counts = Counter(first).most_common(1)
    if not counts or counts[0][1] < EARLY_SHARE * EARLY_ROWS:
        return None
    why, n = counts[0]
    return f"{n} of the first {EARLY_ROWS} rows failed: {shown(why)}"


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside llm_ops (and Polars), for
    :func:`warn_failed`'s ``warnings.warn``: its own frame is 1."""
    level = 1
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    return level
