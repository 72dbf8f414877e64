"""The one status vocabulary, and the frames that carry statuses between the stages.

Every row of a result gets one of :data:`STATUSES`:

ok
    answered by the endpoint during this job
cached
    answer taken from the cache, nothing sent
similar
    answer of a *similar* request (``semantic_cache=``): a cached one, or one sent earlier in
    the job; which request and how similar are in ``<output>_similar_to`` and
    ``<output>_similarity``
skipped
    a referenced column was null, a budget stopped sending, or the request is too large for
    the cache to keep its answer; nothing sent
rejected
    the endpoint refused the request (HTTP 4xx other than 401/403/408/409/429, or a 5xx whose
    body says the input is not supported), or, before
    anything was sent, its image or PDF could not be read or is over a limit; not retried
filtered
    the endpoint's content filter stopped the answer (OpenAI: ``content_filter``); the
    partial answer is not kept, not cached and not retried
failed
    no answer after all retries (timeouts, connection errors, 429, 5xx, malformed bodies,
    answers that did not finish)
truncated
    the answer stopped at ``max_tokens`` (OpenAI: ``length``); the partial text is kept
invalid
    a structured answer (``schema=``) that is not JSON or does not match the schema; the raw
    text is kept in ``<output>_raw``
"""

from __future__ import annotations

from typing import Final, Literal, get_args

import polars as pl

Status = Literal[
    "ok", "cached", "similar", "skipped", "rejected", "filtered", "failed", "truncated", "invalid"
]
STATUSES: Final[tuple[Status, ...]] = get_args(Status)
STATUS_DTYPE: Final = pl.Enum(STATUSES)
"""The Polars type of every ``<output>_status`` column."""

ANSWERED: Final[frozenset[Status]] = frozenset({"ok", "cached", "similar", "truncated"})
"""Rows that carry an answer."""
FAILED: Final[frozenset[Status]] = frozenset({"rejected", "filtered", "failed", "invalid"})
"""Rows that got no usable answer: what ``on_error="raise"`` raises for."""
CACHEABLE: Final[frozenset[Status]] = frozenset({"ok", "truncated"})
"""Outcomes the cache keeps as answers; a failure never is one."""
ESCALATE: Final[tuple[Status, ...]] = ("rejected", "filtered", "failed", "invalid", "truncated")
"""Statuses that always send a row on to the next model of a cascade."""

RESULTS: Final = pl.Schema(
    {
        "key": pl.String,
        "text": pl.String,
        "json": pl.String,
        "status": pl.String,
        "error": pl.String,
        "prompt_tokens": pl.Int64,
        "completion_tokens": pl.Int64,
        "similar_to": pl.String,
        "similarity": pl.Float64,
        "reasoning": pl.String,
    }
)
"""One row per settled distinct request: its answer (or why not), tokens, for a ``similar``
answer which request it came from, and a reasoning model's thinking (null when none came, and
for a similar answer: the thinking was over another prompt). What join-back gives the rows."""

ROW_KEYS: Final = pl.Schema({"key": pl.String, "skip_reason": pl.String, "skip_status": pl.String})
"""One row per input row, in order: its request key (null when it is not sent), why not, and
the status that gives the row: ``skipped`` (a null input), or ``rejected`` (an image or PDF
that cannot be sent)."""

REQUESTS: Final = pl.Schema(
    {"key": pl.String, "system": pl.String, "prompt": pl.String, "rows": pl.Int64}
)
"""One row per distinct request: its key, rendered texts and how many input rows share it."""
