"""The operators: ``llm_complete``, ``llm_complete_async``, ``llm_embed`` and ``estimate``.

Each is a thin caller of a :class:`~llm_ops.Client` made for the call from its options (see
:class:`~llm_ops.Options`); make a client yourself to share one across calls.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Literal, Unpack, cast, overload

import polars as pl
import pyarrow as pa

from ._client import Client, complete_on, complete_on_async, embed_later, given_client
from ._config import endpoint_of
from ._frames import Frame, PolarsFrame
from ._options import (
    EmbedOptions,
    ModelOption,
    Options,
    ResultOptions,
    check_embedding,
    split_options,
)
from ._pipeline.estimate import Estimate
from ._report import RunReport


@overload
def llm_complete(
    df: PolarsFrame,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[Options],
) -> PolarsFrame: ...
@overload
def llm_complete(
    df: PolarsFrame,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[Options],
) -> tuple[PolarsFrame, RunReport]: ...
@overload
def llm_complete(
    df: pa.Table,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[Options],
) -> pa.Table: ...
@overload
def llm_complete(
    df: pa.Table,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[Options],
) -> tuple[pa.Table, RunReport]: ...
def llm_complete(
    df: Frame,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: bool = False,
    client: Client | None = None,
    **options: Unpack[Options],
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
        A LazyFrame stays lazy: its options and templates are checked against its schema
        now, and the requests are made when it is collected, for all its rows at once (read
        the report with :func:`llm_ops.last_report` then; ``return_report`` is refused).
    prompt
        Template with ``{column}`` references, e.g. ``"Summarize: {text}"``. Only plain column
        names; ``{{`` and ``}}`` are literal braces. Rows where a referenced column is null
        are ``skipped``.
    model
        Model name as the endpoint knows it, or a **cascade**: a list of names from the
        cheapest to the strongest, or a :class:`~llm_ops.Cascade` that also says which
        answered rows go on (``escalate``). Every row goes to the first model; rows whose
        answer is ``rejected``, ``failed``, ``invalid`` or ``truncated`` go on to the next.
        ``<output>_model`` is added: the model whose answer the row has.
    output
        Name of the answer column; the status and error columns are named after it.
    keep_reasoning
        ``True`` adds ``<output>_reasoning``: the thinking a reasoning model returns beside
        its answer (the message's ``reasoning_content``, as DeepSeek, vLLM and llama.cpp send
        it, or ``reasoning``); null where none came. It changes what the job keeps, not what
        is asked, so it is neither sent nor keyed: the cache stores the thinking whenever the
        endpoint returns it, and a cached answer brings it back.
    system
        Optional system message, a template like ``prompt``.
    schema
        A pydantic model class or a JSON schema dict: ask for JSON matching it, validate every
        answer, and make ``<output>`` a struct column with typed fields. An answer that is not
        valid JSON or does not match gets status ``invalid``; its raw text is kept in
        ``<output>_raw`` (added with ``schema``), never replaced by defaults.
    repair
        With ``schema``: ``True`` asks once more for an answer that is not valid, showing the
        model its answer and what was wrong with it (the attempt counts as a retry). Per
        call, so one client may repair in one call and not in the next.
    images
        Image column(s) sent with each row's prompt, after its text: a column name, a list of
        them, or an :class:`~llm_ops.Images` with OpenAI's ``detail``. A ``Binary`` column
        holds image bytes (PNG, JPEG, WebP, GIF); a ``String`` column a path, a ``file://``,
        ``data:`` or ``http(s)://`` URL. An image is keyed by the sha256 of its bytes, and
        the cache keeps that reference, never the bytes. A null image skips its row; one
        that cannot be read, is not an image or is over 20 MB makes it ``rejected``, unsent.
    documents
        PDF column(s) sent the same way: a column name, a list, or a
        :class:`~llm_ops.Documents` (sent as OpenAI ``file`` parts, or as page images with
        ``send_as="pages"``; at most ``max_pages`` pages).
    sampling
        A :class:`~llm_ops.Sampling`: ``max_tokens``, ``temperature``, ``top_p``, ``seed``,
        ``stop``, ``reasoning_effort``, ``max_completion_tokens``; each is sent when set, and
        is part of the cache key.
    endpoint
        Where requests go: a URL such as ``"http://127.0.0.1:8000/v1"``, or an
        :class:`~llm_ops.Endpoint` with the key, headers (Azure's ``api-key``), TLS, a proxy
        or a name for cache keys. Default: ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, then
        OpenAI. A loopback endpoint needs no key. The key is never stored, logged or put in a
        message.
    cache
        Path of the DuckDB cache file, or a :class:`~llm_ops.Cache` saying how it is written
        too; ``None`` uses ``LLM_OPS_CACHE`` or ``~/.cache/llm-ops/cache.duckdb``; ``False``
        turns caching off. Answers go to the cache's journal at once, so a killed job keeps
        what it paid for.
    concurrency
        The most requests in flight, at most 4,096; unset, the job finds how many the
        endpoint absorbs. It raises what is in flight while the throughput rises with it and
        keeps the least that does as much (see :attr:`~llm_ops.RunReport.concurrency_why`);
        a number given is where it starts, and it only comes down from there where the
        server queues. Either way the first request goes alone, so a wrong key or endpoint
        costs one request.
    retries
        :class:`~llm_ops.Retries`: attempts per request, seconds per attempt, and the longest
        ``Retry-After`` an endpoint may ask for.
    rate_limit
        :class:`~llm_ops.RateLimit`: requests and tokens per minute to stay under. The
        endpoint's rate-limit headers are followed too; the tighter limit wins.
    batch
        ``True`` or a :class:`~llm_ops.BatchMode`: the distinct uncached requests go through
        the provider's Files and Batches API at its price (half the live one by default, see
        :meth:`~llm_ops.Price.for_batch`), and the job waits for them (up to 24 h). The
        batches are recorded in the cache before and after each provider call, so a rerun
        after a crash picks them up and never submits a request twice.
    budget
        A :class:`~llm_ops.Budget`: stop sending once the job's projected spend (dollars, HTTP
        requests, tokens) would pass it; rows not sent are ``skipped`` with the reason,
        everything answered is cached, and the report's ``budget_stop`` says why.
    packing
        A :class:`~llm_ops.Packing`: several distinct prompts in one request, useful where a
        provider prices per request (no row ever gets another's answer).
    send_order
        The order the uncached requests are sent in. ``"prefix"`` (the default) sends them by
        system message, then prompt text (one run per concurrent request, taken in turn), so
        requests sharing a prefix go out close together and the server's prefix cache (vLLM,
        SGLang, llama.cpp, OpenAI prompt caching) reuses it; ``"input"``, in the order of
        their first rows. Only when a request is sent changes: every row's answer, status
        and position are the same.
    pricing
        A :class:`~llm_ops.Price`, or a dict of model name to Price, overriding
        :data:`llm_ops.PRICES` for the report's cost and for the budget's ``max_cost``;
        ``"free"`` for models you host yourself, whose cost is then $0 rather than unknown.
    semantic_cache
        A :class:`~llm_ops.SemanticCache` turns on the second cache tier: a request that misses
        the exact cache is embedded, and the answer of the most similar cached request with
        the same model, system message and parameters is reused when the cosine similarity
        reaches the threshold; near-duplicates within the job are sent once. Such rows get
        status ``similar``; ``<output>_similar_to`` (the reused request's cache key) and
        ``<output>_similarity`` are added. Off by default.
    on_error
        ``"null"``: failed rows get a null answer and their status. ``"raise"``: after the job
        finished and every answer was cached, raise :class:`~llm_ops.RowsFailedError`.
    progress
        ``None`` shows a progress line when stderr is a terminal; ``True``/``False`` force it
        on/off; a callable receives a :class:`~llm_ops.Progress` about twice a second.
    return_report
        Return ``(frame, RunReport)`` instead of the frame alone. Either way the report is
        :func:`llm_ops.last_report` afterwards, in this thread or asyncio task.
    client
        A :class:`~llm_ops.Client` to run on (its engine, cache and limits), instead of one
        made for the call from ``endpoint``, ``cache``, ``concurrency``, ``retries`` and
        ``rate_limit``, which are then left out: the client has them.

    Examples
    --------
    >>> import polars as pl
    >>> from llm_ops import llm_complete
    >>> from llm_ops.testing import LocalEndpoint
    >>> reviews = pl.DataFrame({"text": ["Lovely dress", None, "Lovely dress"]})
    >>> with LocalEndpoint() as endpoint:
    ...     out = reviews.pipe(llm_complete, prompt="Summarize: {text}", model="sim",
    ...                        endpoint=endpoint.base_url, cache=False)
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
    return complete_on(client, df, prompt, model, return_report, options)


@overload
async def llm_complete_async(
    df: PolarsFrame,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[Options],
) -> PolarsFrame: ...
@overload
async def llm_complete_async(
    df: PolarsFrame,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[Options],
) -> tuple[PolarsFrame, RunReport]: ...
@overload
async def llm_complete_async(
    df: pa.Table,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: Literal[False] = ...,
    client: Client | None = None,
    **options: Unpack[Options],
) -> pa.Table: ...
@overload
async def llm_complete_async(
    df: pa.Table,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: Literal[True],
    client: Client | None = None,
    **options: Unpack[Options],
) -> tuple[pa.Table, RunReport]: ...
async def llm_complete_async(
    df: Frame,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: bool = False,
    client: Client | None = None,
    **options: Unpack[Options],
) -> Frame | tuple[Frame, RunReport]:
    """:func:`llm_complete` for code already running in an event loop; same arguments (a
    LazyFrame stays lazy: its requests are made when it is collected)."""
    return await complete_on_async(client, df, prompt, model, return_report, options)


@overload
def llm_embed(
    df: PolarsFrame,
    /,
    column: str,
    *,
    model: str,
    output: str = "embedding",
    dimensions: int | None = None,
    inputs_per_request: int = 256,
    client: Client | None = None,
    **options: Unpack[EmbedOptions],
) -> PolarsFrame: ...
@overload
def llm_embed(
    df: pa.Table,
    /,
    column: str,
    *,
    model: str,
    output: str = "embedding",
    dimensions: int | None = None,
    inputs_per_request: int = 256,
    client: Client | None = None,
    **options: Unpack[EmbedOptions],
) -> pa.Table: ...
def llm_embed(
    df: Frame,
    /,
    column: str,
    *,
    model: str,
    output: str = "embedding",
    dimensions: int | None = None,
    inputs_per_request: int = 256,
    client: Client | None = None,
    **options: Unpack[EmbedOptions],
) -> Frame:
    """Add an embedding of ``column`` to every row, as a fixed-size ``Float32`` array column.

    Distinct texts are embedded once, many per request (``inputs_per_request`` inputs, within the
    endpoint's limits), and cached in the ``llm_embeddings`` table of the same cache database.
    ``<output>_status`` and ``<output>_error`` work as for :func:`llm_ops.llm_complete`.

    Parameters
    ----------
    df
        A Polars DataFrame or LazyFrame, or a pyarrow Table; the result is of the same kind.
        A LazyFrame stays lazy: the arguments are checked against its schema now, and the
        texts are embedded when it is collected, all its rows at once. Its vector column is
        a ``List(Float32)`` unless ``dimensions`` is given: a LazyFrame's schema is known
        before anything is sent, the vectors' size is not.
    column
        The text column to embed; null rows are ``skipped``.
    model
        Embedding model name as the endpoint knows it.
    output
        Name of the vector column.
    dimensions
        Ask the endpoint for vectors of this size (part of the cache key).
    inputs_per_request
        Inputs per request.
    endpoint, cache, concurrency, retries, rate_limit, on_error, progress, client
        As for :func:`llm_ops.llm_complete`.

    Examples
    --------
    >>> import polars as pl
    >>> from llm_ops import llm_embed
    >>> from llm_ops.testing import LocalEndpoint
    >>> with LocalEndpoint() as endpoint:
    ...     out = pl.DataFrame({"text": ["red dress", None]}).pipe(
    ...         llm_embed, column="text", model="sim-embed", dimensions=8,
    ...         endpoint=endpoint.base_url, cache=False)
    >>> out.schema["embedding"], out["embedding_status"].to_list()
    (Array(Float32, shape=(8,)), ['ok', 'skipped'])
    """
    made, call = split_options(options)
    if client is None and isinstance(df, pl.LazyFrame):
        return _embed_later(df, column, model, output, dimensions, inputs_per_request, options)
    runner = Client(**made) if client is None else given_client(client, made)
    try:
        result: Frame = runner.embed(
            df,
            column=column,
            model=model,
            output=output,
            dimensions=dimensions,
            inputs_per_request=inputs_per_request,
            **cast(ResultOptions, call),
        )
    finally:
        if client is None:  # a client of its own, made for this call
            runner.close()
    return result


def _embed_later(
    df: pl.LazyFrame,
    column: str,
    model: str,
    output: str,
    dimensions: int | None,
    inputs_per_request: int,
    options: EmbedOptions,
) -> pl.LazyFrame:
    """``llm_embed`` of a LazyFrame: checked now, sent on a client of its own when it is
    collected."""
    made, call = split_options(options)
    Client(**made)  # its options checked
    columns = check_embedding(
        df.collect_schema(),
        column=column,
        model=model,
        output=output,
        dimensions=dimensions,
        inputs_per_request=inputs_per_request,
        on_error=options.get("on_error", "null"),
    )

    def send(frame: pl.DataFrame) -> pl.DataFrame:
        with Client(**made) as client:
            embedded: pl.DataFrame = client.embed(
                frame,
                column,
                model=model,
                output=output,
                dimensions=dimensions,
                inputs_per_request=inputs_per_request,
                **cast(ResultOptions, call),
            )
        return embedded

    return embed_later(df, columns, dimensions, send)


def estimate(
    df: Any,
    /,
    prompt: str,
    *,
    model: ModelOption,
    client: Client | None = None,
    **options: Unpack[Options],
) -> Estimate:
    """Plan a :func:`~llm_ops.llm_complete` job and price it; nothing is sent.

    Takes exactly what :func:`~llm_ops.llm_complete` takes (transport options such as
    ``concurrency`` are ignored, and no API key is needed), so the same keyword arguments
    price the job that ``llm_complete`` would run (``client=`` too: its endpoint and cache);
    cache hits are counted against the cache, which is read but never created. For a cascade
    (``model=[small, large]``) the counts are the first model's, and the cost range runs from
    every row answered by the first model to every row sent to every model.

    Examples
    --------
    >>> import polars as pl
    >>> from llm_ops import Sampling, estimate
    >>> frame = pl.DataFrame({"text": ["fits well", "runs small", "fits well", None]})
    >>> plan = estimate(frame, prompt="Summarize: {text}", model="gpt-4o-mini",
    ...                 sampling=Sampling(max_tokens=50), cache=False)
    >>> plan.requests, plan.skipped_rows, plan.output_tokens_max
    (2, 1, 100)
    >>> cascade = estimate(frame, prompt="Summarize: {text}", model=["gpt-4o-mini", "gpt-4o"],
    ...                    sampling=Sampling(max_tokens=50), cache=False)
    >>> cascade.cost_min == plan.cost_min, cascade.cost_max > 10 * plan.cost_max
    (True, True)
    """
    made, call = split_options(options)
    if client is not None:
        return given_client(client, made).estimate(df, prompt=prompt, model=model, **call)
    # Nothing is sent, so no key is needed; the endpoint still names the cache keys.
    endpoint = endpoint_of(made.get("endpoint"))
    if endpoint.api_key is None and not os.environ.get("OPENAI_API_KEY"):
        made["endpoint"] = replace(endpoint, api_key="unused")
    return Client(**made).estimate(df, prompt=prompt, model=model, **call)
