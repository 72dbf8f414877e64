"""``llm_complete``: the public operator over Polars and Arrow frames."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar, cast, overload

import polars as pl
import pyarrow as pa
from pydantic import BaseModel

from ._escalate import EscalateOption
from ._frame import run_frame
from ._job import CachePath, ProgressOption, make_job
from ._plan import from_arrow
from ._pricing import PricingOption
from ._report import RunReport
from ._run import run_sync
from ._semantic import SemanticCache
from .exceptions import ConfigError

Frame = TypeVar("Frame", pl.DataFrame, pl.LazyFrame, pa.Table)
SchemaOption = type[BaseModel] | Mapping[str, Any] | None


def _to_polars(df: Any) -> pl.DataFrame:
    if isinstance(df, pl.DataFrame):
        return df
    if isinstance(df, pl.LazyFrame):
        return df.collect()
    if isinstance(df, pa.Table):
        return from_arrow(df)
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
    job = make_job(_schema(df), **args)
    frame = _to_polars(df)
    columns, report = await run_frame(frame, job)
    return _same_kind(df, frame.hstack(columns.get_columns())), report


@overload
def llm_complete(
    df: Frame, /, *, prompt: str, model: str | Sequence[str], output: str = ...,
    system: str | None = ...,
    base_url: str | None = ..., api_key: str | None = ..., cache: CachePath = ...,
    concurrency: int = ..., max_tokens: int | None = ..., temperature: float | None = ...,
    top_p: float | None = ..., seed: int | None = ..., stop: str | list[str] | None = ...,
    max_attempts: int = ..., timeout: float = ..., on_error: Literal["null", "raise"] = ...,
    flush_every: int = ..., flush_seconds: float = ..., rpm: float | None = ...,
    tpm: float | None = ..., progress: ProgressOption = ..., schema: SchemaOption = ...,
    repair: bool = ..., rows_per_request: int = ..., pack_tokens: int | None = ...,
    pricing: PricingOption = ..., max_cost: float | None = ..., max_requests: int | None = ...,
    max_tokens_total: int | None = ..., escalate: EscalateOption = ...,
    semantic_cache: SemanticCache | None = ..., return_report: Literal[False] = ...,
) -> Frame: ...
@overload
def llm_complete(
    df: Frame, /, *, prompt: str, model: str | Sequence[str], output: str = ...,
    system: str | None = ...,
    base_url: str | None = ..., api_key: str | None = ..., cache: CachePath = ...,
    concurrency: int = ..., max_tokens: int | None = ..., temperature: float | None = ...,
    top_p: float | None = ..., seed: int | None = ..., stop: str | list[str] | None = ...,
    max_attempts: int = ..., timeout: float = ..., on_error: Literal["null", "raise"] = ...,
    flush_every: int = ..., flush_seconds: float = ..., rpm: float | None = ...,
    tpm: float | None = ..., progress: ProgressOption = ..., schema: SchemaOption = ...,
    repair: bool = ..., rows_per_request: int = ..., pack_tokens: int | None = ...,
    pricing: PricingOption = ..., max_cost: float | None = ..., max_requests: int | None = ...,
    max_tokens_total: int | None = ..., escalate: EscalateOption = ...,
    semantic_cache: SemanticCache | None = ..., return_report: Literal[True],
) -> tuple[Frame, RunReport]: ...
def llm_complete(
    df: Frame,
    /,
    *,
    prompt: str,
    model: str | Sequence[str],
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
    flush_every: int = 1024,
    flush_seconds: float = 2.0,
    rpm: float | None = None,
    tpm: float | None = None,
    progress: ProgressOption = None,
    schema: SchemaOption = None,
    repair: bool = False,
    rows_per_request: int = 1,
    pack_tokens: int | None = None,
    pricing: PricingOption = None,
    max_cost: float | None = None,
    max_requests: int | None = None,
    max_tokens_total: int | None = None,
    escalate: EscalateOption = None,
    semantic_cache: SemanticCache | None = None,
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
        Model name as the endpoint knows it, or a **cascade**: a list of names from the
        cheapest to the strongest. Every row goes to the first model; rows whose answer is
        ``rejected``, ``failed``, ``invalid`` or ``truncated`` (and rows ``escalate`` flags) go
        on to the next. ``<output>_model`` is added: the model whose answer the row has.
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
        Requests in flight at once (at most 4,096); the first goes alone, so a wrong key or
        endpoint costs one request.
    max_tokens, temperature, top_p, seed, stop
        Sent to the endpoint when set, and part of the cache key.
    max_attempts, timeout
        Attempts per request (the first included) and seconds per attempt.
    on_error
        ``"null"``: failed rows get a null answer and their status. ``"raise"``: after the job
        finished and every answer was cached, raise :class:`~llm_ops.RowsFailedError`.
    flush_every, flush_seconds
        Answers go to the cache's journal at once (at most 32, or ``flush_every``, behind), so
        a killed job keeps what it paid for, and are merged into the DuckDB file once this
        many are pending or this many seconds passed.
    rpm, tpm
        Requests and tokens per minute to stay under. The endpoint's ``x-ratelimit-*`` headers
        are followed too; the tighter limit wins.
    progress
        ``None`` shows a progress line when stderr is a terminal; ``True``/``False`` force it
        on/off; a callable receives a :class:`~llm_ops.Progress` about twice a second.
    schema
        A pydantic model class or a JSON schema dict: ask for JSON matching it, validate every
        answer, and make ``<output>`` a struct column with typed fields. An answer that is not
        valid JSON or does not match gets status ``invalid``; its raw text is kept in
        ``<output>_raw`` (added with ``schema``), never replaced by defaults.
    repair
        With ``schema``: resend an invalid answer once, with the validation error (counted as
        a retry).
    rows_per_request, pack_tokens
        Pack up to this many distinct requests (and about this many prompt tokens) into one
        request whose answer lists each by id; useful where a provider prices per request.
        Every id must come back exactly once, else the pack is split in halves and resent,
        down to single rows, so no row gets another's answer. Answers are cached per row.
    pricing
        A :class:`~llm_ops.Price`, or a dict of model name to Price, overriding
        :data:`llm_ops.PRICES` for the report's cost and for ``max_cost``.
    max_cost, max_requests, max_tokens_total
        Stop sending once the job's projected spend (dollars, HTTP requests, tokens) would
        pass this; rows not sent are ``skipped`` with the reason, everything answered is
        cached, and the report's ``budget_stop`` says why.
    escalate
        With a cascade: which answered rows to send on to the next model.
        :func:`~llm_ops.confidence_below` reads a confidence field of a structured answer,
        e.g. ``confidence_below(0.7)``; any boolean Polars expression over the input and answer
        columns works too, e.g. ``pl.col("summary").str.contains("(?i)not sure")``, or a SQL
        expression as a string, e.g. ``"summary LIKE 'unsure:%'"``.
    semantic_cache
        A :class:`~llm_ops.SemanticCache` turns on the second cache tier: a request that misses
        the exact cache is embedded, and the answer of the most similar cached request with
        the same model, system message and parameters is reused when the cosine similarity
        reaches the threshold; near-duplicates within the job are sent once. Such rows get
        status ``similar``; ``<output>_similar_to`` (the reused request's cache key) and
        ``<output>_similarity`` are added. Off by default.
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
    result, report = run_sync(_complete(df, args))
    return (result, report) if return_report else result


@overload
async def llm_complete_async(
    df: Frame, /, *, prompt: str, model: str | Sequence[str], output: str = ...,
    system: str | None = ...,
    base_url: str | None = ..., api_key: str | None = ..., cache: CachePath = ...,
    concurrency: int = ..., max_tokens: int | None = ..., temperature: float | None = ...,
    top_p: float | None = ..., seed: int | None = ..., stop: str | list[str] | None = ...,
    max_attempts: int = ..., timeout: float = ..., on_error: Literal["null", "raise"] = ...,
    flush_every: int = ..., flush_seconds: float = ..., rpm: float | None = ...,
    tpm: float | None = ..., progress: ProgressOption = ..., schema: SchemaOption = ...,
    repair: bool = ..., rows_per_request: int = ..., pack_tokens: int | None = ...,
    pricing: PricingOption = ..., max_cost: float | None = ..., max_requests: int | None = ...,
    max_tokens_total: int | None = ..., escalate: EscalateOption = ...,
    semantic_cache: SemanticCache | None = ..., return_report: Literal[False] = ...,
) -> Frame: ...
@overload
async def llm_complete_async(
    df: Frame, /, *, prompt: str, model: str | Sequence[str], output: str = ...,
    system: str | None = ...,
    base_url: str | None = ..., api_key: str | None = ..., cache: CachePath = ...,
    concurrency: int = ..., max_tokens: int | None = ..., temperature: float | None = ...,
    top_p: float | None = ..., seed: int | None = ..., stop: str | list[str] | None = ...,
    max_attempts: int = ..., timeout: float = ..., on_error: Literal["null", "raise"] = ...,
    flush_every: int = ..., flush_seconds: float = ..., rpm: float | None = ...,
    tpm: float | None = ..., progress: ProgressOption = ..., schema: SchemaOption = ...,
    repair: bool = ..., rows_per_request: int = ..., pack_tokens: int | None = ...,
    pricing: PricingOption = ..., max_cost: float | None = ..., max_requests: int | None = ...,
    max_tokens_total: int | None = ..., escalate: EscalateOption = ...,
    semantic_cache: SemanticCache | None = ..., return_report: Literal[True],
) -> tuple[Frame, RunReport]: ...
async def llm_complete_async(
    df: Frame,
    /,
    *,
    prompt: str,
    model: str | Sequence[str],
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
    flush_every: int = 1024,
    flush_seconds: float = 2.0,
    rpm: float | None = None,
    tpm: float | None = None,
    progress: ProgressOption = None,
    schema: SchemaOption = None,
    repair: bool = False,
    rows_per_request: int = 1,
    pack_tokens: int | None = None,
    pricing: PricingOption = None,
    max_cost: float | None = None,
    max_requests: int | None = None,
    max_tokens_total: int | None = None,
    escalate: EscalateOption = None,
    semantic_cache: SemanticCache | None = None,
    return_report: bool = False,
) -> Frame | tuple[Frame, RunReport]:
    """:func:`llm_complete` for code already running in an event loop; same arguments."""
    args = {k: v for k, v in locals().items() if k not in ("df", "return_report")}
    result, report = await _complete(df, args)
    return (result, report) if return_report else result
