"""Every option of a job, defined once, and the typed parts they become.

:class:`Options` is the one definition of the keyword options that ``llm_complete``,
``llm_complete_async``, ``estimate`` and :meth:`llm_ops.Client.complete` take after
``prompt`` and ``model``: what a :class:`~llm_ops.Client` is made with
(:class:`ClientOptions`) and what each call says (:class:`CallOptions`). The CLI, the flow and
the SQL functions pass their settings on by these names.

:func:`make_job` turns a call's options into a :class:`Job`: the request spec (what is keyed),
the columns it adds, and the levers (packing, budget, cascade, semantic cache) that the
pipeline composes around the path. Each part checks itself, so a bad option is a
:class:`~llm_ops.ConfigError` before anything is sent.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, TypedDict, cast

import polars as pl
from pydantic import BaseModel

from ._escalate import EscalateOption, check_escalation, escalation_rule
from ._order import SEND_ORDERS, SendOrder
from ._pricing import Price, PricingOption, SpendingCap, price_for
from ._progress import Progress, ProgressCallback, resolve_progress
from ._schema import output_schema
from ._semantic import SemanticCache
from ._spec import Connection, Limits, RequestSpec, is_number, positive_int, seconds
from ._status import STATUS_DTYPE
from ._template import check_columns, parse_template, render
from .exceptions import ConfigError

CachePath = str | os.PathLike[str] | bool | None
ProgressOption = bool | Callable[[Progress], None] | None
SchemaOption = type[BaseModel] | Mapping[str, Any] | None
ModelOption = str | Sequence[str]


class ClientOptions(TypedDict, total=False):
    """What a :class:`~llm_ops.Client` is made with: the endpoint, the cache and the limits,
    shared by every job it runs."""

    base_url: str | None
    api_key: str | None
    endpoint_name: str | None
    headers: Mapping[str, str] | None
    verify: bool | str | os.PathLike[str] | ssl.SSLContext
    cert: str | os.PathLike[str] | tuple[str, str] | None
    proxy: str | None
    cache: CachePath
    concurrency: int
    max_attempts: int
    timeout: float
    rpm: float | None
    tpm: float | None
    max_retry_after: float
    max_response_bytes: int
    flush_every: int
    flush_seconds: float
    merge_wait: float


class ResultOptions(TypedDict, total=False):
    """What every operator's call says about failed rows and progress."""

    on_error: Literal["null", "raise"]
    progress: ProgressOption


class AskOptions(ResultOptions, total=False):
    """:class:`RequestOptions` but ``schema``: what ``llm_extract`` takes besides the schema,
    which it names as a parameter of its own (positional, as ``llm_classify``'s labels)."""

    system: str | None
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    seed: int | None
    stop: str | list[str] | None
    repair: bool
    rows_per_request: int
    pack_tokens: int | None
    pricing: PricingOption
    max_cost: float | None
    max_requests: int | None
    max_tokens_total: int | None
    escalate: EscalateOption
    semantic_cache: SemanticCache | None
    mode: Literal["live", "batch"]
    on_expired: Literal["resubmit", "live"]
    batch_max_requests: int
    batch_max_bytes: int
    batch_poll_seconds: float
    send_order: SendOrder


class RequestOptions(AskOptions, total=False):
    """What one completion call says besides its prompt, model and output column: what the
    ``llm`` expression namespace takes too (where the output is the expression's name)."""

    schema: SchemaOption


class CallOptions(RequestOptions, total=False):
    """What one completion call says besides its prompt and model."""

    output: str


class Options(ClientOptions, CallOptions, total=False):
    """Every keyword option of ``llm_complete`` (see its docstring for what each means)."""


class EmbedOptions(ClientOptions, ResultOptions, total=False):
    """The keyword options of ``llm_embed`` besides its own."""


CLIENT_OPTIONS = frozenset(ClientOptions.__optional_keys__)
LIMIT_OPTIONS = CLIENT_OPTIONS & {item.name for item in fields(Limits)}
"""The client options that are fields of :class:`~llm_ops._spec.Limits` (which holds their
defaults and checks them)."""
CONNECTION_OPTIONS = CLIENT_OPTIONS & {item.name for item in fields(Connection)}
"""The client options that are fields of :class:`~llm_ops._spec.Connection`."""


def connection_of(options: Mapping[str, Any]) -> Connection:
    """The :class:`~llm_ops._spec.Connection` of a client's ``options``, checked (an option
    given as ``None`` keeps its default)."""
    given = {k: options[k] for k in CONNECTION_OPTIONS if options.get(k) is not None}
    return Connection(**given)


def cache_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The cache file's options among ``options``, checked; the others keep the defaults of
    :class:`~llm_ops.Cache`."""
    given = {k: options[k] for k in ("flush_every", "flush_seconds", "merge_wait") if k in options}
    if "flush_every" in given:
        positive_int("flush_every", given["flush_every"])
    if "flush_seconds" in given:
        given["flush_seconds"] = seconds("flush_seconds", given["flush_seconds"])
    wait = given.get("merge_wait")
    if wait is not None and not (is_number(wait) and wait == 0):  # 0: do not wait for a reader
        given["merge_wait"] = seconds("merge_wait", wait)
    return given


def split_options(options: Mapping[str, Any]) -> tuple[ClientOptions, CallOptions]:
    """``options`` as (what the client is made with, the rest)."""
    unknown = set(options) - Options.__optional_keys__ - EmbedOptions.__optional_keys__
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(sorted(unknown))}; see "
            "help(llm_ops.llm_complete) for the options"
        )
    client = {k: v for k, v in options.items() if k in CLIENT_OPTIONS}
    call = {k: v for k, v in options.items() if k not in CLIENT_OPTIONS}
    return cast(ClientOptions, client), cast(CallOptions, call)


@dataclass(frozen=True)
class Columns:
    """The columns a job adds: answer, status, error, then the optional ones."""

    output: str = "completion"
    structured: bool = False
    semantic: bool = False
    cascade: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.output, str) or not self.output:
            raise ConfigError(f"output must be a non-empty column name, got {self.output!r}")

    @property
    def status(self) -> str:
        return f"{self.output}_status"

    @property
    def error(self) -> str:
        return f"{self.output}_error"

    @property
    def raw(self) -> str:
        return f"{self.output}_raw"

    @property
    def similar_to(self) -> str:
        return f"{self.output}_similar_to"

    @property
    def similarity(self) -> str:
        return f"{self.output}_similarity"

    @property
    def model(self) -> str:
        return f"{self.output}_model"

    @property
    def names(self) -> tuple[str, ...]:
        return (
            self.output,
            self.status,
            self.error,
            *([self.raw] if self.structured else []),
            *([self.similar_to, self.similarity] if self.semantic else []),
            *([self.model] if self.cascade else []),
        )

    def dtypes(self, answer: pl.DataType) -> dict[str, pl.DataType]:
        """The type of each of :attr:`names`, in their order, ``answer`` being the answer's:
        a lazy result's schema is known before anything is sent."""
        dtypes: dict[str, pl.DataType] = {
            self.output: answer,
            self.status: STATUS_DTYPE,
            self.error: pl.String(),
            self.raw: pl.String(),
            self.similar_to: pl.String(),
            self.similarity: pl.Float64(),
            self.model: pl.String(),
        }
        return {name: dtypes[name] for name in self.names}

    def check_free(self, schema: Mapping[str, Any]) -> None:
        for column in self.names:
            if column in schema:
                raise ConfigError(
                    f"the input already has a column {column!r}; choose another "
                    "output= name or drop that column first"
                )


@dataclass(frozen=True)
class Packing:
    """Lever: several distinct prompts per request (``rows_per_request``)."""

    rows_per_request: int = 1
    pack_tokens: int | None = None

    def __post_init__(self) -> None:
        positive_int("rows_per_request", self.rows_per_request)
        if self.pack_tokens is not None:
            positive_int("pack_tokens", self.pack_tokens)


@dataclass(frozen=True)
class Spending:
    """Lever: prices and the budgets that stop sending (``max_cost`` and friends)."""

    prices: Mapping[str, Price | None] = field(default_factory=dict)
    max_cost: float | None = None
    max_requests: int | None = None
    max_tokens_total: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_requests", "max_tokens_total"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        if self.max_cost is not None:
            if not is_number(self.max_cost) or self.max_cost < 0:
                raise ConfigError(
                    f"max_cost must be a number of dollars >= 0, got {self.max_cost!r}"
                )
            for name, price in self.prices.items():
                if price is None:
                    raise ConfigError(
                        f"max_cost needs a price for model {name!r}, which has "
                        "none; pass pricing={'" + name + "': Price(...)}"
                    )

    def price(self, model: str) -> Price | None:
        return self.prices.get(model)

    def budget(
        self, price: Price | None, spent: tuple[float, int, int] = (0.0, 0, 0)
    ) -> SpendingCap | None:
        """A fresh budget for one dispatch at ``price``, less what was ``spent`` already
        (dollars, requests, tokens), or ``None`` without limits."""
        cost, requests, tokens = spent
        budget = SpendingCap(
            price,
            None if self.max_cost is None else max(0.0, self.max_cost - cost),
            None if self.max_requests is None else max(0, self.max_requests - requests),
            None if self.max_tokens_total is None else max(0, self.max_tokens_total - tokens),
        )
        return budget if budget.limited else None


@dataclass(frozen=True)
class Cascade:
    """Lever: models from the cheapest to the strongest, and which answers go on."""

    models: tuple[str, ...]
    escalate: pl.Expr | None = None


@dataclass(frozen=True)
class Batching:
    """Lever: the distinct uncached requests go through the provider's Files and Batches API
    (``mode="batch"``), at its price (half the live one by default), answered within 24 h."""

    max_requests: int = 50_000  # lines per batch file (OpenAI's limit)
    max_bytes: int = 200_000_000  # bytes per batch file (OpenAI's limit)
    poll_seconds: float = 5.0  # the first wait between polls; it grows to a minute
    on_expired: Literal["resubmit", "live"] = "resubmit"  # what an expired batch's rest does

    def __post_init__(self) -> None:
        positive_int("batch_max_requests", self.max_requests)
        positive_int("batch_max_bytes", self.max_bytes)
        seconds("batch_poll_seconds", self.poll_seconds)
        if self.on_expired not in ("resubmit", "live"):
            raise ConfigError(f"on_expired must be 'resubmit' or 'live', got {self.on_expired!r}")


@dataclass(frozen=True)
class Job:
    """One call, as typed parts; each stage takes the parts it uses."""

    spec: RequestSpec
    columns: Columns
    spending: Spending
    packing: Packing = Packing()
    cascade: Cascade | None = None
    semantic: SemanticCache | None = None
    repair: bool = False
    batching: Batching | None = None  # None: live requests
    send_order: SendOrder = "prefix"  # see llm_ops._order
    on_error: Literal["null", "raise"] = "null"
    progress: ProgressCallback | None = field(default=None, repr=False)
    spent: tuple[float, int, int] = (0.0, 0, 0)  # by earlier parts: dollars, requests, tokens

    @property
    def models(self) -> tuple[str, ...]:
        return self.cascade.models if self.cascade else (self.spec.model,)

    @property
    def added(self) -> dict[str, pl.DataType]:
        """The columns the job adds and their types: the answer is text, or the struct of
        ``schema=``."""
        schema = self.spec.schema
        return self.columns.dtypes(pl.String() if schema is None else schema.dtype)

    @property
    def endpoint_models(self) -> tuple[str, ...]:
        """Every model the job may ask the endpoint for: a cascade's, the semantic cache's."""
        return (*self.models, *(() if self.semantic is None else (self.semantic.model,)))

    @property
    def price(self) -> Price | None:
        """The price of the model in use, through the Batch API in batch mode."""
        price = self.spending.price(self.spec.model)
        return price.for_batch() if price is not None and self.batching else price

    @property
    def live_price(self) -> Price | None:
        """The price of the model in use for live requests."""
        return self.spending.price(self.spec.model)

    @property
    def semantic_price(self) -> Price | None:
        return None if self.semantic is None else self.spending.price(self.semantic.model)

    def for_model(self, model: str) -> Job:
        """This job with ``model`` (one of a cascade's) in use."""
        return replace(self, spec=self.spec.with_model(model))

    def after(self, spent: tuple[float, int, int]) -> Job:
        """This job after ``spent`` (dollars, requests, tokens) went on earlier parts of it:
        earlier chunks, earlier models of a cascade, the semantic cache's embeddings."""
        if not any(spent):
            return self
        cost, requests, tokens = self.spent
        return replace(self, spent=(cost + spent[0], requests + spent[1], tokens + spent[2]))

    def budget(self) -> SpendingCap | None:
        """A fresh budget for one dispatch, or ``None`` without limits."""
        return self.spending.budget(self.price, self.spent)


def models_of(model: object) -> tuple[str, ...]:
    """``model=``: one name, or a cascade's names from the cheapest to the strongest."""
    names = [model] if isinstance(model, str) else model
    if (
        not isinstance(names, Sequence)
        or not names
        or not all(isinstance(name, str) and name.strip() for name in names)
    ):
        raise ConfigError(
            f"model must be a model name such as 'gpt-4o-mini', or a list of names "
            f"for a cascade such as ['gpt-4o-mini', 'gpt-4o'], got {model!r}"
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"a cascade names each model once, got {list(names)!r}")
    return tuple(names)


def make_job(
    *, prompt: str, model: ModelOption, endpoint: str, cached: bool, options: CallOptions
) -> Job:
    """Check a call's options and build its :class:`Job` (see :func:`check_job` for its
    check against a table's columns).

    ``endpoint`` is the endpoint's identity; ``cached`` whether the client has a cache.
    """
    unknown = set(options) - CallOptions.__optional_keys__
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(sorted(unknown))}; see "
            "help(llm_ops.llm_complete) for the options"
        )
    models = models_of(model)
    output = options.get("output", "completion")
    prompt_template = parse_template(prompt, argument="prompt")
    system = options.get("system")
    system_template = None if system is None else parse_template(system, argument="system")
    schema = options.get("schema")
    structured = output_schema(schema) if schema is not None else None
    semantic = options.get("semantic_cache")
    if semantic is not None and not isinstance(semantic, SemanticCache):
        raise ConfigError(
            "semantic_cache takes a SemanticCache, e.g. "
            "semantic_cache=SemanticCache('text-embedding-3-small', threshold=0.95)"
        )
    if semantic is not None and not cached:
        raise ConfigError(
            "the semantic cache lives in the cache database: pass a cache path "
            "instead of cache=False, or drop semantic_cache="
        )
    added = Columns(
        output,
        structured=structured is not None,
        semantic=semantic is not None,
        cascade=len(models) > 1,
    )
    on_error = options.get("on_error", "null")
    if on_error not in ("null", "raise"):
        raise ConfigError(f"on_error must be 'null' or 'raise', got {on_error!r}")
    spec = RequestSpec.build(
        endpoint=endpoint,
        model=models[0],
        prompt=prompt_template,
        system=system_template,
        max_tokens=options.get("max_tokens"),
        temperature=options.get("temperature"),
        top_p=options.get("top_p"),
        seed=options.get("seed"),
        stop=options.get("stop"),
        schema=structured,
    )
    packing = Packing(options.get("rows_per_request", 1), options.get("pack_tokens"))
    if packing.rows_per_request > 1 and structured is not None:
        raise ConfigError(
            "rows_per_request cannot be combined with schema= yet; use one or the other"
        )
    repair = options.get("repair", False)
    if repair and structured is None:
        raise ConfigError("repair=True only applies to structured output; pass schema= too")
    pricing = options.get("pricing")
    priced = [*models, *([semantic.model] if semantic is not None else [])]
    spending = Spending(
        {name: price_for(name, pricing) for name in priced},
        options.get("max_cost"),
        options.get("max_requests"),
        options.get("max_tokens_total"),
    )
    mode = options.get("mode", "live")
    if mode not in ("live", "batch"):
        raise ConfigError(f"mode must be 'live' or 'batch', got {mode!r}")
    batch_options = ("on_expired", "batch_max_requests", "batch_max_bytes", "batch_poll_seconds")
    if mode == "live" and any(name in options for name in batch_options):
        raise ConfigError(
            f"{', '.join(n for n in batch_options if n in options)} only apply to mode='batch'"
        )
    batching = None
    if mode == "batch":
        if not cached:
            raise ConfigError(
                "mode='batch' records its batches in the cache database, so a "
                "rerun never pays twice: pass a cache path instead of "
                "cache=False"
            )
        if packing.rows_per_request > 1:
            raise ConfigError(
                "rows_per_request cannot be combined with mode='batch' yet; "
                "the Batch API already prices per token at half the live rate"
            )
        batching = Batching(
            max_requests=options.get("batch_max_requests", 50_000),
            max_bytes=options.get("batch_max_bytes", 200_000_000),
            poll_seconds=options.get("batch_poll_seconds", 5.0),
            on_expired=options.get("on_expired", "resubmit"),
        )
    send_order = options.get("send_order", "prefix")
    if send_order not in SEND_ORDERS:
        raise ConfigError(f"send_order must be 'prefix' or 'input', got {send_order!r}")
    escalate = options.get("escalate")
    rule = (
        escalation_rule(escalate, output, structured, len(models)) if escalate is not None else None
    )
    return Job(
        spec=spec,
        columns=added,
        spending=spending,
        packing=packing,
        cascade=Cascade(models, rule) if len(models) > 1 else None,
        semantic=semantic,
        repair=repair,
        batching=batching,
        send_order=send_order,
        on_error=on_error,
        progress=resolve_progress(options.get("progress")),
    )


def check_job(job: Job, columns: Mapping[str, pl.DataType]) -> None:
    """Check ``job`` against the input's ``columns``: the columns it adds must be new, its
    escalation rule must read them, its templates must reference renderable ones."""
    job.columns.check_free(columns)
    if job.cascade is not None and job.cascade.escalate is not None:
        check_escalation(job.cascade.escalate, columns, job.columns.output, job.spec.schema)
    check_columns(job.spec.prompt, columns, argument="prompt")
    if job.spec.system is not None:
        check_columns(job.spec.system, columns, argument="system")


def check_embedding(
    columns: Mapping[str, pl.DataType],
    *,
    column: object,
    model: object,
    output: str,
    dimensions: int | None,
    inputs_per_request: int,
    on_error: object,
) -> Columns:
    """Check an embedding call against the input's ``columns``, as
    :meth:`llm_ops.Client.embed` does before it sends anything; the columns it adds."""
    if not isinstance(column, str) or not column:
        raise ConfigError(f"column must name the text column to embed, got {column!r}")
    if column not in columns:
        raise ConfigError(
            f"column {column!r} is not in the table; available columns: {', '.join(columns)}"
        )
    render(column, columns[column], used_by="llm_embed")  # raises if it cannot be text
    positive_int("inputs_per_request", inputs_per_request)
    if on_error not in ("null", "raise"):
        raise ConfigError(f"on_error must be 'null' or 'raise', got {on_error!r}")
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(
            f"model must be a model name such as 'text-embedding-3-small', got {model!r}"
        )
    if dimensions is not None:
        positive_int("dimensions", dimensions)
    added = Columns(output)
    added.check_free(columns)
    return added
