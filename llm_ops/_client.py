"""``Client``: one endpoint, its cache and its limits, for as long as you need them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import hashlib
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any, ClassVar, Generic, Literal, TypeVar, Unpack, cast, overload

import polars as pl
import pyarrow as pa

from ._cache import cache_of
from ._config import Limits, RateLimit, Retries, endpoint_of
from ._engine.dispatcher import DRAIN_SECONDS
from ._engine.engine import Engine
from ._failures import warn_columns, warn_report
from ._frames import Frame, PolarsFrame, same_kind, schema_of, to_polars
from ._limits import LeasedLimiter, QuotaLink
from ._options import (
    AskOptions,
    CallOptions,
    ClientOptions,
    Columns,
    Job,
    ModelOption,
    Options,
    RequestOptions,
    ResultOptions,
    SchemaOption,
    check_embedding,
    check_job,
    make_job,
    split_options,
    typed,
    unknown_options,
)
from ._pipeline import batch_admin
from ._pipeline.backend import Backend
from ._pipeline.batch import BatchPart, BatchRunner
from ._pipeline.embed import embed_frame
from ._pipeline.estimate import Estimate, estimate_frame
from ._pipeline.run import run_frame
from ._progress import resolve_progress
from ._report import RunReport, latest, remember_latest
from ._signals import graceful_sigterm, stopping_gently
from ._spec import EmbeddingSpec
from .exceptions import ConfigError

T = TypeVar("T")

SemanticOperator = Callable[..., Any]
_semantic_operators: dict[str, SemanticOperator] = {}


def provide_semantic_operators(**operators: SemanticOperator) -> None:
    """Give :class:`Client` the frame operators its :meth:`~Client.filter`,
    :meth:`~Client.classify` and :meth:`~Client.extract` run: ``llm_filter`` and the others
    live a layer above the client (on the ``llm`` expressions), which ``import llm_ops``
    loads, and provides them from there."""
    _semantic_operators.update(operators)


def given_client(client: object, made: Mapping[str, object]) -> Client:
    """``client`` as an operator's ``client=`` gives it: a :class:`Client`, given without the
    options a client is made with (``made``), which it already has."""
    if not isinstance(client, Client):
        raise ConfigError(f"client must be an llm_ops.Client, got {type(client).__name__}")
    if made:
        raise ConfigError(
            f"pass either client= or the client's options ({', '.join(sorted(made))}), "
            "not both: a Client keeps the options it was made with"
        )
    return client


class Client:
    """A long-lived client of one OpenAI-compatible endpoint, with its cache and limits.

    Like ``httpx.Client``: made once, it holds one connection pool, one rate limiter and one
    adaptive-concurrency state for its whole life, so every job it runs (a DataFrame, each
    chunk of a table, each vector of a SQL query) shares what was learned about the endpoint:
    a ``Retry-After``, limits from its rate-limit headers, a lowered concurrency. Its work
    runs on an event loop of its own, in a background thread, so the same client serves sync
    and async callers; the ``llm`` expressions given ``client=`` run on the thread Polars calls
    them on, and send their requests through the same engine, on this loop. Use it as a
    context manager, or call :meth:`close`.

    Every operator is a method of it (:meth:`complete`, :meth:`embed`, :meth:`filter`,
    :meth:`classify`, :meth:`extract`, :meth:`estimate`), and every operator function takes
    ``client=`` to run on it: both are one way to run a job. :meth:`last_report` is the
    report of its last job in the calling thread or asyncio task.

    Parameters
    ----------
    **options
        ``endpoint``, ``cache``, ``concurrency``, ``retries``, ``rate_limit``: as for
        :func:`llm_ops.llm_complete` (see :class:`llm_ops.ClientOptions`). Everything else
        (``schema=`` and ``repair=``, ``sampling=``, ``send_order=``, ...) is said per call,
        so one client serves calls that differ in it.
    quota
        A rate budget shared beyond this process, which the client's rate limiter leases
        from instead of keeping a ``rate_limit`` of its own: what a Ray worker's client is
        made with (see :mod:`llm_ops.ray`); ``None``, the default: the client's own.

    Examples
    --------
    >>> import polars as pl
    >>> from llm_ops import Client
    >>> from llm_ops.testing import LocalEndpoint
    >>> df = pl.DataFrame({"text": ["Lovely dress", "Runs small"]})
    >>> with LocalEndpoint() as endpoint, Client(endpoint=endpoint.base_url, cache=False) as client:
    ...     first = client.complete(df, prompt="Summarize: {text}", model="sim")
    ...     second = client.complete(df, prompt="Title: {text}", model="sim", output="title")
    >>> second.columns
    ['text', 'title', 'title_status', 'title_error']
    """

    drain_seconds: ClassVar[float] = DRAIN_SECONDS
    """How long, at most, a stopped job (SIGTERM, Ctrl-C, a cancelled task) lets what is in
    flight be answered before it drops it."""

    def __init__(
        self,
        *,
        quota: QuotaLink | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        unknown = set(options) - ClientOptions.__optional_keys__
        if unknown - CallOptions.__optional_keys__:
            raise unknown_options(unknown - CallOptions.__optional_keys__)
        if unknown:
            raise ConfigError(
                f"Client takes no option(s) {', '.join(sorted(unknown))}; pass "
                "them to complete() instead"
            )
        endpoint = endpoint_of(options.get("endpoint"))
        self.connection = endpoint.connection
        self.endpoint = endpoint.resolve()
        self.options: ClientOptions = ClientOptions(**{**options, "endpoint": endpoint})
        """The options the client was made with, its endpoint an :class:`~llm_ops.Endpoint`
        (a cluster's workers are made with them)."""
        self.limits = Limits(
            options.get("concurrency"),
            typed(options, "retries", Retries, "Retries(max_attempts=3)") or Retries(),
            typed(options, "rate_limit", RateLimit, "RateLimit(rpm=500)") or RateLimit(),
            endpoint.max_response_bytes,
        )
        self.cache = cache_of(options.get("cache"))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._engine: Engine | None = None
        self._starting = threading.Lock()
        # A rate budget shared beyond this process (a cluster's quota: see llm_ops.ray), which
        # the engine's limiter leases from; None: the engine's own budget.
        self.quota = quota

    def worker_options(self) -> ClientOptions:
        """What a worker's client is made with: this client's options with the endpoint as
        resolved here (a worker may not have this process's environment), and no cache of its
        own (a worker writes its answers where its job says)."""
        resolved = self.endpoint
        endpoint = replace(
            endpoint_of(self.options.get("endpoint")),
            base_url=resolved.url_with_query,
            api_key=resolved.api_key,
        )
        return {**self.options, "endpoint": endpoint, "cache": False}

    def __repr__(self) -> str:
        cache = None if self.cache is None else str(self.cache.path)
        return (
            f"Client(endpoint={self.endpoint.identity!r}, cache={cache!r}, "
            f"concurrency={self.limits.concurrency})"
        )

    # -- completions --------------------------------------------------------------------------

    @overload
    def complete(
        self,
        df: PolarsFrame,
        /,
        prompt: str,
        *,
        model: ModelOption,
        return_report: Literal[False] = ...,
        **options: Unpack[CallOptions],
    ) -> PolarsFrame: ...
    @overload
    def complete(
        self,
        df: PolarsFrame,
        /,
        prompt: str,
        *,
        model: ModelOption,
        return_report: Literal[True],
        **options: Unpack[CallOptions],
    ) -> tuple[PolarsFrame, RunReport]: ...
    @overload
    def complete(
        self,
        df: pa.Table,
        /,
        prompt: str,
        *,
        model: ModelOption,
        return_report: Literal[False] = ...,
        **options: Unpack[CallOptions],
    ) -> pa.Table: ...
    @overload
    def complete(
        self,
        df: pa.Table,
        /,
        prompt: str,
        *,
        model: ModelOption,
        return_report: Literal[True],
        **options: Unpack[CallOptions],
    ) -> tuple[pa.Table, RunReport]: ...
    def complete(
        self,
        df: Frame,
        /,
        prompt: str,
        *,
        model: ModelOption,
        return_report: bool = False,
        **options: Unpack[CallOptions],
    ) -> Frame | tuple[Frame, RunReport]:
        """:func:`llm_ops.llm_complete` on this client (same arguments but the client's)."""
        return self._complete_any(df, prompt, model, return_report, options)

    def _complete_any(
        self,
        df: Frame,
        prompt: str,
        model: ModelOption,
        return_report: bool,
        options: CallOptions,
        *,
        own: bool = False,
    ) -> Frame | tuple[Frame, RunReport]:
        """:meth:`complete`, whichever ``return_report`` (for the operators that pass theirs
        on); ``own``: the caller made this client for the call (see :meth:`_complete_later`)."""
        if isinstance(df, pl.LazyFrame):
            return self._complete_later(df, prompt, model, return_report, options, own=own)
        result, report = self.run(self._complete(df, prompt, model, options))
        self._finished(report, options)
        return (result, report) if return_report else result

    @overload
    async def complete_async(
        self,
        df: PolarsFrame,
        /,
        prompt: str,
        *,
        model: ModelOption,
        return_report: Literal[False] = ...,
        **options: Unpack[CallOptions],
    ) -> PolarsFrame: ...
    @overload
    async def complete_async(
        self,
        df: PolarsFrame,
        /,
        prompt: str,
        *,
        model: ModelOption,
        return_report: Literal[True],
        **options: Unpack[CallOptions],
    ) -> tuple[PolarsFrame, RunReport]: ...
    @overload
    async def complete_async(
        self,
        df: pa.Table,
        /,
        prompt: str,
        *,
        model: ModelOption,
        return_report: Literal[False] = ...,
        **options: Unpack[CallOptions],
    ) -> pa.Table: ...
    @overload
    async def complete_async(
        self,
        df: pa.Table,
        /,
        prompt: str,
        *,
        model: ModelOption,
        return_report: Literal[True],
        **options: Unpack[CallOptions],
    ) -> tuple[pa.Table, RunReport]: ...
    async def complete_async(
        self,
        df: Frame,
        /,
        prompt: str,
        *,
        model: ModelOption,
        return_report: bool = False,
        **options: Unpack[CallOptions],
    ) -> Frame | tuple[Frame, RunReport]:
        """:meth:`complete` for code already running in an event loop."""
        return await self._complete_any_async(df, prompt, model, return_report, options)

    async def _complete_any_async(
        self,
        df: Frame,
        prompt: str,
        model: ModelOption,
        return_report: bool,
        options: CallOptions,
        *,
        own: bool = False,
    ) -> Frame | tuple[Frame, RunReport]:
        """:meth:`complete_async`, whichever ``return_report``."""
        if isinstance(df, pl.LazyFrame):
            return self._complete_later(df, prompt, model, return_report, options, own=own)
        result, report = await self.run_async(self._complete(df, prompt, model, options))
        self._finished(report, options)
        return (result, report) if return_report else result

    def _finished(self, report: RunReport, options: CallOptions) -> None:
        """What a finished completion job leaves: its report, the last one of the caller's
        thread or task (here, not on the client's loop, so each caller sees its own), and the
        warning of its failed rows."""
        remember_latest(lambda: report, self)
        warn_failed_rows(report, options)

    def last_report(self) -> RunReport | None:
        """The report of the job that ran last on this client in this thread or asyncio task
        (as :func:`llm_ops.last_report`, but of this client's jobs only); ``None``: none yet."""
        return latest(self)

    def _complete_later(
        self,
        df: pl.LazyFrame,
        prompt: str,
        model: ModelOption,
        return_report: bool,
        options: CallOptions,
        *,
        own: bool = False,
    ) -> pl.LazyFrame:
        """:meth:`complete` of a LazyFrame: checked against its schema now, sent on this
        client when it is collected (its report is then :func:`llm_ops.last_report`); with
        ``own``, on a client made like this one for each collect, as a call that made this
        client for itself has closed it by then."""
        job = self._job(prompt, model, options, columns=df.collect_schema())

        def send(frame: pl.DataFrame) -> tuple[pl.DataFrame, RunReport]:
            if not own:
                return self.run(self._complete(frame, prompt, model, options))
            with Client(**self.options) as client:
                return client.run(client._complete(frame, prompt, model, options))

        return complete_later(
            df, job, return_report, options, send=send, client=None if own else self
        )

    async def _complete(
        self, df: Frame, prompt: str, model: ModelOption, options: CallOptions
    ) -> tuple[Frame, RunReport]:
        job = self._job(prompt, model, options, columns=schema_of(df))
        frame = to_polars(df)
        backend = await self.prepare(models=job.endpoint_models)
        columns, report = await run_frame(frame, job, backend)
        return same_kind(df, frame.hstack(columns.get_columns())), report

    # -- embeddings ---------------------------------------------------------------------------

    def embed(
        self,
        df: Frame,
        /,
        column: str,
        *,
        model: str,
        output: str = "embedding",
        dimensions: int | None = None,
        inputs_per_request: int = 256,
        **options: Unpack[ResultOptions],
    ) -> Frame:
        """:func:`llm_ops.llm_embed` on this client (same arguments but the client's)."""
        on_error = options.get("on_error", "null")
        columns = check_embedding(
            schema_of(df),
            column=column,
            model=model,
            output=output,
            dimensions=dimensions,
            inputs_per_request=inputs_per_request,
            on_error=on_error,
        )
        if isinstance(df, pl.LazyFrame):

            def send(frame: pl.DataFrame) -> pl.DataFrame:
                embedded: pl.DataFrame = self.embed(
                    frame,
                    column,
                    model=model,
                    output=output,
                    dimensions=dimensions,
                    inputs_per_request=inputs_per_request,
                    **options,
                )
                return embedded

            lazy: Frame = embed_later(df, columns, dimensions, send)
            return lazy
        spec = EmbeddingSpec(self.endpoint.identity, _model(model), dimensions)
        frame = to_polars(df)

        async def run() -> pl.DataFrame:
            backend = await self.prepare()
            return await embed_frame(
                frame,
                column,
                spec,
                backend,
                columns=columns,
                inputs_per_request=inputs_per_request,
                on_error=on_error,
                progress=resolve_progress(options.get("progress")),
            )

        added = self.run(run())
        warn_columns(added, columns.status, columns.error, f"the {columns.error!r} column")
        result: Frame = same_kind(df, frame.hstack(added.get_columns()))
        return result

    # -- semantic operators -----------------------------------------------------------------

    @overload
    def filter(
        self,
        df: Frame,
        /,
        prompt: str,
        *,
        model: ModelOption,
        return_report: Literal[False] = ...,
        **options: Unpack[RequestOptions],
    ) -> Frame: ...
    @overload
    def filter(
        self,
        df: Frame,
        /,
        prompt: str,
        *,
        model: ModelOption,
        return_report: Literal[True],
        **options: Unpack[RequestOptions],
    ) -> tuple[Frame, RunReport]: ...
    def filter(
        self,
        df: Frame,
        /,
        prompt: str,
        *,
        model: ModelOption,
        return_report: bool = False,
        **options: Unpack[RequestOptions],
    ) -> Frame | tuple[Frame, RunReport]:
        """:func:`llm_ops.llm_filter` on this client: keep the rows for which the model
        answers yes to ``prompt``.

        Parameters
        ----------
        df
            A Polars DataFrame or LazyFrame, or a pyarrow Table; the result is of the same kind.
        prompt
            A yes/no question as a template over the columns: ``"Is {text} about shipping?"``.
        model
            Model name, or a cascade.
        return_report
            Return ``(frame, RunReport)``; not for a LazyFrame (see :meth:`last_report`).
        **options
            As for :func:`llm_ops.llm_filter`, but the client's own (``endpoint``, ``cache``,
            ...), which it was made with.

        Examples
        --------
        >>> import polars as pl
        >>> from llm_ops import Client
        >>> from llm_ops.testing import LocalEndpoint
        >>> reviews = pl.DataFrame({"text": ["Shipping was slow", "Love the colour",
        ...                                  "Never arrived"]})
        >>> with LocalEndpoint() as endpoint, Client(endpoint=endpoint.base_url,
        ...                                          cache=False) as client:
        ...     late = client.filter(reviews, "Is this review about shipping? {text}",
        ...                          model="sim")
        >>> late["text"].to_list()
        ['Shipping was slow', 'Never arrived']
        """
        return cast(
            "Frame | tuple[Frame, RunReport]",
            _semantic_operators["filter"](
                df, prompt, model=model, return_report=return_report, client=self, **options
            ),
        )

    @overload
    def classify(
        self,
        df: Frame,
        /,
        column: str,
        labels: Sequence[str],
        *,
        model: ModelOption,
        prompt: str | None = None,
        output: str = "label",
        return_report: Literal[False] = ...,
        **options: Unpack[RequestOptions],
    ) -> Frame: ...
    @overload
    def classify(
        self,
        df: Frame,
        /,
        column: str,
        labels: Sequence[str],
        *,
        model: ModelOption,
        prompt: str | None = None,
        output: str = "label",
        return_report: Literal[True],
        **options: Unpack[RequestOptions],
    ) -> tuple[Frame, RunReport]: ...
    def classify(
        self,
        df: Frame,
        /,
        column: str,
        labels: Sequence[str],
        *,
        model: ModelOption,
        prompt: str | None = None,
        output: str = "label",
        return_report: bool = False,
        **options: Unpack[RequestOptions],
    ) -> Frame | tuple[Frame, RunReport]:
        """:func:`llm_ops.llm_classify` on this client: classify ``column`` as one of
        ``labels``, an ``Enum`` column with status and error.

        Parameters
        ----------
        df
            A Polars DataFrame or LazyFrame, or a pyarrow Table; the result is of the same kind.
        column
            The text to classify.
        labels
            The label names, each once.
        model
            Model name, or a cascade.
        prompt
            A template over the columns; by default one naming the labels.
        output
            Name of the label column; the others are named after it.
        return_report, **options
            As for :meth:`filter`.

        Examples
        --------
        >>> import polars as pl
        >>> from llm_ops import Client
        >>> from llm_ops.testing import LocalEndpoint
        >>> reviews = pl.DataFrame({"text": ["Shipping was slow", "Lovely fabric"]})
        >>> with LocalEndpoint() as endpoint, Client(endpoint=endpoint.base_url,
        ...                                          cache=False) as client:
        ...     topics = client.classify(reviews, "text", ["shipping", "product"], model="sim")
        >>> topics["label"].to_list()
        ['shipping', 'product']
        """
        return cast(
            "Frame | tuple[Frame, RunReport]",
            _semantic_operators["classify"](
                df,
                column,
                labels,
                model=model,
                prompt=prompt,
                output=output,
                return_report=return_report,
                client=self,
                **options,
            ),
        )

    @overload
    def extract(
        self,
        df: Frame,
        /,
        column: str,
        schema: SchemaOption,
        *,
        model: ModelOption,
        prompt: str | None = None,
        output: str = "extracted",
        return_report: Literal[False] = ...,
        **options: Unpack[AskOptions],
    ) -> Frame: ...
    @overload
    def extract(
        self,
        df: Frame,
        /,
        column: str,
        schema: SchemaOption,
        *,
        model: ModelOption,
        prompt: str | None = None,
        output: str = "extracted",
        return_report: Literal[True],
        **options: Unpack[AskOptions],
    ) -> tuple[Frame, RunReport]: ...
    def extract(
        self,
        df: Frame,
        /,
        column: str,
        schema: SchemaOption,
        *,
        model: ModelOption,
        prompt: str | None = None,
        output: str = "extracted",
        return_report: bool = False,
        **options: Unpack[AskOptions],
    ) -> Frame | tuple[Frame, RunReport]:
        """:func:`llm_ops.llm_extract` on this client: extract the fields of ``schema`` from
        ``column``, a ``Struct`` column with status and error.

        Parameters
        ----------
        df
            A Polars DataFrame or LazyFrame, or a pyarrow Table; the result is of the same kind.
        column
            The text to extract from.
        schema
            A pydantic model class or a JSON schema dict of an object.
        model
            Model name, or a cascade.
        prompt
            A template over the columns; by default one asking for the schema's fields.
        output
            Name of the struct column; the others are named after it.
        return_report, **options
            As for :meth:`filter`.

        Examples
        --------
        >>> import polars as pl
        >>> from pydantic import BaseModel
        >>> from llm_ops import Client
        >>> from llm_ops.testing import LocalEndpoint
        >>> class Order(BaseModel):
        ...     item: str
        ...     quantity: int
        >>> notes = pl.DataFrame({"text": ["two red scarves"]})
        >>> with LocalEndpoint() as endpoint, Client(endpoint=endpoint.base_url,
        ...                                          cache=False) as client:
        ...     orders = client.extract(notes, "text", Order, model="sim")
        >>> orders["extracted_status"].to_list()
        ['ok']
        """
        return cast(
            "Frame | tuple[Frame, RunReport]",
            _semantic_operators["extract"](
                df,
                column,
                schema,
                model=model,
                prompt=prompt,
                output=output,
                return_report=return_report,
                client=self,
                **options,
            ),
        )

    def _job(
        self,
        prompt: str,
        model: ModelOption,
        options: CallOptions,
        *,
        columns: Mapping[str, pl.DataType],
    ) -> Job:
        """The job of a call on this client, checked against the input's ``columns``: settings
        only, so a job never carries the data it runs over."""
        job = make_job(
            prompt=prompt,
            model=model,
            endpoint=self.endpoint.identity,
            dialect=self.endpoint.dialect,
            cached=self.cache is not None,
            options=options,
        )
        check_job(job, columns)
        return job

    # -- estimates ----------------------------------------------------------------------------

    def estimate(
        self, df: Any, /, prompt: str, *, model: ModelOption, **options: Unpack[CallOptions]
    ) -> Estimate:
        """:func:`llm_ops.estimate` against this client's endpoint and cache; nothing is sent."""
        job = self._job(prompt, model, options, columns=schema_of(df))
        return estimate_frame(to_polars(df), job, self.cache)

    # -- provider batches -------------------------------------------------------------------

    def submit(
        self, df: Frame, /, *, prompt: str, model: ModelOption, **options: Unpack[CallOptions]
    ) -> list[BatchPart]:
        """Submit a job's distinct uncached requests as provider batches and return at once,
        without waiting for them (``batch=True`` is implied).

        The batches are recorded in the cache. Get the rows' answers later with
        :meth:`complete` and the same arguments: it finds these batches, waits for them and
        collects their answers instead of submitting anything again; or collect every
        recorded batch into the cache with :meth:`collect_batches` (``llm-ops batches
        collect``).
        """
        batch = options.get("batch") or True
        job = self._job(prompt, model, {**options, "batch": batch}, columns=schema_of(df))
        frame = to_polars(df)
        return self.run(self._on_backend(lambda backend: batch_admin.submit(frame, job, backend)))

    def batches(self, *, job_id: str | None = None) -> list[BatchPart]:
        """The batches recorded in the cache (of one submission, or all) as last seen; see
        :meth:`refresh_batches` for the provider's current counts."""
        return batch_admin.recorded(self.cache, job_id=job_id)

    def refresh_batches(self, *, job_id: str | None = None) -> list[BatchPart]:
        """:meth:`batches`, with each live batch's state and counts asked of the provider."""
        return self._each_batch_part(job_id, BatchRunner.refresh)

    def collect_batches(self, *, job_id: str | None = None, poll_seconds: float = 5.0) -> int:
        """Wait for the recorded batches not yet collected (of one submission, or all) and
        stream their answers into the cache; returns how many requests were collected.
        ``poll_seconds``: the first wait between polls (it grows to a minute), as
        :class:`~llm_ops.BatchMode`'s."""
        parts = [part for part in self.batches(job_id=job_id) if part.state != "collected"]
        return self.run(
            self._on_backend(
                lambda backend: batch_admin.collect(parts, backend, poll_seconds=poll_seconds)
            )
        )

    def cancel_batches(self, *, job_id: str) -> list[BatchPart]:
        """Cancel a submission's live batches; collect them afterwards to keep what they
        answered."""
        return self._each_batch_part(job_id, BatchRunner.cancel)

    def _each_batch_part(
        self, job_id: str | None, action: batch_admin.PartAction
    ) -> list[BatchPart]:
        """Ask the provider to ``action`` each recorded batch part; returns the parts."""
        parts = self.batches(job_id=job_id)
        endpoint = self.endpoint.identity
        self.run(
            self._on_backend(lambda backend: batch_admin.each(parts, endpoint, backend, action))
        )
        return parts

    async def _on_backend(self, work: Callable[[Backend], Awaitable[T]]) -> T:
        """``work`` on what :meth:`prepare` gives."""
        return await work(await self.prepare())

    # -- the client's event loop --------------------------------------------------------------

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._starting:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="llm-ops-client", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    async def prepare(self, *, models: Sequence[str] = ()) -> Backend:
        """What every job of this client runs on: the engine (made once, on this client's
        loop: its connection pool, rate limiter and adaptive concurrency) and the cache, made
        ready to use before anything is paid for, with ``models`` checked against the models
        the endpoint lists (:class:`~llm_ops.ConfigError` for one it lacks).

        Tables, SQL functions and cluster workers drive the pipeline through it; run it on
        this client's loop (:meth:`run`, :meth:`run_async`)."""
        # the cache's file work (DuckDB, off the GIL) overlaps the engine's making and the
        # round trip to /models
        loop = asyncio.get_running_loop()
        prepared = None if self.cache is None else loop.run_in_executor(None, self.cache.prepare)
        return Backend(await self._ready_engine(models, prepared), self.cache)

    async def lend_engine(self) -> Engine:
        """This client's engine (the one :meth:`prepare` gives), for a job running on an
        event loop of its own: the ``llm`` expressions, on the thread Polars calls them on.
        The engine stays on this client's loop; such a job reaches it through
        :meth:`Engine.hosted <llm_ops._engine.engine.Engine.hosted>`, which the dispatch
        does for every attempt, so both kinds of job share one connection pool, one rate
        limiter and one adaptive concurrency. Make the cache ready first (the job's thread
        does it in place)."""
        return await self.run_async(self._ready_engine(()))

    async def _ready_engine(
        self, models: Sequence[str], prepared: Awaitable[None] | None = None
    ) -> Engine:
        """The engine, made on this client's loop once, with ``models`` checked; a fresh
        one resumes the concurrency the cache learned (once ``prepared``, the cache's
        making ready, is done)."""
        fresh = self._engine is None
        try:
            if self._engine is None:
                self._engine = self._new_engine()
            engine = self._engine
            if models:
                await engine.check_models(models)
        finally:
            if prepared is not None:
                await prepared
        if fresh and self.cache is not None and self.limits.concurrency is None:
            learned = await asyncio.to_thread(
                self.cache.learned_concurrency, self.endpoint.identity
            )
            if learned is not None:
                engine.concurrency.resume(learned)
        return engine

    def _new_engine(self) -> Engine:
        """The engine of this client's endpoint, limits and quota, on the running loop."""
        limiter = None
        if self.quota is not None:
            limiter = LeasedLimiter(self.quota, rpm=self.limits.rpm, tpm=self.limits.tpm)
        return Engine(self.endpoint, self.limits, limiter, self.connection)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on this client's loop and wait for it, from sync code (a
        notebook's running loop included). Ctrl-C stops the job as SIGTERM does (what is in
        flight is answered and kept, for a few seconds at most) and waits for that; a second
        Ctrl-C does not wait. SIGTERM drains it (see :mod:`llm_ops._signals`)."""
        job = _Running(coroutine, self._start())
        with graceful_sigterm():
            try:
                while True:  # wake up now and then: a signal is only handled between waits
                    with contextlib.suppress(concurrent.futures.TimeoutError):
                        return job.result.result(timeout=0.1)
            except KeyboardInterrupt:
                job.cancel()
                while not job.ended.done():
                    concurrent.futures.wait((job.ended,), timeout=0.1)
                raise

    async def run_async(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on this client's loop, awaited from another loop. Cancelling the
        awaiting task stops the job as SIGTERM does (what is in flight is answered and kept,
        for a few seconds at most) and waits for that before the cancellation goes on."""
        job = _Running(coroutine, self._start())
        try:
            return await asyncio.shield(asyncio.wrap_future(job.result))
        except asyncio.CancelledError:
            job.cancel()
            await asyncio.wrap_future(job.ended)
            raise

    def call_stopped_gently(self, call: Callable[[], T]) -> T:
        """``call()`` (sync code running jobs on this client), on a thread of its own, so that
        a KeyboardInterrupt here (how Ray cancels a task) stops this process's jobs as SIGTERM
        does: nothing new is sent, what is in flight is answered and kept (for at most
        :attr:`drain_seconds`), and then the interrupt goes on. SIGTERM drains them too. The
        caller's context goes with ``call``, as :func:`asyncio.to_thread` takes it: a span
        current here is current there."""
        with concurrent.futures.ThreadPoolExecutor(1) as pool, graceful_sigterm():
            calling = pool.submit(contextvars.copy_context().run, call)
            try:
                while True:  # a KeyboardInterrupt is only raised between waits
                    with contextlib.suppress(concurrent.futures.TimeoutError):
                        return calling.result(timeout=0.1)
            except KeyboardInterrupt:
                with stopping_gently():
                    concurrent.futures.wait([calling])
                raise

    def close(self) -> None:
        """Close the connection pool and stop the client's loop; the client cannot be used
        again."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._engine is not None:
            asyncio.run_coroutine_threadsafe(self._engine.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        self._loop = self._thread = self._engine = None

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _Running(Generic[T]):
    """A coroutine running on a client's loop, for a caller on another thread: its
    ``result``, and ``ended`` once it ran to its end, which a cancelled job reaches after it
    drained (a cancelled ``result`` does not wait for that)."""

    def __init__(self, coroutine: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop):
        self.ended: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._loop = loop
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False
        self.result = asyncio.run_coroutine_threadsafe(self._run(coroutine), loop)

    async def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        try:
            if self._cancelled:  # before it started: it never will
                coroutine.close()
                raise asyncio.CancelledError
            self._task = asyncio.current_task()
            return await coroutine
        finally:
            self.ended.set_result(None)

    def cancel(self) -> None:
        """Cancel the coroutine, whether it runs already or not yet."""
        self._loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        self._cancelled = True
        if self._task is not None:
            self._task.cancel()


def _model(model: object) -> str:
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(
            f"model must be a model name such as 'text-embedding-3-small', got {model!r}"
        )
    return model


def complete_on(
    client: Client | None,
    df: Frame,
    prompt: str,
    model: ModelOption,
    return_report: bool,
    options: Options,
) -> Frame | tuple[Frame, RunReport]:
    """``llm_complete``'s work: on ``client`` when one is given, else on a client of its own,
    made from ``options`` for this call and closed after it."""
    made, call = split_options(options)
    runner = Client(**made) if client is None else given_client(client, made)
    try:
        return runner._complete_any(df, prompt, model, return_report, call, own=client is None)
    finally:
        if client is None:
            runner.close()


async def complete_on_async(
    client: Client | None,
    df: Frame,
    prompt: str,
    model: ModelOption,
    return_report: bool,
    options: Options,
) -> Frame | tuple[Frame, RunReport]:
    """:func:`complete_on` for a caller in an event loop."""
    made, call = split_options(options)
    runner = Client(**made) if client is None else given_client(client, made)
    try:
        return await runner._complete_any_async(
            df, prompt, model, return_report, call, own=client is None
        )
    finally:
        if client is None:
            runner.close()


def complete_later(
    df: pl.LazyFrame,
    job: Job,
    return_report: bool,
    options: CallOptions,
    *,
    send: Callable[[pl.DataFrame], tuple[pl.DataFrame, RunReport]],
    client: Client | None = None,
) -> pl.LazyFrame:
    """A completion of a LazyFrame, ``job`` already checked against its schema: ``send``
    answers the collected frame (its report is then :func:`llm_ops.last_report`, and
    ``client``'s :meth:`~Client.last_report`)."""
    if return_report:
        raise ConfigError(
            "return_report=True needs an eager frame: a LazyFrame is answered when it is "
            "collected; then read llm_ops.last_report()"
        )
    reports: list[RunReport] = []
    # Remembered here, in the thread or task that made the frame: Polars may collect it on a
    # thread of its own, whose context the caller never reads.
    remember_latest(lambda: reports[-1] if reports else None, client)

    def run(frame: pl.DataFrame) -> pl.DataFrame:
        result, report = send(frame)
        reports[:] = [report]
        remember_latest(lambda: report, client)  # and where it ran (often the same thread)
        warn_failed_rows(report, options)
        return result

    return _deferred(df, run, job.added)


def embed_later(
    df: pl.LazyFrame,
    columns: Columns,
    dimensions: int | None,
    send: Callable[[pl.DataFrame], pl.DataFrame],
) -> pl.LazyFrame:
    """An embedding of a LazyFrame, already checked (``columns`` it adds): ``send`` embeds
    the collected frame. Without ``dimensions`` the vectors' size is unknown until then, so
    they are a ``List``."""
    vector = pl.List(pl.Float32) if dimensions is None else pl.Array(pl.Float32, dimensions)

    def run(frame: pl.DataFrame) -> pl.DataFrame:
        return send(frame).with_columns(pl.col(columns.output).cast(vector))

    return _deferred(df, run, columns.dtypes(vector))


def warn_failed_rows(report: RunReport, options: CallOptions) -> None:
    """The one warning of a finished completion job with failed rows (see
    :class:`~llm_ops.RowsFailedWarning`), naming its error column."""
    error = Columns(options.get("output", "completion")).error
    warn_report(report, f"the {error!r} column, or the report's errors (return_report=True)")


def _deferred(
    df: pl.LazyFrame,
    run: Callable[[pl.DataFrame], pl.DataFrame],
    added: Mapping[str, pl.DataType],
) -> pl.LazyFrame:
    """``df``, to which ``run`` adds the columns ``added`` (names and types, known now, after
    the input's) when it is collected.

    ``run`` gets every row at once, as an eager frame (it is not streamable), so a job dedupes,
    budgets and reports over the whole frame, as for a DataFrame; and no filter, projection
    or slice is pushed past it, so it gets the rows it would get eagerly.
    """
    schema = pl.Schema({**df.collect_schema(), **added})
    return df.map_batches(run, schema=schema, streamable=False)


def shared_key(made: ClientOptions) -> str:
    """A digest of the options and environment a shared client is made from (the expressions'
    and the tables' shared clients are keyed by it): the key holds no secret (an endpoint's
    API key, ``OPENAI_API_KEY``) in plain, where the cache is kept for the process's life."""
    cache = cache_of(made.get("cache"))
    canonical = (
        tuple(sorted((name, _identity(value)) for name, value in made.items() if name != "cache")),
        None if cache is None else (str(cache.path), _identity(vars(cache))),
        os.environ.get("OPENAI_BASE_URL"),
        os.environ.get("OPENAI_API_KEY"),
    )
    return hashlib.sha256(repr(canonical).encode()).hexdigest()


def _identity(value: object) -> object:
    """A hashable stand-in for an option's value that tells every two values apart: an
    object's every field, where its ``repr`` hides some (an endpoint's key and headers)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return tuple((f.name, _identity(getattr(value, f.name))) for f in dataclasses.fields(value))
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _identity(v)) for k, v in value.items()))
    return repr(value)
