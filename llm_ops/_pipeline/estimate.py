"""``estimate``: what a job would send and cost, without sending anything."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl

from .._cache import Cache
from .._media import media_of, media_tokens
from .._options import Job
from .._outcome import text_of
from .._pricing import Price, add_costs, approx_tokens, cost_or_none, price_hint
from .._report import dollars
from .dispatch import requests_for
from .plan import plan_frame


@dataclass(frozen=True)
class Estimate:
    """A job's plan and price range, computed without sending a request.

    Input tokens are estimated at four characters a token plus four per message (no tokenizer
    can be downloaded here); output tokens are bounded by ``max_tokens`` and unknown without it.
    Costs are ``None`` when the model has no price ($0 when nothing is to be sent); the batch
    costs are those of ``batch=True`` (see :meth:`~llm_ops.Price.for_batch`). For a cascade
    the counts are the first model's, and the cost range runs from every row answered by the
    first model to every row sent to every model.
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
    batch_cost_min: float | None = None
    batch_cost_max: float | None = None
    unpriced: tuple[str, ...] = ()  # the job's models without a price
    refreshed_for_age: int = 0  # of the requests to send, those cached but older than max_age
    media_rows: int = 0  # rows whose request to send carries images or PDFs
    images: int = 0  # image parts to send (a PDF sent as pages: one per page)
    documents: int = 0  # PDFs to send as files
    media_tokens: int = 0  # of input_tokens, the images' and PDFs' (OpenAI's tile rule)

    def __str__(self) -> str:
        output = (
            "unbounded (set max_tokens)"
            if self.output_tokens_max is None
            else (f"{self.output_tokens_max:,}")
        )
        packing = (
            f"  ({self.requests_without_packing:,} without packing)"
            if self.requests != self.requests_without_packing
            else ""
        )
        return "\n".join(
            [
                f"rows                 {self.rows:>12,}",
                f"rows skipped (null)  {self.skipped_rows:>12,}",
                f"distinct requests    {self.distinct_requests:>12,}",
                f"cache hits           {self.cache_hits:>12,}",
                f"requests to send     {self.requests:>12,}{packing}",
                *(
                    [f"  refreshed for age  {self.refreshed_for_age:>12,}   (older than max_age)"]
                    if self.refreshed_for_age
                    else []
                ),
                *(
                    [
                        f"rows with media      {self.media_rows:>12,}   ({self.images:,} "
                        f"images, {self.documents:,} PDFs: about {self.media_tokens:,} input "
                        "tokens)"
                    ]
                    if self.media_rows
                    else []
                ),
                f"input tokens (est.)  {self.input_tokens:>12,}   (about 4 characters a token)",
                f"output tokens (max)  {output:>12}",
                f"cost                 {dollars(self.cost_min)} to {dollars(self.cost_max)}",
                f"cost (batch API)     {dollars(self.batch_cost_min)} to "
                f"{dollars(self.batch_cost_max)}",
                *([price_hint(self.unpriced)] if self.unpriced else []),
            ]
        )


def estimate_frame(frame: pl.DataFrame, job: Job, cache: Cache | None) -> Estimate:
    """Plan ``job`` over ``frame`` and price it; nothing is sent, no cache file is made."""
    plan = plan_frame(frame, job.spec, cache)
    return price_plan(
        job,
        [plan.misses],
        rows=frame.height,
        keyed_rows=int(plan.distinct["rows"].sum()),
        distinct=plan.distinct.height,
        cache_hits=plan.hits.height,
        refreshed=plan.refreshed,
    )


def price_plan(
    job: Job,
    misses: Iterable[pl.DataFrame],
    *,
    rows: int,
    keyed_rows: int,
    distinct: int,
    cache_hits: int,
    refreshed: int = 0,
) -> Estimate:
    """An :class:`Estimate` of sending the ``REQUESTS`` frames ``misses`` (a frame's, or a
    table's chunks), packed as the job packs them."""
    requests = chars = messages = singles = 0
    media = MediaCount()
    for part in misses:
        singles += part.height
        media.add(part, job)
        for request in requests_for(part, job, inline_media=False):
            requests += 1
            chars += sum(len(text_of(m["content"])) for m in request.messages)
            messages += len(request.messages)
    input_tokens = approx_tokens(chars, messages) + media.tokens
    # a reasoning model's thinking counts against max_completion_tokens, not max_tokens
    max_tokens = job.spec.params.get("max_completion_tokens") or job.spec.params.get("max_tokens")
    output_max = None if max_tokens is None else max_tokens * singles
    live = [job.spending.price(model) for model in job.models]
    batch = [None if price is None else price.for_batch() for price in live]
    cost_min, cost_max = _cost_range(live, requests, input_tokens, output_max, media.images)
    batch_min, batch_max = _cost_range(batch, requests, input_tokens, output_max, media.images)
    return Estimate(
        rows=rows,
        skipped_rows=rows - keyed_rows,
        distinct_requests=distinct,
        cache_hits=cache_hits,
        requests=requests,
        requests_without_packing=singles,
        input_tokens=input_tokens,
        output_tokens_max=output_max,
        cost_min=cost_min,
        cost_max=cost_max,
        refreshed_for_age=refreshed,
        batch_cost_min=batch_min,
        batch_cost_max=batch_max,
        media_rows=media.rows,
        images=media.images,
        documents=media.documents,
        media_tokens=media.tokens,
        unpriced=tuple(
            model
            for model, price in zip(job.models, live, strict=True)
            if price is None and requests  # nothing to send costs $0, priced or not
        ),
    )


@dataclass
class MediaCount:
    """The images and PDFs of the requests to send, and what they cost in input tokens."""

    rows: int = 0
    images: int = 0
    documents: int = 0
    tokens: int = 0

    def add(self, misses: pl.DataFrame, job: Job) -> None:
        spec = job.spec
        if spec.media is None or "media" not in misses.columns:
            return
        pages = spec.media.documents is not None and spec.media.documents.send_as == "pages"
        for rows, value in misses.select("rows", "media").iter_rows():
            items = media_of(value)
            self.rows += rows
            self.tokens += media_tokens(items, spec.media, spec.model)
            for item in items:
                if item["kind"] == "image":
                    self.images += 1
                elif pages:
                    self.images += item["pages"]
                else:
                    self.documents += 1


def _cost_range(
    prices: list[Price | None],
    requests: int,
    input_tokens: int,
    output_max: int | None,
    images: int = 0,
) -> tuple[float | None, float | None]:
    """From every request answered by the first model with no output, to every request sent
    to every model with ``output_max`` tokens (unknown without a bound); nothing to send
    costs $0."""
    if not requests:
        return 0.0, 0.0
    low = cost_or_none(
        prices[0], requests=requests, input_tokens=input_tokens, output_tokens=0, images=images
    )
    high: float | None = 0.0
    for price in prices:
        most = (
            None
            if output_max is None
            else cost_or_none(
                price,
                requests=requests,
                input_tokens=input_tokens,
                output_tokens=output_max,
                images=images,
            )
        )
        high = add_costs(high, most)
    return low, high
