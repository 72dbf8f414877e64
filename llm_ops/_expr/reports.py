"""An expression's run report: its batches added up for :func:`last_report`, and recorded in
``llm_runs`` (the first batch at once, later ones together at most every ``flush_seconds``,
the rest when the process exits), since each record is a write to the cache file."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from .._client import Client
from .._options import Job
from .._outcome import Counters
from .._report import (
    RunCosts,
    RunFacts,
    RunReport,
    latest,
    make_report,
    remember_latest,
    sum_reports,
)
from .._status import STATUSES

_unrecorded: weakref.WeakSet[Reports] = weakref.WeakSet()


def last_report() -> RunReport | None:
    """The report of the job that ran last in this thread or asyncio task; ``None`` before
    any has.

    Every job counts: ``llm_complete`` (and :meth:`Client.complete <llm_ops.Client.complete>`),
    ``llm_filter``, ``llm_classify``, ``llm_extract``, and an ``llm`` expression: every batch
    it answered so far, added up. A LazyFrame's job and an expression belong to the thread or
    task that made them, wherever Polars runs them. Each thread has its own last report, and
    each asyncio task starts from its creator's and keeps its own jobs' to itself, so jobs
    running side by side never read each other's; :meth:`Client.last_report
    <llm_ops.Client.last_report>` is the same, of one client's jobs.

    A failed row is null in an expression's plain form; this report's ``statuses`` and
    ``failed_rows`` say how many there were (``with_status=True`` says which). The same
    figures are recorded in ``llm_runs``: one row for the first batch, then one for the
    batches of each ``flush_seconds`` (2 s) after it.

    Examples
    --------
    >>> import polars as pl
    >>> import llm_ops
    >>> from llm_ops.testing import LocalEndpoint
    >>> df = pl.DataFrame({"text": ["fits well", None, "fits well", "[[sim:status=400]]"]})
    >>> with LocalEndpoint() as endpoint:
    ...     out = df.with_columns(pl.col("text").llm.complete(
    ...         "Summarize: {}", model="sim", endpoint=endpoint.base_url, cache=False))
    >>> report = llm_ops.last_report()
    >>> report.rows, report.requests_sent, report.failed_rows
    (4, 2, 1)
    >>> {status: n for status, n in report.statuses.items() if n}
    {'ok': 2, 'skipped': 1, 'rejected': 1}
    """
    return latest()


class Reports:
    """One expression's batch reports: added up for :func:`last_report`, and recorded in
    ``llm_runs``.

    ``clock`` tells whether ``flush_seconds`` have passed since the last record:
    :func:`time.monotonic`, or a test's fake one. (The timer that records the last batches
    of a query soon after it runs on real time: it only bounds how late they are.)
    """

    def __init__(self, client: Client, *, clock: Callable[[], float] = time.monotonic):
        self.client = client
        self._clock = clock
        self.cache = client.cache
        self.run_id = uuid.uuid4().hex[:12]
        self.total: RunReport | None = None
        self._pending: list[RunReport] = []
        self._recorded_at: float | None = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        # held while a record is written: the exit waits for one under way on the timer's
        # (daemon) thread, which the interpreter would otherwise stop inside DuckDB
        self._recording = threading.Lock()
        # Remembered where the expression is made, in the caller's thread or task: Polars may
        # run its batches on threads of its own, whose context the caller never reads.
        remember_latest(lambda: self.total, client)

    def so_far(self, job: Job) -> RunReport:
        """Every batch's report added up (no rows yet: an empty report of ``job``)."""
        if self.total is not None:
            return self.total
        return dataclasses.replace(nothing_done(job), run_id=self.run_id)

    def include_batch(self, report: RunReport) -> None:
        """Add one batch's report to the total, and to what is still to be recorded."""
        with self._lock:
            both = [report] if self.total is None else [self.total, report]
            self.total = dataclasses.replace(added_up(both), run_id=self.run_id)
            # held: the expression itself is gone once its query ran; and remembered on the
            # thread Polars runs the batch on too (often the caller's)
            remember_latest(lambda: self.total, self.client)
            if self.cache is None:
                return
            self._pending.append(report)
            due = (
                self._recorded_at is None
                or self._clock() - self._recorded_at >= self.cache.flush_seconds
            )
            if not due and self._timer is None:
                # the last batches of a query are recorded soon after it, not at exit
                self._timer = threading.Timer(self.cache.flush_seconds, self.record)
                self._timer.daemon = True
                self._timer.start()
            _unrecorded.add(self)
        if due:
            self.record()

    def record(self, *, wait: float | None = 0.5) -> None:
        """Record the batches not recorded yet, as one run, trying the file for ``wait``
        seconds (``None``: the cache's ``merge_wait``, at exit); the journal keeps the rest."""
        with self._recording:
            with self._lock:
                pending, self._pending = self._pending, []
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                self._recorded_at = self._clock()
            if pending and self.cache is not None:
                self.cache.record_run(added_up(pending).as_dict(), wait=wait)
            with self._lock:
                if not self._pending:
                    _unrecorded.discard(self)


def record_unrecorded() -> None:
    """Record every expression's batches not recorded yet (at exit)."""
    for reports in list(_unrecorded):
        reports.record(wait=None)


def added_up(reports: list[RunReport]) -> RunReport:
    if len(reports) == 1:
        return reports[0]
    return sum_reports(
        reports,
        started_at=reports[0].started_at,
        wall_seconds=sum(report.wall_seconds for report in reports),
        model=reports[0].model,
    )


def nothing_done(
    job: Job, started_at: datetime | None = None, wall_seconds: float = 0.0
) -> RunReport:
    """The report of rows answered without sending or looking up anything."""
    facts = RunFacts(
        model=job.spec.model,
        endpoint=job.spec.endpoint,
        started_at=started_at or datetime.now(UTC),
        wall_seconds=wall_seconds,
        rows=0,
        distinct=0,
        cache_hits=0,
        counters=Counters(),
        statuses={},
    )
    return make_report(facts, RunCosts(cost=None if job.live_price is None else 0.0))


def in_order(statuses: Mapping[str, int]) -> dict[str, int]:
    return {status: statuses.get(status, 0) for status in STATUSES}
