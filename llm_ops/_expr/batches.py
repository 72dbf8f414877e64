"""The batch functions of the ``llm`` expressions: every batch Polars hands one goes through
its client's pipeline, one batch at a time, and comes back as the result's column."""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import functools
import time
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar, cast

import polars as pl

from .._checks import positive_int
from .._client import Client
from .._failures import failure_reasons, warn_columns
from .._media import Documents, Images
from .._options import (
    CallOptions,
    ClientOptions,
    EmbedOptions,
    Job,
    ModelOption,
    RequestOptions,
    check_job,
    make_job,
    split_options,
)
from .._pipeline.backend import Backend
from .._pipeline.embed import embed_frame
from .._pipeline.join import raise_failed_rows, status_counts
from .._pipeline.run import run_frame
from .._progress import resolve_progress
from .._report import RunReport
from .._spec import EmbeddingSpec
from .._status import FAILED
from .._telemetry import carried, current_context
from ..exceptions import ConfigError, RowsFailedError, TemplateError
from .asks import Ask, Output, shaped, shaped_dtype
from .reports import Reports, in_order, nothing_done, record_unrecorded
from .runtime import client_for, close_runtimes, runtime_of
from .values import VALUE, escaped, templates_for, value_name, with_value

T = TypeVar("T")

OnReport = Callable[[RunReport], None]


def completion(
    expr: pl.Expr,
    ask: Ask,
    prompt: str | None,
    caller: str,
    model: ModelOption,
    output: Output,
    client: Client | None,
    options: Mapping[str, Any],
    answer: str = "answer",
) -> tuple[pl.Expr, Completions]:
    """The expression asking ``ask`` of every value of ``expr``, and its batch function."""
    made, call = split_options(options)
    if "output" in call:
        raise ConfigError(
            "an expression takes no output=: its output is its name (.alias('summary')), and "
            "with_status=True gives the answer with its status and error"
        )
    batches = Completions(
        client,
        made,
        prompt,
        model,
        cast(RequestOptions, call),
        ask=ask,
        output=output,
        answer=answer,
        caller=caller,
    )
    return batches.over(expr), batches


def embedding(
    expr: pl.Expr,
    model: str,
    dimensions: int | None,
    inputs_per_request: int,
    output: Output,
    client: Client | None,
    options: Mapping[str, Any],
) -> pl.Expr:
    """The expression embedding every value of ``expr``."""
    made, call = split_options(options)
    unknown = set(call) - EmbedOptions.__optional_keys__
    if unknown:
        raise ConfigError(
            f"embed takes no option(s) {', '.join(sorted(unknown))}; see help(llm_ops.llm_embed)"
        )
    batches = Embeddings(
        client,
        made,
        model=model,
        dimensions=dimensions,
        inputs_per_request=inputs_per_request,
        output=output,
        options=cast(EmbedOptions, call),
    )
    return batches.over(expr)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, from the symbols this process already has (``find_library``
    would run ``ldconfig``); ``None`` elsewhere: without glibc there are no such arenas."""
    try:
        return cast("Callable[[int], int] | None", getattr(ctypes.CDLL(None), "malloc_trim", None))
    except (OSError, TypeError):  # no dlopen(NULL): Windows
        return None


def release_freed_memory() -> None:
    """Hand the memory a finished batch freed back to the system.

    Each batch's frames are freed by Arrow, Polars and DuckDB on whichever thread made them;
    glibc keeps those pages in per-thread arenas, so a long stream's resident size creeps up
    with the number of batches although nothing is held (measured in benchmarks/streaming.py).
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class BatchRowsFailedError(RowsFailedError):
    """``on_error="raise"`` in an expression: rows of the batch did not get an answer.

    Polars raises a batch function's error again as a new exception of its class, made from
    its message and where in the query it happened, so this one can be made from a message
    alone and keeps the rows, errors and statuses of the one it is made from.
    """

    _raised: ClassVar[dict[str, tuple[list[int], list[str], list[str]]]] = {}

    def __init__(self, *args: Any, cached: bool = True) -> None:
        if len(args) == 3:
            super().__init__(*args, cached=cached)
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


class ExprBatchFunction:
    """The batch function of one expression: every batch Polars hands it goes through its
    client, one batch at a time."""

    ask: Ask  # what the batches ask, and the shape of their answer
    job: Job  # as checked when the expression was made

    def __init__(
        self,
        client: Client | None,
        made: ClientOptions,
        *,
        output: Output,
        options: Mapping[str, Any],
    ):
        # this expression holds the shared client it is given: it is not closed under it
        self.client = client = client_for(client, made, user=self)
        self.runtime = runtime_of(client)
        self.output = output
        self.on_error = options.get("on_error", "null")
        if self.on_error not in ("null", "raise"):
            raise ConfigError(f"on_error must be 'null' or 'raise', got {self.on_error!r}")
        self.reports = Reports(client)
        self._memo: pl.DataFrame | None = None  # without a cache: what earlier batches got
        self.warned = False  # a RowsFailedWarning was given for a batch
        # the span current where the expression is made is its jobs' parent: Polars runs
        # the batches on threads of its own, where the caller's span is not current
        self.parent = current_context()

    def over(self, expr: pl.Expr) -> pl.Expr:
        return expr.map_batches(self, return_dtype=self.dtype, is_elementwise=True)

    @functools.cached_property
    def dtype(self) -> pl.DataType:
        return shaped_dtype(self.output, self.job.columns, self.ask.result_dtype(self.job))

    def __call__(self, values: pl.Series) -> pl.Series:
        if values.is_empty():
            return pl.Series(values.name, [], dtype=self.dtype)
        frame, job = self.prepare(values)
        with self.runtime.lock:
            columns = self.answer(frame, job)
        if self.on_error == "raise" and columns[job.columns.status].is_in(list(FAILED)).any():
            try:
                raise_failed_rows(columns, job.columns, cached=self.client.cache is not None)
            except RowsFailedError as exc:
                raise BatchRowsFailedError(
                    exc.rows, exc.errors, exc.statuses, cached=self.client.cache is not None
                ) from None
        if not self.warned:  # once per expression: the first batch with failed rows speaks
            names = job.columns
            self.warned = bool(columns[names.status].is_in(list(FAILED)).any())
            warn_columns(
                columns,
                names.status,
                names.error,
                f"the {names.error!r} field of with_status=True, or llm_ops.last_report().errors",
            )
        result = shaped(self.output, job.columns, self.ask.result(pl.col(job.columns.output)))
        answered = columns.select(result).to_series().alias(values.name)
        release_freed_memory()
        return answered

    def report(self) -> RunReport:
        """Every batch's report added up (no rows yet: an empty report)."""
        return self.reports.so_far(self.job)

    def prepare(self, values: pl.Series) -> tuple[pl.DataFrame, Job]:
        """The batch as the frame its job reads, and that job."""
        raise NotImplementedError

    def run(self, frame: pl.DataFrame, job: Job) -> tuple[pl.DataFrame, RunReport | None]:
        """The added columns of ``frame``'s rows, and the report (``None`` when the run
        recorded its report itself before it raised)."""
        raise NotImplementedError

    def on_backend(
        self, work: Callable[[Backend, OnReport], Coroutine[Any, Any, T]]
    ) -> tuple[T, list[RunReport]]:
        """``work`` on the client's backend, on the runtime's loop, and the reports it gave
        ``on_report``; a stopped run's reports still count before it raises."""
        reports: list[RunReport] = []

        async def on_loop() -> T:
            with carried(self.parent):
                return await work(await self.runtime.backend(), reports.append)

        try:
            return self.runtime.run(on_loop()), reports
        except BaseException:
            for report in reports:
                self.reports.include_batch(report)
            raise

    def answer(self, frame: pl.DataFrame, job: Job) -> pl.DataFrame:
        if self.client.cache is not None:  # the cache answers what earlier batches got
            columns, ran = self.run(frame, job)
            if ran is not None:
                self.reports.include_batch(ran)
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
        self.reports.include_batch(
            dataclasses.replace(
                report,
                rows=frame.height,
                statuses=in_order(status_counts(columns, job.columns)),
                errors=failure_reasons(columns, job.columns.status, job.columns.error),
            )
        )
        return columns


class Completions(ExprBatchFunction):
    """``.llm.complete`` and the expressions made of it (classify, extract, filter)."""

    def __init__(
        self,
        client: Client | None,
        made: ClientOptions,
        prompt: str | None,
        model: ModelOption,
        options: RequestOptions,
        *,
        ask: Ask,
        output: Output,
        answer: str = "answer",
        caller: str,
    ):
        super().__init__(client, made, output=output, options=options)
        self.ask = ask
        self.model = model
        self.caller = caller
        self.prompt = prompt if prompt is not None else (ask.prompt or "{}")
        self.system = options.get("system")
        schema = options.get("schema")
        if ask.schema is not None and schema is not None:
            raise ConfigError(f"{caller} asks for its own schema; drop schema=")
        self.options: CallOptions = {
            **options,
            "output": answer,
            "schema": ask.schema if ask.schema is not None else schema,
            "on_error": "null",  # raised per batch, with the rows of the batch
        }
        self._jobs: dict[str | None, Job] = {}
        # Checked now, before anything is sent: options, templates, schema, prices.
        self.job = self.job_for(VALUE, value=None)
        self.media = self.job.spec.media  # the columns images= and documents= name

    def job_for(self, name: str, *, value: bool | None) -> Job:
        """The job for a batch whose value is the column ``name`` (``value=True``), or whose
        struct's fields are the columns (``value=False``); ``None``: not known yet."""
        prompt, system = templates_for(
            self.prompt, self.system, name, value=value, caller=self.caller
        )
        return make_job(
            prompt=prompt,
            model=self.model,
            endpoint=self.client.endpoint.identity,
            dialect=self.client.endpoint.dialect,
            cached=self.client.cache is not None,
            options={**self.options, "system": system},
        )

    def media_job(self, name: str, *, documents: bool) -> Job:
        """The job for a batch whose value is an image (a ``Binary`` column, or one that
        ``images=`` names) or a PDF (one that ``documents=`` names): sent after the prompt's
        text, which then cannot hold the value itself."""
        if self.ask.prompt is None and with_value(self.prompt, name, argument="prompt")[1]:
            raise TemplateError(
                f"{self.caller}: the value is sent as an image or PDF, so the prompt asks "
                f"about it without {{}}, e.g. pl.col({name!r}).llm.{self.caller}('What is on "
                "this label?')"
            )
        rest = cast(
            CallOptions,
            {k: v for k, v in self.options.items() if k not in ("images", "documents")},
        )
        if documents:
            given = self.options.get("documents")
            rest["documents"] = (
                dataclasses.replace(given, columns=(name,))
                if isinstance(given, Documents)
                else Documents(name)
            )
        else:
            shown = self.options.get("images")
            rest["images"] = (
                dataclasses.replace(shown, columns=(name,))
                if isinstance(shown, Images)
                else Images(name)
            )
        return make_job(
            prompt=escaped(self.prompt),
            model=self.model,
            endpoint=self.client.endpoint.identity,
            dialect=self.client.endpoint.dialect,
            cached=self.client.cache is not None,
            options=rest,
        )

    def prepare(self, values: pl.Series) -> tuple[pl.DataFrame, Job]:
        reserved = self.job.columns.names
        is_struct = isinstance(values.dtype, pl.Struct)
        media = self.media
        documents = not is_struct and media is not None and values.name in media.document_columns
        image = not is_struct and (
            values.dtype == pl.Binary or (media is not None and values.name in media.image_columns)
        )
        if image or documents:
            name = value_name(values.name, reserved)
            frame = values.alias(name).to_frame()
            job = self._jobs.get(f"media:{name}")
            if job is None:
                job = self._jobs[f"media:{name}"] = self.media_job(name, documents=documents)
                check_job(job, frame.schema)
            return frame, job
        if isinstance(values.dtype, pl.Struct):
            frame, key, name = values.struct.unnest(), None, ""
            taken = [field for field in frame.columns if field in reserved]
            if taken:
                raise ConfigError(
                    f"{self.caller}: the struct's field {taken[0]!r} is a name the answer's "
                    f"columns use ({', '.join(reserved)}); rename it inside the struct, e.g. "
                    f"pl.struct(pl.col({taken[0]!r}).alias('{taken[0]}_'), ...)"
                )
        else:
            name = value_name(values.name, reserved)
            frame, key = values.alias(name).to_frame(), name
        job = self._jobs.get(key)
        if job is None:
            job = self.job_for(name or VALUE, value=key is not None)
            check_job(job, frame.schema)
            self._jobs[key] = job
        return frame, job

    def run(self, frame: pl.DataFrame, job: Job) -> tuple[pl.DataFrame, RunReport | None]:
        (columns, report), _ = self.on_backend(
            lambda backend, on_report: run_frame(
                frame, job, backend, record=False, on_report=on_report
            )
        )
        return columns, report


class Embeddings(ExprBatchFunction):
    """``.llm.embed``."""

    def __init__(
        self,
        client: Client | None,
        made: ClientOptions,
        *,
        model: str,
        dimensions: int | None,
        inputs_per_request: int,
        output: Output,
        options: EmbedOptions,
    ):
        super().__init__(client, made, output=output, options=options)
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(
                f"model must be a model name such as 'text-embedding-3-small', got {model!r}"
            )
        if dimensions is not None:
            positive_int("dimensions", dimensions)
        self.inputs_per_request = positive_int("inputs_per_request", inputs_per_request)
        self.progress = resolve_progress(options.get("progress"))
        self.spec = EmbeddingSpec(self.client.endpoint.identity, model, dimensions)
        self.vector: pl.DataType = (
            pl.List(pl.Float32) if dimensions is None else pl.Array(pl.Float32, dimensions)
        )
        self.ask = Ask(dtype=self.vector)
        self.job = make_job(
            prompt="{value}",  # an embedding's "job" only names its columns
            model=model,
            endpoint=self.client.endpoint.identity,
            dialect=self.client.endpoint.dialect,
            cached=self.client.cache is not None,
            options={"output": "answer", "progress": False},
        )

    def prepare(self, values: pl.Series) -> tuple[pl.DataFrame, Job]:
        if values.dtype not in (pl.String, pl.Null):
            raise ConfigError(
                f"embed takes a string expression, got {values.dtype}; cast it first, e.g. "
                ".cast(pl.String), or pl.format(...) several columns into one"
            )
        name = value_name(values.name, self.job.columns.names)
        return values.alias(name).to_frame(), self.job

    def run(self, frame: pl.DataFrame, job: Job) -> tuple[pl.DataFrame, RunReport | None]:
        columns, reports = self.on_backend(
            lambda backend, on_report: embed_frame(
                frame,
                frame.columns[0],
                self.spec,
                backend,
                columns=job.columns,
                inputs_per_request=self.inputs_per_request,
                on_error="null",
                progress=self.progress,
                on_report=on_report,
            )
        )
        vectors = columns[job.columns.output]
        width = getattr(vectors.dtype, "size", None)
        wanted = self.spec.dimensions
        if wanted is not None and width not in (wanted, 0) and vectors.drop_nulls().len():
            raise ConfigError(
                f"the endpoint returned vectors of {width} dimensions, not dimensions={wanted} "
                "(some servers, such as llama.cpp, ignore it); leave dimensions= out"
            )
        # one type in every batch, so what earlier batches got (without a cache) stacks
        columns = columns.with_columns(pl.col(job.columns.output).cast(self.vector))
        return columns, reports[0] if reports else None


@atexit.register
def _at_exit() -> None:
    record_unrecorded()  # first: a report is recorded in the cache, not on a runtime's loop
    close_runtimes()
