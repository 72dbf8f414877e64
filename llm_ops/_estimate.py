"""``estimate``: what a job would send and cost, without sending anything."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._job import CachePath, make_job
from ._operator import _schema, _to_polars
from ._plan import plan_frame
from ._pricing import PricingOption, add_costs, cost_or_none
from ._run import requests_for


@dataclass(frozen=True)
class Estimate:
    """A job's plan and price range, computed without sending a request.

    Input tokens are estimated at four characters a token plus four per message (no tokenizer
    can be downloaded here); output tokens are bounded by ``max_tokens`` and unknown without it.
    Costs are ``None`` when the model has no price.
    """

    rows: int
    skipped_rows: int
    distinct_requests: int
    cache_hits: int
    requests: int
    requests_without_packing: int
    input_tokens: int
    output_tokens_max: int | None
    cost_min: float | None
    cost_max: float | None

    def __str__(self) -> str:
        def money(value: float | None) -> str:
            return "unknown" if value is None else f"${value:,.4f}"

        output = "unbounded (set max_tokens)" if self.output_tokens_max is None else (
            f"{self.output_tokens_max:,}")
        packing = (f"  ({self.requests_without_packing:,} without packing)"
                   if self.requests != self.requests_without_packing else "")
        return "\n".join([
            f"rows                 {self.rows:>12,}",
            f"rows skipped (null)  {self.skipped_rows:>12,}",
            f"distinct requests    {self.distinct_requests:>12,}",
            f"cache hits           {self.cache_hits:>12,}",
            f"requests to send     {self.requests:>12,}{packing}",
            f"input tokens (est.)  {self.input_tokens:>12,}   (about 4 characters a token)",
            f"output tokens (max)  {output:>12}",
            f"cost                 {money(self.cost_min)} to {money(self.cost_max)}",
        ])


def estimate(
    df: Any,
    /,
    *,
    prompt: str,
    model: str | Sequence[str],
    system: str | None = None,
    base_url: str | None = None,
    cache: CachePath = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    rows_per_request: int = 1,
    pack_tokens: int | None = None,
    pricing: PricingOption = None,
) -> Estimate:
    """Plan a :func:`~llm_ops.llm_complete` job and price it; nothing is sent.

    The arguments mean what they mean for ``llm_complete``; those that change the request
    (``system``, ``max_tokens``, ``temperature``, the endpoint) must match for cache hits
    to be counted. For a cascade (``model=[small, large]``) the counts are the first model's,
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
    frame = _to_polars(df)
    job = make_job(_schema(df), prompt=prompt, model=model, system=system, base_url=base_url,
                   api_key="not-needed-nothing-is-sent", cache=cache, max_tokens=max_tokens,
                   temperature=temperature, rows_per_request=rows_per_request,
                   pack_tokens=pack_tokens, pricing=pricing)
    plan = plan_frame(frame, job)
    requests = list(requests_for(plan.misses, job))
    chars = sum(len(m["content"]) for r in requests for m in r.messages)
    input_tokens = chars // 4 + 4 * sum(len(r.messages) for r in requests)
    output_max = None if max_tokens is None else max_tokens * plan.misses.height
    cost_min = cost_or_none(job.price, requests=len(requests), input_tokens=input_tokens,
                            output_tokens=0)
    cost_max: float | None = 0.0
    for price in job.prices.values():
        most = None if output_max is None else cost_or_none(
            price, requests=len(requests), input_tokens=input_tokens, output_tokens=output_max)
        cost_max = add_costs(cost_max, most)
    return Estimate(
        rows=frame.height, skipped_rows=frame.height - int(plan.distinct["rows"].sum()),
        distinct_requests=plan.distinct.height, cache_hits=plan.hits.height,
        requests=len(requests), requests_without_packing=plan.misses.height,
        input_tokens=input_tokens, output_tokens_max=output_max, cost_min=cost_min,
        cost_max=cost_max,
    )
