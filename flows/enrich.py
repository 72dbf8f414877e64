"""Enrich a Parquet table with one LLM answer per row: Parquet in, Parquet out.

Run once on the sample reviews against the bundled local endpoint::

    python flows/enrich.py

or on any table and endpoint, with a flag per parameter (``--help`` lists them)::

    python flows/enrich.py --input data.parquet --output out.parquet \\
        --base-url https://api.openai.com/v1 --model gpt-4o-mini --prompt 'Summarize: {text}'

Serve it as a deployment (then trigger runs from the UI or ``prefect deployment run``)::

    python flows/enrich.py serve

The work is split into retryable tasks over files in a work directory next to the output:
``plan`` (read in batches, render, key, dedupe, anti-join the cache, write chunk files),
one ``send-chunk`` task per chunk of distinct requests (never one per row), and ``write``
(join answers back batch by batch, write row groups). Answers live in the DuckDB cache, not in
Prefect, so a rerun after a crash or cancellation sends only what the cache lacks.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from types import UnionType
from typing import Any, Literal, Union, cast, get_args, get_origin
from urllib.parse import urlsplit
from uuid import UUID

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.blocks.system import Secret
from prefect.cache_policies import NO_CACHE
from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from llm_ops import (
    SETTINGS,
    Client,
    ClientOptions,
    JobAbortedError,
    LlmOpsError,
    Options,
    RunReport,
    options_from_settings,
    parse_duration,
)
from llm_ops.exceptions import Words
from llm_ops.tables import BatchPart, Counters, Table, TablePlan, Written, media_folders

STARTUP_SECONDS = 180  # for Prefect's temporary API server, when the main job starts one
DEMO_PROMPT = "Summarize this customer review in one sentence:\n\n{text}"

# Prefect's API stores a flow run's parameters as it receives them, before the flow (and
# Prefect's validation of its parameters) runs, so a key in base_url must be refused before
# the API takes it: in Python by EnrichConfig(...), and for a deployment's runs by the API,
# which checks them against the flow's parameter schema, where this pattern sits. Hence one
# pattern for both, in the regex dialect Python and JavaScript share, anchored since JSON
# Schema searches. The engine sends a URL's query with every request (where gateways take
# keys), so no query passes but Azure's `api-version`: a version, not a secret.
BASE_URL_PATTERN = (
    r"^[^@/?#]*//[^@/?#]*"  # scheme and host, without user:password@
    r"(/[^?#]*)?"  # path
    r"(\?api-version=[A-Za-z0-9._-]+)?$"
)
# Header names that hold credentials: their values come from Secret blocks (header_secrets),
# never from a parameter. Case-insensitive without an inline flag, which JavaScript lacks.
_CREDENTIAL_WORDS = (
    "auth", "key", "token", "secret", "passw", "cookie", "signature", "credential", "session"
)  # fmt: skip
HEADER_NAME_PATTERN = (
    r"^(?![\s\S]*("
    + "|".join("".join(f"[{c.upper()}{c}]" for c in word) for word in _CREDENTIAL_WORDS)
    + "))"
)
PROXY_PATTERN = "^[^@]*$"  # no user:password@: the proxy's credentials go in HTTPS_PROXY
_WHERE_THE_KEY_GOES = (
    "Prefect stores a flow run's parameters: put the key in OPENAI_API_KEY or in a Prefect "
    "Secret block named by api_key_secret"
)


def _why_refused(url: str) -> str:
    """What is wrong with a refused base_url, without a word of it: a failed run's error is
    stored and shown."""
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return "base_url is not a URL; write it like 'https://host/v1'"
    if "@" in netloc:
        return f"base_url must not hold credentials (user:password@host). {_WHERE_THE_KEY_GOES}."
    if "?" in url.partition("#")[0]:
        return (
            f"base_url must have no query but '?api-version=<version>'. {_WHERE_THE_KEY_GOES} "
            "(for a gateway that takes its key only in the query, leave base_url unset and "
            "set OPENAI_BASE_URL, query and all, where the flow runs)."
        )
    if "#" in url:
        return "base_url must have no fragment ('#...')."
    return "base_url must be an http(s) URL like 'https://host/v1'."


class EnrichConfig(BaseModel):
    """Parameters of :func:`enrich_table`. The API key is never a parameter: it comes from
    ``OPENAI_API_KEY`` or from the Prefect Secret block named by ``api_key_secret``."""

    # pydantic's errors quote the input, and a refused base_url's input is a key.
    model_config = ConfigDict(hide_input_in_errors=True)

    input: str = Field("data/womens_clothing_reviews.parquet", description="Parquet path or glob")
    output: str = Field("output/reviews_enriched.parquet", description="Parquet file to write")
    prompt: str = Field(DEMO_PROMPT, description="template with {column} references")
    model: str | list[str] = Field(
        "sim", description="a model, or a cascade's models from the cheapest to the strongest"
    )
    escalate: str | None = Field(
        None, description="with a cascade: SQL condition sending an answered row to the next model"
    )
    output_column: str = Field(
        "summary",
        description="name of the answer column; its status and error columns are named after it",
    )
    system: str | None = Field(None, description="system message, a template like prompt")
    base_url: str | None = Field(
        None,
        description="default: OPENAI_BASE_URL, then OpenAI; no credentials and no query but "
        "'?api-version=<version>' (the key: OPENAI_API_KEY or api_key_secret)",
        json_schema_extra={"pattern": BASE_URL_PATTERN},
    )
    endpoint_name: str | None = Field(
        None, description="the endpoint's name in cache keys instead of its URL"
    )
    api_key_secret: str | None = Field(None, description="name of a Prefect Secret block")
    headers: dict[str, str] | None = Field(
        None,
        description="headers sent with every request, e.g. {'X-Tenant': 'acme'}; none that "
        "holds a credential (see header_secrets)",
        json_schema_extra={"propertyNames": {"pattern": HEADER_NAME_PATTERN}},
    )
    header_secrets: dict[str, str] | None = Field(
        None,
        description="headers whose values are in Prefect Secret blocks, header name to block "
        "name, e.g. {'api-key': 'azure-openai-key'} for Azure OpenAI",
    )
    verify: bool | str = Field(
        True, description="a CA bundle's path to check the server's certificate with; false: none"
    )
    cert: str | None = Field(None, description="client certificate (PEM) for mutual TLS")
    cert_key: str | None = Field(None, description="its key, if not in the cert file")
    proxy: str | None = Field(
        None,
        description="http(s) proxy URL without credentials (a proxy that asks for them: "
        "HTTPS_PROXY where the flow runs); default: HTTPS_PROXY, HTTP_PROXY, ALL_PROXY",
        json_schema_extra={"pattern": PROXY_PATTERN},
    )
    cache: str | None = Field(
        None,
        description="DuckDB cache file; default: LLM_OPS_CACHE, then ~/.cache/llm-ops/cache.duckdb",
    )
    max_age: str | None = Field(
        None,
        description="reuse cached answers at most this old: 1d, 6h, 30m, 45s or seconds; an "
        "older one is sent again and the new answer kept beside it (default: any age)",
    )
    concurrency: int | None = Field(
        None, ge=1, description="most requests in flight (default: found while the job runs)"
    )
    rpm: float | None = Field(None, description="requests per minute to stay under")
    tpm: float | None = Field(None, description="tokens per minute to stay under")
    max_tokens: int | None = Field(None, description="most tokens per answer")
    temperature: float | None = Field(None, description="sampling temperature")
    images: list[str] | None = Field(
        None,
        description="columns of images (bytes, or paths and URLs) sent with each row's prompt",
    )
    image_detail: Literal["low", "high", "auto"] | None = Field(
        None, description="with images: how closely the model looks (part of the cache key)"
    )
    documents: list[str] | None = Field(
        None, description="columns of PDFs (bytes or paths) sent with each row's prompt"
    )
    documents_as: Literal["file", "pages"] | None = Field(
        None, description="with documents: 'file' parts (default) or page images ('pages')"
    )
    max_pages: int | None = Field(
        None, ge=1, description="with documents: the most pages a PDF may have (default 100)"
    )
    max_pixels: int | None = Field(
        None,
        ge=1,
        description="with images: the most pixels an image may have, read from its header "
        "(default: 89478485, Pillow's limit); a larger one's row is rejected",
    )
    media_folders: list[str] | None = Field(
        None,
        description="with images or documents: the folders whose files a path in the table "
        "may name, after symlinks (default: the input's folder); a path elsewhere is its "
        "row's rejected status",
    )
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = Field(
        None, description="how long a reasoning model thinks before it answers"
    )
    max_completion_tokens: int | None = Field(
        None, ge=1, description="most tokens per answer, a reasoning model's thinking included"
    )
    keep_reasoning: bool = Field(
        False,
        description="add <output>_reasoning: a reasoning model's thinking beside each answer "
        "(not sent, not part of the cache key)",
    )
    timeout: float | None = Field(None, gt=0, description="seconds per attempt (default: 60)")
    max_attempts: int | None = Field(None, ge=1, description="attempts per request (default: 5)")
    chunk_size: int = Field(5_000, ge=1, description="distinct requests per send-chunk task")
    rows_per_read: int = Field(100_000, ge=1, description="rows per read batch and row group")
    on_error: Literal["null", "raise"] = Field(
        "null",
        description="null: failed rows get a null answer and the run succeeds; raise: the run "
        "fails when any row failed, after the output is written and every answer cached",
    )
    pricing: list[str] | None = Field(
        None,
        description="prices as MODEL=IN,OUT, $ per 1M input and output tokens (a third number: "
        "$ per request), once per model; IN,OUT for every model; or free (default: the built-in "
        "price of a known model)",
    )
    max_cost: float | None = Field(None, description="stop sending past this many dollars")
    max_requests: int | None = Field(None, description="stop sending past this many requests")
    semantic_cache: str | None = Field(
        None, description="embedding model: reuse answers of similar cached requests"
    )
    semantic_cache_threshold: float = Field(
        0.95, gt=0, le=1, description="cosine similarity from which a similar answer is reused"
    )
    batch: bool = Field(
        False, description="through the provider's Batch API, at half the price, within 24 h"
    )
    on_expired: Literal["resubmit", "live"] | None = Field(
        None, description="with batch mode: what an expired batch's unanswered part does"
    )
    batch_poll_seconds: float | None = Field(
        None, gt=0, description="with batch mode: first wait between polls (default 5 s)"
    )
    send_order: Literal["prefix", "input"] | None = Field(
        None,
        description="'prefix' (default): requests sharing a prefix go out together, for the "
        "server's prefix cache; 'input': unsorted",
    )
    ray_address: str | None = Field(
        None,
        description="send the chunks on a Ray cluster: 'local' (started on this machine), "
        "'auto' or 'ray://host:10001'; with none, on this machine as usual",
    )
    ray_workers: int | None = Field(
        None, ge=1, description="with Ray: chunks sent at once (a local cluster's CPUs)"
    )

    @field_validator("base_url")
    @classmethod
    def _no_credentials(cls, url: str | None) -> str | None:
        if url is None or re.search(BASE_URL_PATTERN, url):
            return url
        raise ValueError(_why_refused(url))

    @field_validator("max_age")
    @classmethod
    def _a_duration(cls, age: str | None) -> str | None:
        if age is not None:
            parse_duration(age)  # a ConfigError is a ValueError: pydantic says which field
        return age

    @field_validator("headers")
    @classmethod
    def _no_credential_headers(cls, headers: dict[str, str] | None) -> dict[str, str] | None:
        for name in headers or {}:
            if not re.search(HEADER_NAME_PATTERN, name):
                raise ValueError(
                    f"the header {name!r} holds a credential, and Prefect stores a flow run's "
                    "parameters: put its value in a Prefect Secret block and name it in "
                    "header_secrets instead"
                )
        return headers

    @field_validator("proxy")
    @classmethod
    def _no_proxy_credentials(cls, proxy: str | None) -> str | None:
        if proxy is not None and not re.search(PROXY_PATTERN, proxy):
            raise ValueError(
                "proxy must hold no credentials (user:password@), as Prefect stores a flow "
                "run's parameters: set HTTPS_PROXY (or HTTP_PROXY) where the flow runs instead"
            )
        return proxy

    def settings(self) -> dict[str, Any]:
        """The job's settings by their names (see :data:`llm_ops.SETTINGS`), for
        :func:`llm_ops.options_from_settings`: fields named like a setting pass on as they
        are; the column name, the key and the secret headers are put in."""
        names = {*Options.__optional_keys__, *SETTINGS, "model", "semantic_cache_threshold"}
        settings = {
            name: value
            for name, value in self.model_dump().items()
            if name in names and value is not None
        }
        settings["output"] = self.output_column
        settings["media_folders"] = media_folders(self.input, settings)
        settings["progress"] = False  # the flow reports through its artifacts and logs
        if self.api_key_secret:
            settings["api_key"] = _secret(self.api_key_secret)
        if self.header_secrets:
            secrets = {name: _secret(block) for name, block in self.header_secrets.items()}
            settings["headers"] = {**(self.headers or {}), **secrets}
        if self.cert is not None and self.cert_key is not None:
            settings["cert"] = (self.cert, self.cert_key)
        return settings


def _secret(block: str) -> str:
    """The value of the Prefect Secret block named ``block``."""
    return cast("Secret[str]", Secret.load(block)).get()  # sync in a sync flow


_clients: dict[str, Client] = {}


def _client(settings: dict[str, Any]) -> Client:
    """One client per process and settings, so the endpoint's limits learned in one chunk
    task hold in the next."""
    key = json.dumps(settings, sort_keys=True, default=str)
    if key not in _clients:
        client = _clients[key] = Client(**options_from_settings(settings))
        atexit.register(client.close)
    return _clients[key]


def _of_client(setting: str) -> bool:
    """Whether a setting is the client's (the endpoint, the cache, the limits)."""
    option = SETTINGS[setting][0] if setting in SETTINGS else setting
    return option in ClientOptions.__optional_keys__


_PARAMETER_OF_SETTING = {
    "api_key": "api_key_secret",
    "headers": "header_secrets",
    "output": "output_column",
}


class ParameterWords(Words):
    """Settings named in an error as the flow's parameters: the API key and credential
    headers are the Secret blocks that hold them, a URL is ``base_url``."""

    def name(self, setting: str) -> str:
        return _PARAMETER_OF_SETTING.get(setting, setting)

    def set_to(self, setting: str, value: str | None) -> str:
        return f"{self.name(setting)}={value!r}" if value else f"{self.name(setting)}=..."


PARAMETER_WORDS = ParameterWords()


@contextmanager
def _in_parameter_words() -> Iterator[None]:
    """An llm-ops error raised within names the flow's parameters, in the run's log and
    state, not Python's options."""
    try:
        yield
    except LlmOpsError as exc:
        exc.say_in(PARAMETER_WORDS)
        raise


def open_table(config: EnrichConfig) -> Table:
    """The job the config describes; raises ``ConfigError`` for what can be checked before
    sending."""
    settings = config.settings()
    made = {name: settings.pop(name) for name in list(settings) if _of_client(name)}
    options = options_from_settings(settings)
    return Table(
        _client(made),
        config.input,
        config.output,
        prompt=config.prompt,
        model=options.pop("model"),
        rows_per_read=config.rows_per_read,
        chunk_size=config.chunk_size,
        **options,
    )


@task(name="plan", cache_policy=NO_CACHE, retries=1)
def plan_requests(config: EnrichConfig) -> TablePlan:
    with _in_parameter_words():
        return open_table(config).plan()


def _retry_unless_aborted(task: Any, task_run: Any, state: Any) -> bool:
    # A refused key or an empty quota will not fix itself on retry.
    return not isinstance(state.result(raise_on_failure=False), JobAbortedError)


@task(
    name="send-chunk",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=_retry_unless_aborted,
    task_run_name="send-chunk-{number}",
)
def send_chunk(config: EnrichConfig, chunk: str, number: int, spent: Counters) -> Counters:
    with _in_parameter_words():
        return open_table(config).run_chunk(chunk, spent=spent)


@task(name="cascade", cache_policy=NO_CACHE, retries=1, retry_condition_fn=_retry_unless_aborted)
def cascade_table(config: EnrichConfig) -> RunReport:
    """The whole table through the cascade, batch by batch; a retry re-sends only what the
    cache lacks."""
    with _in_parameter_words():
        return open_table(config).run_cascade()


@task(name="write", cache_policy=NO_CACHE, retries=1)
def write_output(config: EnrichConfig) -> Written:
    with _in_parameter_words():
        return open_table(config).write()


def _dollars(amount: float | None) -> float | str:
    return "unknown" if amount is None else round(amount, 6)


def report_table(report: RunReport) -> list[dict[str, Any]]:
    """The run report as rows of (figure, value) for a Prefect table artifact."""
    figures = {
        "rows": report.rows,
        "distinct requests": report.distinct_requests,
        "cache hits": report.cache_hits,
        "requests sent": report.requests_sent,
        "retries": report.retries,
        **{f"rows {status}": n for status, n in report.statuses.items()},
        "prompt tokens": report.prompt_tokens,
        "completion tokens": report.completion_tokens,
        "cost ($)": _dollars(report.cost),
        "saved in all ($)": _dollars(report.cost_saved),
        **{
            f"saved by {lever} (requests, $)": f"{saving.requests:,}, {_dollars(saving.cost)}"
            for lever, saving in report.savings.items()
        },
        "wall seconds": round(report.wall_seconds, 2),
        "cache": report.cache or "off",
    }
    hint = report.price_hint()
    if hint is not None:
        figures["cost unknown"] = hint
    return [{"figure": name, "value": value} for name, value in figures.items()]


@flow(name="enrich-table")
def enrich_table(config: EnrichConfig | None = None) -> dict[str, Any]:
    """Add ``config.output_column`` (+ ``_status``, ``_error``) to every row of a Parquet input."""
    with _in_parameter_words():
        return _enrich_table(config or EnrichConfig())


def _enrich_table(config: EnrichConfig) -> dict[str, Any]:
    logger = get_run_logger()
    started_at = datetime.now(UTC)
    table = open_table(config)  # bad parameters fail the run here, before anything is written
    logger.info(
        "enriching %d file(s) matching %s with model %s",
        len(table.files),
        config.input,
        config.model,
    )

    if table.cascade:
        report = cascade_table(config)
        return _finish(config, report)

    plan = plan_requests(config)
    logger.info(
        "%d rows, %d distinct requests, %d cached, %d to send in %d chunk(s)",
        plan.rows,
        plan.distinct,
        plan.cache_hits,
        plan.misses,
        len(plan.chunks),
    )
    progress = cast(
        UUID,
        create_progress_artifact(  # sync in a sync flow
            0.0 if plan.chunks else 100.0, key="enrich-progress", description="share of chunks sent"
        ),
    )
    submissions: set[str] = set()
    if table.job.batching is not None:
        parts = [part for chunk in plan.chunks for part in submit_batches(config, chunk)]
        submissions = {part.job_id for part in parts}
        _publish_batches(parts, "submitted")
    counters = Counters()
    if config.ray_address is not None:
        counters = send_chunks_on_ray(config, plan.chunks, progress)
    for number, chunk in enumerate(plan.chunks if config.ray_address is None else [], start=1):
        counters.add(send_chunk(config, chunk, number, counters))
        update_progress_artifact(progress, 100.0 * number / len(plan.chunks))
        logger.info(
            "chunk %d/%d done: %d requests sent so far", number, len(plan.chunks), counters.sent
        )

    written = write_output(config)
    report = table.finish(plan, counters, written, started_at=started_at)
    if submissions:
        ended = [part for part in table.client.batches() if part.job_id in submissions]
        _publish_batches(ended, "at the end")
    return _finish(config, report)


@task(
    name="send-chunks-on-ray",
    cache_policy=NO_CACHE,
    retries=1,
    retry_condition_fn=_retry_unless_aborted,
)
def send_chunks_on_ray(config: EnrichConfig, chunks: list[str], progress: UUID) -> Counters:
    """Every chunk as a Ray task on the cluster, under one rate limit; answers are merged
    into the cache as chunks end, so a retry or a rerun sends only what is still missing."""
    from llm_ops.ray import connect, send_chunks

    logger = get_run_logger()

    table = open_table(config)
    started = time.perf_counter()

    def on_chunk(done: int, total: int, counters: Counters) -> None:
        update_progress_artifact(progress, 100.0 * done / total)
        cost = table.cost(counters)
        logger.info(
            "chunk %d/%d done on Ray: %d requests (%.0f/s), %d rate limited, %d retries, %s",
            done,
            total,
            counters.sent,
            counters.sent / (time.perf_counter() - started),
            counters.rate_limited,
            counters.retries,
            "cost unknown" if cost is None else f"${cost:,.4f} so far",
        )

    connect(config.ray_address or "local", config.ray_workers)
    return send_chunks(table, chunks, workers=config.ray_workers, on_chunk=on_chunk)


@task(
    name="submit-batches",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=_retry_unless_aborted,
)
def submit_batches(config: EnrichConfig, chunk: str) -> list[BatchPart]:
    """Submit a chunk's requests as provider batches and record them; a retry or a rerun
    submits nothing that a recorded batch carries. ``send-chunk`` then waits for them."""
    return open_table(config).submit(chunk)


def _publish_batches(parts: list[BatchPart], when: str) -> None:
    rows = [
        {
            "submission": p.job_id,
            "part": p.part,
            "batch": p.batch_id or "",
            "state": p.state,
            "requests": p.requests,
        }
        for p in parts
    ]
    create_table_artifact(rows, key="enrich-batches", description=f"provider batches, {when}")


def _finish(config: EnrichConfig, report: RunReport) -> dict[str, Any]:
    """Publish the report, and fail the run when rows failed and ``on_error`` is "raise"."""
    create_table_artifact(
        report_table(report),
        key="enrich-report",
        description=f"llm-ops run {report.run_id}: {config.input}",
    )
    get_run_logger().info("wrote %s\n%s", config.output, report)
    if config.on_error == "raise" and report.failed_rows:
        raise LlmOpsError(
            f"{report.failed_rows} of {report.rows} rows failed (on_error='raise'); the output "
            "was written and every answer is cached, so a rerun sends only the failed rows"
        )
    return asdict(report)


# The command line: a flag per parameter that holds one text, number or choice (the headers,
# their secrets and verify are a deployment's, set in Prefect), with the parameter's description
# as its help but where the command line differs.
_CLI_SKIPPED = {"headers", "header_secrets", "verify"}
_CLI_HELP = {
    "base_url": "endpoint; the key comes from OPENAI_API_KEY. Without it, the bundled local "
    "simulator is started and answers (the demo). No credentials and no query but "
    "'?api-version=<version>'",
    "model": "model name; again for a cascade, from the cheapest to the strongest",
    "concurrency": "most requests in flight (default: found while the job runs; 64 with the "
    "local simulator)",
    "endpoint_name": "the endpoint's name in cache keys instead of its URL (default: the URL; "
    "the simulator's name with the local simulator)",
}
_CLI_METAVARS = {
    "input": "FILE",
    "output": "FILE",
    "prompt": "TEMPLATE",
    "model": "MODEL",
    "escalate": "SQL",
    "output_column": "NAME",
    "system": "TEMPLATE",
    "base_url": "URL",
    "endpoint_name": "NAME",
    "api_key_secret": "BLOCK",
    "cert": "PEM",
    "cert_key": "PEM",
    "proxy": "URL",
    "cache": "FILE",
    "timeout": "SECONDS",
    "max_tokens": "TOKENS",
    "temperature": "TEMPERATURE",
    "batch_poll_seconds": "SECONDS",
    "semantic_cache": "EMBEDDING_MODEL",
    "semantic_cache_threshold": "COSINE",
    "ray_address": "ADDRESS",
    "pricing": "MODEL=IN,OUT",
    "max_cost": "USD",
    "images": "COLUMN",
    "documents": "COLUMN",
    "media_folders": "FOLDER",
}


def command_line() -> argparse.ArgumentParser:
    """``python flows/enrich.py``'s arguments: a flag per :class:`EnrichConfig` field."""
    parser = argparse.ArgumentParser(
        prog="python flows/enrich.py",
        description="Enrich a Parquet table with one LLM answer per row, as a Prefect flow run. "
        "Without arguments: the demo, the sample reviews summarised by the bundled local "
        "simulator.",
        epilog="python flows/enrich.py serve: serve the flow as the deployment 'reviews' "
        "(runs are then triggered from the Prefect UI or 'prefect deployment run').",
    )
    for name, field in EnrichConfig.model_fields.items():
        union = get_origin(field.annotation) in (Union, UnionType)
        kinds = [k for k in get_args(field.annotation) if k is not type(None)] if union else []
        kinds = kinds or [field.annotation]
        if name in _CLI_SKIPPED:
            continue
        how: dict[str, Any]
        if name in ("model", "pricing", "images", "documents", "media_folders"):
            how = {"action": "append"}
        elif kinds == [bool]:
            how = {"action": "store_true", "default": None}
        elif len(kinds) == 1 and get_origin(kinds[0]) is Literal:
            how = {"choices": list(get_args(kinds[0]))}
        elif len(kinds) == 1 and kinds[0] in (str, int, float):
            how = {"type": kinds[0], "metavar": _CLI_METAVARS.get(name, "N")}
        else:
            raise TypeError(f"EnrichConfig.{name}: no flag for {field.annotation}")
        text = _CLI_HELP.get(name) or field.description or ""
        if field.default not in (None, False) and "default" not in text:
            text += f" (default: {field.default})".replace("\n", "\\n")
        if how.get("action") != "store_true":
            how = {"metavar": _CLI_METAVARS.get(name), **how}
        parser.add_argument("--" + name.replace("_", "-"), **how, help=text.replace("%", "%%"))
    return parser


def config_of(argv: list[str]) -> EnrichConfig:
    """The flow's parameters from the command line; exits with a usage error for wrong ones."""
    parser = command_line()
    parsed = vars(parser.parse_args(argv))
    given = {name: value for name, value in parsed.items() if value is not None}
    if len(given.get("model", ())) == 1:
        given["model"] = given["model"][0]
    try:
        return EnrichConfig(**given)
    except ValidationError as exc:
        parser.error(
            "; ".join(
                f"--{str(error['loc'][0]).replace('_', '-')}: {error['msg']}"
                for error in exc.errors()
            )
        )


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"]:
        # The API then refuses a run whose base_url holds a key before storing its parameters.
        enrich_table.serve(name="reviews", tags=["llm-ops"], enforce_parameter_schema=True)
        return
    config = config_of(argv)
    # Prefect's temporary API server can take longer than its default 20 s on a busy machine.
    with temporary_settings({PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: STARTUP_SECONDS}):
        if config.base_url is not None:
            _run(config)
            return
        from llm_ops.testing import LocalEndpoint

        # Any free port: the simulator's name, not its URL, is what the cache keys hold.
        with LocalEndpoint() as endpoint:
            simulated = {
                "base_url": endpoint.base_url,
                "endpoint_name": config.endpoint_name or endpoint.name,
                "concurrency": config.concurrency or 64,
            }
            _run(config.model_copy(update=simulated))


def _run(config: EnrichConfig) -> None:
    try:
        enrich_table(config)
    except RuntimeError as exc:
        if "ephemeral Prefect API server" not in str(exc):
            raise
        sys.exit(
            f"Prefect's temporary API server did not start within {STARTUP_SECONDS} s (a "
            "busy machine?). Run the command again, or start a server once with "
            "'prefect server start' and set PREFECT_API_URL=http://127.0.0.1:4200/api."
        )


if __name__ == "__main__":
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    main(sys.argv[1:])
