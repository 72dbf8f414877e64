"""The exceptions llm-ops raises.

Every exception is a subclass of :class:`LlmOpsError`, so one ``except`` catches them all::

    LlmOpsError
    ├── ConfigError            misuse, raised before any request is sent
    │   ├── TemplateError      the prompt template is malformed or references bad columns
    │   └── MissingApiKeyError a remote endpoint and no API key
    ├── CacheError             the cache database cannot be opened or written
    │   └── CacheLockedError   another process holds the cache file
    ├── JobAbortedError        the job was stopped: refused (401/403, quota, its first 8
    │                          answers refusals alike) or unreachable
    ├── JobInterruptedError    SIGTERM stopped the job; what was answered is cached
    ├── RowsFailedError        ``on_error="raise"`` and some rows did not get an answer
    │
    │   internal: caught inside llm-ops, never raised to a caller
    ├── InvalidOutput          an answer does not match the schema: its row is ``invalid``
    └── TransportError         an attempt got no HTTP answer: retried, else its row ``failed``
        ├── CouldNotConnect    nothing was sent
        ├── TimedOut           the attempt took longer than its timeout
        ├── ConnectionFailed   the connection broke while sending or reading
        ├── Malformed          not a well-formed HTTP answer: retried once, else ``failed``
        ├── Refused            a proxy or TLS server refuses every request alike: job stops
        └── BadBody            the answer was too large, or in an encoding not asked for

Warnings are subclasses of :class:`LlmOpsWarning` (a ``UserWarning``), so one filter
silences or raises them all::

    LlmOpsWarning
    └── RowsFailedWarning      a job finished with rows that did not get an answer

The internal ones live where they are raised (:mod:`llm_ops._schema`,
:mod:`llm_ops._engine.boundary`), not in this module's ``__all__``. Errors raised by aiohttp
and the ``openai`` SDK are mapped to this tree at one boundary
(:mod:`llm_ops._engine.boundary`), DuckDB's by the cache (:mod:`llm_ops._cache`); all are
chained with ``raise ... from exc``, and messages never contain an API key.

A message names a setting in its caller's words: written with :func:`setting` or
:func:`setting_to`, it reads ``api_key=`` in Python, and a front end that calls
:meth:`LlmOpsError.worded` (the command line, the Prefect flow) names its own flag or
parameter instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

__all__ = [
    "CacheError",
    "CacheLockedError",
    "ConfigError",
    "JobAbortedError",
    "JobInterruptedError",
    "LlmOpsError",
    "LlmOpsWarning",
    "MissingApiKeyError",
    "RowsFailedError",
    "RowsFailedWarning",
    "TemplateError",
    "Words",
    "said_in",
]


# A setting named in a message: its name, and with "=" what it would be set to ("=" alone:
# to a value of the caller's). Brackets no URL, name or template holds, so nothing else
# in a message is read as one.
_SETTING_MARK = re.compile(r"\u27e6(\w+)(=?)(.*?)\u27e7")


def setting(name: str) -> str:
    """The setting ``name`` (a key of :data:`llm_ops.SETTINGS`) as a message names it:
    ``base_url`` in Python, ``--base-url`` on the command line."""
    return f"\u27e6{name}\u27e7"


def setting_to(name: str, value: str | None = None) -> str:
    """Setting ``name`` to ``value`` as a message says it: ``base_url='http://...'`` in
    Python, ``--base-url http://...`` on the command line; without a value, how to give one
    (``api_key=...``, ``--api-key-env VARIABLE``)."""
    return f"\u27e6{name}={value or ''}\u27e7"


class Words:
    """How a front end names settings in messages; this one is Python's (keyword options)."""

    def name(self, setting: str) -> str:
        """The setting itself, e.g. ``base_url``."""
        return setting

    def set_to(self, setting: str, value: str | None) -> str:
        """Setting it to ``value``, or to a value of the caller's (``None``)."""
        if not value:
            return f"{self.name(setting)}=..."
        if setting == "base_url":  # in Python a URL is given as the endpoint= it stands for
            return f"endpoint={value!r}"
        return f"{self.name(setting)}={value!r}"


PYTHON_WORDS = Words()


class LlmOpsError(Exception):
    """Base class of every error raised by llm-ops.

    A setting its message names (see :func:`setting`) reads as Python's keyword option,
    unless a front end said it in its own words (:meth:`say_in`); :meth:`worded` names it
    in any.
    """

    def worded(self, words: Words) -> str:
        """The message, each setting named in ``words``."""
        return _in_words(super().__str__(), words)

    def say_in(self, words: Words) -> None:
        """Name the settings in ``words`` from now on, wherever the error is shown (a
        front end that re-raises it: its log, its run's state)."""
        self.words = words

    def __str__(self) -> str:
        return self.worded(getattr(self, "words", PYTHON_WORDS))


@contextmanager
def said_in(words: Words) -> Iterator[None]:
    """Within, an llm-ops error raised names its settings in ``words`` (a front end's: a
    flow's parameters), wherever it is shown after (a run's log and state).

    Examples
    --------
    >>> from llm_ops.exceptions import ConfigError, Words, said_in, setting
    >>> class Shouting(Words):
    ...     def name(self, setting: str) -> str:
    ...         return setting.upper()
    >>> try:
    ...     with said_in(Shouting()):
    ...         raise ConfigError(f"{setting('base_url')} is wrong")
    ... except ConfigError as exc:
    ...     print(exc)
    BASE_URL is wrong
    """
    try:
        yield
    except LlmOpsError as exc:
        exc.say_in(words)
        raise


def _in_words(message: str, words: Words) -> str:
    def say(mark: re.Match[str]) -> str:
        name, assigned, value = mark.groups()
        return words.set_to(name, value or None) if assigned else words.name(name)

    return _SETTING_MARK.sub(say, message)


class ConfigError(LlmOpsError, ValueError):
    """An argument is wrong; nothing was sent. The message says what to change."""


class TemplateError(ConfigError):
    """The prompt or system template is malformed or references columns it cannot use."""


class MissingApiKeyError(ConfigError):
    """A remote endpoint was chosen without an API key."""


class CacheError(LlmOpsError):
    """The cache database could not be opened, migrated or written."""


class CacheLockedError(CacheError):
    """Another process holds the cache file open for writing."""


class JobAbortedError(LlmOpsError):
    """The endpoint refused the whole job (bad credentials, no quota, its first answers all
    refusals alike, such as images to a model that takes none) or could not be reached;
    nothing more was sent.

    Answers received before the refusal are in the cache.
    """


class JobInterruptedError(LlmOpsError):
    """SIGTERM stopped the job: nothing new was sent, what was in flight was answered, and
    every answer is in the cache, so a rerun sends only the rest."""


class RowsFailedError(LlmOpsError):
    """Raised by ``on_error="raise"`` after the job finished (and, with a cache, every answer
    was cached).

    Attributes
    ----------
    rows
        Positions (0-based) of the rows that did not get an answer.
    errors
        The error message of each of those rows, in the same order.
    """

    def __init__(
        self,
        rows: Sequence[int],
        errors: Sequence[str],
        statuses: Sequence[str],
        *,
        cached: bool = True,
    ):
        self.rows = list(rows)
        self.errors = list(errors)
        self.statuses = list(statuses)
        shown = "\n".join(
            f"  row {row}: {status}: {error}"
            for row, status, error in zip(self.rows[:10], self.statuses, self.errors, strict=False)
        )
        more = f"\n  ... and {len(self.rows) - 10} more" if len(self.rows) > 10 else ""
        rerun = (
            "everything answered is cached, so a rerun only sends these rows"
            if cached
            else "the cache is off, so a rerun sends every row again"
        )
        super().__init__(f"{len(self.rows)} row(s) did not get an answer; {rerun}:\n{shown}{more}")


class LlmOpsWarning(UserWarning):
    """Base class of every warning llm-ops gives: ``warnings.filterwarnings("ignore",
    category=llm_ops.LlmOpsWarning)`` silences them, ``"error"`` raises them."""


class RowsFailedWarning(LlmOpsWarning):
    """A job finished and some rows did not get an answer (their output is null): given once
    per job, with how many rows failed and the most common reasons. Each row's error is in the
    ``<output>_error`` column; :attr:`llm_ops.RunReport.errors` counts the reasons. Silence it
    with ``warnings.simplefilter("ignore", llm_ops.RowsFailedWarning)``.
    """
