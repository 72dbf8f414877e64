"""The data every stage passes around: a distinct request, a pack or batch of them, and its
outcome; and the live counters of a dispatch.

The planner makes :class:`Request` s, the engine sends them and reports one :class:`Outcome`
each, the persist, join and report stages read those: none of them needs the engine for its
types.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from ._pack import pack_messages
from ._status import Status
from .exceptions import JobAbortedError, JobInterruptedError

Sent = Status | Literal["aborted"]
"""What became of a request: a row status, or ``aborted`` when the job stopped first."""
STOPS = (JobAbortedError, JobInterruptedError, asyncio.CancelledError)
"""Why a dispatch can stop early: refused or unreachable, SIGTERM, Ctrl-C."""
TRUNCATED_MESSAGE = "the answer was cut at max_tokens (it stopped for its length)"
MEDIA_IN_FLIGHT = 256 * 2**20
"""The most bytes of images and PDFs (as sent, base64) a dispatch's requests hold at once."""


class Share:
    """What one request holds of an :class:`InFlight` budget."""

    def __init__(self, size: int) -> None:
        self.size = size


class InFlight:
    """A dispatch's budget of media bytes in flight: a request carrying images or PDFs holds
    its share (:attr:`Request.media_bytes`, the most its media may take) from reading its
    files to its last attempt, and waits for room first; once its files are read, it gives
    back what they did not take (a PDF's pages rendered to less than they might). So however
    many requests are in flight, and whatever a PDF's pages render to, their media hold at
    most ``limit`` bytes (one request alone may hold more: it is never refused, only made to
    wait until it is alone)."""

    def __init__(self, limit: int = MEDIA_IN_FLIGHT) -> None:
        self.limit = limit
        self.held = 0
        self._waiting: list[asyncio.Future[None]] = []

    @contextlib.asynccontextmanager
    async def holding(self, size: int) -> AsyncIterator[Share]:
        """Hold ``size`` bytes (all of the budget, at most) while the block runs."""
        share = Share(min(size, self.limit))
        while self.held + share.size > self.limit:
            room = asyncio.get_running_loop().create_future()
            self._waiting.append(room)
            try:
                await room
            finally:
                if room in self._waiting:
                    self._waiting.remove(room)
        self.held += share.size
        try:
            yield share
        finally:  # given back at once, without awaiting: a cancelled request returns it too
            self.shrink(share, 0)

    def shrink(self, share: Share, size: int) -> None:
        """Hold only ``size`` bytes of ``share`` from now on (when that is less)."""
        if size >= share.size:
            return
        self.held -= share.size - size
        share.size = size
        waiting, self._waiting = self._waiting, []
        for room in waiting:  # each looks again whether its share fits
            if not room.done():
                room.set_result(None)


# The share the request being sent holds, for Request.sent_messages to shrink to what its
# media took: set by Request.holding, in the task that sends the request.
_SHARE: contextvars.ContextVar[Share | None] = contextvars.ContextVar("share", default=None)


def media_bytes_in(messages: list[dict[str, Any]]) -> int:
    """The bytes of the ``data:`` URLs in ``messages``: what their images and files take."""
    total = 0
    for message in messages:
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            inner = part.get("image_url") or part.get("file") or {}
            url = inner.get("url") or inner.get("file_data") or ""
            total += len(url) if url.startswith("data:") else 0
    return total


def text_of(content: str | list[dict[str, Any]]) -> str:
    """The text of a message's content: itself, or its text parts (a request with media)."""
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content if part.get("type") == "text")


def images_in(messages: list[dict[str, Any]]) -> int:
    """The image parts of ``messages`` (a PDF sent as pages: one a page), which a provider
    pricing per image (:attr:`~llm_ops.Price.per_image`) bills."""
    return sum(
        1
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image_url"
    )


@dataclass(frozen=True)
class Request:
    """One distinct request: its key, the chat messages and the canonical request JSON."""

    key: str
    messages: list[dict[str, Any]]  # a content is a text, or a list of parts with media
    request_json: str
    rows: int = 1  # input rows waiting for this answer
    media_tokens: int = 0  # the images' and PDFs' prompt tokens, estimated
    # The messages as sent, made just before sending (off the event loop): ``messages`` hold
    # the images and PDFs as the hashes that were keyed, these their bytes. Raises
    # llm_ops._media.Unusable when a file changed or went since it was keyed.
    load: Callable[[], list[dict[str, Any]]] | None = field(default=None, repr=False)
    # the most media bytes the messages as sent hold, and the dispatch's budget they count in
    media_bytes: int = 0
    in_flight: InFlight | None = field(default=None, repr=False, compare=False)

    @contextlib.asynccontextmanager
    async def holding(self) -> AsyncIterator[None]:
        """Hold this request's share of the media bytes in flight (nothing without media),
        shrunk by :meth:`sent_messages` to what they took."""
        if self.in_flight is None or not self.media_bytes:
            yield
            return
        async with self.in_flight.holding(self.media_bytes) as share:
            token = _SHARE.set(share)
            try:
                yield
            finally:
                _SHARE.reset(token)

    async def sent_messages(self) -> list[dict[str, Any]]:
        """The messages to send: :attr:`messages`, or what :attr:`load` makes, in a thread
        (reading files, encoding and rendering PDF pages would stall the loop)."""
        if self.load is None:
            return self.messages
        messages = await asyncio.to_thread(self.load)
        share = _SHARE.get()
        if self.in_flight is not None and share is not None:
            self.in_flight.shrink(share, media_bytes_in(messages))
        return messages


@dataclass(frozen=True)
class Pack(Request):
    """Up to ``rows_per_request`` distinct requests with the same system message, sent as one
    (see :mod:`llm_ops._pack`)."""

    members: tuple[Request, ...] = ()
    system: str | None = None

    def split(self) -> tuple[Request, Request]:
        """Two halves; a half of one member is that member's ordinary request."""
        middle = len(self.members) // 2
        return make_pack(self.members[:middle], self.system), make_pack(
            self.members[middle:], self.system
        )


def make_pack(members: tuple[Request, ...], system: str | None) -> Request:
    """A pack of ordinary single-row ``members`` sharing ``system``; one member is itself."""
    if len(members) == 1:
        return members[0]
    prompts = [member.messages[-1]["content"] for member in members]
    return Pack(
        key="pack:" + members[0].key,
        messages=pack_messages(system, prompts),
        request_json="",
        rows=sum(m.rows for m in members),
        members=members,
        system=system,
    )


@dataclass(frozen=True)
class EmbeddingsRequest(Request):
    """Several distinct inputs sent as one embeddings request."""

    keys: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    requests_json: tuple[str, ...] = ()
    input_rows: tuple[int, ...] = ()  # input rows waiting for each input

    def split(self) -> tuple[EmbeddingsRequest, EmbeddingsRequest]:
        """Two halves, each its own request."""
        middle = len(self.inputs) // 2
        halves = (slice(None, middle), slice(middle, None))
        return tuple(  # type: ignore[return-value]
            EmbeddingsRequest(
                key=f"{self.key}.{n}",
                messages=[],
                request_json="",
                rows=sum(self.input_rows[half]),
                keys=self.keys[half],
                inputs=self.inputs[half],
                requests_json=self.requests_json[half],
                input_rows=self.input_rows[half],
            )
            for n, half in enumerate(halves)
        )


@dataclass(slots=True)  # one per request on the hot path: slots make it cheaper
class Outcome:
    """What became of one request."""

    key: str
    status: Sent
    text: str | None = None
    json: str | None = None  # normalised structured answer, when a schema was asked for
    vectors: list[list[float]] | None = None  # embeddings, one per input of an EmbeddingsRequest
    items: list[tuple[Request, Outcome]] | None = None  # a pack's members and their outcomes
    error: str | None = None
    stop_reason: str | None = None  # why the answer stopped, in the endpoint's own word
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, read from the server's prefix cache
    reasoning_tokens: int = 0  # of completion_tokens, a reasoning model's unseen thinking
    reasoning: str | None = None  # that thinking's text, when the endpoint returned it
    cache_write_tokens: int = 0  # of prompt_tokens, written to the provider's prompt cache
    latency_ms: float = 0.0
    attempts: int = 0
    http_status: int | None = None  # of the last failed attempt the endpoint answered
    usage_known: bool = True  # False: the endpoint's token counts could not be right
    response_model: str | None = None  # the model the answer names (for its attempt's span)
    response_id: str | None = None  # the answer's own id (for its attempt's span)


@dataclass
class Counters:
    """Live counters of one job, readable while it runs (``Dispatcher.counters``)."""

    total: int = 0
    sent: int = 0
    answered: int = 0  # attempts answered with HTTP 200: what per-request pricing bills
    retries: int = 0
    done: int = 0
    rate_limited: int = 0
    timeouts: int = 0
    splits: int = 0  # packs whose answers did not match their ids, split and resent
    over_budget: int = 0  # requests not sent because a budget was reached
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, billed at the cached-input price
    reasoning_tokens: int = 0  # of completion_tokens, billed but never seen (thinking)
    cache_write_tokens: int = 0  # of prompt_tokens, billed at the cache-write price
    images: int = 0  # image parts of the requests answered, for a price per image
    usage_unknown: int = 0  # answers whose usage could not be right: their tokens are not here
    # the embedding requests the semantic cache made for this job, and their tokens
    embedding_requests: int = 0
    embedding_tokens: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    # where the concurrency was when the dispatch ended, and why (see llm_ops._concurrency)
    concurrency: int = 0
    concurrency_why: str = ""

    def add(self, other: Counters) -> None:
        """Add another dispatch's counters (say, one chunk's) to these; the concurrency is the
        later one's."""
        for item in fields(self):
            if item.name == "by_status":
                for status, n in other.by_status.items():
                    self.by_status[status] = self.by_status.get(status, 0) + n
            elif item.name in ("concurrency", "concurrency_why"):
                if other.concurrency:
                    setattr(self, item.name, getattr(other, item.name))
            else:
                setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))
