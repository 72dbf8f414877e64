"""Validated arguments of one job, shared by every entry point."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import polars as pl
from pydantic import BaseModel

from . import _cache
from ._cache import Cache
from ._engine import EngineSettings
from ._escalate import EscalateOption, escalation_rule
from ._key import build_request, messages_for, normalize_base_url
from ._pricing import Budget, Price, PricingOption, price_for
from ._progress import Progress, resolve_progress
from ._schema import OutputSchema, output_schema
from ._semantic import SemanticCache
from ._template import Template, check_columns, parse_template
from .exceptions import ConfigError, MissingApiKeyError

CachePath = str | os.PathLike[str] | bool | None
ProgressOption = bool | Callable[[Progress], None] | None
DEFAULT_BASE_URL = "https://api.openai.com/v1"


@dataclass(frozen=True)
class Job:
    """Validated arguments of one call: what to send, where, and how."""

    prompt: Template
    system: Template | None
    model: str
    output: str
    base_url: str  # without its query, which goes in ``query``
    api_key: str = field(repr=False)
    cache: Cache | None
    params: dict[str, Any]
    settings: EngineSettings
    on_error: str
    flush_every: int
    flush_seconds: float
    progress: Callable[[Progress], None] | None
    schema: OutputSchema | None = None
    repair: bool = False
    rows_per_request: int = 1
    pack_tokens: int | None = None
    price: Price | None = None
    max_cost: float | None = None
    max_requests: int | None = None
    max_tokens_total: int | None = None
    models: tuple[str, ...] = ()  # a cascade's models, in order; model is the one in use
    prices: Mapping[str, Price | None] = field(default_factory=dict)
    escalate: pl.Expr | None = None
    semantic: SemanticCache | None = None
    semantic_price: Price | None = None
    query: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold a key

    def less_budget(self, cost: float, requests: int, tokens: int) -> Job:
        """This job with its budgets reduced by what was spent already: by earlier chunks,
        earlier models of a cascade, or the embeddings of the semantic cache."""
        if self.budget() is None:
            return self
        return dataclasses.replace(
            self,
            max_cost=None if self.max_cost is None else max(0.0, self.max_cost - cost),
            max_requests=None if self.max_requests is None else max(0, self.max_requests
                                                                    - requests),
            max_tokens_total=None if self.max_tokens_total is None else max(
                0, self.max_tokens_total - tokens),
        )

    def for_model(self, model: str) -> Job:
        """This job with ``model`` (one of a cascade's) in use."""
        return dataclasses.replace(self, model=model, price=self.prices.get(model))

    @property
    def cascade(self) -> bool:
        return len(self.models) > 1

    def budget(self) -> Budget | None:
        """A fresh budget for one dispatch, or ``None`` without limits."""
        budget = Budget(self.price, self.max_cost, self.max_requests, self.max_tokens_total)
        return budget if budget.limited else None
    @property
    def status_column(self) -> str:
        return f"{self.output}_status"

    @property
    def error_column(self) -> str:
        return f"{self.output}_error"

    @property
    def raw_column(self) -> str:
        return f"{self.output}_raw"

    @property
    def similar_to_column(self) -> str:
        return f"{self.output}_similar_to"

    @property
    def similarity_column(self) -> str:
        return f"{self.output}_similarity"

    @property
    def model_column(self) -> str:
        return f"{self.output}_model"

    @property
    def new_columns(self) -> tuple[str, ...]:
        """The columns this job adds, in order."""
        return added_columns(self.output, schema=self.schema is not None,
                             semantic=self.semantic is not None, cascade=self.cascade)


def added_columns(output: str, *, schema: bool, semantic: bool, cascade: bool) -> tuple[str, ...]:
    """The names of the columns a job adds: answer, status, error, then the optional ones."""
    return (
        output, f"{output}_status", f"{output}_error",
        *([f"{output}_raw"] if schema else []),
        *([f"{output}_similar_to", f"{output}_similarity"] if semantic else []),
        *([f"{output}_model"] if cascade else []),
    )


def _is_local(base_url: str) -> bool:
    host = urlsplit(base_url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


MAX_CONCURRENCY = 4096
MAX_ATTEMPTS = 100
MAX_SECONDS = 24 * 3600.0


def _positive_int(name: str, value: object, *, most: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if most is not None and value > most:
        raise ConfigError(f"{name} must be at most {most:,}, got {value:,}")
    return value


def _is_number(value: object) -> bool:
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and math.isfinite(value))


def _shown(url: str) -> str:
    """A URL as it may appear in a message: no user info, query or fragment."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(not a URL)"
    return f"{parts.scheme}://{host}{port}{parts.path}"


def endpoint_of(base_url: str | None) -> tuple[str, dict[str, str]]:
    """``base_url=`` (or ``OPENAI_BASE_URL``, or OpenAI): the URL without its query, and the
    query parameters, which are sent with every request but are never part of a key, stored
    or shown (gateways put keys there). Credentials in the URL are refused."""
    url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    if not isinstance(url, str):
        raise ConfigError(f"base_url must be a string URL, got {type(url).__name__}")
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018  (raises for a bad port)
    except ValueError as exc:
        raise ConfigError(f"base_url is not a valid URL ({exc}); write it like "
                          "'http://127.0.0.1:8765/v1'") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"base_url must be an http(s) URL like 'http://127.0.0.1:8765/v1', got "
                          f"{_shown(url)!r}")
    if parts.username is not None or parts.password is not None:
        raise ConfigError("base_url must not hold credentials (user:password@host): they would "
                          "be sent and kept in the clear. Pass the key as api_key= or "
                          "OPENAI_API_KEY.")
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")), query


def _check_api_key(key: object) -> None:
    if not isinstance(key, str):
        raise ConfigError(f"api_key must be a string, got {type(key).__name__}")
    if not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise ConfigError("api_key holds a space, a line break or a non-ASCII character, which "
                          "an HTTP header cannot carry; check for a stray newline or quote "
                          "(the key is not shown)")


def make_job(
    columns: pl.Schema,
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
    on_error: str = "null",
    flush_every: int = 1024,
    flush_seconds: float = 2.0,
    rpm: float | None = None,
    tpm: float | None = None,
    progress: bool | Callable[[Progress], None] | None = False,
    schema: type[BaseModel] | Mapping[str, Any] | None = None,
    repair: bool = False,
    rows_per_request: int = 1,
    pack_tokens: int | None = None,
    pricing: PricingOption = None,
    max_cost: float | None = None,
    max_requests: int | None = None,
    max_tokens_total: int | None = None,
    escalate: EscalateOption = None,
    semantic_cache: SemanticCache | None = None,
) -> Job:
    models = _models(model)
    if not isinstance(output, str) or not output:
        raise ConfigError(f"output must be a non-empty column name, got {output!r}")
    prompt_template = parse_template(prompt, what="prompt")
    check_columns(prompt_template, columns, what="prompt")
    system_template = None
    if system is not None:
        system_template = parse_template(system, what="system")
        check_columns(system_template, columns, what="system")
    structured = output_schema(schema) if schema is not None else None
    if semantic_cache is not None and not isinstance(semantic_cache, SemanticCache):
        raise ConfigError("semantic_cache takes a SemanticCache, e.g. "
                          "semantic_cache=SemanticCache('text-embedding-3-small', threshold=0.95)")
    added = added_columns(output, schema=structured is not None,
                          semantic=semantic_cache is not None, cascade=len(models) > 1)
    for column in added:
        if column in columns:
            raise ConfigError(
                f"the input already has a column {column!r}; choose another output= name or "
                "drop that column first"
            )
    _positive_int("concurrency", concurrency, most=MAX_CONCURRENCY)
    _positive_int("max_attempts", max_attempts, most=MAX_ATTEMPTS)
    _positive_int("flush_every", flush_every)
    if max_tokens is not None:
        _positive_int("max_tokens", max_tokens)
    for name, value, high in (("temperature", temperature, 2.0), ("top_p", top_p, 1.0)):
        if value is not None and (not _is_number(value) or not 0 <= value <= high):
            raise ConfigError(f"{name} must be a number between 0 and {high:g}, got {value!r}")
    for name, value in (("timeout", timeout), ("flush_seconds", flush_seconds)):
        if not _is_number(value) or not 0 < value <= MAX_SECONDS:
            raise ConfigError(f"{name} must be a positive number of seconds (at most "
                              f"{MAX_SECONDS:,.0f}), got {value!r}")
    for name, limit in (("rpm", rpm), ("tpm", tpm)):
        if limit is not None and (not _is_number(limit) or limit <= 0):
            raise ConfigError(f"{name} must be a positive number per minute, got {limit!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    stops = [stop] if isinstance(stop, str) else stop
    if stop is not None and (not isinstance(stops, list | tuple) or not stops or not all(
            isinstance(s, str) and s for s in stops)):
        raise ConfigError(f"stop must be a string or a list of non-empty strings, got {stop!r}")
    if on_error not in ("null", "raise"):
        raise ConfigError(f"on_error must be 'null' or 'raise', got {on_error!r}")

    url, query = endpoint_of(base_url)
    key = api_key or os.environ.get("OPENAI_API_KEY")
    if key:
        _check_api_key(key)
    elif _is_local(url):
        key = "no-key-needed"
    else:
        raise MissingApiKeyError(
            f"no API key for {normalize_base_url(url)}: pass api_key=... or set "
            "OPENAI_API_KEY (a local endpoint on 127.0.0.1 needs none)"
        )
    _positive_int("rows_per_request", rows_per_request)
    for name, cap in (("max_requests", max_requests), ("max_tokens_total", max_tokens_total)):
        if cap is not None:
            _positive_int(name, cap)
    prices = {name: price_for(name, pricing) for name in models}
    if max_cost is not None:
        if not _is_number(max_cost) or max_cost < 0:
            raise ConfigError(f"max_cost must be a number of dollars >= 0, got {max_cost!r}")
        embedding = [semantic_cache.model] if semantic_cache is not None else []
        for name, price in {**prices, **{m: price_for(m, pricing) for m in embedding}}.items():
            if price is None:
                raise ConfigError(f"max_cost needs a price for model {name!r}, which has none; "
                                  "pass pricing={'" + name + "': Price(...)}")
    if pack_tokens is not None:
        _positive_int("pack_tokens", pack_tokens)
    if rows_per_request > 1 and structured is not None:
        raise ConfigError("rows_per_request cannot be combined with schema= yet; use one or "
                          "the other")
    if repair and structured is None:
        raise ConfigError("repair=True only applies to structured output; pass schema= too")
    cache_path = _cache.resolve_cache_path(cache)
    if semantic_cache is not None and cache_path is None:
        raise ConfigError("the semantic cache lives in the cache database: pass a cache path "
                          "instead of cache=False, or drop semantic_cache=")
    rule = (escalation_rule(escalate, columns, output, structured, len(models))
            if escalate is not None else None)
    params = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
              "seed": seed, "stop": stop if isinstance(stop, str | None) else list(stop),
              "response_format": structured.response_format() if structured else None}
    return Job(
        prompt=prompt_template,
        system=system_template,
        model=models[0],
        output=output,
        base_url=url,
        api_key=key,
        cache=None if cache_path is None else Cache(cache_path),
        params={k: v for k, v in params.items() if v is not None},
        settings=EngineSettings(
            concurrency=concurrency, max_attempts=max_attempts, timeout=float(timeout),
            rpm=rpm, tpm=tpm,
        ),
        on_error=on_error,
        flush_every=flush_every,
        flush_seconds=flush_seconds,
        progress=resolve_progress(progress),
        schema=structured,
        repair=repair,
        rows_per_request=rows_per_request,
        pack_tokens=pack_tokens,
        price=prices[models[0]],
        max_cost=max_cost,
        max_requests=max_requests,
        max_tokens_total=max_tokens_total,
        models=models,
        prices=prices,
        escalate=rule,
        semantic=semantic_cache,
        semantic_price=price_for(semantic_cache.model, pricing) if semantic_cache else None,
        query=query,
    )


def _models(model: object) -> tuple[str, ...]:
    """``model=``: one name, or a cascade's names from the cheapest to the strongest."""
    names = [model] if isinstance(model, str) else model
    if not isinstance(names, Sequence) or not names or not all(
            isinstance(name, str) and name.strip() for name in names):
        raise ConfigError(f"model must be a model name such as 'gpt-4o-mini', or a list of names "
                          f"for a cascade such as ['gpt-4o-mini', 'gpt-4o'], got {model!r}")
    if len(set(names)) != len(names):
        raise ConfigError(f"a cascade names each model once, got {list(names)!r}")
    return tuple(names)


def request_for(job: Job, system: str | None, prompt: str) -> dict[str, Any]:
    return build_request(
        endpoint=job.base_url, model=job.model, messages=messages_for(system, prompt),
        params=job.params,
    )
