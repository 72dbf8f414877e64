"""``llm_complete``: plan, dedupe, cache lookup, dispatch, persist, join back, report."""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import os
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, overload
from urllib.parse import urlsplit

import duckdb
import polars as pl
import pyarrow as pa

from . import _cache
from ._engine import TRUNCATED_MESSAGE, Dispatcher, EngineSettings, Outcome, Request, redact
from ._key import (
    UPPERCASE_ESCAPE_PATTERN,
    build_request,
    canonical_json,
    key_sql,
    messages_for,
    normalize_base_url,
    request_key,
)
from ._progress import Progress, TerminalDisplay, Tracker, resolve_progress
from ._report import FAILED_STATUSES, STATUSES, RunReport
from ._template import Template, check_columns, parse_template
from .exceptions import ConfigError, JobAbortedError, MissingApiKeyError, RowsFailedError

Frame = TypeVar("Frame", pl.DataFrame, pl.LazyFrame, pa.Table)
CachePath = str | os.PathLike[str] | bool | None
ProgressOption = bool | Callable[[Progress], None] | None

DEFAULT_BASE_URL = "https://api.openai.com/v1"
STATUS_DTYPE = pl.Enum(STATUSES)
_CACHEABLE = frozenset({"ok", "truncated"})


@dataclass(frozen=True)
class _Job:
    """Validated arguments of one call."""

    prompt: Template
    system: Template | None
    model: str
    output: str
    base_url: str
    api_key: str
    cache_path: Path | None
    params: dict[str, Any]
    settings: EngineSettings
    on_error: str
    flush_every: int
    flush_seconds: float
    progress: Callable[[Progress], None] | None

    @property
    def status_column(self) -> str:
        return f"{self.output}_status"

    @property
    def error_column(self) -> str:
        return f"{self.output}_error"


def _is_local(base_url: str) -> bool:
    host = urlsplit(base_url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def _make_job(
    schema: pl.Schema,
    *,
    prompt: str,
    model: str,
    output: str,
    system: str | None,
    base_url: str | None,
    api_key: str | None,
    cache: CachePath,
    concurrency: int,
    max_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    seed: int | None,
    stop: str | list[str] | None,
    max_attempts: int,
    timeout: float,
    on_error: str,
    flush_every: int,
    flush_seconds: float,
    rpm: float | None,
    tpm: float | None,
    progress: bool | Callable[[Progress], None] | None,
) -> _Job:
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"model must be a non-empty string such as 'gpt-4o-mini', got {model!r}")
    if not isinstance(output, str) or not output:
        raise ConfigError(f"output must be a non-empty column name, got {output!r}")
    prompt_template = parse_template(prompt, what="prompt")
    check_columns(prompt_template, schema, what="prompt")
    system_template = None
    if system is not None:
        system_template = parse_template(system, what="system")
        check_columns(system_template, schema, what="system")
    for column in (output, f"{output}_status", f"{output}_error"):
        if column in schema:
            raise ConfigError(
                f"the input already has a column {column!r}; choose another output= name or "
                "drop that column first"
            )
    _positive_int("concurrency", concurrency)
    _positive_int("max_attempts", max_attempts)
    _positive_int("flush_every", flush_every)
    if max_tokens is not None:
        _positive_int("max_tokens", max_tokens)
    for name, value, high in (("temperature", temperature, 2.0), ("top_p", top_p, 1.0)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= high
        ):
            raise ConfigError(f"{name} must be a number between 0 and {high:g}, got {value!r}")
    for name, value in (("timeout", timeout), ("flush_seconds", flush_seconds)):
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
    for name, limit in (("rpm", rpm), ("tpm", tpm)):
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int | float) or limit <= 0
        ):
            raise ConfigError(f"{name} must be a positive number per minute, got {limit!r}")
    if on_error not in ("null", "raise"):
        raise ConfigError(f"on_error must be 'null' or 'raise', got {on_error!r}")

    url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        raise ConfigError(f"base_url must be an http(s) URL like 'http://127.0.0.1:8765/v1', got "
                          f"{redact(url, api_key)!r}")
    key = api_key or os.environ.get("OPENAI_API_KEY")
    if not key:
        if not _is_local(url):
            raise MissingApiKeyError(
                f"no API key for {normalize_base_url(url)}: pass api_key=... or set "
                "OPENAI_API_KEY (a local endpoint on 127.0.0.1 needs none)"
            )
        key = "no-key-needed"
    params = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
              "seed": seed, "stop": stop}
    return _Job(
        prompt=prompt_template,
        system=system_template,
        model=model,
        output=output,
        base_url=url,
        api_key=key,
        cache_path=_cache.resolve_cache_path(cache),
        params={k: v for k, v in params.items() if v is not None},
        settings=EngineSettings(
            concurrency=concurrency, max_attempts=max_attempts, timeout=float(timeout),
            rpm=rpm, tpm=tpm,
        ),
        on_error=on_error,
        flush_every=flush_every,
        flush_seconds=flush_seconds,
        progress=resolve_progress(progress),
    )


@dataclass
class _Plan:
    """Per-row keys and the distinct requests to answer."""

    row_keys: pl.DataFrame  # one row per input row: key (null when skipped), skip_reason
    distinct: pl.DataFrame  # key, system, prompt, rows (how many input rows share it)
    hits: pl.DataFrame  # key, text, status, error
    misses: pl.DataFrame  # key, system, prompt, rows


def _plan(frame: pl.DataFrame, job: _Job) -> _Plan:
    """Render every row, key it, dedupe with DuckDB and anti-join against the cache."""
    system_expr = job.system.expr() if job.system else pl.lit(None, dtype=pl.String)
    texts = frame.select(job.prompt.expr().alias("prompt"), system_expr.alias("system"))
    expression, parameters = key_sql(
        endpoint=job.base_url, model=job.model, params=job.params,
        with_system=job.system is not None,
    )
    null_check = "prompt IS NULL" + (" OR system IS NULL" if job.system else "")
    con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False})
    try:
        con.register("texts", texts.to_arrow())
        keys = con.sql(
            f"SELECT CASE WHEN {null_check} THEN NULL ELSE {expression} END AS key FROM texts",
            params=parameters,
        ).pl()
        keys = _fix_escaped_keys(keys, texts, job)
        con.register("keyed", pl.concat([texts, keys], how="horizontal").to_arrow())
        distinct = con.sql(
            "SELECT key, any_value(system) AS system, any_value(prompt) AS prompt, "
            "count(*)::BIGINT AS rows FROM keyed WHERE key IS NOT NULL GROUP BY key"
        ).pl()
    finally:
        con.close()

    referenced = [*job.prompt.columns, *(job.system.columns if job.system else ())]
    skip_reason: pl.Expr = pl.lit(None, dtype=pl.String)
    for column in reversed(list(dict.fromkeys(referenced))):
        skip_reason = (
            pl.when(pl.col(column).is_null())
            .then(pl.lit(f"column {column!r} is null; row not sent"))
            .otherwise(skip_reason)
        )
    row_keys = pl.concat([keys, frame.select(skip_reason.alias("skip_reason"))], how="horizontal")

    hits = _lookup(job.cache_path, distinct)
    misses = distinct.join(hits.select("key"), on="key", how="anti", maintain_order="left")
    return _Plan(row_keys=row_keys, distinct=distinct, hits=hits, misses=misses)


def _fix_escaped_keys(keys: pl.DataFrame, texts: pl.DataFrame, job: _Job) -> pl.DataFrame:
    """Recompute, with the reference implementation, keys of rows DuckDB escapes differently."""
    odd = texts.select(
        pl.any_horizontal(
            pl.col("prompt").str.contains(UPPERCASE_ESCAPE_PATTERN),
            pl.col("system").str.contains(UPPERCASE_ESCAPE_PATTERN),
        ).fill_null(False)
    ).to_series()
    if not odd.any():
        return keys
    fixed = keys["key"].to_list()
    for index in odd.arg_true().to_list():
        system, prompt = texts.row(index)[1], texts.row(index)[0]
        fixed[index] = request_key(_request(job, system, prompt))
    return pl.DataFrame({"key": fixed}, schema={"key": pl.String})


def _request(job: _Job, system: str | None, prompt: str) -> dict[str, Any]:
    return build_request(
        endpoint=job.base_url, model=job.model, messages=messages_for(system, prompt),
        params=job.params,
    )


def _lookup(cache_path: Path | None, distinct: pl.DataFrame) -> pl.DataFrame:
    empty = pl.DataFrame(
        schema={"key": pl.String, "text": pl.String, "status": pl.String, "error": pl.String}
    )
    if cache_path is None or distinct.is_empty():
        return empty
    found = pl.from_arrow(_cache.lookup(cache_path, distinct.select("key").to_arrow()))
    assert isinstance(found, pl.DataFrame)
    return found.select(
        "key",
        pl.col("response_text").alias("text"),
        pl.when(pl.col("status") == "truncated").then(pl.lit("truncated"))
        .otherwise(pl.lit("cached")).alias("status"),
        pl.when(pl.col("status") == "truncated")
        .then(pl.lit(f"{TRUNCATED_MESSAGE} (from the cache)"))
        .otherwise(pl.lit(None, dtype=pl.String)).alias("error"),
    )


class _AnswerSink:
    """Collects outcomes and writes cacheable answers through to the cache in batches.

    A full batch makes the worker that filled it wait for the write, so a worker never has a
    new request in flight while more than ``flush_every`` answers are unwritten: a crash loses
    at most ``concurrency + flush_every`` paid answers. :meth:`flush_periodically` bounds
    how long an answer waits when answers trickle in.
    """

    def __init__(self, job: _Job):
        self.job = job
        self.outcomes: list[Outcome] = []
        self._pending: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()
        self._endpoint = normalize_base_url(job.base_url)

    async def add(self, request: Request, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if self.job.cache_path is None or outcome.status not in _CACHEABLE:
            return
        self._pending.append(
            {
                "key": outcome.key, "model": self.job.model, "endpoint": self._endpoint,
                "request": request.request_json, "status": outcome.status,
                "response_text": outcome.text, "response_json": None,
                "finish_reason": outcome.finish_reason, "prompt_tokens": outcome.prompt_tokens,
                "completion_tokens": outcome.completion_tokens,
                "latency_ms": outcome.latency_ms, "attempts": outcome.attempts,
            }
        )
        if len(self._pending) >= self.job.flush_every:
            await self.flush()

    async def flush(self) -> None:
        async with self._lock:
            batch, self._pending = self._pending, []
            if batch and self.job.cache_path is not None:
                await asyncio.to_thread(_cache.write_answers, self.job.cache_path, batch)

    async def flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.job.flush_seconds)
            await self.flush()


def _requests(misses: pl.DataFrame, job: _Job) -> Iterator[Request]:
    for key, system, prompt, rows in misses.iter_rows():
        request = _request(job, system, prompt)
        yield Request(key=key, messages=request["messages"], request_json=canonical_json(request),
                      rows=rows)


def _join_back(plan: _Plan, sink: _AnswerSink, job: _Job) -> pl.DataFrame:
    answered = pl.DataFrame(
        {
            "key": [o.key for o in sink.outcomes],
            "text": [o.text if o.status in _CACHEABLE else None for o in sink.outcomes],
            "status": [o.status for o in sink.outcomes],
            "error": [o.error for o in sink.outcomes],
        },
        schema={"key": pl.String, "text": pl.String, "status": pl.String, "error": pl.String},
    )
    results = pl.concat([plan.hits, answered])
    joined = plan.row_keys.join(results, on="key", how="left", maintain_order="left")
    not_sent = "not sent: the job was stopped before this request was dispatched"
    return joined.select(
        pl.col("text").alias(job.output),
        pl.when(pl.col("skip_reason").is_not_null()).then(pl.lit("skipped"))
        .when(pl.col("status").is_null()).then(pl.lit("failed"))
        .otherwise(pl.col("status")).cast(STATUS_DTYPE).alias(job.status_column),
        pl.coalesce(pl.col("skip_reason"), pl.col("error"),
                    pl.when(pl.col("status").is_null()).then(pl.lit(not_sent)))
        .alias(job.error_column),
    )


async def _dispatch(plan: _Plan, job: _Job, sink: _AnswerSink, dispatcher: Dispatcher) -> None:
    """Send the misses, publishing progress while they are in flight."""
    tracker = Tracker(
        rows=plan.row_keys.height,
        rows_settled=plan.row_keys.height - int(plan.misses["rows"].sum()),
        requests=plan.misses.height,
        dispatcher=dispatcher,
    )

    async def on_outcome(request: Request, outcome: Outcome) -> None:
        tracker.rows_done += request.rows
        await sink.add(request, outcome)

    helpers = [asyncio.create_task(sink.flush_periodically())]
    if job.progress is not None:
        helpers.append(asyncio.create_task(tracker.publish(job.progress)))
    try:
        await dispatcher.run(_requests(plan.misses, job), on_outcome)
    finally:
        for helper in helpers:
            helper.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        if isinstance(job.progress, TerminalDisplay):
            job.progress.close()


async def _run(frame: pl.DataFrame, job: _Job) -> tuple[pl.DataFrame, RunReport]:
    started_at = datetime.now(UTC)
    clock = time.perf_counter()
    plan = await asyncio.to_thread(_plan, frame, job)
    sink = _AnswerSink(job)
    dispatcher = Dispatcher(
        base_url=job.base_url, api_key=job.api_key, model=job.model, params=job.params,
        settings=job.settings,
    )
    stopped: BaseException | None = None
    try:
        await _dispatch(plan, job, sink, dispatcher)
    except (JobAbortedError, asyncio.CancelledError) as exc:
        # Interrupted (Ctrl-C) or refused: keep what was paid for, then report and re-raise.
        stopped = exc
    finally:
        await sink.flush()
    columns = await asyncio.to_thread(_join_back, plan, sink, job)
    counts = columns[job.status_column].value_counts()
    statuses = {s: 0 for s in STATUSES} | {str(s): int(n) for s, n in counts.iter_rows()}
    if stopped is None:
        outcome = "completed"
    else:
        outcome = "aborted" if isinstance(stopped, JobAbortedError) else "interrupted"
    report = RunReport(
        run_id=uuid.uuid4().hex[:12],
        started_at=started_at,
        finished_at=datetime.now(UTC),
        model=job.model,
        endpoint=normalize_base_url(job.base_url),
        rows=frame.height,
        distinct_requests=plan.distinct.height,
        cache_hits=plan.hits.height,
        requests_sent=dispatcher.counters.sent,
        retries=dispatcher.counters.retries,
        statuses=statuses,
        prompt_tokens=dispatcher.counters.prompt_tokens,
        completion_tokens=dispatcher.counters.completion_tokens,
        wall_seconds=time.perf_counter() - clock,
        outcome=outcome,
        error=str(stopped) if isinstance(stopped, JobAbortedError) else None,
    )
    if job.cache_path is not None:
        await asyncio.to_thread(_cache.record_run, job.cache_path, report.as_dict())
    if stopped is not None:
        if isinstance(stopped, asyncio.CancelledError):
            print(f"interrupted; answers so far are cached.\n{report}", file=sys.stderr)
        raise stopped
    if job.on_error == "raise" and report.failed_rows:
        _raise_failed_rows(columns, job)
    return columns, report


def _raise_failed_rows(columns: pl.DataFrame, job: _Job) -> None:
    failed = (
        columns.with_row_index("row")
        .filter(pl.col(job.status_column).cast(pl.String).is_in(list(FAILED_STATUSES)))
    )
    raise RowsFailedError(
        failed["row"].to_list(),
        failed[job.error_column].fill_null("").to_list(),
        failed[job.status_column].cast(pl.String).to_list(),
    )


def _to_polars(df: Any) -> pl.DataFrame:
    if isinstance(df, pl.DataFrame):
        return df
    if isinstance(df, pl.LazyFrame):
        return df.collect()
    if isinstance(df, pa.Table):
        converted = pl.from_arrow(df)
        assert isinstance(converted, pl.DataFrame)
        return converted
    raise ConfigError(
        f"llm_complete takes a polars DataFrame or LazyFrame or a pyarrow Table, got "
        f"{type(df).__name__}; convert it first, e.g. pl.from_pandas(df)"
    )


def _schema(df: Any) -> pl.Schema:
    if isinstance(df, pl.LazyFrame):
        return df.collect_schema()
    return _to_polars(df).schema


def _same_kind(original: Frame, result: pl.DataFrame) -> Frame:
    if isinstance(original, pl.LazyFrame):
        return result.lazy()
    if isinstance(original, pa.Table):
        return cast(Frame, result.to_arrow())
    return result


async def _complete(df: Frame, args: dict[str, Any]) -> tuple[Frame, RunReport]:
    job = _make_job(_schema(df), **args)
    frame = _to_polars(df)
    columns, report = await _run(frame, job)
    return _same_kind(df, frame.hstack(columns.get_columns())), report


def _run_sync(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coroutine`` to completion from sync code, even inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    # A notebook's loop is running in this thread: give the job a loop of its own.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="llm-ops") as pool:
        return pool.submit(asyncio.run, coroutine).result()


@overload
def llm_complete(
    df: Frame, /, *, prompt: str, model: str, output: str = ..., system: str | None = ...,
    base_url: str | None = ..., api_key: str | None = ..., cache: CachePath = ...,
    concurrency: int = ..., max_tokens: int | None = ..., temperature: float | None = ...,
    top_p: float | None = ..., seed: int | None = ..., stop: str | list[str] | None = ...,
    max_attempts: int = ..., timeout: float = ..., on_error: Literal["null", "raise"] = ...,
    flush_every: int = ..., flush_seconds: float = ..., rpm: float | None = ...,
    tpm: float | None = ..., progress: ProgressOption = ..., return_report: Literal[False] = ...,
) -> Frame: ...
@overload
def llm_complete(
    df: Frame, /, *, prompt: str, model: str, output: str = ..., system: str | None = ...,
    base_url: str | None = ..., api_key: str | None = ..., cache: CachePath = ...,
    concurrency: int = ..., max_tokens: int | None = ..., temperature: float | None = ...,
    top_p: float | None = ..., seed: int | None = ..., stop: str | list[str] | None = ...,
    max_attempts: int = ..., timeout: float = ..., on_error: Literal["null", "raise"] = ...,
    flush_every: int = ..., flush_seconds: float = ..., rpm: float | None = ...,
    tpm: float | None = ..., progress: ProgressOption = ..., return_report: Literal[True],
) -> tuple[Frame, RunReport]: ...
def llm_complete(
    df: Frame,
    /,
    *,
    prompt: str,
    model: str,
    output: str = "completion",
    system: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    cache: CachePath = None,
    concurrency: int = 32,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: str | list[str] | None = None,
    max_attempts: int = 5,
    timeout: float = 60.0,
    on_error: Literal["null", "raise"] = "null",
    flush_every: int = 256,
    flush_seconds: float = 1.0,
    rpm: float | None = None,
    tpm: float | None = None,
    progress: ProgressOption = None,
    return_report: bool = False,
) -> Frame | tuple[Frame, RunReport]:
    """Run a prompt over every row and add the answers as new columns.

    Each row's prompt is rendered from its columns; identical requests are sent once; answers
    already in the cache are reused; the rest are sent concurrently to an OpenAI-compatible
    endpoint. Row count, order and the input's columns are kept; three columns are added:
    ``<output>`` (the answer text), ``<output>_status`` (see :data:`llm_ops.STATUSES`) and
    ``<output>_error`` (null when the row is fine, else one line saying what went wrong).

    Parameters
    ----------
    df
        A Polars DataFrame or LazyFrame, or a pyarrow Table; the result is of the same kind.
        A LazyFrame is collected: the requests are made when this function is called.
    prompt
        Template with ``{column}`` references, e.g. ``"Summarize: {text}"``. Only plain column
        names; ``{{`` and ``}}`` are literal braces. Rows where a referenced column is null
        are ``skipped``.
    model
        Model name as the endpoint knows it.
    output
        Name of the answer column; the status and error columns are named after it.
    system
        Optional system message, a template like ``prompt``.
    base_url, api_key
        The endpoint. Default to ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, then to OpenAI. A
        loopback endpoint needs no key. The key is never stored, logged or put in a message.
    cache
        Path of the DuckDB cache file; ``None`` uses ``LLM_OPS_CACHE`` or
        ``~/.cache/llm-ops/cache.duckdb``; ``False`` turns caching off.
    concurrency
        Requests in flight at once.
    max_tokens, temperature, top_p, seed, stop
        Sent to the endpoint when set, and part of the cache key.
    max_attempts, timeout
        Attempts per request (the first included) and seconds per attempt.
    on_error
        ``"null"``: failed rows get a null answer and their status. ``"raise"``: after the job
        finished and every answer was cached, raise :class:`~llm_ops.RowsFailedError`.
    flush_every, flush_seconds
        Answers are written to the cache once this many are pending or this many seconds
        passed, so a killed job keeps what it paid for.
    rpm, tpm
        Requests and tokens per minute to stay under. The endpoint's ``x-ratelimit-*`` headers
        are followed too; the tighter limit wins.
    progress
        ``None`` shows a progress line when stderr is a terminal; ``True``/``False`` force it
        on/off; a callable receives a :class:`~llm_ops.Progress` about twice a second.
    return_report
        Return ``(frame, RunReport)`` instead of the frame alone.

    Examples
    --------
    >>> import polars as pl
    >>> from llm_ops import llm_complete
    >>> from llm_ops.testing import LocalEndpoint
    >>> reviews = pl.DataFrame({"text": ["Lovely dress", None, "Lovely dress"]})
    >>> with LocalEndpoint() as endpoint:
    ...     out = reviews.pipe(llm_complete, prompt="Summarize: {text}", model="sim",
    ...                        base_url=endpoint.base_url, cache=False)
    >>> out.select("completion_status", "completion_error")
    shape: (3, 2)
    ┌───────────────────┬─────────────────────────────────┐
    │ completion_status ┆ completion_error                │
    │ ---               ┆ ---                             │
    │ enum              ┆ str                             │
    ╞═══════════════════╪═════════════════════════════════╡
    │ ok                ┆ null                            │
    │ skipped           ┆ column 'text' is null; row not… │
    │ ok                ┆ null                            │
    └───────────────────┴─────────────────────────────────┘
    >>> out["completion"][0]
    'sim #a9d110f4: Summarize: Lovely dress'
    """
    args = {k: v for k, v in locals().items() if k not in ("df", "return_report")}
    result, report = _run_sync(_complete(df, args))
    return (result, report) if return_report else result


@overload
async def llm_complete_async(
    df: Frame, /, *, prompt: str, model: str, output: str = ..., system: str | None = ...,
    base_url: str | None = ..., api_key: str | None = ..., cache: CachePath = ...,
    concurrency: int = ..., max_tokens: int | None = ..., temperature: float | None = ...,
    top_p: float | None = ..., seed: int | None = ..., stop: str | list[str] | None = ...,
    max_attempts: int = ..., timeout: float = ..., on_error: Literal["null", "raise"] = ...,
    flush_every: int = ..., flush_seconds: float = ..., rpm: float | None = ...,
    tpm: float | None = ..., progress: ProgressOption = ..., return_report: Literal[False] = ...,
) -> Frame: ...
@overload
async def llm_complete_async(
    df: Frame, /, *, prompt: str, model: str, output: str = ..., system: str | None = ...,
    base_url: str | None = ..., api_key: str | None = ..., cache: CachePath = ...,
    concurrency: int = ..., max_tokens: int | None = ..., temperature: float | None = ...,
    top_p: float | None = ..., seed: int | None = ..., stop: str | list[str] | None = ...,
    max_attempts: int = ..., timeout: float = ..., on_error: Literal["null", "raise"] = ...,
    flush_every: int = ..., flush_seconds: float = ..., rpm: float | None = ...,
    tpm: float | None = ..., progress: ProgressOption = ..., return_report: Literal[True],
) -> tuple[Frame, RunReport]: ...
async def llm_complete_async(
    df: Frame,
    /,
    *,
    prompt: str,
    model: str,
    output: str = "completion",
    system: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    cache: CachePath = None,
    concurrency: int = 32,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: str | list[str] | None = None,
    max_attempts: int = 5,
    timeout: float = 60.0,
    on_error: Literal["null", "raise"] = "null",
    flush_every: int = 256,
    flush_seconds: float = 1.0,
    rpm: float | None = None,
    tpm: float | None = None,
    progress: ProgressOption = None,
    return_report: bool = False,
) -> Frame | tuple[Frame, RunReport]:
    """:func:`llm_complete` for code already running in an event loop; same arguments."""
    args = {k: v for k, v in locals().items() if k not in ("df", "return_report")}
    result, report = await _complete(df, args)
    return (result, report) if return_report else result
