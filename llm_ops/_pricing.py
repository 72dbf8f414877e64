"""Prices, cost estimates and spending limits.

Providers price in two ways: per token (input, output and often a cheaper cached-input price,
in dollars per million tokens) or per request (a flat fee per call). :data:`PRICES` holds list
prices for common models; pass ``pricing=`` to add or override models. A model without a price
has an *unknown* cost, never a zero one.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from .exceptions import ConfigError


@dataclass(frozen=True)
class Price:
    """What a model costs: dollars per million tokens, and/or dollars per request.

    ``per_image`` prices each image sent (a PDF sent as pages: each page), for providers
    that bill images per picture rather than as input tokens.
    ``cached_input_per_million`` prices the input tokens a server read from its prefix cache
    (``usage.prompt_tokens_details.cached_tokens``, which OpenAI and vLLM report, and the
    reads Anthropic reports); without it they cost the input price.
    ``cache_write_per_million`` prices the input tokens written to a provider's prompt cache
    (Anthropic bills a write 1.25 times the input price for its five-minute cache); without
    it they cost the input price. ``batch`` is the price through
    the provider's Batch API (``batch=True``); without one, every part of the live price is
    halved, as OpenAI, Anthropic and most gateways bill batches (the cache's discounts stack
    with the batch's).

    Examples
    --------
    >>> Price(input_per_million=0.15, output_per_million=0.60).cost(
    ...     requests=10, input_tokens=2_000_000, output_tokens=1_000_000)
    0.9
    >>> Price(per_request=0.002).cost(requests=500, input_tokens=10**9, output_tokens=0)
    1.0
    >>> Price(2.0, 8.0, cached_input_per_million=0.5).cost(
    ...     requests=1, input_tokens=1_000_000, output_tokens=0, cached_input_tokens=600_000)
    1.1
    >>> Price(3.0, 15.0, 0.30, cache_write_per_million=3.75).cost(
    ...     requests=1, input_tokens=3_000, output_tokens=0, cached_input_tokens=1_000,
    ...     cache_write_tokens=1_000)
    0.00705
    >>> batch = Price(0.15, 0.60).for_batch()
    >>> batch.input_per_million, batch.output_per_million
    (0.075, 0.3)
    """

    input_per_million: float = 0.0
    output_per_million: float = 0.0
    cached_input_per_million: float | None = None
    per_request: float = 0.0
    batch: Price | None = None
    per_image: float = 0.0
    cache_write_per_million: float | None = None

    def for_batch(self) -> Price:
        """The price of the same work sent through the Batch API."""
        if self.batch is not None:
            return self.batch
        cached, written = self.cached_input_per_million, self.cache_write_per_million
        return Price(
            self.input_per_million / 2,
            self.output_per_million / 2,
            None if cached is None else cached / 2,
            self.per_request / 2,
            per_image=self.per_image / 2,
            cache_write_per_million=None if written is None else written / 2,
        )

    @classmethod
    def given(
        cls,
        input_per_million: float | None = None,
        output_per_million: float | None = None,
        per_request: float | None = None,
    ) -> Price | None:
        """A price from the parts given (the rest free), or ``None`` when none is: what a
        command line's or a flow's price flags mean."""
        parts = (input_per_million, output_per_million, per_request)
        if all(part is None for part in parts):
            return None
        return cls(input_per_million or 0.0, output_per_million or 0.0, None, per_request or 0.0)

    def cost(
        self,
        *,
        requests: int,
        input_tokens: int,
        output_tokens: int,
        cached_input_tokens: int = 0,
        images: int = 0,
        cache_write_tokens: int = 0,
    ) -> float:
        """Dollars for this many requests, tokens and images; ``cached_input_tokens`` and
        ``cache_write_tokens`` (both part of ``input_tokens``) at the cached-input and the
        cache-write prices."""
        cached_rate = (
            self.input_per_million
            if self.cached_input_per_million is None
            else self.cached_input_per_million
        )
        write_rate = (
            self.input_per_million
            if self.cache_write_per_million is None
            else self.cache_write_per_million
        )
        fresh = input_tokens - cached_input_tokens - cache_write_tokens
        total = (
            self.per_request * requests
            + self.per_image * images
            + self.input_per_million * fresh / 1e6
            + cached_rate * cached_input_tokens / 1e6
            + write_rate * cache_write_tokens / 1e6
            + self.output_per_million * output_tokens / 1e6
        )
        return round(total, 10)


# List prices in US dollars (OpenAI, 2025); check your provider's page and override with
# pricing= when they differ. The local simulator's models (llm_ops.testing) cost nothing, as
# a model you host does: a demo on them costs $0, and a benchmark that wants list-price
# figures passes pricing= (benchmarks/levers.py prices sim-small as gpt-4o-mini).
PRICES: dict[str, Price] = {
    "gpt-4o-mini": Price(0.15, 0.60, 0.075),
    "gpt-4o": Price(2.50, 10.00, 1.25),
    "gpt-4.1": Price(2.00, 8.00, 0.50),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.025),
    # Anthropic (2025): a cache read is a tenth of the input price, a write (five-minute
    # cache) 1.25 times it
    "claude-opus-4-5": Price(5.00, 25.00, 0.50, cache_write_per_million=6.25),
    "claude-sonnet-4-5": Price(3.00, 15.00, 0.30, cache_write_per_million=3.75),
    "claude-haiku-4-5": Price(1.00, 5.00, 0.10, cache_write_per_million=1.25),
    "text-embedding-3-small": Price(0.02),
    "text-embedding-3-large": Price(0.13),
    "sim": Price(),
    "sim-small": Price(),
    "sim-embed": Price(),
    "sim-think": Price(),
}

PricingOption = Price | Mapping[str, Price] | Literal["free"] | None
"""``pricing=``: one price for every model, a price per model, or ``"free"`` for models you
host yourself (every cost is then $0, known, not unknown)."""
FREE = Price()

CHARS_PER_TOKEN = 4
"""No tokenizer can be downloaded here: prompts are estimated at about four characters a
token, plus four tokens per chat message."""


def approx_tokens(chars: int, messages: int = 0) -> int:
    """About how many tokens ``chars`` characters in ``messages`` chat messages are."""
    return chars // CHARS_PER_TOKEN + 4 * messages


def price_hint(models: Sequence[str]) -> str:
    """How to give ``models`` (those without a price) one: the same words in the run report,
    ``estimate``, the CLI and the Prefect flow, each way named.

    Examples
    --------
    >>> import textwrap
    >>> print(textwrap.fill(price_hint(["gpt4o-mini"]), 90))
    no price for 'gpt4o-mini' (did you mean 'gpt-4o-mini'?): give one in dollars per million
    input and output tokens with pricing={'gpt4o-mini': Price(IN, OUT)} in Python, or
    --pricing gpt4o-mini=IN,OUT on the command line and in the flow; for a model you host,
    pricing='free' (--pricing free)
    """
    named = ", ".join(map(repr, models))
    first = models[0]
    closest = difflib.get_close_matches(first, list(PRICES), n=1, cutoff=0.6)
    guess = f" (did you mean {closest[0]!r}?)" if closest else ""
    return (
        f"no price for {named}{guess}: give one in dollars per million input and output "
        f"tokens with pricing={{{first!r}: Price(IN, OUT)}} in Python, or --pricing "
        f"{first}=IN,OUT on the command line and in the flow; for a model you host, "
        "pricing='free' (--pricing free)"
    )


def parse_pricing(items: Sequence[str]) -> PricingOption:
    """The ``pricing=`` that ``--pricing`` items give on the command line and in the flow:
    ``MODEL=IN,OUT`` per model (dollars per million input and output tokens, and optionally
    a third number, dollars per request), ``IN,OUT`` for every model, or ``free``.

    Examples
    --------
    >>> parse_pricing(["gpt-4o-mini=0.15,0.60"])["gpt-4o-mini"].output_per_million
    0.6
    >>> parse_pricing(["free"])
    'free'
    """
    if not items:
        return None
    if list(items) == ["free"]:
        return "free"
    table: dict[str, Price] = {}
    for item in items:
        model, _, rates = item.rpartition("=")
        try:
            numbers = [float(rate) for rate in rates.split(",")]
            if len(numbers) not in (2, 3) or min(numbers) < 0:
                raise ValueError
        except ValueError:
            raise ConfigError(
                f"--pricing takes MODEL=IN,OUT (dollars per million input and output tokens, "
                f"e.g. gpt-4o-mini=0.15,0.60), IN,OUT for every model, or free; got {item!r}"
            ) from None
        table[model] = Price(numbers[0], numbers[1], None, numbers[2] if numbers[2:] else 0.0)
    if "" in table and len(table) > 1:
        raise ConfigError(
            "--pricing takes IN,OUT for every model or MODEL=IN,OUT per model, not both"
        )
    return table.pop("") if "" in table else table


def price_for(model: str, pricing: PricingOption = None) -> Price | None:
    """The price of ``model``: from ``pricing`` (a Price, a table, or ``"free"``), else
    :data:`PRICES`."""
    if isinstance(pricing, Price):
        return pricing
    if pricing == "free":
        return FREE
    if pricing is not None:
        if not isinstance(pricing, Mapping) or not all(
            isinstance(p, Price) for p in pricing.values()
        ):
            raise ConfigError(
                "pricing must be a Price, a dict of model name to Price, e.g. "
                "{'my-model': Price(input_per_million=0.5, output_per_million=1.5)}, or "
                "'free' for models you host yourself"
            )
        if model in pricing:
            return pricing[model]
    return PRICES.get(model)


def cost_or_none(
    price: Price | None,
    *,
    requests: int,
    input_tokens: int,
    output_tokens: int,
    cached_input_tokens: int = 0,
    images: int = 0,
    cache_write_tokens: int = 0,
) -> float | None:
    """:meth:`Price.cost`, or ``None`` when the price is unknown; nothing spent (no request,
    no token) costs $0 whatever the price, so a job the cache answered costs $0, not unknown."""
    if price is None:
        return 0.0 if not (requests or input_tokens or output_tokens) else None
    return price.cost(
        requests=requests,
        images=images,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=cached_input_tokens,
        cache_write_tokens=cache_write_tokens,
    )


def add_costs(a: float | None, b: float | None) -> float | None:
    """The sum of two costs, unknown if either is."""
    return None if a is None or b is None else round(a + b, 10)


def subtract_costs(a: float | None, b: float | None) -> float | None:
    """``a - b``, unknown if either is."""
    return None if a is None or b is None else round(a - b, 10)


@dataclass
class SpendingCap:
    """Spending limits of one job; a request is only sent if its projected cost still fits."""

    price: Price | None
    max_cost: float | None = None
    max_requests: int | None = None
    max_tokens_total: int | None = None
    spent_cost: float = 0.0
    spent_requests: int = 0
    spent_tokens: int = 0
    exhausted: str | None = None  # why sending stopped

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.max_cost, self.max_requests, self.max_tokens_total))

    def charge(self, cost: float, requests: int, tokens: int) -> None:
        """Count what other work of the job spent (say, the semantic cache's embeddings)."""
        self.spent_cost += cost
        self.spent_requests += requests
        self.spent_tokens += tokens

    def reserve(self, input_tokens: int, output_tokens: int) -> bool:
        """Count one request of about this size against the limits, if it fits."""
        if self.exhausted is not None:
            return False
        cost = (
            cost_or_none(
                self.price, requests=1, input_tokens=input_tokens, output_tokens=output_tokens
            )
            or 0.0
        )
        tokens = input_tokens + output_tokens
        if self.max_requests is not None and self.spent_requests + 1 > self.max_requests:
            self.exhausted = f"max_requests={self.max_requests} reached"
        elif self.max_tokens_total is not None and (
            self.spent_tokens + tokens > self.max_tokens_total
        ):
            self.exhausted = f"max_tokens_total={self.max_tokens_total:,} would be exceeded"
        elif self.max_cost is not None and self.spent_cost + cost > self.max_cost + 1e-9:
            self.exhausted = f"max_cost=${self.max_cost:g} would be exceeded"
        if self.exhausted is not None:
            return False
        self.spent_requests += 1
        self.spent_tokens += tokens
        self.spent_cost += cost
        return True

    def settle(
        self,
        estimated: tuple[int, int],
        actual: tuple[int, int],
        *,
        cached_input_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> None:
        """Replace a reservation's estimate with what ``usage`` reported: ``actual`` input and
        output tokens, ``cached_input_tokens`` and ``cache_write_tokens`` of the input at the
        cached-input and cache-write prices (a reservation counts every input token at the
        full price)."""
        self.spent_tokens += sum(actual) - sum(estimated)
        if self.price is not None:
            self.spent_cost += self.price.cost(
                requests=0,
                input_tokens=actual[0],
                output_tokens=actual[1],
                cached_input_tokens=cached_input_tokens,
                cache_write_tokens=cache_write_tokens,
            ) - self.price.cost(requests=0, input_tokens=estimated[0], output_tokens=estimated[1])
