"""``estimate``: what a job would send and cost, without sending anything."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from .._cache import Cache
from .._media import media_of, media_tokens
from .._options import Job
from .._outcome import text_of
from .._pricing import Price, add_costs, approx_tokens, cost_or_none, price_hint
from .._report import dollars
from .dispatch import requests_for
from .plan import Keyed, plan_frame

REASONING_MODEL = re.compile(r"(^|/)(o\d|gpt-5|deepseek-reasoner|deepseek-r1|qwq)|think", re.I)
"""Model names taken for a reasoning model's without a reasoning option set: OpenAI's o-series
(o1, o3, o4-mini) and gpt-5, DeepSeek's reasoner and R1, Qwen's QwQ, and any name with
"think" in it (Qwen3's -Thinking models, the simulator's sim-think); a provider's prefix
(``openai/o3``) is allowed."""
REASONING_OUTPUT_MULTIPLE = 5
"""A reasoning model's output with its thinking, at most, as a multiple of its answers' when
nothing caps the thinking (``max_completion_tokens`` unset): up to four thinking tokens an
answer token, as low and medium effort commonly spend. Servers differ on whether
``max_tokens`` caps the thinking too, so it is not taken to."""


@dataclass(frozen=True)
class Estimate:
    """A job's plan and price range, computed without sending a request.

    Input tokens are estimated at four characters a token plus four per message (no tokenizer
    can be downloaded here); output tokens are bounded by ``max_tokens`` and unknown without it.
    Costs are ``None`` when the model has no price ($0 when nothing is to be sent); the batch
    costs are those of ``batch=True`` (see :meth:`~llm_ops.Price.for_batch`). For a cascade
    the counts are the first model's, and the cost range runs from every row answered by the
    first model to every row sent to every model.

    A reasoning model's thinking is output too, billed and unseen, and how much of it there
    will be is not known before the run. So for a job that asks one (``reasoning``:
    ``reasoning_effort`` or ``max_completion_tokens`` set, or a model named like one, see
    :data:`REASONING_MODEL`) the output is a range: ``output_tokens_max`` and ``cost_max``
    bound the answers alone, ``output_tokens_high``, ``cost_high`` and ``batch_cost_high`` the
    answers with the most thinking: ``max_completion_tokens`` a request when it is set (it caps
    both), else :data:`REASONING_OUTPUT_MULTIPLE` times the answers' bound. For any other
    model the high figures equal the max ones.

    Where the endpoint's dialect marks the shared prefix for a provider's prompt cache
    (Anthropic's, see :attr:`~llm_ops._options.Job.prompt_cache`), the system prompt is
    projected written once (``cache_write_tokens``) and read by every later request sending
    it (``cache_read_tokens``), each at its own price: both are part of ``input_tokens``. A
    system prompt under the provider's least cacheable prefix is projected uncached, and one
    still cached from an earlier job (five minutes at Anthropic) is projected written again.
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
    # A reasoning model (see is_reasoning): its thinking is output too, unknown before the run.
    # output_tokens_max and cost_max are then the answers alone, the *_high the answers with
    # as much thinking as can be (see reasoning_bound); without one, the same as theirs.
    reasoning: bool = False
    output_tokens_high: int | None = None
    cost_high: float | None = None
    batch_cost_high: float | None = None
    rejected_rows: int = 0  # rows whose image or PDF cannot be sent (not in skipped_rows)
    media_rows: int = 0  # rows whose request to send carries images or PDFs
    images: int = 0  # image parts to send (a PDF sent as pages: one per page)
    documents: int = 0  # PDFs to send as files
    media_tokens: int = 0  # of input_tokens, the images' and PDFs' (OpenAI's tile rule)
    cache_write_tokens: int = 0  # of input_tokens, written to the provider's prompt cache
    cache_read_tokens: int = 0  # of input_tokens, read from it

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
                *(
                    [f"rows rejected        {self.rejected_rows:>12,}   (media not sendable)"]
                    if self.rejected_rows
                    else []
                ),
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
                *(
                    [
                        f"  prompt cache       {self.cache_read_tokens:>12,}   read, "
                        f"{self.cache_write_tokens:,} written (the system prompt)"
                    ]
                    if self.cache_write_tokens
                    else []
                ),
                f"output tokens (max)  {output:>12}",
                *self._thinking_tokens(),
                f"cost                 {dollars(self.cost_min)} to {dollars(self.cost_max)}",
                *self._thinking_cost("cost with thinking", self.cost_min, self.cost_high),
                f"cost (batch API)     {dollars(self.batch_cost_min)} to "
                f"{dollars(self.batch_cost_max)}",
                *self._thinking_cost(
                    "  batch, thinking", self.batch_cost_min, self.batch_cost_high
                ),
                *([price_hint(self.unpriced)] if self.unpriced else []),
            ]
        )

    def _thinking_tokens(self) -> list[str]:
        """A reasoning model's output tokens with its thinking, at most."""
        if not self.reasoning:
            return []
        high = self.output_tokens_high
        if high is None:
            return ["  with thinking         unbounded   (set max_completion_tokens to bound it)"]
        return [f"  with thinking      {high:>12,}   (a reasoning model: thinking is output too)"]

    def _thinking_cost(self, label: str, low: float | None, high: float | None) -> list[str]:
        if not self.reasoning:
            return []
        return [f"{label:<20} {dollars(low)} to {dollars(high)}"]


def estimate_frame(frame: pl.DataFrame, job: Job, cache: Cache | None) -> Estimate:
    """Plan ``job`` over ``frame`` and price it; nothing is sent, no cache file is made."""
    plan = plan_frame(frame, job.spec, cache)
    return price_plan(
        job,
        [plan.misses],
        rows=frame.height,
        keyed_rows=int(plan.distinct["rows"].sum()),
        rejected_rows=count_rejected(plan),
        distinct=plan.distinct.height,
        cache_hits=plan.hits.height,
        refreshed=plan.refreshed,
    )


def count_rejected(keyed: Keyed) -> int:
    """The rows of ``keyed`` whose image or PDF cannot be sent."""
    rejected = keyed.groups["skip_status"] == "rejected"
    return int(rejected.gather(keyed.row_group).sum())


def price_plan(
    job: Job,
    misses: Iterable[pl.DataFrame],
    *,
    rows: int,
    keyed_rows: int,
    rejected_rows: int = 0,
    distinct: int,
    cache_hits: int,
    refreshed: int = 0,
) -> Estimate:
    """An :class:`Estimate` of sending the ``REQUESTS`` frames ``misses`` (a frame's, or a
    table's chunks), packed as the job packs them."""
    requests = chars = messages = singles = 0
    media = MediaCount()
    cache = PromptCache(job.prompt_cache)
    for part in misses:
        singles += part.height
        media.add(part, job)
        for request in requests_for(part, job):
            requests += 1
            chars += sum(len(text_of(m["content"])) for m in request.messages)
            messages += len(request.messages)
            cache.add(request.messages)
    input_tokens = approx_tokens(chars, messages) + media.tokens
    cached = (cache.read, cache.written)
    # a reasoning model's thinking counts against max_completion_tokens, not max_tokens
    max_tokens = job.spec.params.get("max_completion_tokens") or job.spec.params.get("max_tokens")
    output_max = None if max_tokens is None else max_tokens * singles
    live = [job.spending.price(model) for model in job.models]
    batch = [None if price is None else price.for_batch() for price in live]
    cost_min, cost_max = _cost_range(live, requests, input_tokens, output_max, media.images, cached)
    batch_min, batch_max = _cost_range(
        batch, requests, input_tokens, output_max, media.images, cached
    )
    estimated = Estimate(
        rows=rows,
        skipped_rows=rows - keyed_rows - rejected_rows,
        rejected_rows=rejected_rows,
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
        cache_write_tokens=cache.written,
        cache_read_tokens=cache.read,
        unpriced=tuple(
            model
            for model, price in zip(job.models, live, strict=True)
            if price is None and requests  # nothing to send costs $0, priced or not
        ),
    )
    return with_thinking(
        estimated, job, live, batch, requests, input_tokens, singles, media.images, cached
    )


def is_reasoning(job: Job) -> bool:
    """Whether the job asks a reasoning model, whose thinking is output nobody sees: a
    reasoning option is set (``reasoning_effort``, ``max_completion_tokens``) or a model's name
    is one's (:data:`REASONING_MODEL`)."""
    params = job.spec.params
    if "reasoning_effort" in params or "max_completion_tokens" in params:
        return True
    return any(REASONING_MODEL.search(model) for model in job.models)


def reasoning_bound(job: Job, answers: int | None, singles: int) -> int | None:
    """A reasoning model's output tokens with its thinking, at most: ``max_completion_tokens``
    a request (it caps the thinking and the answer together), else
    :data:`REASONING_OUTPUT_MULTIPLE` times the ``answers`` bound; ``None``: unbounded."""
    cap = job.spec.params.get("max_completion_tokens")
    if cap is not None:
        return int(cap) * singles
    return None if answers is None else answers * REASONING_OUTPUT_MULTIPLE


def with_thinking(
    estimated: Estimate,
    job: Job,
    live: list[Price | None],
    batch: list[Price | None],
    requests: int,
    input_tokens: int,
    singles: int,
    images: int,
    cached: tuple[int, int] = (0, 0),
) -> Estimate:
    """``estimated`` with its output and costs at the most thinking can make them: the same
    as without for a model that does not reason."""
    if not is_reasoning(job):
        return replace(
            estimated,
            output_tokens_high=estimated.output_tokens_max,
            cost_high=estimated.cost_max,
            batch_cost_high=estimated.batch_cost_max,
        )
    high = reasoning_bound(job, estimated.output_tokens_max, singles)
    return replace(
        estimated,
        reasoning=True,
        output_tokens_high=high,
        cost_high=_cost_range(live, requests, input_tokens, high, images, cached)[1],
        batch_cost_high=_cost_range(batch, requests, input_tokens, high, images, cached)[1],
    )


@dataclass
class PromptCache:
    """The system prompts of the requests to send as a provider's prompt cache bills them,
    when the endpoint marks them for it (``least``: the fewest tokens it caches; ``None``: no
    mark): each distinct one written by its first request, read by every later one."""

    least: int | None
    written: int = 0
    read: int = 0
    seen: set[str] = field(default_factory=set)

    def add(self, messages: list[dict[str, Any]]) -> None:
        if self.least is None or not messages or messages[0].get("role") != "system":
            return
        system = text_of(messages[0]["content"])
        tokens = approx_tokens(len(system), 1)
        if tokens < self.least:
            return
        if system in self.seen:
            self.read += tokens
        else:
            self.seen.add(system)
            self.written += tokens


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
    cached: tuple[int, int] = (0, 0),
) -> tuple[float | None, float | None]:
    """From every request answered by the first model with no output, to every request sent
    to every model with ``output_max`` tokens (unknown without a bound); ``cached``: the input
    tokens (read, written) of the provider's prompt cache. Nothing to send costs $0."""
    if not requests:
        return 0.0, 0.0
    read, written = cached
    low = cost_or_none(
        prices[0],
        requests=requests,
        input_tokens=input_tokens,
        output_tokens=0,
        images=images,
        cached_input_tokens=read,
        cache_write_tokens=written,
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
                cached_input_tokens=read,
                cache_write_tokens=written,
            )
        )
        high = add_costs(high, most)
    return low, high
