"""Every option of a job, defined once, and the typed parts they become.

:class:`Options` is the one definition of the keyword options that ``llm_complete``,
``llm_complete_async``, ``estimate`` and :meth:`llm_ops.Client.complete` take after
``prompt`` and ``model``: what a :class:`~llm_ops.Client` is made with
(:class:`ClientOptions`) and what each call says (:class:`CallOptions`). Settings that belong
together are one typed object each, checking its own fields when made, all defined in
:mod:`llm_ops._config`: the endpoint (:class:`~llm_ops.Endpoint`), :class:`~llm_ops.Retries`,
:class:`~llm_ops.RateLimit`, :class:`~llm_ops.Sampling`, and the levers
:class:`~llm_ops.Packing`, :class:`~llm_ops.Budget`, :class:`~llm_ops.BatchMode`,
:class:`~llm_ops.Cascade` and :class:`~llm_ops.SemanticCache` (besides the cache file,
:class:`~llm_ops.Cache`, and the media columns, :class:`~llm_ops.Images` and
:class:`~llm_ops.Documents`).

The CLI and the flow spell each field as a flat setting (``--temperature``,
``max_cost:``): :data:`SETTINGS` says which object each belongs to, and
:func:`options_from_settings` builds the same objects from them.

:func:`make_job` assembles a call's checked parts into a :class:`Job`: the request spec
(what is keyed), the columns it adds, and the levers the pipeline composes around the path,
after checking the few things that depend on more than one part (a batch needs a cache).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypedDict, cast, get_type_hints

import polars as pl
from pydantic import BaseModel

from ._cache import Cache, cache_of
from ._checks import positive_int
from ._config import (
    BatchMode,
    Budget,
    Cascade,
    ConfidenceBelow,
    Endpoint,
    Packing,
    RateLimit,
    Retries,
    Sampling,
    SemanticCache,
)
from ._dialects import Dialect
from ._media import Documents, DocumentsOption, Images, ImagesOption, Media
from ._order import SEND_ORDERS, SendOrder
from ._pricing import Price, PricingOption, SpendingCap, parse_pricing, price_for
from ._progress import ProgressCallback, resolve_progress
from ._schema import OutputSchema, output_schema
from ._settings import DECLARED, settings_map
from ._spec import RequestSpec
from ._status import STATUS_DTYPE, STATUSES
from ._template import check_columns, parse_template, render
from .exceptions import ConfigError, setting

CachePath = str | os.PathLike[str] | bool | None
CacheOption = CachePath | Cache
EndpointOption = str | Endpoint | None
ProgressOption = bool | ProgressCallback | None
SchemaOption = type[BaseModel] | Mapping[str, Any] | None


ModelOption = str | Sequence[str] | Cascade


class ClientOptions(TypedDict, total=False):
    """What a :class:`~llm_ops.Client` is made with: the endpoint, the cache and the limits,
    shared by every job it runs."""

    endpoint: EndpointOption
    cache: CacheOption
    concurrency: int | None
    retries: Retries
    rate_limit: RateLimit


class ResultOptions(TypedDict, total=False):
    """What every operator's call says about failed rows and progress."""

    on_error: Literal["null", "raise"]
    progress: ProgressOption


class AskOptions(ResultOptions, total=False):
    """:class:`RequestOptions` but ``schema``: what ``llm_extract`` takes besides the schema,
    which it names as a parameter of its own (positional, as ``llm_classify``'s labels)."""

    system: str | None
    repair: bool  # with a schema: an invalid answer is asked again, shown what was wrong
    keep_reasoning: bool  # a reasoning model's thinking, as <output>_reasoning
    sampling: Sampling
    images: ImagesOption | None
    documents: DocumentsOption | None
    packing: Packing
    send_order: SendOrder
    pricing: PricingOption
    budget: Budget
    semantic_cache: SemanticCache | None
    batch: bool | BatchMode


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

OPTION_CLASSES: Mapping[str, type] = {
    "endpoint": Endpoint,
    "cache": Cache,
    "retries": Retries,
    "rate_limit": RateLimit,
    "sampling": Sampling,
    "packing": Packing,
    "budget": Budget,
    "batch": BatchMode,
    "model": Cascade,
    "semantic_cache": SemanticCache,
    "images": Images,
    "documents": Documents,
}
"""Each option that takes an object -> its class: what a setting of the CLI or the flow is
checked and typed against."""


SETTINGS: Mapping[str, tuple[str, str]] = settings_map(DECLARED)
"""The flat settings of the CLI (``--temperature``) and the flow (``temperature:``) that are
a field of an option's object: setting -> (option, field). Every other setting is the option
of its name. ``media_folders`` is the ``folders`` of both :class:`Images` and
:class:`Documents`. Made from the declarations of :mod:`llm_ops._settings`."""


SPELLED_ELSEWHERE: Mapping[str, str] = {
    "output_column": "output",  # the flow's and the CLI's (--output-column) spelling
    "column": "output",
    "api_base": "endpoint",
    "max_concurrency": "concurrency",
    "system_prompt": "system",
    "prompt_template": "prompt",
}
"""Options as other tools, or llm-ops' own command line and flow, spell them: the option's
name here, for an error to say what to type."""

RENAMED_SETTINGS: Mapping[str, str] = {
    "batch_max_requests": "requests_per_batch",  # max_requests is Budget's alone
    "batch_max_bytes": "bytes_per_batch",
}
"""Flat settings (and their flags) that were renamed: the former name -> the one it is now,
for an error to name it."""


def unknown_options(names: set[str]) -> ConfigError:
    """The error for options that are not: where a former one went, what an option spelled
    elsewhere is called here, the closest name to a misspelt one, else where to look."""
    moved = [
        f"{name} is {OPTION_CLASSES[SETTINGS[name][0]].__name__}({SETTINGS[name][1]}=...) as "
        f"{SETTINGS[name][0]}= now"
        for name in sorted(names)
        if name in SETTINGS
    ]
    for name in sorted(names & set(RENAMED_SETTINGS)):
        option, field_name = SETTINGS[RENAMED_SETTINGS[name]]
        moved.append(
            f"{name} is {setting(RENAMED_SETTINGS[name])} now "
            f"({OPTION_CLASSES[option].__name__}({field_name}=...) as {option}=)"
        )
    other = sorted(names - set(SETTINGS) - set(RENAMED_SETTINGS))
    if "mode" in other:
        moved.append("mode='batch' is batch=True (or batch=BatchMode(...)) now")
        other.remove("mode")
    said = [f"unknown option(s) {', '.join(other)}"] if other else []
    known = sorted(Options.__optional_keys__ | EmbedOptions.__optional_keys__ | set(SETTINGS))
    for name in other:
        spelled = SPELLED_ELSEWHERE.get(name)
        closest = difflib.get_close_matches(name, known, n=1) if spelled is None else [spelled]
        if not closest:
            continue
        meant = closest[0]
        if meant in SETTINGS:
            option, field_name = SETTINGS[meant]
            meant = f"{OPTION_CLASSES[option].__name__}({field_name}=...) as {option}="
        else:
            meant += "="
        said.append(f"did you mean {meant} instead of {name}=?")
    return ConfigError(
        "; ".join([*said, *moved]) + "; see help(llm_ops.llm_complete) for the options"
    )


def options_from_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword options of a call from flat settings, as the CLI's flags and the flow's
    parameters spell them: the fields of an object (see :data:`SETTINGS`) make that object;
    ``batch=True`` and ``semantic_cache`` (an embedding model's name), ``pricing`` (a list of
    ``--pricing`` items, see :func:`~llm_ops.parse_pricing`) and ``model`` with ``escalate``
    (a :class:`Cascade`) are put together too. A setting of ``None`` is left out.

    Examples
    --------
    >>> from llm_ops import options_from_settings
    >>> options_from_settings({"temperature": 0, "max_cost": 2.5, "output": "summary"})
    {'output': 'summary', 'sampling': Sampling(max_tokens=None, temperature=0, top_p=None, seed=None, stop=None, reasoning_effort=None, max_completion_tokens=None), 'budget': Budget(max_cost=2.5, max_requests=None, max_tokens_total=None)}
    """  # noqa: E501
    given = {name: value for name, value in settings.items() if value is not None}
    options: dict[str, Any] = {k: v for k, v in given.items() if k not in SETTINGS}
    fields: dict[str, dict[str, Any]] = {}
    for name, value in given.items():
        if name in SETTINGS and name != "media_folders":
            option, field_name = SETTINGS[name]
            fields.setdefault(option, {})[field_name] = value
    if isinstance(options.get("pricing"), list | tuple):
        options["pricing"] = parse_pricing(options["pricing"])
    for option, values in fields.items():
        if option == "model":
            options["model"] = Cascade(options.get("model", ()), **values)
        elif option == "cache":
            options["cache"] = Cache(options.get("cache") or _default_cache(), **values)
        elif option == "semantic_cache":
            if "semantic_cache" in options:  # the threshold alone is no semantic cache
                options["semantic_cache"] = SemanticCache(options["semantic_cache"], **values)
        elif option in ("images", "documents"):
            if option not in options:
                raise ConfigError(f"{_settings_of(given, option)} only with {option}")
            options[option] = OPTION_CLASSES[option](options[option], **values)
        elif option == "batch" and options.get("batch") is not True:
            raise ConfigError(f"{_settings_of(given, 'batch')} only in batch mode")
        else:
            options[option] = OPTION_CLASSES[option](**values)
    if "media_folders" in given:
        _set_media_folders(options, given["media_folders"])
    if isinstance(options.get("semantic_cache"), str):
        options["semantic_cache"] = SemanticCache(options["semantic_cache"])
    if options.get("batch") is False:
        del options["batch"]
    return options


def _set_media_folders(options: dict[str, Any], folders: Any) -> None:
    """``media_folders`` as the ``folders`` of the images and the documents given."""
    given = [option for option in ("images", "documents") if option in options]
    if not given:
        raise ConfigError("media_folders applies only with images or documents")
    for option in given:
        kind: type[Images | Documents] = Images if option == "images" else Documents
        value = options[option]
        options[option] = replace(
            value if isinstance(value, kind) else kind(value), folders=folders
        )


def _settings_of(given: Mapping[str, Any], option: str) -> str:
    """The settings of ``given`` that are fields of ``option``, as the user named them, and
    the verb: ``"image_detail applies"``, ``"bytes_per_batch, on_expired apply"``."""
    names = sorted(name for name in given if name in SETTINGS and SETTINGS[name][0] == option)
    return f"{', '.join(names)} {'applies' if len(names) == 1 else 'apply'}"


def setting_names() -> set[str]:
    """Every flat setting: the options that are not objects of fields, and those fields."""
    return {setting.name for setting in DECLARED if setting.flat}


def setting_type(name: str) -> object:
    """The type of a flat setting (see :data:`SETTINGS`): its field's, or its option's."""
    if name in SETTINGS:
        return option_type(*SETTINGS[name])
    return option_type(name, None)


def option_type(option: str, field_name: str | None) -> object:
    """The type of ``option`` (an option of :class:`Options`), or of its object's field
    ``field_name``."""
    if field_name is None:
        return get_type_hints(Options)[option]
    kind = OPTION_CLASSES[option]
    return get_type_hints(kind.__init__ if kind is Cache else kind)[field_name]


def _default_cache() -> os.PathLike[str]:
    cache = cache_of(None)
    assert cache is not None
    return cache.path


def split_options(options: Mapping[str, Any]) -> tuple[ClientOptions, CallOptions]:
    """``options`` as (what the client is made with, the rest)."""
    unknown = set(options) - Options.__optional_keys__ - EmbedOptions.__optional_keys__
    if unknown:
        raise unknown_options(unknown)
    client = {k: v for k, v in options.items() if k in CLIENT_OPTIONS}
    call = {k: v for k, v in options.items() if k not in CLIENT_OPTIONS}
    return cast(ClientOptions, client), cast(CallOptions, call)


def typed(options: Mapping[str, Any], name: str, kind: type[Any], example: str) -> Any:
    """The option ``name`` of ``options`` when it is a ``kind`` (``None`` when not given);
    else a :class:`~llm_ops.ConfigError` showing ``example``."""
    value = options.get(name)
    if value is not None and not isinstance(value, kind):
        raise ConfigError(f"{name} takes a {kind.__name__}, e.g. {name}={example}")
    return value


@dataclass(frozen=True)
class Columns:
    """The columns a job adds: answer, status, error, then the optional ones."""

    output: str = "completion"
    structured: bool = False
    semantic: bool = False
    cascade: bool = False
    reasoning: bool = False  # keep_reasoning=

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
    def reasoning_text(self) -> str:
        return f"{self.output}_reasoning"

    @property
    def names(self) -> tuple[str, ...]:
        return (
            self.output,
            self.status,
            self.error,
            *([self.raw] if self.structured else []),
            *([self.similar_to, self.similarity] if self.semantic else []),
            *([self.model] if self.cascade else []),
            *([self.reasoning_text] if self.reasoning else []),
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
            self.reasoning_text: pl.String(),
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
class Spending:
    """The prices of a job's models and the budget that stops sending."""

    prices: Mapping[str, Price | None] = field(default_factory=dict)
    limits: Budget = Budget()

    def __post_init__(self) -> None:
        if self.limits.max_cost is not None:
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
        limits = self.limits
        budget = SpendingCap(
            price,
            None if limits.max_cost is None else max(0.0, limits.max_cost - cost),
            None if limits.max_requests is None else max(0, limits.max_requests - requests),
            None if limits.max_tokens_total is None else max(0, limits.max_tokens_total - tokens),
        )
        return budget if budget.limited else None


@dataclass(frozen=True)
class Job:
    """One call, as typed parts; each stage takes the parts it uses."""

    spec: RequestSpec
    columns: Columns
    spending: Spending
    packing: Packing = Packing()
    cascade: Cascade | None = None  # its escalate a Polars expression: see escalation_rule
    semantic: SemanticCache | None = None
    batching: BatchMode | None = None  # None: live requests
    send_order: SendOrder = "prefix"  # which uncached requests go first (llm_ops._order)
    repair: bool = False  # an invalid structured answer is asked again once, shown its error
    on_error: Literal["null", "raise"] = "null"
    progress: ProgressCallback | None = field(default=None, repr=False)
    spent: tuple[float, int, int] = (0.0, 0, 0)  # by earlier parts: dollars, requests, tokens
    # the fewest tokens of a prefix the provider's prompt cache takes, when the endpoint's
    # dialect marks the shared prefix (the system prompt) for it: the estimate projects its
    # writes and reads (llm_ops._pipeline.estimate); None: nothing is marked
    prompt_cache: int | None = None

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.cascade.models) if self.cascade else (self.spec.model,)

    @property
    def escalate_rule(self) -> pl.Expr | None:
        """Which answered rows a cascade sends on, besides failed ones."""
        rule = None if self.cascade is None else self.cascade.escalate
        return rule if isinstance(rule, pl.Expr) else None

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


def make_job(
    *,
    prompt: str,
    model: ModelOption,
    endpoint: str,
    cached: bool,
    options: CallOptions,
    dialect: Dialect | None = None,
) -> Job:
    """Assemble a call's checked options into its :class:`Job` (see :func:`check_job` for
    its check against a table's columns).

    ``endpoint`` is the endpoint's identity; ``cached`` whether the client has a cache;
    ``dialect`` the endpoint's (``None``: OpenAI's).
    """
    unknown = set(options) - CallOptions.__optional_keys__
    if unknown:
        raise unknown_options(unknown)
    cascade = model if isinstance(model, Cascade) else Cascade(model)
    models = tuple(cascade.models)
    output = options.get("output", "completion")
    system = options.get("system")
    schema = options.get("schema")
    structured = output_schema(schema) if schema is not None else None
    semantic = typed(
        options, "semantic_cache", SemanticCache, "SemanticCache('text-embedding-3-small')"
    )
    sampling = typed(options, "sampling", Sampling, "Sampling(temperature=0)") or Sampling()
    packing = typed(options, "packing", Packing, "Packing(rows_per_request=8)") or Packing()
    budget = typed(options, "budget", Budget, "Budget(max_cost=5.0)") or Budget()
    batch = options.get("batch", False)
    batching = BatchMode() if batch is True else None if batch is False else batch
    if not isinstance(batching, BatchMode | None):
        raise ConfigError(
            "batch takes True, False or a BatchMode, e.g. batch=BatchMode(poll_seconds=30)"
        )
    on_error = options.get("on_error", "null")
    send_order = options.get("send_order", "prefix")
    repair = _switch(options, "repair")
    keep_reasoning = _switch(options, "keep_reasoning")
    media = Media.of(options.get("images"), options.get("documents"))
    _check_together(structured is not None, semantic, packing, batching, media, cached=cached)
    if on_error not in ("null", "raise"):
        raise ConfigError(f"on_error must be 'null' or 'raise', got {on_error!r}")
    if send_order not in SEND_ORDERS:
        raise ConfigError(f"send_order must be 'prefix' or 'input', got {send_order!r}")
    if repair and structured is None:
        raise ConfigError(
            "repair asks again for an answer that does not match the schema: give schema= "
            "too, or drop repair=True"
        )
    pricing = options.get("pricing")
    priced = [*models, *([semantic.model] if semantic is not None else [])]
    rule = (
        escalation_rule(cascade.escalate, output, structured, len(models))
        if cascade.escalate is not None
        else None
    )
    return Job(
        spec=RequestSpec.build(
            endpoint=endpoint,
            model=models[0],
            prompt=parse_template(prompt, argument="prompt"),
            system=None if system is None else parse_template(system, argument="system"),
            params={**sampling.params, **keyed_provider(dialect)},
            schema=structured,
            media=media,
        ),
        columns=Columns(
            output,
            structured=structured is not None,
            semantic=semantic is not None,
            cascade=len(models) > 1,
            reasoning=keep_reasoning,
        ),
        spending=Spending({name: price_for(name, pricing) for name in priced}, budget),
        packing=packing,
        cascade=replace(cascade, escalate=rule) if len(models) > 1 else None,
        semantic=semantic,
        batching=batching,
        send_order=send_order,
        repair=repair,
        on_error=on_error,
        progress=resolve_progress(options.get("progress")),
        prompt_cache=_prompt_cache(dialect),
    )


def keyed_provider(dialect: Dialect | None) -> dict[str, str]:
    """The provider as a request key holds it: ``{"provider": name}`` for a dialect other than
    OpenAI's, so the same prompt to another provider is another key; nothing for OpenAI's,
    whose keys were made before there were dialects and must never change."""
    if dialect is None or dialect.name == "openai":
        return {}
    return {"provider": dialect.name}


def _prompt_cache(dialect: Dialect | None) -> int | None:
    """The fewest tokens the provider's prompt cache takes, when ``dialect`` marks the shared
    prefix for it (its optional members, see :class:`~llm_ops._dialects.Dialect`)."""
    if not getattr(dialect, "marks_prompt_cache", False):
        return None
    return int(getattr(dialect, "least_cached_tokens", 0))


def _switch(options: CallOptions, name: Literal["repair", "keep_reasoning"]) -> bool:
    """The switch ``name`` of ``options``: ``True`` or ``False`` (the default)."""
    value = options.get(name, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}")
    return value


def _check_together(
    structured: bool,
    semantic: SemanticCache | None,
    packing: Packing,
    batching: BatchMode | None,
    media: Media | None,
    *,
    cached: bool,
) -> None:
    """What depends on more than one option."""
    if media is not None and packing.rows_per_request > 1:
        raise ConfigError(
            "packing cannot carry images or PDFs: a packed request's rows would share one "
            "message; drop packing= or images=/documents="
        )
    if media is not None and semantic is not None:
        raise ConfigError(
            "the semantic cache compares texts, and cannot tell two images apart: drop "
            "semantic_cache= or images=/documents="
        )
    if semantic is not None and not cached:
        raise ConfigError(
            "the semantic cache lives in the cache database: pass a cache path "
            "instead of cache=False, or drop semantic_cache="
        )
    if packing.rows_per_request > 1 and structured:
        raise ConfigError("packing cannot be combined with schema= yet; use one or the other")
    if batching is not None and not cached:
        raise ConfigError(
            "batch mode records its batches in the cache database, so a rerun never pays "
            "twice: pass a cache path instead of cache=False"
        )
    if batching is not None and packing.rows_per_request > 1:
        raise ConfigError(
            "packing cannot be combined with batch mode yet; the Batch API already prices "
            "per token at half the live rate"
        )


def escalation_rule(
    escalate: object, output: str, structured: OutputSchema | None, models: int
) -> pl.Expr:
    """``escalate=`` as a boolean Polars expression over the input and answer columns (see
    :func:`check_escalation` for its check against them)."""
    if models < 2:
        raise ConfigError(
            "escalate= decides which rows go on to the next model of a cascade: "
            "pass model=[first, second, ...] too"
        )
    if isinstance(escalate, ConfidenceBelow):
        escalate = escalate.expr(output, structured)
    elif isinstance(escalate, str):  # SQL, for the CLI and flow parameters
        try:
            escalate = pl.sql_expr(escalate)
        except pl.exceptions.PolarsError as exc:
            raise ConfigError(
                f"escalate {escalate!r} is not a SQL expression Polars can read "
                f"({exc}); e.g. \"{output} LIKE 'unsure:%'\""
            ) from exc
    if not isinstance(escalate, pl.Expr):
        raise ConfigError(
            "escalate takes confidence_below(0.7), a Polars expression or a SQL "
            "condition that is true for the rows to send to the next model, e.g. "
            "pl.col('summary').str.contains('not sure')"
        )
    return escalate


def check_job(job: Job, columns: Mapping[str, pl.DataType]) -> None:
    """Check ``job`` against the input's ``columns``: the columns it adds must be new, its
    escalation rule must read them, its templates must reference renderable ones."""
    job.columns.check_free(columns)
    if job.escalate_rule is not None:
        check_escalation(job.escalate_rule, columns, job.columns.output, job.spec.schema)
    check_columns(job.spec.prompt, columns, argument="prompt")
    if job.spec.media is not None:
        job.spec.media.check(columns)
    if job.spec.system is not None:
        check_columns(job.spec.system, columns, argument="system")


def check_escalation(
    rule: pl.Expr, columns: Mapping[str, pl.DataType], output: str, structured: OutputSchema | None
) -> None:
    """Evaluate ``rule`` on an empty frame of the input and answer columns, so that a bad rule
    fails before anything is sent."""
    answer_columns = {
        output: structured.dtype if structured else pl.String,
        f"{output}_status": pl.Enum(STATUSES),
        f"{output}_error": pl.String,
    }
    if structured is not None:
        answer_columns[f"{output}_raw"] = pl.String
    empty = pl.DataFrame(schema={**columns, **answer_columns})
    try:
        dtype = empty.select(rule).to_series().dtype
    except pl.exceptions.PolarsError as exc:
        raise ConfigError(
            f"escalate cannot be evaluated on the input and answer columns "
            f"({', '.join(empty.columns)}): {exc}"
        ) from exc
    if dtype != pl.Boolean:
        raise ConfigError(
            f"escalate must give true/false per row, but gives {dtype}; compare it, e.g. ... < 0.8"
        )


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
