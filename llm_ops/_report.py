"""The run report: what one job did, returned to Python and recorded in ``llm_runs``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

STATUSES = ("ok", "cached", "skipped", "rejected", "failed", "truncated", "invalid")
"""Every value a ``<output>_status`` column can hold, in this order (a Polars ``Enum``).

ok
    answered by the endpoint during this job
cached
    answer taken from the cache, nothing sent
skipped
    a referenced column was null; nothing sent
rejected
    the endpoint refused the request (HTTP 4xx other than 401/403/408/409/429); not retried
failed
    no answer after all retries (timeouts, connection errors, 429, 5xx, malformed bodies)
truncated
    the answer stopped at ``max_tokens`` (finish_reason ``length``); the partial text is kept
invalid
    a structured answer (``schema=``) that is not JSON or does not match the schema; the raw
    text is kept in ``<output>_raw``
"""

FAILED_STATUSES = frozenset({"rejected", "failed", "invalid"})


@dataclass(frozen=True)
class RunReport:
    """Counts, tokens and timing of one job.

    Attributes
    ----------
    rows
        Rows in the input.
    distinct_requests
        Distinct requests after dedupe (rows with a null input are not requests).
    cache_hits
        Distinct requests answered from the cache.
    requests_sent
        HTTP requests made, retries included.
    retries
        Attempts beyond the first.
    statuses
        Rows per status (see :data:`llm_ops.STATUSES`).
    prompt_tokens, completion_tokens
        Tokens billed for requests sent during this job (cache hits cost nothing).
    wall_seconds
        Time from the call to the answer, planning and cache writes included.
    outcome
        ``"completed"``, ``"aborted"`` (the endpoint stopped the job) or ``"interrupted"``.
    cost
        Dollars spent by this job under the model's price; ``None`` when the price is unknown.
    cost_saved
        What the cache, dedupe and packing saved: the cost of one request per row, minus
        ``cost``; ``None`` when unknown.
    budget_stop
        Why a budget (``max_cost``, ``max_requests``, ``max_tokens_total``) stopped sending;
        the rows not sent are ``skipped``.
    """

    run_id: str
    started_at: datetime
    finished_at: datetime
    model: str
    endpoint: str
    rows: int
    distinct_requests: int
    cache_hits: int
    requests_sent: int
    retries: int
    statuses: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_seconds: float = 0.0
    outcome: str = "completed"
    error: str | None = None
    cost: float | None = None
    cost_saved: float | None = None
    budget_stop: str | None = None

    @property
    def failed_rows(self) -> int:
        """Rows that got no usable answer (``rejected``, ``failed`` or ``invalid``)."""
        return sum(n for status, n in self.statuses.items() if status in FAILED_STATUSES)

    def as_dict(self) -> dict[str, Any]:
        """The report as plain values, as stored in ``llm_runs``."""
        return asdict(self)

    def __str__(self) -> str:
        statuses = ", ".join(f"{k} {v}" for k, v in self.statuses.items() if v) or "none"
        lines = [
            f"llm-ops run {self.run_id} ({self.outcome}) · model {self.model} · {self.endpoint}",
            f"  rows               {self.rows:>10,}",
            f"  distinct requests  {self.distinct_requests:>10,}",
            f"  cache hits         {self.cache_hits:>10,}",
            f"  requests sent      {self.requests_sent:>10,}  ({self.retries:,} retries)",
            f"  tokens in / out    {self.prompt_tokens:>10,} / {self.completion_tokens:,}",
            f"  cost               {_dollars(self.cost):>10}  (saved {_dollars(self.cost_saved)})",
            f"  wall time          {self.wall_seconds:>10.2f} s",
            f"  rows by status     {statuses}",
        ]
        if self.budget_stop:
            lines.append(f"  budget stop        {self.budget_stop}")
        if self.error:
            lines.append(f"  error              {self.error}")
        return "\n".join(lines)


def _dollars(amount: float | None) -> str:
    return "unknown" if amount is None else f"${amount:,.4f}"
