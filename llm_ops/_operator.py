"""The operators: ``llm_complete``, ``llm_complete_async``, ``llm_embed`` and ``estimate``.

Each is a thin caller of a :class:`~llm_ops.Client` made for the call from its options (see
:class:`~llm_ops.Options`); make a client yourself to share one across calls.
"""

from __future__ import annotations

import os
from typing import Any, Literal, Unpack, cast, overload

import polars as pl
import pyarrow as pa

from ._client import Client, complete_later, embed_later, warn_failed_rows
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
    **options: Unpack[Options],
) -> tuple[pa.Table, RunReport]: ...
def llm_complete(
    df: Frame,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: bool = False,
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
    headers
        Headers sent with every request, such as Azure OpenAI's ``{"api-key": ...}`` or a
        gateway's tenant header; with ``Authorization``, ``api-key`` or ``x-api-key`` among
        them no API key is needed. Never part of a cache key; values of headers named like a
        credential never appear in a message or log.
    verify, cert
        TLS: ``verify`` checks the server's certificate against the system's authorities
        (``True``), a CA bundle's path, or an :class:`ssl.SSLContext`; ``False`` checks
        nothing. ``cert`` is a client certificate for servers that ask for one (mutual TLS): a
        PEM file holding the key too, or a ``(certificate, key)`` pair of paths.
    proxy
        An ``http://`` or ``https://`` proxy (``user:password@`` in it for one that asks);
        by default the one ``HTTPS_PROXY``, ``HTTP_PROXY`` or ``ALL_PROXY`` names, unless
        ``NO_PROXY`` names the host.
    endpoint_name
        The endpoint's name in cache keys instead of its URL, so one server reached under
        several URLs (a changing port, a load balancer and its replicas) shares its answers.
        The bundled simulator's is :attr:`llm_ops.testing.LocalEndpoint.name`.
    cache
        Path of the DuckDB cache file; ``None`` uses ``LLM_OPS_CACHE`` or
        ``~/.cache/llm-ops/cache.duckdb``; ``False`` turns caching off.
    concurrency
        The most requests in flight, at most 4,096; unset, the job finds how many the
        endpoint absorbs. It raises what is in flight while the throughput rises with it and
        keeps the least that does as much (see :attr:`~llm_ops.RunReport.concurrency_why`);
        a number given is where it starts, and it only comes down from there where the
        server queues. Either way the first request goes alone, so a wrong key or endpoint
        costs one request.
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
    merge_wait
        Seconds the end of the job waits for a reader holding the cache file to let go of it
        (30 by default; 0: no wait), so its answers are in the file when the job returns;
        what is left waits in the journal (``report.journal_pending``), still cache hits,
        until ``llm-ops cache merge`` or any later job.
    rpm, tpm
        Requests and tokens per minute to stay under. The endpoint's ``x-ratelimit-*`` headers
        are followed too; the tighter limit wins.
    max_retry_after
        Seconds an endpoint may ask every sender to wait (``Retry-After``, default 120); a
        request asked to wait longer fails instead of stalling the job, and when every
        request is, the job stops with :class:`~llm_ops.JobAbortedError`.
    max_response_bytes
        Bytes one answer's body may hold, compressed and decompressed (default 8 MiB; an
        embeddings answer may hold 128 KiB more per input); a larger one fails its request.
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
        :data:`llm_ops.PRICES` for the report's cost and for ``max_cost``; ``"free"`` for
        models you host yourself, whose cost is then $0 rather than unknown.
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
    mode
        ``"live"`` sends requests as they are planned; ``"batch"`` sends the distinct
        uncached requests through the provider's Files and Batches API at its price (half the
        live one by default, see :meth:`~llm_ops.Price.for_batch`) and waits for them (up to
        24 h). The batches are recorded in the cache before and after each provider call, so
        a rerun after a crash picks them up and never submits a request twice.
    on_expired
        With batch mode: what the part of an expired or cancelled batch that was not
        answered does, ``"resubmit"`` (in a new batch) or ``"live"`` (sent now).
    batch_max_requests, batch_max_bytes
        With batch mode: requests and bytes per batch file (OpenAI: 50,000 and 200 MB).
    batch_poll_seconds
        With batch mode: the first wait between asking how the batches do; it grows to a
        minute.
    send_order
        The order the uncached requests are sent in: ``"prefix"`` (the default) by system
        message, then prompt text (in one run per concurrent request, taken in turn), so
        requests sharing a prefix go out close together and the server's prefix cache (vLLM,
        SGLang, llama.cpp, OpenAI prompt caching) reuses it; ``"input"``: in the order of
        their first rows. Only when a request is sent changes: every row's answer, status
        and position are the same either way.
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
    if isinstance(df, pl.LazyFrame):
        return _complete_later(df, prompt, model, return_report, options)
    made, call = split_options(options)
    with Client(**made) as client:
        result, report = client.run(client._complete(df, prompt, model, call))
    warn_failed_rows(report, call)
    return (result, report) if return_report else result


@overload
async def llm_complete_async(
    df: PolarsFrame,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: Literal[False] = ...,
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
    **options: Unpack[Options],
) -> tuple[pa.Table, RunReport]: ...
async def llm_complete_async(
    df: Frame,
    /,
    prompt: str,
    *,
    model: ModelOption,
    return_report: bool = False,
    **options: Unpack[Options],
) -> Frame | tuple[Frame, RunReport]:
    """:func:`llm_complete` for code already running in an event loop; same arguments (a
    LazyFrame stays lazy: its requests are made when it is collected)."""
    if isinstance(df, pl.LazyFrame):
        return _complete_later(df, prompt, model, return_report, options)
    made, call = split_options(options)
    client = Client(**made)
    try:
        result, report = await client.run_async(client._complete(df, prompt, model, call))
    finally:
        client.close()
    warn_failed_rows(report, call)
    return (result, report) if return_report else result


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
    base_url, api_key, cache, concurrency, max_attempts, timeout, on_error, progress
        As for :func:`llm_ops.llm_complete`, and so are ``headers``, ``verify``, ``cert`` and
        ``proxy``.

    Examples
    --------
    >>> import polars as pl
    >>> from llm_ops import llm_embed
    >>> from llm_ops.testing import LocalEndpoint
    >>> with LocalEndpoint() as endpoint:
    ...     out = pl.DataFrame({"text": ["red dress", None]}).pipe(
    ...         llm_embed, column="text", model="sim-embed", dimensions=8,
    ...         base_url=endpoint.base_url, cache=False)
    >>> out.schema["embedding"], out["embedding_status"].to_list()
    (Array(Float32, shape=(8,)), ['ok', 'skipped'])
    """
    if isinstance(df, pl.LazyFrame):
        return _embed_later(df, column, model, output, dimensions, inputs_per_request, options)
    made, call = split_options(options)
    with Client(**made) as client:
        result: Frame = client.embed(
            df,
            column=column,
            model=model,
            output=output,
            dimensions=dimensions,
            inputs_per_request=inputs_per_request,
            **cast(ResultOptions, call),
        )
    return result


def _complete_later(
    df: pl.LazyFrame,
    prompt: str,
    model: ModelOption,
    return_report: bool,
    options: Options,
) -> pl.LazyFrame:
    """``llm_complete`` of a LazyFrame: checked now, sent on a client of its own when it is
    collected."""
    made, call = split_options(options)
    job = Client(**made)._job(prompt, model, call, columns=df.collect_schema())

    def send(frame: pl.DataFrame) -> tuple[pl.DataFrame, RunReport]:
        with Client(**made) as client:
            return client.run(client._complete(frame, prompt, model, call))

    return complete_later(df, job, return_report, call, send=send)


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
    df: Any, /, prompt: str, *, model: ModelOption, **options: Unpack[Options]
) -> Estimate:
    """Plan a :func:`~llm_ops.llm_complete` job and price it; nothing is sent.

    Takes exactly what :func:`~llm_ops.llm_complete` takes (transport options such as
    ``concurrency`` are ignored, and no API key is needed), so the same keyword arguments
    price the job that ``llm_complete`` would run; cache hits are counted against the cache,
    which is read but never created. For a cascade (``model=[small, large]``) the counts are
    the first model's,
    and the cost range runs from every row answered by the first model to every row sent to
    every model.

    Examples
    --------
    >>> import polars as pl
    >>> from llm_ops import estimate
    >>> frame = pl.DataFrame({"text": ["fits well", "runs small", "fits well", None]})
    >>> plan = estimate(frame, prompt="Summarize: {text}", model="gpt-4o-mini",
    ...                 max_tokens=50, cache=False)
    >>> plan.requests, plan.skipped_rows, plan.output_tokens_max
    (2, 1, 100)
    >>> cascade = estimate(frame, prompt="Summarize: {text}", model=["gpt-4o-mini", "gpt-4o"],
    ...                    max_tokens=50, cache=False)
    >>> cascade.cost_min == plan.cost_min, cascade.cost_max > 10 * plan.cost_max
    (True, True)
    """
    made, call = split_options(options)
    # Nothing is sent, so no key is needed; the endpoint still names the cache keys.
    made["api_key"] = made.get("api_key") or os.environ.get("OPENAI_API_KEY") or "unused"
    return Client(**made).estimate(df, prompt=prompt, model=model, **call)
