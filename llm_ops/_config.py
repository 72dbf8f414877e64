"""Every option object of a call or a client, each a frozen dataclass that checks its fields when
made, so a bad argument is a :class:`~llm_ops.ConfigError` before anything is sent (as httpx
keeps ``Timeout``, ``Limits`` and ``Proxy`` in its ``_config``).

* :class:`Endpoint`: where requests go and how (``endpoint=``); it resolves into the
  :class:`~llm_ops._endpoint.ResolvedEndpoint` and :class:`~llm_ops._endpoint.Connection`
  requests use.
* :class:`Retries` and :class:`RateLimit`, put together with the concurrency into
  :class:`Limits`: transport settings, never part of a key.
* :class:`Sampling`: the sampling parameters, part of the key.
* The levers: :class:`Cascade` (``model=``; its ``escalate=`` rule
  :func:`confidence_below`), :class:`Packing`, :class:`Budget`, :class:`BatchMode`
  (``batch=``) and :class:`SemanticCache`.

Three options are objects defined elsewhere: :class:`~llm_ops.Cache` is the cache file's
handle, with methods that read and rewrite it (``vacuum``, ``prune``, ...), so it lives with
the rest of that file's code in :mod:`llm_ops._cache`; :class:`~llm_ops.Images` and
:class:`~llm_ops.Documents` stay beside the ``Media`` they make in :mod:`llm_ops._media`, which
every request key reads. :data:`llm_ops._options.OPTION_CLASSES` names the class of each
option that takes one, these too. No ``repr`` shows a secret.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field, fields
from typing import Any, Literal, get_args

import polars as pl

from ._checks import is_number, positive_int, seconds
from ._concurrency import DEFAULT_CAP
from ._dialects import Dialect
from ._endpoint import _NAME, Connection, ResolvedEndpoint, _check_api_key, dialect_for
from ._order import SendOrder
from ._schema import OutputSchema
from ._wire import AsyncTransport
from .exceptions import ConfigError

MAX_CONCURRENCY = 4096
MAX_ATTEMPTS = 100
MAX_RESPONSE_BYTES = 2**31  # what one answer's body may be allowed to hold, at the most
ReasoningEffort = Literal["minimal", "low", "medium", "high"]


@dataclass(frozen=True)
class Endpoint:
    """Where requests go and how they get there: ``endpoint=`` of every call and of
    :class:`~llm_ops.Client` (a URL alone stands for ``Endpoint(url)``).

    Parameters
    ----------
    base_url
        The OpenAI-compatible API's URL, e.g. ``"http://127.0.0.1:8000/v1"``; ``None``:
        ``OPENAI_BASE_URL``, then OpenAI's. Credentials in it are refused; query parameters
        (some gateways take their key there) are sent but never stored or shown.
    api_key
        ``None``: ``OPENAI_API_KEY``. A loopback endpoint needs none, nor one whose
        ``headers`` carry the credentials. Never stored, logged or put in a message.
    headers
        Sent with every request, such as Azure OpenAI's ``{"api-key": ...}`` or a gateway's
        tenant header. Never part of a cache key; values of headers named like a credential
        never appear in a message or log.
    verify, cert
        TLS: ``verify`` checks the server's certificate against the system's authorities
        (``True``), a CA bundle's path, or an :class:`ssl.SSLContext`; ``False`` checks
        nothing. ``cert`` is a client certificate for servers that ask for one (mutual TLS):
        a PEM file holding the key too, or a ``(certificate, key)`` pair of paths.
    proxy
        An ``http://`` or ``https://`` proxy (``user:password@`` in it for one that asks); by
        default the one ``HTTPS_PROXY``, ``HTTP_PROXY`` or ``ALL_PROXY`` names, unless
        ``NO_PROXY`` names the host.
    name
        The endpoint's name in cache keys instead of its URL, so one server reached under
        several URLs (a changing port, a load balancer and its replicas) shares its answers:
        letters, digits, ``.``, ``_`` and ``-``. The bundled simulator's is
        :attr:`llm_ops.testing.LocalEndpoint.name`.
    max_response_bytes
        Bytes one answer's body may hold, compressed and decompressed (default 8 MiB; an
        embeddings answer may hold 128 KiB more per input); a larger one fails its request.
    provider
        The API's dialect: how requests are written and answers read. ``"openai"``, the
        OpenAI-compatible API that most servers and gateways speak; ``"anthropic"``,
        Anthropic's Messages API (base URL ``https://api.anthropic.com``); or a dialect object
        (``llm_ops._dialects.Dialect``: a test's, or an API llm-ops does not ship). ``None``:
        the one the host is known for (``api.openai.com``, ``api.anthropic.com``), else
        ``"openai"``. A provider other than OpenAI is part of the cache key (see
        ``docs/cache.md``): an answer from one provider is never served for another.
    transport
        Sends each HTTP request instead of llm-ops' own pool of connections, as httpx's
        ``transport=``: an object with ``async handle_async_request(request)``, taking an
        ``HttpRequest`` (``method``, ``url``, ``headers``, ``body``, ``timeout``,
        ``max_bytes``) and returning an ``HttpAnswer`` (``status``, ``headers``, ``body``),
        and ``async aclose()``: an :class:`~llm_ops.AsyncTransport`. For tests, or to
        trace each request; the engine still retries, paces and reads every answer.
        ``verify``, ``cert`` and ``proxy`` are then the transport's to apply.
    prompt_cache
        Mark the prefix every request shares (the system prompt) for the provider's prompt
        cache, where its API asks for a mark (Anthropic's ``cache_control``): the first
        request writes it (billed above the input price), later ones read it (far below).
        ``True`` by default; OpenAI-compatible servers cache without a mark, so it changes
        nothing there. Never part of a cache key.

    Examples
    --------
    >>> from llm_ops import Endpoint
    >>> Endpoint("https://my-resource.openai.azure.com/openai/v1", headers={"api-key": "..."})
    Endpoint(base_url='https://my-resource.openai.azure.com/openai/v1', name=None)
    """

    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    verify: bool | str | os.PathLike[str] | ssl.SSLContext = field(default=True, repr=False)
    cert: str | os.PathLike[str] | tuple[str, str] | None = field(default=None, repr=False)
    proxy: str | None = field(default=None, repr=False)
    name: str | None = None
    max_response_bytes: int = field(default=8 * 2**20, repr=False)
    provider: str | Dialect | None = field(default=None, repr=False)
    transport: AsyncTransport | None = field(default=None, repr=False, compare=False)
    prompt_cache: bool = field(default=True, repr=False)
    connection: Connection = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.base_url is not None and not isinstance(self.base_url, str):
            raise ConfigError(f"base_url must be a string URL, got {type(self.base_url).__name__}")
        if self.api_key is not None:
            _check_api_key(self.api_key)
        if self.name is not None and not (
            isinstance(self.name, str) and _NAME.fullmatch(self.name)
        ):
            raise ConfigError(
                "an endpoint's name must be of letters, digits, '.', '_' and '-' "
                f"(at most 100), like 'vllm-prod'; got {self.name!r}"
            )
        positive_int("max_response_bytes", self.max_response_bytes, most=MAX_RESPONSE_BYTES)
        if not isinstance(self.prompt_cache, bool):
            raise ConfigError(f"prompt_cache must be True or False, got {self.prompt_cache!r}")
        if self.provider is not None:
            dialect_for(self.provider)  # a name no dialect has: ConfigError now, not later
        connection = Connection(self.headers, self.verify, self.cert, self.proxy, self.transport)
        object.__setattr__(self, "connection", connection)
        object.__setattr__(self, "headers", connection.headers)
        object.__setattr__(self, "proxy", connection.proxy)

    def resolve(self) -> ResolvedEndpoint:
        """The URL and credentials in effect (see :meth:`ResolvedEndpoint.resolve`)."""
        return ResolvedEndpoint.resolve(
            self.base_url,
            self.api_key,
            name=self.name,
            keyed_by_headers=self.connection.authenticates,
            provider=self.provider,
            prompt_cache=self.prompt_cache,
        )


def endpoint_of(endpoint: object) -> Endpoint:
    """``endpoint=``: an :class:`Endpoint`, a URL standing for one, or ``None`` (the
    environment's)."""
    if endpoint is None or isinstance(endpoint, str):
        return Endpoint(endpoint)
    if not isinstance(endpoint, Endpoint):
        raise ConfigError(
            "endpoint takes a URL such as 'http://127.0.0.1:8000/v1', or an Endpoint(url, "
            f"api_key=..., headers=...), got {type(endpoint).__name__}"
        )
    return endpoint


@dataclass(frozen=True)
class Retries:
    """How a request is tried again: ``retries=`` of every call and of
    :class:`~llm_ops.Client`.

    ``max_attempts``: attempts per request, the first included. ``timeout``: seconds per
    attempt. ``max_retry_after``: the seconds an endpoint may ask every sender to wait
    (``Retry-After``); a request asked to wait longer fails instead of stalling the job, and
    when every request is, the job stops with :class:`~llm_ops.JobAbortedError`.
    Asking again for an invalid structured answer is ``repair=`` of the call, beside
    ``schema=``.

    Examples
    --------
    >>> from llm_ops import Retries
    >>> Retries(max_attempts=3, timeout=20)
    Retries(max_attempts=3, timeout=20.0, max_retry_after=120.0)
    """

    max_attempts: int = 5
    timeout: float = 60.0
    max_retry_after: float = 120.0
    # repair was a field here, read from the client's limits (so never per call): given, it
    # names its new place, an option of the call.
    repair: InitVar[bool | None] = None

    def __post_init__(self, repair: bool | None) -> None:
        if repair is not None:
            raise ConfigError(
                "repair is an option beside schema= now: llm_complete(..., schema=..., repair=True)"
            )
        positive_int("max_attempts", self.max_attempts, most=MAX_ATTEMPTS)
        object.__setattr__(self, "timeout", seconds("timeout", self.timeout))
        object.__setattr__(
            self, "max_retry_after", seconds("max_retry_after", self.max_retry_after)
        )


@dataclass(frozen=True)
class RateLimit:
    """Requests (``rpm``) and tokens (``tpm``) per minute to stay under: ``rate_limit=`` of
    every call and of :class:`~llm_ops.Client`. The endpoint's rate-limit headers are followed
    too; the tighter limit wins.

    Examples
    --------
    >>> from llm_ops import RateLimit
    >>> RateLimit(rpm=500, tpm=200_000)
    RateLimit(rpm=500, tpm=200000)
    """

    rpm: float | None = None
    tpm: float | None = None

    def __post_init__(self) -> None:
        for name, limit in (("rpm", self.rpm), ("tpm", self.tpm)):
            if limit is not None and (not is_number(limit) or limit <= 0):
                raise ConfigError(f"{name} must be a positive number per minute, got {limit!r}")


@dataclass(frozen=True)
class Limits:
    """How hard to push an endpoint, put together from a client's checked options:
    transport settings, never part of a request key."""

    concurrency: int | None = None  # None: the knee the controller finds (llm_ops._concurrency)
    retries: Retries = Retries()
    rate_limit: RateLimit = RateLimit()
    max_response_bytes: int = 8 * 2**20
    backoff_base: float = 0.5
    backoff_max: float = 30.0

    def __post_init__(self) -> None:
        if self.concurrency is not None:
            positive_int("concurrency", self.concurrency, most=MAX_CONCURRENCY)

    @property
    def most_in_flight(self) -> int:
        """The cap on requests in flight: ``concurrency`` given, else the controller's."""
        return self.concurrency or DEFAULT_CAP

    @property
    def max_attempts(self) -> int:
        return self.retries.max_attempts

    @property
    def timeout(self) -> float:
        return self.retries.timeout

    @property
    def max_retry_after(self) -> float:
        return self.retries.max_retry_after

    @property
    def rpm(self) -> float | None:
        return self.rate_limit.rpm

    @property
    def tpm(self) -> float | None:
        return self.rate_limit.tpm


@dataclass(frozen=True)
class Sampling:
    """How the model samples its answer: ``sampling=`` of every completion call. Each field
    is sent to the endpoint when set, and is part of the cache key.

    ``max_tokens``: the most tokens per answer. ``temperature`` (0 to 2) and ``top_p``
    (0 to 1): the sampling's randomness. ``seed``: asks for reproducible sampling where the
    server offers it. ``stop``: a text, or texts, at which the answer stops.
    ``reasoning_effort`` (``"minimal"``, ``"low"``, ``"medium"`` or ``"high"``): how long a
    reasoning model (OpenAI's o-series, gpt-5) thinks before it answers.
    ``max_completion_tokens``: the most tokens per answer, thinking included, as reasoning
    models take it; a request with ``max_tokens`` that such a model refuses is resent with
    ``max_completion_tokens`` instead, under the same cache key.
    Keeping a reasoning model's thinking is ``keep_reasoning=`` of the call, beside
    ``output=``: it adds a column, and changes nothing that is asked.

    Examples
    --------
    >>> from llm_ops import Sampling
    >>> Sampling(temperature=0, max_tokens=200)  # doctest: +ELLIPSIS
    Sampling(max_tokens=200, temperature=0, top_p=None, seed=None, stop=None, ...)
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | Sequence[str] | None = None
    reasoning_effort: ReasoningEffort | None = None
    max_completion_tokens: int | None = None
    # keep_reasoning was a field here, the one neither sent nor keyed: given, it names its
    # new place, an option of the call.
    keep_reasoning: InitVar[bool | None] = None

    def __post_init__(self, keep_reasoning: bool | None) -> None:
        if keep_reasoning is not None:
            raise ConfigError(
                "keep_reasoning is an option beside output= now: "
                "llm_complete(..., output=..., keep_reasoning=True)"
            )
        if self.max_tokens is not None:
            positive_int("max_tokens", self.max_tokens)
        if self.max_completion_tokens is not None:
            positive_int("max_completion_tokens", self.max_completion_tokens)
        effort = self.reasoning_effort
        if effort is not None and effort not in get_args(ReasoningEffort):
            raise ConfigError(
                "reasoning_effort must be one of "
                f"{', '.join(map(repr, get_args(ReasoningEffort)))}, got {effort!r}"
            )
        for name, value, high in (
            ("temperature", self.temperature, 2.0),
            ("top_p", self.top_p, 1.0),
        ):
            if value is not None and (not is_number(value) or not 0 <= value <= high):
                raise ConfigError(f"{name} must be a number between 0 and {high:g}, got {value!r}")
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"seed must be an integer, got {seed!r}")
        stop = self.stop
        stops = [stop] if isinstance(stop, str) else stop
        if stop is not None and (
            not isinstance(stops, list | tuple)
            or not stops
            or not all(isinstance(s, str) and s for s in stops)
        ):
            raise ConfigError(f"stop must be a string or a list of non-empty strings, got {stop!r}")
        if stop is not None and not isinstance(stop, str):
            object.__setattr__(self, "stop", list(stop))

    @property
    def params(self) -> dict[str, Any]:
        """The fields that are set, as the request's parameters."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


@dataclass(frozen=True)
class ConfidenceBelow:
    """An ``escalate=`` rule: the structured answer's confidence field is below ``threshold``.
    Made by :func:`confidence_below`."""

    threshold: float
    field: str = "confidence"

    def expr(self, output: str, structured: OutputSchema | None) -> pl.Expr:
        dtype = structured.dtype if structured is not None else None
        fields = {f.name: f.dtype for f in dtype.fields} if isinstance(dtype, pl.Struct) else {}
        if not fields.get(self.field, pl.Null()).is_numeric():
            raise ConfigError(
                f"confidence_below reads the number field {self.field!r} of a structured answer: "
                f"pass schema= with such a field (e.g. {self.field}: float), or name the field "
                "with confidence_below(..., field=...)"
            )
        return pl.col(output).struct.field(self.field) < self.threshold


def confidence_below(threshold: float, *, field: str = "confidence") -> ConfidenceBelow:
    """A cascade rule: send a row on when its structured answer's ``field`` < ``threshold``.

    Use it as ``escalate=confidence_below(0.7)`` with a ``schema=`` that has a number field
    named ``confidence`` (or ``field``) which the model fills in.

    Examples
    --------
    >>> confidence_below(0.7)
    ConfidenceBelow(threshold=0.7, field='confidence')
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise ConfigError(f"confidence_below takes a number, got {threshold!r}")
    return ConfidenceBelow(float(threshold), field)


EscalateOption = pl.Expr | ConfidenceBelow | str | None


@dataclass(frozen=True)
class Cascade:
    """Models from the cheapest to the strongest, and which answers go on: ``model=`` of a
    completion call (a list of names stands for ``Cascade(names)``).

    Every row goes to the first model; rows whose answer is ``rejected``, ``failed``,
    ``invalid`` or ``truncated``, and rows ``escalate`` flags, go on to the next.
    ``<output>_model`` is added: the model whose answer the row has.

    Parameters
    ----------
    models
        Model names, the cheapest first, each once.
    escalate
        Which answered rows go on besides: :func:`~llm_ops.confidence_below` reads a
        confidence field of a structured answer, e.g. ``confidence_below(0.7)``; any boolean
        Polars expression over the input and answer columns works too, e.g.
        ``pl.col("summary").str.contains("(?i)not sure")``, or a SQL expression as a string,
        e.g. ``"summary LIKE 'unsure:%'"``.

    Examples
    --------
    >>> from llm_ops import Cascade, confidence_below
    >>> Cascade(["gpt-4o-mini", "gpt-4o"], escalate=confidence_below(0.7))  # doctest: +ELLIPSIS
    Cascade(models=('gpt-4o-mini', 'gpt-4o'), escalate=ConfidenceBelow(...))
    """

    models: Sequence[str]
    escalate: EscalateOption = None

    def __post_init__(self) -> None:
        models = self.models
        names = [models] if isinstance(models, str) else models
        if (
            not isinstance(names, Sequence)
            or not names
            or not all(isinstance(name, str) and name.strip() for name in names)
        ):
            raise ConfigError(
                "model must be a model name such as 'gpt-4o-mini', or a cascade such as "
                f"['gpt-4o-mini', 'gpt-4o'] or Cascade([...], escalate=...), got {models!r}"
            )
        if len(set(names)) != len(names):
            raise ConfigError(f"a cascade names each model once, got {list(names)!r}")
        if self.escalate is not None and len(names) < 2:
            raise ConfigError(
                "escalate decides which rows go on to the next model of a cascade: "
                "give Cascade two models or more, or drop escalate"
            )
        object.__setattr__(self, "models", tuple(names))


@dataclass(frozen=True)
class Packing:
    """Several distinct prompts per request: ``packing=`` of a completion call.

    Up to ``rows_per_request`` distinct requests (and about ``pack_tokens`` prompt tokens)
    go in one request whose answer lists each by id; useful where a provider prices per
    request. Every id must come back exactly once, else the pack is split in halves and
    resent, down to single rows, so no row gets another's answer. Answers are cached per row.
    The order requests are sent in is ``send_order=`` of the call.

    Examples
    --------
    >>> from llm_ops import Packing
    >>> Packing(rows_per_request=8)
    Packing(rows_per_request=8, pack_tokens=None)
    """

    rows_per_request: int = 1
    pack_tokens: int | None = None
    # send_order was a field here though it is scheduling, not packing: given, it names its
    # new place, an option of the call.
    send_order: InitVar[SendOrder | None] = None

    def __post_init__(self, send_order: SendOrder | None) -> None:
        if send_order is not None:
            raise ConfigError(
                "send_order is an option of the call now, not of Packing: "
                f"llm_complete(..., send_order={send_order!r})"
            )
        positive_int("rows_per_request", self.rows_per_request)
        if self.pack_tokens is not None:
            positive_int("pack_tokens", self.pack_tokens)


@dataclass(frozen=True)
class Budget:
    """When a job stops sending: ``budget=`` of a completion call.

    Sending stops once the job's projected spend would pass ``max_cost`` dollars (which needs
    a price for every model: see ``pricing=``), ``max_requests`` HTTP requests or
    ``max_tokens_total`` tokens; rows not sent are ``skipped`` with the reason, everything
    answered is cached, and the report's ``budget_stop`` says why.

    Examples
    --------
    >>> from llm_ops import Budget
    >>> Budget(max_cost=5.0)
    Budget(max_cost=5.0, max_requests=None, max_tokens_total=None)
    """

    max_cost: float | None = None
    max_requests: int | None = None
    max_tokens_total: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_requests", "max_tokens_total"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        if self.max_cost is not None and (not is_number(self.max_cost) or self.max_cost < 0):
            raise ConfigError(f"max_cost must be a number of dollars >= 0, got {self.max_cost!r}")


@dataclass(frozen=True)
class BatchMode:
    """Through the provider's Files and Batches API: ``batch=`` of a completion call
    (``batch=True`` stands for ``BatchMode()``).

    The distinct uncached requests go in batch files at the Batch API's price (half the live
    one by default, see :meth:`~llm_ops.Price.for_batch`), answered within 24 h. The batches
    are recorded in the cache before and after each provider call, so a rerun after a crash
    picks them up and never submits a request twice.

    Parameters
    ----------
    requests_per_batch, bytes_per_batch
        Requests and bytes per batch at most. ``None`` (the default): the provider's own
        limits (OpenAI's: 50,000 and 200 MB; Anthropic's: 100,000 and 256 MB; Gemini's:
        2 GB, sent inline up to 20 MB and as a file beyond). A smaller number cuts smaller
        batches; a number above the provider's limit is a :class:`ConfigError` when the job
        starts, before anything is sent.
    poll_seconds
        The first wait between asking how the batches do; it grows to a minute.
    on_expired
        What the part of an expired or cancelled batch that was not answered does:
        ``"resubmit"`` (in a new batch) or ``"live"`` (sent now).

    Examples
    --------
    >>> from llm_ops import BatchMode
    >>> BatchMode(poll_seconds=30)
    BatchMode(requests_per_batch=None, bytes_per_batch=None, poll_seconds=30.0, on_expired='resubmit')
    """  # noqa: E501

    requests_per_batch: int | None = None
    bytes_per_batch: int | None = None
    poll_seconds: float = 5.0
    on_expired: Literal["resubmit", "live"] = "resubmit"
    # The former names of requests_per_batch and bytes_per_batch, when max_requests was
    # Budget's too: given, they name the new ones.
    max_requests: InitVar[int | None] = None
    max_bytes: InitVar[int | None] = None

    def __post_init__(self, max_requests: int | None, max_bytes: int | None) -> None:
        for old, new, value in (
            ("max_requests", "requests_per_batch", max_requests),
            ("max_bytes", "bytes_per_batch", max_bytes),
        ):
            if value is not None:
                raise ConfigError(
                    f"BatchMode's {old} is {new} now: BatchMode({new}={value!r})"
                    + ("; max_requests= is Budget's alone" if old == "max_requests" else "")
                )
        for name in ("requests_per_batch", "bytes_per_batch"):
            if getattr(self, name) is not None:  # None: the provider's limit
                positive_int(name, getattr(self, name))
        object.__setattr__(self, "poll_seconds", seconds("batch poll_seconds", self.poll_seconds))
        if self.on_expired not in ("resubmit", "live"):
            raise ConfigError(f"on_expired must be 'resubmit' or 'live', got {self.on_expired!r}")


@dataclass(frozen=True)
class SemanticCache:
    """Settings of the semantic cache, an opt-in second cache tier (``semantic_cache=``).

    Parameters
    ----------
    model
        Embedding model, on the same endpoint as the completions.
    threshold
        Cosine similarity from which a cached answer is reused (0 < threshold <= 1). High
        values (0.95 and up) reuse answers to near-identical prompts only.
    dimensions
        Ask the embedding endpoint for vectors of this size.
    inputs_per_request
        Texts per embedding request.

    Examples
    --------
    >>> SemanticCache("text-embedding-3-small", threshold=0.97)  # doctest: +ELLIPSIS
    SemanticCache(model='text-embedding-3-small', threshold=0.97, dimensions=None, ...)
    """

    model: str
    threshold: float = 0.95
    dimensions: int | None = None
    inputs_per_request: int = 256

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError(
                f"SemanticCache needs an embedding model name such as "
                f"'text-embedding-3-small', got {self.model!r}"
            )
        threshold = self.threshold
        if (
            isinstance(threshold, bool)
            or not isinstance(threshold, int | float)
            or not (0 < threshold <= 1)
        ):
            raise ConfigError(
                f"SemanticCache threshold is a cosine similarity in (0, 1], "
                f"e.g. 0.95, got {threshold!r}"
            )
        for name in ("dimensions", "inputs_per_request"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigError(f"SemanticCache {name} must be a positive integer, got {value!r}")

    @property
    def params(self) -> dict[str, Any]:
        return {"dimensions": self.dimensions} if self.dimensions is not None else {}
