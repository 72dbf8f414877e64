"""Tables on a Ray cluster: many workers send the chunks, under one rate limit, one writer.

Install with ``pip install 'llm-ops[ray]'``. A :class:`~llm_ops.tables.Table` that outgrows one
machine's client runs its chunks as Ray tasks::

    from llm_ops import Client, RateLimit
    from llm_ops.ray import run_on_ray
    from llm_ops.tables import Table

    limit = RateLimit(rpm=10_000)
    with Client(endpoint=..., cache="output/cache.duckdb", rate_limit=limit) as client:
        table = Table(client, "data/*.parquet", "output/out.parquet",
                      prompt="Summarize: {text}", model="gpt-4o-mini")
        report = run_on_ray(table, address="local", workers=4)

What is shared, and how:

* **Planning and the cache stay on the driver.** It keys and dedupes the input, looks the
  distinct requests up in the cache and writes the misses as chunk files in the work directory
  (``<out>.work/``), which every worker can read (one machine, or a shared file system).
* **One rate limit for the whole cluster.** A :class:`Quota` actor holds the requests- and
  tokens-per-minute budgets (the client's ``rate_limit``, and limits any worker learns from
  the endpoint's rate-limit headers) and every ``Retry-After`` pause. Workers lease tokens from it a
  quarter of a second's worth at a time, so the sum of their traffic stays under the limit
  without a round trip per request; each worker keeps its own adaptive concurrency.
* **One writer for the cache.** Workers never open the cache file: each appends its answers to
  journal files of its own in ``<out>.work/answers/`` as they arrive (durable if the worker
  dies), and the driver merges them into the cache as chunks finish, and whatever a dead worker
  left before it plans again. A chunk retried on another worker skips what its earlier attempt
  answered, so nothing answered is sent again beyond what was in flight. When a chunk fails,
  the others stop as on SIGTERM: they keep what they had in flight.
* **One report.** Each chunk returns its counters; the report adds them up, and ``on_chunk``
  (the flow's progress artifact and logs) hears about every chunk as it ends.
* **Progress while chunks run.** With ``on_progress``, each worker sends its chunk's
  :class:`~llm_ops.Progress` snapshots to a small actor, at most one a second, and the driver
  looks at them as often while it waits for the chunks (the flow logs a long chunk's progress
  from them); without it, nothing is sent.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ._client import Client
from ._dialects import HeardLimits
from ._progress import Progress
from ._report import RunReport
from ._telemetry import carrier, joined
from .exceptions import ConfigError, LlmOpsError
from .tables import Counters, SharedQuota, Table, WorkerStore, send_chunk

__all__ = ["Quota", "connect", "run_on_ray", "send_chunks"]

OnChunk = Callable[[int, int, Counters], None]
# a running chunk's number (1-based, among the chunks), the chunks in all, one of its snapshots,
# and whether that is its last (heard as the chunk ended)
OnProgress = Callable[[int, int, Progress, bool], None]

PROGRESS_EVERY_SECONDS = 1.0  # a chunk's snapshots reach the driver at most this often


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - the extra is installed in the dev setup
        raise ConfigError("running on a Ray cluster needs Ray: pip install 'llm-ops[ray]'") from exc
    return ray


def run_on_ray(
    table: Table,
    *,
    address: str = "local",
    workers: int | None = None,
    on_chunk: OnChunk | None = None,
    on_progress: OnProgress | None = None,
) -> RunReport:
    """:meth:`Table.run <llm_ops.tables.Table.run>`, with the chunks sent by Ray workers.

    Parameters
    ----------
    table
        The job; its client's cache, endpoint and limits are the driver's.
    address
        ``"local"`` (a Ray instance on this machine, started if none is running) or a Ray
        address such as ``"auto"`` or ``"ray://host:10001"``.
    workers
        How many chunks are sent at once (a local instance gets that many CPUs); ``None``:
        one per CPU of the cluster.
    on_chunk
        Called on the driver as each chunk ends, with the chunks done, the chunks in all and
        the counters so far (a flow's progress).
    on_progress
        Called on the driver with the running chunks' :class:`~llm_ops.Progress` snapshots
        (each counting its own chunk's rows), about once a second per chunk: the chunk's
        number among the chunks (from 1), the chunks in all, the snapshot, and whether it is
        the chunk's last (``True`` once, as the chunk ends, before ``on_chunk`` hears of it).
        Each snapshot is told once, in order, a second or so after the worker took it;
        ``None``: the workers send none.

    Returns
    -------
    RunReport
        The job's report, recorded in ``llm_runs``. A cascade runs on the driver instead
        (:meth:`~llm_ops.tables.Table.run_cascade`): which rows reach the next model depends
        on the answers.

    Examples
    --------
    A local Ray instance takes longer to start than an example in the test suite may (about
    6 s on two cores, and this example 10 s), so the suite skips the lines that need one;
    ``tests/test_ray.py`` runs the same calls on a cluster it starts once.

    >>> import tempfile
    >>> from datetime import UTC, datetime
    >>> from pathlib import Path
    >>> import polars as pl
    >>> from llm_ops import Client
    >>> from llm_ops.ray import run_on_ray, send_chunks
    >>> from llm_ops.tables import Table
    >>> from llm_ops.testing import LocalEndpoint
    >>> work = tempfile.TemporaryDirectory()
    >>> reviews, out = Path(work.name, "reviews.parquet"), Path(work.name, "out.parquet")
    >>> pl.DataFrame({"text": [f"review {i % 30}" for i in range(100)]}).write_parquet(reviews)
    >>> cache = Path(work.name, "cache.duckdb")
    >>> def progress(done, total, counters):
    ...     print(f"{done}/{total} chunks, {counters.sent} requests sent")
    >>> with (  # doctest: +SKIP
    ...     LocalEndpoint() as endpoint,
    ...     Client(endpoint=endpoint.base_url, cache=cache) as client,
    ... ):
    ...     table = Table(client, reviews, out, prompt="Summarize: {text}", model="sim",
    ...                   chunk_size=10)
    ...     report = run_on_ray(table, address="local", workers=2)
    ...     # the same, as steps a flow takes (a new prompt, so that it sends again):
    ...     steps = Table(client, reviews, out, prompt="Describe: {text}", model="sim",
    ...                   chunk_size=10)
    ...     started, plan = datetime.now(UTC), steps.plan()
    ...     counters = send_chunks(steps, plan.chunks, workers=2, on_chunk=progress)
    ...     stepped = steps.finish(plan, counters, steps.write(), started_at=started)
    1/3 chunks, 10 requests sent
    2/3 chunks, 20 requests sent
    3/3 chunks, 30 requests sent
    >>> report.rows, report.requests_sent, stepped.requests_sent  # doctest: +SKIP
    (100, 30, 30)
    >>> import ray  # doctest: +SKIP
    >>> ray.shutdown()  # doctest: +SKIP
    >>> work.cleanup()
    """
    started_at = datetime.now(UTC)
    if table.cascade:
        return table.run_cascade()  # who goes on to the next model depends on the answers
    connect(address, workers)
    plan = table.plan()
    counters = send_chunks(
        table, plan.chunks, workers=workers, on_chunk=on_chunk, on_progress=on_progress
    )
    return table.finish(plan, counters, table.write(), started_at=started_at)


def connect(address: str = "local", workers: int | None = None) -> None:
    """Join the Ray cluster at ``address`` (``"local"``: start one here) unless joined.

    Parameters
    ----------
    address
        ``"local"``, or a Ray address such as ``"auto"`` or ``"ray://host:10001"``.
    workers
        The CPUs of a local instance (``None``: this machine's); not used to join a cluster.

    Examples
    --------
    The test suite skips the lines that need a Ray instance, as for :func:`run_on_ray`.

    >>> import ray  # doctest: +SKIP
    >>> from llm_ops.ray import connect
    >>> connect("local", workers=2)  # doctest: +SKIP
    >>> ray.is_initialized(), ray.cluster_resources()["CPU"]  # doctest: +SKIP
    (True, 2.0)
    >>> connect("local", workers=4)  # joined already, so nothing changes  # doctest: +SKIP
    >>> ray.cluster_resources()["CPU"]  # doctest: +SKIP
    2.0
    >>> ray.shutdown()  # doctest: +SKIP
    """
    ray = _ray()
    if ray.is_initialized():
        return
    if address == "local":
        ray.init(
            num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False
        )
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)


def send_chunks(
    table: Table,
    chunks: list[str],
    *,
    workers: int | None = None,
    on_chunk: OnChunk | None = None,
    on_progress: OnProgress | None = None,
    progress_every: float = PROGRESS_EVERY_SECONDS,
) -> Counters:
    """Send ``chunks`` (from :meth:`Table.plan`) as Ray tasks, at most ``workers`` at once,
    merging their answers into the cache as they end; returns the counters added up.

    The step of :func:`run_on_ray` that runs on the cluster, for a flow that takes the
    table's steps itself (as ``flows/enrich.py`` does): :meth:`~llm_ops.tables.Table.plan`,
    then this, then :meth:`~llm_ops.tables.Table.write` and
    :meth:`~llm_ops.tables.Table.finish`. ``workers``, ``on_chunk`` and ``on_progress``
    are as for :func:`run_on_ray`; ``progress_every`` is how often, in seconds, a worker
    sends its chunk's snapshot and the driver looks at those sent (with ``on_progress``
    only). A job in batch mode, with the semantic cache or with a budget is a
    :class:`~llm_ops.ConfigError` for now. The example of :func:`run_on_ray` takes these
    steps too.
    """
    ray = _ray()
    job = table.job
    if job.batching is not None or job.semantic is not None or job.spending.budget(None):
        raise ConfigError(
            "on Ray, a table runs live requests without the semantic cache or "
            "budgets (max_cost, ...) for now; drop them, or run without Ray"
        )
    store = table.answers_dir
    store.mkdir(parents=True, exist_ok=True)
    quota = (
        ray.remote(Quota)
        .options(num_cpus=0)
        .remote(table.client.limits.rpm, table.client.limits.tpm)
    )
    heard = None if on_progress is None else _Heard(on_progress, len(chunks))
    work = _Work(
        client_options=dict(table.client.worker_options()),
        job=dataclasses.replace(job, progress=None),
        answers=str(store),
        flush_every=table.cache.flush_every,
        flush_seconds=table.cache.flush_seconds,
        max_age=table.cache.max_age,
        quota=quota,
        trace_headers=carrier(),
        snapshots=None if heard is None else heard.snapshots,
        progress_every=progress_every,
    )
    task = ray.remote(_send_chunk).options(num_cpus=1, max_retries=2)
    limit = workers or max(1, int(ray.available_resources().get("CPU", 1)))
    waiting: list[str] = list(chunks)
    running: list[Any] = []  # Ray object refs
    numbers: dict[Any, int] = {}  # a running chunk's number among the chunks
    total = Counters()
    try:
        while waiting or running:
            while waiting and len(running) < limit:
                number = len(chunks) - len(waiting) + 1
                running.append(task.remote(work, waiting.pop(0), number))
                numbers[running[-1]] = number
            if heard is None:
                done, running = ray.wait(running, num_returns=1)
            else:
                done, running = ray.wait(running, num_returns=1, timeout=progress_every)
                heard.hear(ended=numbers[done[0]] if done else None)
            if not done:
                continue
            numbers.pop(done[0])
            try:
                total.add(ray.get(done[0]))
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                raise (cause if isinstance(cause, LlmOpsError) else exc) from None
            table.cache.adopt(store, wait=2.0)
            if on_chunk is not None:
                on_chunk(len(chunks) - len(waiting) - len(running), len(chunks), total)
    finally:
        _stop(running)
        table.cache.adopt(store, wait=2.0)
    return total


def _stop(running: list[Any]) -> None:
    """Stop the chunks still running after one failed. Gently first: a cancelled task stops
    sending, lets what is in flight be answered and writes its answers to its journal (see
    :func:`_send_chunk`), which killing its process would lose; only those still running
    after the drain are killed."""
    if not running:
        return
    ray = _ray()
    for ref in running:
        ray.cancel(ref)
    _, stuck = ray.wait(running, num_returns=len(running), timeout=Client.drain_seconds + 5)
    for ref in stuck:
        ray.cancel(ref, force=True)


class _Snapshots:
    """The chunks' progress snapshots, from the workers until the driver takes them (a Ray
    actor; each worker sends at most one a second, so the list stays short)."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, Progress]] = []

    def put(self, number: int, progress: Progress) -> None:
        self.sent.append((number, progress))

    def take(self) -> list[tuple[int, Progress]]:
        sent, self.sent = self.sent, []
        return sent


class _Heard:
    """The driver's side of the snapshots: a :class:`_Snapshots` actor the workers send them
    to, and each told to ``on_progress`` once, in order. A chunk's latest is held back until
    a newer one comes or the chunk ends, so that its last is told as the last; one from a
    chunk that ended (from an attempt Ray gave up on) is dropped."""

    def __init__(self, on_progress: OnProgress, chunks: int):
        self.on_progress, self.chunks = on_progress, chunks
        self.snapshots = _ray().remote(_Snapshots).options(num_cpus=0).remote()
        self.latest: dict[int, Progress] = {}  # of the running chunks, not yet told
        self.ended: set[int] = set()

    def hear(self, *, ended: int | None) -> None:
        """Tell what the workers sent since the last look; ``ended``: the chunk that did."""
        sent: list[tuple[int, Progress]] = _ray().get(self.snapshots.take.remote())
        for number, progress in sent:
            if number in self.ended:
                continue
            earlier = self.latest.get(number)
            self.latest[number] = progress
            if earlier is not None:
                self.on_progress(number, self.chunks, earlier, False)
        if ended is not None:
            self.ended.add(ended)
            last = self.latest.pop(ended, None)
            if last is not None:
                self.on_progress(ended, self.chunks, last, True)


class _Forward:
    """A worker's ``progress=`` callback: its chunk's snapshots to the driver's
    :class:`_Snapshots`, at most one every ``every`` seconds (the latest; those between are
    dropped), without waiting for the actor."""

    def __init__(
        self, actor: Any, number: int, every: float, clock: Callable[[], float] = time.monotonic
    ):
        self.actor, self.number, self.every, self.clock = actor, number, every, clock
        self.sent_at = -math.inf
        self.unsent: Progress | None = None  # the latest, when it came too soon to send
        self.last_put: Any = None  # the ref of the last snapshot sent

    def __call__(self, progress: Progress) -> None:
        if self.clock() - self.sent_at < self.every:
            self.unsent = progress
            return
        self._put(progress)

    def flush(self) -> None:
        """Send the snapshot held back, and wait until the actor has every one: the driver
        then hears them before it hears that the chunk ended."""
        if self.unsent is not None:
            self._put(self.unsent)
        if self.last_put is not None:
            _ray().get(self.last_put)

    def _put(self, progress: Progress) -> None:
        self.unsent, self.sent_at = None, self.clock()
        self.last_put = self.actor.put.remote(self.number, progress)


@dataclasses.dataclass(frozen=True)
class _Work:
    """What every chunk task of one run needs."""

    client_options: dict[str, Any] = dataclasses.field(repr=False)  # holds the key
    job: Any  # the table's Job, without its progress
    answers: str
    flush_every: int
    flush_seconds: float
    max_age: timedelta | None
    quota: Any  # the Quota actor's handle
    # the span current on the driver, as W3C trace-context headers: the workers' spans join it
    trace_headers: dict[str, str] | None = None
    snapshots: Any = None  # the _Snapshots actor's handle, when the driver wants progress
    progress_every: float = PROGRESS_EVERY_SECONDS


def _send_chunk(work: _Work, chunk: str, number: int) -> Counters:
    """One chunk, on a worker: its answers go to the work directory, its requests under the
    cluster's quota. Ray cancels a task with a KeyboardInterrupt in the main thread: the
    chunk then stops as on SIGTERM (see :meth:`Client.call_stopped_gently`), so what is in
    flight is answered and journalled within the drain time the driver waits before it
    kills the worker.

    With the driver's span in ``work.trace_headers``, the chunk's ``llm_ops.chunk`` span is
    under it, and its requests' spans under that."""
    with joined(work.trace_headers):
        return _send_chunk_here(work, chunk, number)


def _send_chunk_here(work: _Work, chunk: str, number: int) -> Counters:
    client = Client(quota=_QuotaOfTheCluster(work.quota), **work.client_options)
    store = WorkerStore(
        Path(work.answers),
        flush_every=work.flush_every,
        flush_seconds=work.flush_seconds,
        max_age=work.max_age,
    )
    job, forward = work.job, None
    if work.snapshots is not None:
        forward = _Forward(work.snapshots, number, work.progress_every)
        job = dataclasses.replace(job, progress=forward)
    with client:
        counters = client.call_stopped_gently(lambda: send_chunk(client, job, store, chunk))
    if forward is not None:
        forward.flush()
    return counters


class Quota(SharedQuota):
    """The cluster's rate budget (a Ray actor): the configured limits, those any worker
    learned from the endpoint's headers, and every pause, in one place.

    Examples
    --------
    :func:`send_chunks` makes it an actor that every worker's limiter leases from; here it
    is a plain object:

    >>> from llm_ops.ray import Quota
    >>> quota = Quota(rpm=600, tpm=None)  # ten requests a second, no token budget
    >>> quota.lease(4, 400)  # four requests, and the tokens asked for
    (4, 400, 0.0)
    >>> from llm_ops._dialects import HeardLimit, HeardLimits  # as a dialect reads headers
    >>> quota.observe(HeardLimits(requests=HeardLimit(per_minute=300.0)))  # a lower limit heard
    >>> quota.limits()
    (300.0, None)
    >>> quota.pause(30)  # a worker got Retry-After: 30
    >>> granted, tokens, wait = quota.lease(1, 100)
    >>> granted, tokens, 29 < wait <= 30
    (0, 0, True)
    """


class _QuotaOfTheCluster:
    """How a worker's client reaches the cluster's :class:`Quota` actor (a
    :class:`~llm_ops.Client`'s ``quota``): leases and limits awaited, the rest told."""

    def __init__(self, actor: Any):
        self.actor = actor

    async def limits(self) -> tuple[float | None, float | None]:
        limits: tuple[float | None, float | None] = await self.actor.limits.remote()
        return limits

    async def lease(self, requests: int, tokens: int) -> tuple[int, int, float]:
        granted: tuple[int, int, float] = await self.actor.lease.remote(requests, tokens)
        return granted

    def observe(self, heard: HeardLimits) -> None:
        self.actor.observe.remote(heard)

    def pause(self, seconds: float) -> None:
        self.actor.pause.remote(seconds)
