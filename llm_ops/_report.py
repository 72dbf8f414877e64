"""The run report: what one job did, returned to Python and recorded in ``llm_runs``."""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ._failures import add_reasons
from ._outcome import Counters
from ._pricing import add_costs, price_hint
from ._status import FAILED, STATUSES
from .exceptions import JobAbortedError

LEVERS = ("dedupe", "cache", "packing", "semantic_cache", "cascade", "batch")
"""The ways a job avoids paying for a request, as keys of :attr:`RunReport.savings`.

dedupe
    identical requests in the job sent once
cache
    answers already in the cache (exact key)
packing
    several rows per request (``packing=``)
semantic_cache
    answers of similar requests, cached or sent in the same job (``semantic_cache=``); its
    cost is net of the embeddings it paid for
cascade
    rows a cheaper model answered well enough, which the last model of ``model=[...]`` did
    not have to answer; its cost is net of everything the earlier models cost
batch
    the requests sent through the provider's Batch API (``batch=True``), at its price rather
    than the live one; no requests saved, only dollars
"""


@dataclass(frozen=True)
class Saving:
    """What one lever saved: requests not sent and dollars not spent (``None``: unknown).

    Both are estimates from the tokens of the answers reused, and may be negative where a
    lever cost more than it saved (say, a cascade that escalated most rows).
    """

    requests: int
    cost: float | None


@dataclass(frozen=True)
class ModelUsage:
    """One model's share of a job: rows it answered (final answers), requests and spend."""

    rows: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = 0.0


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
    claimed
        Of ``cache_hits``, those another job sharing the cache had claimed first: it sent
        them, and this job took their answers from the cache once they landed.
    refreshed_for_age
        Of the distinct requests not answered from the cache, those it held an answer to
        older than its ``max_age`` (see :class:`~llm_ops.Cache`): sent again, and the new
        answer kept beside the old one.
    requests_sent
        HTTP requests made, retries included.
    retries
        Attempts beyond the first.
    statuses
        Rows per status (see :data:`llm_ops.STATUSES`).
    prompt_tokens, completion_tokens
        Tokens billed for requests sent during this job (cache hits cost nothing).
    cached_tokens
        Of ``prompt_tokens``, those the server read from its own prefix cache (``usage.
        prompt_tokens_details.cached_tokens``, as OpenAI and vLLM report it), billed at the
        price's ``cached_input_per_million``; answers from llm-ops' cache add none.
    cache_write_tokens
        Of ``prompt_tokens``, those written to a provider's prompt cache (as Anthropic reports
        them), billed at the price's ``cache_write_per_million``.
    reasoning_tokens
        Of ``completion_tokens``, those a reasoning model spent thinking (``usage.
        completion_tokens_details.reasoning_tokens``, as OpenAI's o-series and gpt-5 report
        it): billed as output, though no answer shows them. The text gives their share of
        the output tokens.
    reasoning_cost
        Of ``cost``, what ``reasoning_tokens`` cost at the model's output price: what the
        unseen thinking was billed (0 when there was none; ``None`` when the price is
        unknown). The text gives it, and its share of the cost, when there was thinking.
    usage_unknown
        Answers whose ``usage`` could not be right (a negative or absurd token count): their
        text is kept, their tokens are unknown (NULL in the cache) and left out of the tokens
        and cost here, and budgets count them at their estimate.
    wall_seconds
        Time from the call to the answer, planning and cache writes included.
    outcome
        ``"completed"``, ``"aborted"`` (the endpoint stopped the job) or ``"interrupted"``.
    cost
        Dollars spent by this job under the model's price; ``None`` when the price is unknown.
    cost_saved
        What every lever saved together: the cost of one request per row (to the last model
        of a cascade), minus ``cost``; ``None`` when unknown.
    budget_stop
        Why a budget (``max_cost``, ``max_requests``, ``max_tokens_total``) stopped sending;
        the rows not sent are ``skipped``.
    savings
        Requests and cost saved by each lever used (see :data:`llm_ops.LEVERS`).
    models
        Per model (an embedding model too, with ``semantic_cache=``): rows answered,
        requests, tokens and cost.
    mode
        ``"live"``, or ``"batch"`` when the requests went through the provider's Batch API.
    concurrency, concurrency_why
        The limit on requests in flight when the job ended, and why it was there: where the
        controller found the endpoint's throughput to stop rising (``"throughput flat above
        512, latency x2.8"``, ``"queueing above 8: ..."``), the cap given (``concurrency=``),
        or a back-off (``"halved: 429s"``). The next job on the endpoint starts from it.
    cache
        The cache file's path (``None``: caching was off); not stored in ``llm_runs``.
    journal_pending
        Answers still in the cache's journal when the job ended, not yet in the DuckDB file,
        because another process (a reader) held it for longer than ``merge_wait``. They are
        cache hits for every job already; ``llm-ops cache merge`` (or any later job) merges
        them once the file is free, and other tools see them from then on. Not stored in
        ``llm_runs``.
    errors
        Failed rows per reason, most common first: each row's error with its numbers as ``N``
        (an HTTP status kept), so rows that failed the same way count together; the ten most
        common reasons. Each row's own error is in the ``<output>_error`` column. Not stored
        in ``llm_runs``.
    operator, plan, plan_why, waves
        A set operator's run (``llm_aggregate``, ``llm_top_k``, ``llm_join``,
        ``llm_resolve``): its name, the plan it chose (``"quickselect"``, ``"cascade"``,
        ...), why, and the rounds of judgments it sent, each one job (its counts are the sum
        of theirs). ``None`` and 0 for a row-wise job. Not stored in ``llm_runs``.
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
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0
    usage_unknown: int = 0
    refreshed_for_age: int = 0
    claimed: int = 0
    wall_seconds: float = 0.0
    outcome: str = "completed"
    error: str | None = None
    cost: float | None = None
    cost_saved: float | None = None
    reasoning_cost: float | None = None
    budget_stop: str | None = None
    savings: dict[str, Saving] = field(default_factory=dict)
    models: dict[str, ModelUsage] = field(default_factory=dict)
    mode: str = "live"
    concurrency: int | None = None
    concurrency_why: str | None = None
    cache: str | None = None
    journal_pending: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    operator: str | None = None
    plan: str | None = None
    plan_why: str | None = None
    waves: int = 0

    @property
    def failed_rows(self) -> int:
        """Rows that got no usable answer (``rejected``, ``filtered``, ``failed``,
        ``invalid``)."""
        return sum(n for status, n in self.statuses.items() if status in FAILED)

    def spending(self) -> tuple[float, int, int]:
        """Dollars (0 when unknown), HTTP requests and tokens spent, embeddings included: what
        a budget shared with later work must give up."""
        usage = self.models.values()
        return (
            self.cost or 0.0,
            sum(u.requests for u in usage),
            sum(u.prompt_tokens + u.completion_tokens for u in usage),
        )

    def price_hint(self) -> str | None:
        """How to give the models without a price one, when that left the cost unknown (see
        :func:`llm_ops._pricing.price_hint`); ``None`` when the cost is known."""
        unpriced = [model for model, usage in self.models.items() if usage.cost is None]
        return price_hint(unpriced) if self.cost is None and unpriced else None

    def figures(self) -> dict[str, Any]:
        """The report's figures by name, for a dashboard (a Prefect table artifact): counts,
        tokens, dollars (``"unknown"`` where a price is missing), each lever's savings."""

        def usd(amount: float | None) -> float | str:
            return "unknown" if amount is None else round(amount, 6)

        figures = {
            "rows": self.rows,
            "distinct requests": self.distinct_requests,
            "cache hits": self.cache_hits,
            "requests sent": self.requests_sent,
            "retries": self.retries,
            **{f"rows {status}": n for status, n in self.statuses.items()},
            "prompt tokens": self.prompt_tokens,
            "completion tokens": self.completion_tokens,
            "cost ($)": usd(self.cost),
            "saved in all ($)": usd(self.cost_saved),
            **{
                f"saved by {lever} (requests, $)": f"{saving.requests:,}, {usd(saving.cost)}"
                for lever, saving in self.savings.items()
            },
            "wall seconds": round(self.wall_seconds, 2),
            "cache": self.cache or "off",
        }
        hint = self.price_hint()
        if hint is not None:
            figures["cost unknown"] = hint
        return figures

    def _token_notes(self) -> str:
        """What of the tokens in and out was cached or thinking, when some was."""
        notes = [f"{self.cached_tokens:,} in cached"] if self.cached_tokens else []
        if self.cache_write_tokens:
            notes.append(f"{self.cache_write_tokens:,} in written to the prompt cache")
        if self.reasoning_tokens:
            share = self.reasoning_tokens / max(1, self.completion_tokens)
            notes.append(f"{self.reasoning_tokens:,} out reasoning, {share:.0%} of out")
        return f"  ({'; '.join(notes)})" if notes else ""

    def _reasoning_cost_line(self) -> list[str]:
        """What the thinking cost, and its share of the cost, when there was thinking."""
        if not self.reasoning_tokens:
            return []
        cost = self.reasoning_cost
        of_cost = f"{cost / self.cost:.0%} of cost, " if cost is not None and self.cost else ""
        return [f"  reasoning cost     {dollars(cost):>10}  ({of_cost}thinking billed as output)"]

    def as_dict(self) -> dict[str, Any]:
        """The report as plain values, as stored in ``llm_runs``."""
        return asdict(self)

    def __str__(self) -> str:
        statuses = ", ".join(f"{k} {v}" for k, v in self.statuses.items() if v) or "none"
        lines = [
            f"llm-ops run {self.run_id} ({self.outcome}) · model {self.model} · {self.endpoint}"
            + (" · batch" if self.mode == "batch" else ""),
            f"  rows               {self.rows:>10,}",
            f"  distinct requests  {self.distinct_requests:>10,}",
            f"  cache hits         {self.cache_hits:>10,}",
            *(
                [f"  refreshed for age  {self.refreshed_for_age:>10,}  (older than max_age)"]
                if self.refreshed_for_age
                else []
            ),
            f"  requests sent      {self.requests_sent:>10,}  ({self.retries:,} retries)",
            f"  tokens in / out    {self.prompt_tokens:>10,} / {self.completion_tokens:,}"
            + self._token_notes(),
            f"  cost               {dollars(self.cost):>10}  (saved {dollars(self.cost_saved)})",
            *self._reasoning_cost_line(),
            f"  wall time          {self.wall_seconds:>10.2f} s",
            *(
                [f"  concurrency        {self.concurrency:>10,}  ({self.concurrency_why})"]
                if self.concurrency
                else []
            ),
            f"  rows by status     {statuses}",
            f"  cache              {self.cache or 'off'}",
        ]
        for lever, saving in self.savings.items():
            lines.append(
                f"  saved by {lever:<14} {saving.requests:>7,} requests  {dollars(saving.cost)}"
            )
        if len(self.models) > 1:
            for model, usage in self.models.items():
                lines.append(
                    f"  model {model:<12} {usage.rows:>10,} rows · "
                    f"{usage.requests:,} requests · {dollars(usage.cost)}"
                )
        hint = self.price_hint()
        if hint is not None:
            lines.append(f"  cost unknown       {hint}")
        if self.usage_unknown:
            lines.append(
                f"  usage unknown      {self.usage_unknown:>10,}  answers reported token counts "
                "that cannot be right; left out of tokens and cost"
            )
        if self.plan:
            lines.append(
                f"  plan               {self.plan}, {self.waves:,} waves ({self.plan_why})"
            )
        if self.budget_stop:
            lines.append(f"  budget stop        {self.budget_stop}")
        if self.error:
            lines.append(f"  error              {self.error}")
        if self.journal_pending:
            lines.append(
                f"  journal            {self.journal_pending:,} answers wait in the journal, not "
                "yet in the cache file (a reader held it); run `llm-ops cache merge"
                f"{'' if self.cache is None else ' --cache ' + self.cache}` (or any llm-ops "
                "job) once the reader closes it"
            )
        return "\n".join(lines)


def sum_reports(
    reports: list[RunReport], *, started_at: datetime, wall_seconds: float, model: str
) -> RunReport:
    """One new run's report adding up several (a cascade's models, a table's batches): counts,
    tokens, costs, statuses, savings and models are summed; the first stop and budget stop are
    kept."""
    models: dict[str, ModelUsage] = {}
    savings: dict[str, Saving] = {}
    statuses: dict[str, int] = dict.fromkeys(STATUSES, 0)
    for report in reports:
        for name, usage in report.models.items():
            models[name] = _sum_usage(models.get(name, ModelUsage()), usage)
        for lever, saving in report.savings.items():
            before = savings.get(lever, Saving(0, 0.0))
            savings[lever] = Saving(
                before.requests + saving.requests, add_costs(before.cost, saving.cost)
            )
        for status, n in report.statuses.items():
            statuses[status] = statuses.get(status, 0) + n
    stopped = next((r for r in reports if r.outcome != "completed"), None)
    costs = [r.cost for r in reports]
    saved = [r.cost_saved for r in reports]
    thinking = [r.reasoning_cost for r in reports]
    return RunReport(
        run_id=uuid.uuid4().hex[:12],
        started_at=started_at,
        finished_at=datetime.now(UTC),
        model=model,
        endpoint=reports[0].endpoint,
        rows=sum(r.rows for r in reports),
        distinct_requests=sum(r.distinct_requests for r in reports),
        cache_hits=sum(r.cache_hits for r in reports),
        requests_sent=sum(r.requests_sent for r in reports),
        retries=sum(r.retries for r in reports),
        statuses=statuses,
        prompt_tokens=sum(r.prompt_tokens for r in reports),
        completion_tokens=sum(r.completion_tokens for r in reports),
        cached_tokens=sum(r.cached_tokens for r in reports),
        reasoning_tokens=sum(r.reasoning_tokens for r in reports),
        cache_write_tokens=sum(r.cache_write_tokens for r in reports),
        usage_unknown=sum(r.usage_unknown for r in reports),
        refreshed_for_age=sum(r.refreshed_for_age for r in reports),
        claimed=sum(r.claimed for r in reports),
        wall_seconds=wall_seconds,
        outcome=stopped.outcome if stopped else "completed",
        error=stopped.error if stopped else None,
        cost=None if None in costs else round(sum(c or 0.0 for c in costs), 10),
        cost_saved=None if None in saved else round(sum(c or 0.0 for c in saved), 10),
        reasoning_cost=None if None in thinking else round(sum(c or 0.0 for c in thinking), 10),
        budget_stop=next((r.budget_stop for r in reports if r.budget_stop), None),
        savings=savings,
        models=models,
        mode=reports[0].mode,
        concurrency=next((r.concurrency for r in reversed(reports) if r.concurrency), None),
        concurrency_why=next((r.concurrency_why for r in reversed(reports) if r.concurrency), None),
        cache=reports[0].cache,
        errors=add_reasons(*(r.errors for r in reports)),
    )


@dataclass(frozen=True)
class RunFacts:
    """What a run measured, known once it ends: its model, when and how long, the rows and
    distinct requests, cache hits, what its requests took (``counters``), the rows per
    status, and why it stopped early, if it did. :func:`make_report` makes its report."""

    model: str
    endpoint: str
    started_at: datetime
    wall_seconds: float
    rows: int
    distinct: int
    cache_hits: int
    counters: Counters
    statuses: dict[str, int]
    refreshed: int = 0
    claimed: int = 0
    stopped: BaseException | None = None
    budget_stop: str | None = None
    cache: Path | None = None
    mode: str = "live"


@dataclass(frozen=True)
class RunCosts:
    """What a run cost and saved, priced from its :class:`RunFacts`: in all, per lever and
    per model."""

    cost: float | None = None
    cost_saved: float | None = None
    savings: dict[str, Saving] = field(default_factory=dict)
    models: dict[str, ModelUsage] = field(default_factory=dict)
    reasoning_cost: float | None = None


def make_report(facts: RunFacts, costs: RunCosts | None = None) -> RunReport:
    """The report of a finished (or stopped) run; unpriced without ``costs``."""
    costs = RunCosts() if costs is None else costs
    counters, stopped = facts.counters, facts.stopped
    if stopped is None:
        outcome = "completed"
    else:
        outcome = "aborted" if isinstance(stopped, JobAbortedError) else "interrupted"
    return RunReport(
        run_id=uuid.uuid4().hex[:12],
        started_at=facts.started_at,
        finished_at=datetime.now(UTC),
        model=facts.model,
        endpoint=facts.endpoint,
        rows=facts.rows,
        distinct_requests=facts.distinct,
        cache_hits=facts.cache_hits,
        requests_sent=counters.sent,
        retries=counters.retries,
        statuses={s: facts.statuses.get(s, 0) for s in STATUSES},
        prompt_tokens=counters.prompt_tokens,
        completion_tokens=counters.completion_tokens,
        cached_tokens=counters.cached_tokens,
        reasoning_tokens=counters.reasoning_tokens,
        cache_write_tokens=counters.cache_write_tokens,
        usage_unknown=counters.usage_unknown,
        refreshed_for_age=facts.refreshed,
        claimed=facts.claimed,
        wall_seconds=facts.wall_seconds,
        outcome=outcome,
        error=str(stopped) if isinstance(stopped, JobAbortedError) else None,
        cost=costs.cost,
        cost_saved=costs.cost_saved,
        reasoning_cost=costs.reasoning_cost,
        savings=dict(costs.savings),
        models=dict(costs.models),
        mode=facts.mode,
        budget_stop=facts.budget_stop,
        concurrency=counters.concurrency or None,
        concurrency_why=counters.concurrency_why or None,
        cache=None if facts.cache is None else str(facts.cache),
    )


def add_spending(a: tuple[float, int, int], b: tuple[float, int, int]) -> tuple[float, int, int]:
    """Two :meth:`RunReport.spending` figures added up."""
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def _sum_usage(a: ModelUsage, b: ModelUsage) -> ModelUsage:
    return ModelUsage(
        a.rows + b.rows,
        a.requests + b.requests,
        a.prompt_tokens + b.prompt_tokens,
        a.completion_tokens + b.completion_tokens,
        add_costs(a.cost, b.cost),
    )


def dollars(amount: float | None) -> str:
    if amount is None:
        return "unknown"
    return f"${amount:,.4f}" if round(amount, 4) else "$0.0000"  # never "$-0.0000"


@dataclass(frozen=True)
class _Latest:
    """The last report of one thread or task, of any job and of each client's jobs: never
    changed once set, so a task that copied its context is not changed by its parent's jobs."""

    report: Callable[[], RunReport | None] | None = None
    by_client: Mapping[weakref.ref[object], Callable[[], RunReport | None]] = field(
        default_factory=dict
    )


# A context variable, not a global: each thread has a context of its own, and each asyncio task
# a copy of its creator's, so two jobs running side by side never see each other's report.
_LATEST: ContextVar[_Latest | None] = ContextVar("llm_ops_last_report", default=None)


def remember_latest(report: Callable[[], RunReport | None], client: object = None) -> None:
    """Make ``report`` what :func:`llm_ops.last_report` gives in this thread or task from now
    on, and what ``client.last_report()`` gives there (``client``: the client the job ran on).

    A getter, so a run whose report grows as it goes (an ``llm`` expression, adding up its
    batches; a LazyFrame's job, run when it is collected) is read as it is when asked."""
    now = _LATEST.get() or _Latest()
    # clients closed and gone are dropped, so a thread calling llm_complete again and again
    # (a client each) keeps only the reports of the clients still alive
    by_client = {key: got for key, got in now.by_client.items() if key() is not None}
    if client is not None:
        by_client[weakref.ref(client)] = report
    _LATEST.set(_Latest(report, by_client))


def latest(client: object = None) -> RunReport | None:
    """The report :func:`remember_latest` was given last in this thread or task (of a job on
    ``client``, when given); ``None``: none yet."""
    now = _LATEST.get() or _Latest()
    report = now.report if client is None else now.by_client.get(weakref.ref(client))
    return None if report is None else report()
