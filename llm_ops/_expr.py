"""The ``llm`` expression namespace: a model call as a Polars expression.

``import llm_ops`` registers it (``pl.api.register_expr_namespace("llm")``), so any string
expression can ask a model::

    df.with_columns(pl.col("text").llm.complete("Summarize: {}", model="gpt-4o-mini"))

Each expression is a batch function (``map_batches(..., is_elementwise=True)``): Polars hands
it the whole column of an eager frame, or one batch at a time on the streaming engine, and each
batch runs through the same pipeline, client and cache keys as :func:`llm_ops.llm_complete`
(plan, dedupe, cache lookup, dispatch, join back). Batches on one client run one after the
other, so a value repeated in a later batch is answered by the cache (or, with ``cache=False``,
by what the expression remembers of its earlier batches): one request per distinct value.

Every batch's report is added to the expression's :func:`last_report` and recorded in
``llm_runs``: the first batch at once, later ones together at most every ``flush_seconds``
(and when the process exits), since each record is a write to the cache file.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import os
import re
import string
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, ParamSpec, TypeVar, Unpack, cast

import polars as pl
from pydantic import BaseModel

from ._backend import Backend
from ._cache import Cache, resolve_cache_path
from ._client import Client
from ._embed import embed_frame
from ._engine import Engine
from ._join import raise_failed_rows, status_counts
from ._journal import JournalWriter
from ._options import (
    CallOptions,
    ClientOptions,
    Columns,
    EmbedOptions,
    Job,
    ModelOption,
    RequestOptions,
    SchemaOption,
    check_job,
    make_job,
    split_options,
)
from ._outcome import Counters
from ._progress import resolve_progress
from ._report import RunReport, make_report, sum_reports
from ._run import run_frame
from ._signals import graceful_sigterm
from ._spec import EmbeddingSpec, positive_int
from ._status import FAILED, STATUS_DTYPE, STATUSES
from .exceptions import ConfigError, RowsFailedError, TemplateError

__all__ = ["ExprOptions", "LlmNamespace", "last_report"]

P = ParamSpec("P")
T = TypeVar("T")

Output = Literal["answer", "struct"]
"""What an ``llm`` expression returns: the answer alone (null where a row failed), or a
struct of the answer with its ``status`` and ``error`` (and the other columns
:func:`~llm_ops.llm_complete` would add)."""


class ExprOptions(ClientOptions, RequestOptions, total=False):
    """The keyword options of the ``llm`` expressions and of ``llm_filter``, ``llm_classify``
    and ``llm_extract``: every option of :func:`~llm_ops.llm_complete` but ``output`` (an
    expression's name is its output; see :class:`llm_ops.Options`)."""


# -- what is asked ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Ask:
    """What an expression asks the model for, and how its answer becomes the result."""

    schema: type[BaseModel] | Mapping[str, Any] | None = None  # on the wire
    prompt: str | None = None  # the default prompt, ``{}`` standing for the value
    field: str | None = None  # the field of the structured answer that is the result
    dtype: pl.DataType | None = None  # the result's type, when not the schema's

    def result(self, answer: pl.Expr) -> pl.Expr:
        if self.field is not None:
            answer = answer.struct.field(self.field)
        return answer if self.dtype is None else answer.cast(self.dtype)

    def result_dtype(self, job: Job) -> pl.DataType:
        if self.dtype is not None:
            return self.dtype
        schema = job.spec.schema
        if schema is None:
            return pl.String()
        if self.field is None:
            return schema.dtype
        dtype = cast(pl.Struct, schema.dtype).to_schema()[self.field]
        return dtype if isinstance(dtype, pl.DataType) else dtype()


def text() -> Ask:
    return Ask()


def labels_of(labels: object) -> list[str]:
    if (
        isinstance(labels, str)
        or not isinstance(labels, Sequence)
        or not labels
        or not all(isinstance(label, str) and label for label in labels)
    ):
        raise ConfigError(
            f"labels must be a list of label names such as ['positive', 'negative'], got {labels!r}"
        )
    if len(set(labels)) != len(labels):
        raise ConfigError(f"labels must name each label once, got {list(labels)!r}")
    return list(labels)


def escaped(text: str) -> str:
    """``text`` as literal template text."""
    return text.replace("{", "{{").replace("}", "}}")


def classification(labels: Sequence[str], value: str = "{}") -> Ask:
    """One of ``labels``, constrained by the schema's enum; ``value`` is where the text goes."""
    chosen = labels_of(labels)
    return Ask(
        schema={
            "title": "classification",
            "type": "object",
            "properties": {"label": {"type": "string", "enum": chosen}},
            "required": ["label"],
            "additionalProperties": False,
        },
        prompt=(
            f"Classify the text as exactly one of these labels: "
            f"{escaped(', '.join(chosen))}.\n\nText: {value}"
        ),
        field="label",
        dtype=pl.Enum(chosen),
    )


def one_schema(positional: SchemaOption, keyword: SchemaOption) -> SchemaOption:
    if positional is not None and keyword is not None:
        raise ConfigError("extract takes one schema: pass it as the first argument or schema=")
    return positional if positional is not None else keyword


def extraction(schema: object, value: str = "{}") -> Ask:
    if schema is None or isinstance(schema, str):
        raise ConfigError(
            f"schema must be a pydantic model class or a JSON schema dict, got {schema!r}"
        )
    return Ask(
        schema=cast("type[BaseModel] | Mapping[str, Any]", schema),
        prompt=f"Extract the fields of the JSON schema from the text.\n\nText: {value}",
    )


def verdict() -> Ask:
    return Ask(
        schema={
            "title": "verdict",
            "type": "object",
            "properties": {"answer": {"type": "boolean"}},
            "required": ["answer"],
            "additionalProperties": False,
        },
        field="answer",
    )


# -- templates over an expression's value -----------------------------------------------------

_VALUE = "value"
_NAME = re.compile(r"[^{}\[\].!:]+")


def with_value(source: str, name: str, *, what: str) -> tuple[str, bool]:
    """``source`` with every ``{}`` standing for the column ``name``, and whether it has one."""
    if not isinstance(source, str):
        raise TemplateError(
            f"{what} must be a string template like 'Summarize: {{}}', got {type(source).__name__}"
        )
    try:
        parsed = list(string.Formatter().parse(source))
    except ValueError as exc:
        raise TemplateError(
            f"{what} template {source!r} is malformed ({exc}); "
            "write literal braces as {{ and }}"
        ) from exc
    pieces: list[str] = []
    used = False
    for literal, field, spec, conversion in parsed:
        pieces.append(escaped(literal))
        if field is None:
            continue
        if field == "" and not spec and conversion is None:
            pieces.append("{" + name + "}")
            used = True
        else:  # left for parse_template to accept (a struct's field) or explain
            shown = field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            pieces.append("{" + shown + "}")
    return "".join(pieces), used


def named_fields(source: str) -> list[str]:
    return [field for _, field, _, _ in string.Formatter().parse(source) if field]


def value_name(name: str, reserved: Sequence[str]) -> str:
    """The column the value is known by in templates and messages: its own name when it can be
    one (``column 'text' is null`` reads as in ``llm_complete``), else ``value``."""
    if _NAME.fullmatch(name) and not name.isdigit() and name not in reserved:
        return name
    return _VALUE


# -- clients ----------------------------------------------------------------------------------

_clients: dict[tuple[Any, ...], Client] = {}
_clients_lock = threading.Lock()


def client_for(client: Client | None, made: ClientOptions) -> Client:
    """``client``, or the process's shared client for ``made`` (one per set of options and
    environment), so every batch and every expression with the same options share one pool,
    one rate limiter and what was learned about the endpoint."""
    if client is not None:
        if not isinstance(client, Client):
            raise ConfigError(f"client must be an llm_ops.Client, got {type(client).__name__}")
        if made:
            raise ConfigError(
                f"pass either client= or the client's options ({', '.join(sorted(made))}), "
                "not both: a Client keeps the options it was made with"
            )
        return client
    key = (
        tuple(sorted((name, repr(value)) for name, value in made.items() if name != "cache")),
        str(resolve_cache_path(made.get("cache"))),
        os.environ.get("OPENAI_BASE_URL"),
        os.environ.get("OPENAI_API_KEY"),
    )
    with _clients_lock:
        shared = _clients.get(key)
        if shared is None:
            shared = _clients[key] = Client(**made)
        return shared


# -- where a batch runs ------------------------------------------------------------------------
#
# Polars calls a batch function on whichever thread evaluates the expression: the caller's
# thread, a streaming thread, or one of its own pool's worker threads (several expressions
# of one eager context, group_by().agg, ...). The pipeline uses Polars throughout, and Polars
# work started from another thread waits for a free pool worker; when every worker waits in
# a batch function, none ever is (with two cores, two llm expressions in one with_columns).
# So a batch does not hop to the client's own loop thread: the thread Polars called drives an
# event loop of the client's expressions itself and runs the pipeline's work in place (where
# a pool worker runs nested Polars work itself). Only the network waits on that loop, and the
# journal's merges (which wait for the cache file) and aiohttp's DNS lookups go to a thread.


class InPlace(concurrent.futures.ThreadPoolExecutor):
    """The default executor of a runtime's loop: llm-ops' own work (``asyncio.to_thread`` in
    the pipeline) runs on the thread driving the loop, the rest on a small thread pool."""

    def __init__(self) -> None:
        super().__init__(4, thread_name_prefix="llm-ops")

    def submit(
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> concurrent.futures.Future[T]:
        target: Any = fn
        while isinstance(target, functools.partial):  # to_thread: partial(context.run, fn)
            in_context = isinstance(getattr(target.func, "__self__", None), contextvars.Context)
            target = target.args[0] if in_context and target.args else target.func
        owner = getattr(target, "__self__", None)
        ours = getattr(target, "__module__", "") or ""
        if not ours.startswith("llm_ops") or isinstance(owner, JournalWriter):
            return super().submit(fn, *args, **kwargs)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future


class Runtime:
    """What the expressions of one client share: an event loop driven by the thread Polars
    called, and on it one engine (connection pool, rate limiter, adaptive concurrency) for the
    client's life. One batch at a time: hold :attr:`lock` around :meth:`run`."""

    def __init__(self, client: Client):
        self.client = client
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(InPlace())
        self._engine: Engine | None = None

    async def backend(self) -> Backend:
        """The engine (made on this loop, once) and the client's cache, made ready to use
        before anything is paid for."""
        if self._engine is None:
            made = self.client._limiter  # a cluster's shared limiter (llm_ops.ray), if any
            self._engine = Engine(
                self.client.endpoint,
                self.client.limits,
                None if made is None else made(self.client.limits),
            )
        if self.client.cache is not None:
            self.client.cache.prepare()
        return Backend(self._engine, self.client.cache)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on this loop from this thread (from a helper thread where this
        thread already runs a loop, as a notebook's does); Ctrl-C cancels it and waits until
        what was answered is cached, and SIGTERM drains it, as in :meth:`Client.run`."""
        task = self.loop.create_task(coroutine)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            with graceful_sigterm():
                return self._drive(task)
        outcome: list[Any] = []

        def drive() -> None:
            try:
                outcome.append(self._drive(task))
            except BaseException as exc:
                outcome.append(exc)

        helper = threading.Thread(target=drive, name="llm-ops-expression", daemon=True)
        helper.start()
        try:
            while helper.is_alive():
                helper.join(0.1)
        except KeyboardInterrupt:
            self.loop.call_soon_threadsafe(task.cancel)
            helper.join()
            raise
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return cast(T, outcome[0])

    def _drive(self, task: asyncio.Task[T]) -> T:
        try:
            return self.loop.run_until_complete(task)
        except KeyboardInterrupt:
            task.cancel()
            with contextlib.suppress(BaseException):
                self.loop.run_until_complete(task)
            raise

    def close(self, *, wait: float = 5.0) -> None:
        """Close the engine's connections and the loop, unless a batch still runs after
        ``wait`` seconds (at exit: a query a signal stopped on another thread)."""
        if not self.lock.acquire(timeout=wait):
            return
        try:
            if self._engine is not None:
                self.loop.run_until_complete(self._engine.close())
                self._engine = None
            self.loop.close()
        finally:
            self.lock.release()


_runtimes: weakref.WeakKeyDictionary[Client, Runtime] = weakref.WeakKeyDictionary()


def runtime_of(client: Client) -> Runtime:
    with _clients_lock:
        runtime = _runtimes.get(client)
        if runtime is None:
            runtime = _runtimes[client] = Runtime(client)
        return runtime


# -- reports ----------------------------------------------------------------------------------

_last: Reports | None = None  # held: the expression itself is gone once its query ran
_unrecorded: weakref.WeakSet[Reports] = weakref.WeakSet()


def last_report() -> RunReport | None:
    """The report of the ``llm`` expression (or ``llm_filter``, ``llm_classify``,
    ``llm_extract``) that ran last in this process: every batch it answered so far, added up;
    ``None`` before any has run.

    A failed row is null in an expression's plain form; this report's ``statuses`` and
    ``failed_rows`` say how many there were (``output="struct"`` says which). The same
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
    ...         "Summarize: {}", model="sim", base_url=endpoint.base_url, cache=False))
    >>> report = llm_ops.last_report()
    >>> report.rows, report.requests_sent, report.failed_rows
    (4, 2, 1)
    >>> {status: n for status, n in report.statuses.items() if n}
    {'ok': 2, 'skipped': 1, 'rejected': 1}
    """
    return None if _last is None else _last.total


class Reports:
    """One expression's batch reports: added up for :func:`last_report`, and recorded in
    ``llm_runs``."""

    def __init__(self, cache: Cache | None):
        self.cache = cache
        self.run_id = uuid.uuid4().hex[:12]
        self.total: RunReport | None = None
        self._pending: list[RunReport] = []
        self._recorded_at: float | None = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def add(self, report: RunReport) -> None:
        global _last
        with self._lock:
            both = [report] if self.total is None else [self.total, report]
            self.total = dataclasses.replace(added_up(both), run_id=self.run_id)
            _last = self
            if self.cache is None:
                return
            self._pending.append(report)
            due = (
                self._recorded_at is None
                or time.monotonic() - self._recorded_at >= self.cache.flush_seconds
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
        with self._lock:
            pending, self._pending = self._pending, []
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._recorded_at = time.monotonic()
            _unrecorded.discard(self)
        if pending and self.cache is not None:
            self.cache.record_run(added_up(pending).as_dict(), wait=wait)


def added_up(reports: list[RunReport]) -> RunReport:
    if len(reports) == 1:
        return reports[0]
    return sum_reports(
        reports,
        started_at=reports[0].started_at,
        wall_seconds=sum(report.wall_seconds for report in reports),
        model=reports[0].model,
    )


@atexit.register
def _at_exit() -> None:
    for reports in list(_unrecorded):
        reports.record(wait=None)
    with _clients_lock:
        runtimes = list(_runtimes.values())
        _clients.clear()
    for runtime in runtimes:
        with contextlib.suppress(Exception):  # a loop still running on a killed thread
            runtime.close()


# -- batches ----------------------------------------------------------------------------------


class BatchRowsFailedError(RowsFailedError):
    """``on_error="raise"`` in an expression: rows of the batch did not get an answer.

    Polars raises a batch function's error again as a new exception of its class, made from
    its message and where in the query it happened, so this one can be made from a message
    alone and keeps the rows, errors and statuses of the one it is made from.
    """

    _raised: ClassVar[dict[str, tuple[list[int], list[str], list[str]]]] = {}

    def __init__(self, *args: Any) -> None:
        if len(args) == 3:
            super().__init__(*args)
            self._raised.clear()  # only the error in flight is wanted
            self._raised[str(self)] = (self.rows, self.errors, self.statuses)
            return
        message = str(args[0]) if args else ""
        rows, errors, statuses = next(
            (found for text, found in self._raised.items() if message.startswith(text)),
            ([], [], []),
        )
        Exception.__init__(self, message)
        self.rows, self.errors, self.statuses = rows, errors, statuses


class Batches:
    """The batch function of one expression: every batch Polars hands it goes through its
    client, one batch at a time."""

    dtype: pl.DataType
    on_error: str
    job: Job  # as checked when the expression was made

    def __init__(self, client: Client, *, output: Output):
        if output not in ("answer", "struct"):
            raise ConfigError(
                f"output must be 'answer' or 'struct', got {output!r}; name the result with "
                ".alias(...)"
            )
        self.client = client
        self.runtime = runtime_of(client)
        self.output = output
        self.reports = Reports(client.cache)
        self._memo: pl.DataFrame | None = None  # without a cache: what earlier batches got

    def __call__(self, values: pl.Series) -> pl.Series:
        if values.is_empty():
            return pl.Series(values.name, [], dtype=self.dtype)
        frame, job = self.prepare(values)
        with self.runtime.lock:
            columns = self.answer(frame, job)
        if self.on_error == "raise" and columns[job.columns.status].is_in(list(FAILED)).any():
            try:
                raise_failed_rows(columns, job.columns)
            except RowsFailedError as exc:
                raise BatchRowsFailedError(exc.rows, exc.errors, exc.statuses) from None
        return columns.select(self.result(job)).to_series().alias(values.name)

    def report(self) -> RunReport:
        """Every batch's report added up (no rows yet: an empty report)."""
        if self.reports.total is not None:
            return self.reports.total
        return dataclasses.replace(nothing_done(self.job), run_id=self.reports.run_id)

    def prepare(self, values: pl.Series) -> tuple[pl.DataFrame, Job]:
        """The batch as the frame its job reads, and that job."""
        raise NotImplementedError

    def run(self, frame: pl.DataFrame, job: Job) -> tuple[pl.DataFrame, RunReport | None]:
        """The added columns of ``frame``'s rows, and the report (``None`` when the run
        recorded its report itself before it raised)."""
        raise NotImplementedError

    def result(self, job: Job) -> pl.Expr:
        raise NotImplementedError

    def answer(self, frame: pl.DataFrame, job: Job) -> pl.DataFrame:
        if self.client.cache is not None:  # the cache answers what earlier batches got
            columns, ran = self.run(frame, job)
            if ran is not None:
                self.reports.add(ran)
            return columns
        # No cache: each distinct row is sent once per expression, whichever batch it is in.
        started_at, clock = datetime.now(UTC), time.perf_counter()
        keys = frame.columns
        fresh = frame.unique(maintain_order=True)
        if self._memo is not None:
            seen = self._memo.select(keys)
            fresh = fresh.join(seen, on=keys, how="anti", nulls_equal=True, maintain_order="left")
        report: RunReport | None = None
        if not fresh.is_empty():
            answered, report = self.run(fresh, job)
            added = fresh.hstack(answered.get_columns())
            self._memo = added if self._memo is None else pl.concat([self._memo, added])
        assert self._memo is not None
        columns = frame.join(
            self._memo, on=keys, how="left", nulls_equal=True, maintain_order="left"
        ).drop(keys)
        if report is None:
            report = nothing_done(job, started_at, time.perf_counter() - clock)
        self.reports.add(
            dataclasses.replace(
                report, rows=frame.height, statuses=in_order(status_counts(columns, job.columns))
            )
        )
        return columns

    def fields(self, job: Job, answer: pl.Expr) -> pl.Expr:
        """The result: the answer, or the struct of it with the other columns."""
        if self.output == "answer":
            return answer
        return pl.struct(
            [
                (answer if field == "answer" else pl.col(name)).alias(field)
                for field, name in struct_fields(job.columns).items()
            ]
        )

    def struct_dtype(self, job: Job, answer_dtype: pl.DataType) -> pl.DataType:
        if self.output == "answer":
            return answer_dtype
        dtypes: dict[str, pl.DataType] = {
            "answer": answer_dtype,
            "status": STATUS_DTYPE,
            "error": pl.String(),
            "raw": pl.String(),
            "similar_to": pl.String(),
            "similarity": pl.Float64(),
            "model": pl.String(),
        }
        return pl.Struct({field: dtypes[field] for field in struct_fields(job.columns)})


def nothing_done(
    job: Job, started_at: datetime | None = None, wall_seconds: float = 0.0
) -> RunReport:
    """The report of rows answered without sending or looking up anything."""
    return make_report(
        model=job.spec.model,
        endpoint=job.spec.endpoint,
        started_at=started_at or datetime.now(UTC),
        wall_seconds=wall_seconds,
        rows=0,
        distinct=0,
        cache_hits=0,
        counters=Counters(),
        statuses={},
        stopped=None,
        cost=None if job.live_price is None else 0.0,
    )


def in_order(statuses: Mapping[str, int]) -> dict[str, int]:
    return {status: statuses.get(status, 0) for status in STATUSES}


def struct_fields(columns: Columns) -> dict[str, str]:
    """The struct form's fields and the columns they come from, in ``llm_complete``'s order."""
    suffixes = {"status", "error", "raw", "similar_to", "similarity", "model"}
    fields = {"answer": columns.output}
    for name in columns.names[1:]:
        suffix = name[len(columns.output) + 1 :]
        assert suffix in suffixes
        fields[suffix] = name
    return fields


class Completions(Batches):
    """``.llm.complete`` and the expressions made of it (classify, extract, filter)."""

    def __init__(
        self,
        client: Client,
        prompt: str | None,
        model: ModelOption,
        options: RequestOptions,
        *,
        ask: Ask,
        output: Output,
        answer: str = "answer",
        what: str,
    ):
        super().__init__(client, output=output)
        self.ask = ask
        self.model = model
        self.what = what
        self.prompt = prompt if prompt is not None else (ask.prompt or "{}")
        self.system = options.get("system")
        self.on_error = options.get("on_error", "null")
        schema = options.get("schema")
        if ask.schema is not None and schema is not None:
            raise ConfigError(f"{what} asks for its own schema; drop schema=")
        self.options: CallOptions = {
            **options,
            "output": answer,
            "schema": ask.schema if ask.schema is not None else schema,
            "on_error": "null",  # raised per batch below, with the rows of the batch
        }
        self._jobs: dict[str | None, Job] = {}
        # Checked now, before anything is sent: options, templates, schema, prices.
        self.job = self.job_for(_VALUE, value=None)
        self.dtype = self.struct_dtype(self.job, ask.result_dtype(self.job))

    def job_for(self, name: str, *, value: bool | None) -> Job:
        """The job for a batch whose value is the column ``name`` (``value=True``), or whose
        struct's fields are the columns (``value=False``); ``None``: not known yet."""
        prompt, in_prompt = with_value(self.prompt, name, what="prompt")
        system, in_system = (
            (None, False) if self.system is None else with_value(self.system, name, what="system")
        )
        named = [f for f in named_fields(self.prompt) + named_fields(self.system or "") if f]
        if value is True and named:
            raise TemplateError(
                f"{self.what}: the prompt names {{{named[0]}}}, but the expression's value is "
                "one column: write {} for it (e.g. 'Summarize: {}'), or ask of a struct of "
                f"the columns, e.g. pl.struct({named[0]!r}, ...).llm.{self.what}(...)"
            )
        if value is True and not in_prompt:
            raise TemplateError(
                f"{self.what}: the prompt {self.prompt!r} does not use the value: write {{}} "
                "where it goes, e.g. 'Summarize: {}'"
            )
        if value is False and (in_prompt or in_system):
            raise TemplateError(
                f"{self.what}: the expression is a struct, so the prompt names its fields, "
                "e.g. '{title}: {text}'; {} stands for a single column's value"
            )
        if value is None and named and (in_prompt or in_system):
            raise TemplateError(
                f"{self.what}: the prompt uses both {{}} and {{{named[0]}}}: use {{}} for a "
                "single column's value, or field names for a struct's fields"
            )
        return make_job(
            prompt=prompt,
            model=self.model,
            endpoint=self.client.endpoint.identity,
            cached=self.client.cache is not None,
            options={**self.options, "system": system},
        )

    def prepare(self, values: pl.Series) -> tuple[pl.DataFrame, Job]:
        reserved = self.job.columns.names
        if isinstance(values.dtype, pl.Struct):
            frame, key, name = values.struct.unnest(), None, ""
            taken = [field for field in frame.columns if field in reserved]
            if taken:
                raise ConfigError(
                    f"{self.what}: the struct's field {taken[0]!r} is a name the answer's "
                    f"columns use ({', '.join(reserved)}); rename it inside the struct, e.g. "
                    f"pl.struct(pl.col({taken[0]!r}).alias('{taken[0]}_'), ...)"
                )
        else:
            name = value_name(values.name, reserved)
            frame, key = values.alias(name).to_frame(), name
        job = self._jobs.get(key)
        if job is None:
            job = self.job_for(name or _VALUE, value=key is not None)
            check_job(job, frame.schema)
            self._jobs[key] = job
        return frame, job

    def run(self, frame: pl.DataFrame, job: Job) -> tuple[pl.DataFrame, RunReport | None]:
        reports: list[RunReport] = []

        async def answer() -> tuple[pl.DataFrame, RunReport]:
            backend = await self.runtime.backend()
            return await run_frame(frame, job, backend, record=False, on_report=reports.append)

        try:
            columns, report = self.runtime.run(answer())
        except BaseException:
            for report in reports:  # a stopped job's report still counts
                self.reports.add(report)
            raise
        return columns, report

    def result(self, job: Job) -> pl.Expr:
        answer = self.ask.result(pl.col(job.columns.output))
        return self.fields(job, answer)


class Embeddings(Batches):
    """``.llm.embed``."""

    def __init__(
        self,
        client: Client,
        *,
        model: str,
        dimensions: int | None,
        batch_size: int,
        output: Output,
        options: EmbedOptions,
    ):
        super().__init__(client, output=output)
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(
                f"model must be a model name such as 'text-embedding-3-small', got {model!r}"
            )
        if dimensions is not None:
            positive_int("dimensions", dimensions)
        self.batch_size = positive_int("batch_size", batch_size)
        self.on_error = options.get("on_error", "null")
        if self.on_error not in ("null", "raise"):
            raise ConfigError(f"on_error must be 'null' or 'raise', got {self.on_error!r}")
        self.progress = resolve_progress(options.get("progress"))
        self.spec = EmbeddingSpec(client.endpoint.identity, model, dimensions)
        self.vector: pl.DataType = (
            pl.List(pl.Float32) if dimensions is None else pl.Array(pl.Float32, dimensions)
        )
        self.job = make_job(
            prompt="{value}",  # an embedding's "job" only names its columns
            model=model,
            endpoint=client.endpoint.identity,
            cached=client.cache is not None,
            options={"output": "answer", "progress": False},
        )
        self.dtype = self.struct_dtype(self.job, self.vector)

    def prepare(self, values: pl.Series) -> tuple[pl.DataFrame, Job]:
        if values.dtype not in (pl.String, pl.Null):
            raise ConfigError(
                f"embed takes a string expression, got {values.dtype}; cast it first, e.g. "
                ".cast(pl.String), or pl.format(...) several columns into one"
            )
        name = value_name(values.name, self.job.columns.names)
        return values.alias(name).to_frame(), self.job

    def run(self, frame: pl.DataFrame, job: Job) -> tuple[pl.DataFrame, RunReport | None]:
        reports: list[RunReport] = []

        async def embed() -> pl.DataFrame:
            backend = await self.runtime.backend()
            return await embed_frame(
                frame,
                frame.columns[0],
                self.spec,
                backend,
                columns=job.columns,
                batch_size=self.batch_size,
                on_error="null",
                progress=self.progress,
                on_report=reports.append,
            )

        try:
            columns = self.runtime.run(embed())
        except BaseException:
            for report in reports:
                self.reports.add(report)
            raise
        vectors = columns[job.columns.output]
        width = getattr(vectors.dtype, "size", None)
        wanted = self.spec.dimensions
        if wanted is not None and width not in (wanted, 0) and vectors.drop_nulls().len():
            raise ConfigError(
                f"the endpoint returned vectors of {width} dimensions, not dimensions={wanted} "
                "(some servers, such as llama.cpp, ignore it); leave dimensions= out"
            )
        columns = columns.with_columns(pl.col(job.columns.output).cast(self.vector))
        return columns, reports[0] if reports else None

    def result(self, job: Job) -> pl.Expr:
        return self.fields(job, pl.col(job.columns.output))


# -- the namespace ----------------------------------------------------------------------------


def completion(
    expr: pl.Expr,
    prompt: str | None,
    *,
    model: ModelOption,
    output: Output,
    client: Client | None,
    options: Mapping[str, Any],
    ask: Ask,
    what: str,
    answer: str = "answer",
) -> tuple[pl.Expr, Completions]:
    """The expression asking ``ask`` of every value of ``expr``, and its batch function."""
    made, call = split_options(options)
    if "output" in call:
        raise ConfigError("output takes 'answer' or 'struct' here")
    batches = Completions(
        client_for(client, made),
        prompt,
        model,
        cast(RequestOptions, call),
        ask=ask,
        output=output,
        answer=answer,
        what=what,
    )
    return expr.map_batches(batches, return_dtype=batches.dtype, is_elementwise=True), batches


@pl.api.register_expr_namespace("llm")
class LlmNamespace:
    """Model calls on a column: ``pl.col("text").llm.complete(...)`` and friends.

    Every method takes the keyword options of :func:`llm_ops.llm_complete` (see
    :class:`llm_ops.ExprOptions`), and ``client=`` to run on a :class:`~llm_ops.Client` of
    your own; without it, the expressions with the same client options (``base_url``,
    ``cache``, ``concurrency``, ...) share one client for the life of the process.

    The result keeps the expression's name, as Polars expressions do: name it with
    ``.alias(...)``. Each method returns the answer, null where a row failed or was skipped
    (:func:`llm_ops.last_report` counts them), or, with ``output="struct"``, a struct of
    ``answer``, ``status`` (:data:`llm_ops.STATUSES`) and ``error`` (plus ``raw``,
    ``similar_to``, ``similarity`` and ``model`` where ``llm_complete`` adds those columns).

    Use the plain form where a null answer is all you need to know (a filter, a summary
    column); use ``output="struct"`` where each row must say why it has no answer (a job whose
    failures you look at or retry). In a type-checked module, write
    ``llm(pl.col("text")).complete(...)`` with :func:`llm_ops.polars.llm`: type checkers
    do not see namespaces registered at run time.
    """

    def __init__(self, expr: pl.Expr) -> None:
        self._expr = expr

    def complete(
        self,
        prompt: str | None = None,
        *,
        model: ModelOption,
        output: Output = "answer",
        client: Client | None = None,
        **options: Unpack[ExprOptions],
    ) -> pl.Expr:
        """Ask the model about every value; the answer text (or struct, with ``schema=``).

        Identical prompts are sent once, answers already cached are reused, and a value
        repeated in a later batch of a streaming query is answered by the cache: one request
        per distinct prompt. A row sent here and by :func:`~llm_ops.llm_complete` with the
        same rendered prompt and parameters has the same cache key.

        Parameters
        ----------
        prompt
            A template in which ``{}`` stands for the value, e.g. ``"Summarize: {}"``
            (``{{`` and ``}}`` are literal braces); ``None``: the value is the prompt, as
            with ``pl.format(...)``. On a struct expression (``pl.struct("title", "text")``)
            the template names the fields instead: ``"{title}: {text}"``. A null value (or
            field) is not sent: the row is ``skipped``.
        model
            Model name, or a list of names for a cascade (see :func:`~llm_ops.llm_complete`;
            an ``escalate=`` rule reads the answer as ``pl.col("answer")``).
        output
            ``"answer"``: the answer, null where the row failed or was skipped.
            ``"struct"``: ``{answer, status, error, ...}``, so nothing is hidden.
        client
            A :class:`~llm_ops.Client` to run on, instead of the shared one for these options.
        **options
            As for :func:`~llm_ops.llm_complete`: ``system``, ``base_url``, ``cache``,
            ``max_tokens``, ``temperature``, ``schema``, ``semantic_cache``, ``mode``, ...

        Returns
        -------
        Expr
            ``String`` (a struct of the schema's fields with ``schema=``), or the struct form.

        Examples
        --------
        >>> import polars as pl
        >>> import llm_ops
        >>> from llm_ops.testing import LocalEndpoint
        >>> df = pl.DataFrame({"text": ["Lovely dress", None, "Lovely dress"]})
        >>> with LocalEndpoint() as endpoint:
        ...     out = df.with_columns(
        ...         pl.col("text")
        ...         .llm.complete("Summarize: {}", model="sim", base_url=endpoint.base_url,
        ...                       cache=False)
        ...         .alias("summary"))
        >>> out
        shape: (3, 2)
        ┌──────────────┬─────────────────────────────────┐
        │ text         ┆ summary                         │
        │ ---          ┆ ---                             │
        │ str          ┆ str                             │
        ╞══════════════╪═════════════════════════════════╡
        │ Lovely dress ┆ sim #a9d110f4: Summarize: Love… │
        │ null         ┆ null                            │
        │ Lovely dress ┆ sim #a9d110f4: Summarize: Love… │
        └──────────────┴─────────────────────────────────┘

        The struct form says why a row has no answer:

        >>> with LocalEndpoint() as endpoint:
        ...     out = df.select(
        ...         pl.col("text").llm.complete("Summarize: {}", model="sim", output="struct",
        ...                                     base_url=endpoint.base_url, cache=False)
        ...     ).unnest("text")
        >>> out.select("status", "error")
        shape: (3, 2)
        ┌─────────┬─────────────────────────────────┐
        │ status  ┆ error                           │
        │ ---     ┆ ---                             │
        │ enum    ┆ str                             │
        ╞═════════╪═════════════════════════════════╡
        │ ok      ┆ null                            │
        │ skipped ┆ column 'text' is null; row not… │
        │ ok      ┆ null                            │
        └─────────┴─────────────────────────────────┘
        """
        expr, _ = completion(
            self._expr,
            prompt,
            model=model,
            output=output,
            client=client,
            options=options,
            ask=text(),
            what="complete",
        )
        return expr

    def classify(
        self,
        labels: Sequence[str],
        prompt: str | None = None,
        *,
        model: ModelOption,
        output: Output = "answer",
        client: Client | None = None,
        **options: Unpack[ExprOptions],
    ) -> pl.Expr:
        """Classify every value as one of ``labels``; an ``Enum`` column of them.

        The request's JSON schema allows only these labels (servers that follow schemas, such
        as OpenAI, vLLM and llama.cpp, cannot answer anything else); an answer that is not
        one of them is ``invalid``: null, never coerced to a label.

        Parameters
        ----------
        labels
            The label names, each once.
        prompt
            A template with ``{}`` for the value (or field names, on a struct); by default
            ``"Classify the text as exactly one of these labels: <labels>.\\n\\nText: {}"``.
        model, output, client, **options
            As for :meth:`complete`.

        Examples
        --------
        >>> import polars as pl
        >>> import llm_ops
        >>> from llm_ops.testing import LocalEndpoint
        >>> df = pl.DataFrame({"text": ["Shipping was slow", "Lovely fabric", "Runs small"]})
        >>> with LocalEndpoint() as endpoint:
        ...     out = df.with_columns(
        ...         pl.col("text").llm.classify(["shipping", "product"], model="sim",
        ...                                     base_url=endpoint.base_url, cache=False)
        ...         .alias("topic"))
        >>> out
        shape: (3, 2)
        ┌───────────────────┬──────────┐
        │ text              ┆ topic    │
        │ ---               ┆ ---      │
        │ str               ┆ enum     │
        ╞═══════════════════╪══════════╡
        │ Shipping was slow ┆ shipping │
        │ Lovely fabric     ┆ product  │
        │ Runs small        ┆ product  │
        └───────────────────┴──────────┘
        """
        expr, _ = completion(
            self._expr,
            prompt,
            model=model,
            output=output,
            client=client,
            options=options,
            ask=classification(labels),
            what="classify",
        )
        return expr

    def extract(
        self,
        schema: SchemaOption = None,
        /,
        prompt: str | None = None,
        *,
        model: ModelOption,
        output: Output = "answer",
        client: Client | None = None,
        **options: Unpack[ExprOptions],
    ) -> pl.Expr:
        """Extract the fields of ``schema`` from every value; a ``Struct`` column of them.

        Answers are asked for by the schema and validated as with ``llm_complete(schema=)``;
        one that does not match is ``invalid`` (null here; its raw text in the struct form's
        ``raw``).

        Parameters
        ----------
        schema
            A pydantic model class or a JSON schema dict of an object (positional, or
            ``schema=``).
        prompt
            A template with ``{}`` for the value (or field names, on a struct); by default
            ``"Extract the fields of the JSON schema from the text.\\n\\nText: {}"``.
        model, output, client, **options
            As for :meth:`complete`.

        Examples
        --------
        >>> import polars as pl
        >>> from pydantic import BaseModel
        >>> import llm_ops
        >>> from llm_ops.testing import LocalEndpoint
        >>> class Item(BaseModel):
        ...     product: str
        ...     quantity: int
        >>> df = pl.DataFrame({"text": ["two red scarves", "a blue hat"]})
        >>> with LocalEndpoint() as endpoint:
        ...     out = df.select(
        ...         pl.col("text").llm.extract(Item, model="sim", base_url=endpoint.base_url,
        ...                                    cache=False).struct.unnest())
        >>> out
        shape: (2, 2)
        ┌────────────────────┬──────────┐
        │ product            ┆ quantity │
        │ ---                ┆ ---      │
        │ str                ┆ i64      │
        ╞════════════════════╪══════════╡
        │ Extract the fields ┆ 32       │
        │ Extract the fields ┆ 95       │
        └────────────────────┴──────────┘
        """
        expr, _ = completion(
            self._expr,
            prompt,
            model=model,
            output=output,
            client=client,
            options=options,
            ask=extraction(one_schema(schema, options.pop("schema", None))),
            what="extract",
        )
        return expr

    def filter(
        self,
        prompt: str,
        *,
        model: ModelOption,
        output: Output = "answer",
        client: Client | None = None,
        **options: Unpack[ExprOptions],
    ) -> pl.Expr:
        """Ask a yes/no question of every value; a ``Boolean`` column, for ``df.filter(...)``.

        The answer is asked for as JSON ``{"answer": true|false}``. A row that failed is null,
        which ``df.filter`` drops (:func:`llm_ops.last_report` counts them).

        Polars evaluates every predicate of a ``filter`` on every row, and joins consecutive
        ``filter`` calls into one: ``lf.filter(cheap).filter(pl.col("text").llm.filter(...))``
        asks about the rows ``cheap`` drops too. To ask only about the rows left, filter in
        two steps with the answer as a column in between, as :func:`llm_ops.llm_filter`
        does: ``lf.filter(cheap).with_columns(keep=...llm.filter(...)).filter("keep")``.

        Parameters
        ----------
        prompt
            The question, a template with ``{}`` for the value (or field names, on a struct):
            ``"Is this review about shipping? {}"``.
        model, output, client, **options
            As for :meth:`complete`.

        Examples
        --------
        >>> import polars as pl
        >>> import llm_ops
        >>> from llm_ops.testing import LocalEndpoint
        >>> df = pl.DataFrame({"text": ["Shipping was slow", "Love the colour", "Never arrived"]})
        >>> with LocalEndpoint() as endpoint:
        ...     out = df.filter(pl.col("text").llm.filter(
        ...         "Is this review about shipping? {}", model="sim",
        ...         base_url=endpoint.base_url, cache=False))
        >>> out
        shape: (2, 1)
        ┌───────────────────┐
        │ text              │
        │ ---               │
        │ str               │
        ╞═══════════════════╡
        │ Shipping was slow │
        │ Never arrived     │
        └───────────────────┘
        """
        if not isinstance(prompt, str):
            raise TemplateError(
                "filter needs the question, e.g. .llm.filter('Is this about shipping? {}', ...)"
            )
        expr, _ = completion(
            self._expr,
            prompt,
            model=model,
            output=output,
            client=client,
            options=options,
            ask=verdict(),
            what="filter",
        )
        return expr

    def embed(
        self,
        *,
        model: str,
        dimensions: int | None = None,
        batch_size: int = 256,
        output: Output = "answer",
        client: Client | None = None,
        **options: Unpack[EmbedOptions],
    ) -> pl.Expr:
        """Embed every value; a ``List(Float32)`` column, ``Array(Float32, dimensions)`` with
        ``dimensions``.

        Distinct texts are embedded once, ``batch_size`` to a request, and cached in
        ``llm_embeddings`` with the same keys as :func:`~llm_ops.llm_embed`.

        Parameters
        ----------
        model
            Embedding model name.
        dimensions
            Ask the endpoint for vectors of this size (part of the cache key); the result is
            then a fixed-size ``Array``.
        batch_size
            Inputs per request.
        output, client
            As for :meth:`complete`.
        **options
            As for :func:`~llm_ops.llm_embed`: ``base_url``, ``cache``, ``on_error``, ...

        Examples
        --------
        >>> import polars as pl
        >>> import llm_ops
        >>> from llm_ops.testing import LocalEndpoint
        >>> df = pl.DataFrame({"text": ["red dress", None]})
        >>> with LocalEndpoint() as endpoint:
        ...     out = df.with_columns(
        ...         pl.col("text").llm.embed(model="sim-embed", dimensions=4,
        ...                                  base_url=endpoint.base_url, cache=False)
        ...         .alias("vector"))
        >>> out
        shape: (2, 2)
        ┌───────────┬─────────────────────────────────┐
        │ text      ┆ vector                          │
        │ ---       ┆ ---                             │
        │ str       ┆ array[f32, 4]                   │
        ╞═══════════╪═════════════════════════════════╡
        │ red dress ┆ [0.288675, -0.866025, … -0.288… │
        │ null      ┆ null                            │
        └───────────┴─────────────────────────────────┘
        """
        made, call = split_options(options)
        unknown = set(call) - EmbedOptions.__optional_keys__
        if unknown:
            raise ConfigError(
                f"embed takes no option(s) {', '.join(sorted(unknown))}; see "
                "help(llm_ops.llm_embed)"
            )
        batches = Embeddings(
            client_for(client, made),
            model=model,
            dimensions=dimensions,
            batch_size=batch_size,
            output=output,
            options=cast(EmbedOptions, call),
        )
        return self._expr.map_batches(batches, return_dtype=batches.dtype, is_elementwise=True)
