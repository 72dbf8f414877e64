"""The Anthropic dialect: the Messages API (``POST /v1/messages`` under
``https://api.anthropic.com``), as Anthropic's own SDK speaks it.

Everything Anthropic's API spells lives here (and in the simulator that plays it): the
``x-api-key`` and ``anthropic-version`` headers, the ``system`` field, content blocks
(``text``, ``image``, ``document``, ``thinking``), ``stop_reason``, ``usage`` with its cache
counts, the ``anthropic-ratelimit-*`` headers and the error object.

The request it is given is the canonical request (OpenAI-shaped: what a cache key hashes, see
:mod:`llm_ops._key`), translated here as it is sent:

- system messages become the top-level ``system``; a user message's parts become content
  blocks: a ``data:`` URL image a ``base64`` image source, a remote one a ``url`` source (its
  ``detail`` has no Anthropic counterpart: dropped), a PDF a ``document`` block;
- ``max_tokens`` is always sent, as Anthropic requires it: the request's own, else
  :data:`DEFAULT_MAX_TOKENS`;
- ``stop`` is ``stop_sequences``; ``temperature`` and ``top_p`` go as they are (Anthropic
  refuses a temperature above 1 with its own message); ``seed`` has no Anthropic counterpart
  and is not sent (it asks for reproducibility only "where the server offers it");
- structured output (``response_format`` with a JSON schema) is ``output_config.format``,
  ``{"type": "json_schema", "schema": ...}``: Anthropic's documented structured outputs (GA on
  the Claude API; the beta's ``output_format`` moved there), which constrain the answer's text
  block to the schema. A forced tool call was the older way; it returns the object as a tool's
  input rather than as the answer, so it is not used;
- ``reasoning_effort`` turns extended thinking on: ``thinking: {"type": "enabled",
  "budget_tokens": ...}`` with the budget of :data:`THINKING_BUDGETS`. Anthropic's
  ``max_tokens`` counts the thinking too, so it is the request's ``max_completion_tokens``
  (thinking included, as OpenAI means it), else the answer's ``max_tokens`` (or the default)
  plus the budget. Thinking blocks are kept apart from the answer (:attr:`Reply.reasoning`).
- the system prompt, the prefix every row of a job shares, is marked for Anthropic's prompt
  cache (``cache_control: {"type": "ephemeral"}``, five minutes): its first use is billed as a
  cache write (1.25 times the input price), every later one as a cache read (a tenth of it).
  A prefix shorter than the model's least cacheable one (1,024 tokens and more) is simply not
  cached, at no charge. ``Endpoint(prompt_cache=False)`` marks nothing
  (:meth:`AnthropicDialect.unmarked`).

Anthropic's ``input_tokens`` leaves out the tokens read from and written to its prompt cache;
the neutral prompt count holds all three (as OpenAI's ``prompt_tokens`` holds its cached
ones), the cached count is the tokens read, and the cache writes are a count of their own.
Anthropic reports no count of thinking tokens (``output_tokens`` holds them): the reasoning
count is estimated from the thinking's text, about four characters a token.

Anthropic has no embeddings API: :meth:`AnthropicDialect.embeddings_body` refuses.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import orjson

from .base import (
    MAX_TOKENS_BELIEVED,
    BatchResult,
    ErrorReading,
    HeardLimit,
    HeardLimits,
    MalformedAnswer,
    Reply,
    Stop,
    Usage,
    Vectors,
    error_object,
    header_count,
    header_number,
    named,
    parse_duration,
    token_count,
)

KEY_PREFIX = "v1:"  # a request key: "v1:" and the sha256 hex of its canonical request
BATCH_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
"""The HTTP status a live request would have had, by an errored batch line's error type."""
API_VERSION = "2023-06-01"
"""The ``anthropic-version`` header: the version of the Messages API these bodies are."""
DEFAULT_MAX_TOKENS = 4096
"""``max_tokens`` of a request that sets none: Anthropic requires one. 4,096 tokens hold any
answer a table's cell is meant for, and every Claude model accepts it."""
THINKING_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 24576}
"""Extended thinking's ``budget_tokens`` for each ``reasoning_effort``: 1,024 is the least
Anthropic takes; beyond 32,000 it advises batches."""
CACHE_MARK = {"type": "ephemeral"}
LEAST_CACHED_TOKENS = 1024
"""The shortest prefix Anthropic's prompt cache takes (Claude's Sonnet and Opus models; some
take more): a shorter one is not cached, at no charge."""
CHARS_PER_TOKEN = 4
"""To estimate thinking tokens from the thinking's text, which Anthropic does not count."""
STOPS: dict[object, Stop] = {
    "end_turn": "done",
    "stop_sequence": "done",
    "tool_use": "done",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "filtered",
}
"""``stop_reason`` onto neutral stops; anything else (``pause_turn``, none) did not finish."""
CREDENTIALS = frozenset({"authentication_error", "permission_error"})
RATE_LIMITED = frozenset({"rate_limit_error", "overloaded_error"})
RETRYABLE = frozenset({"api_error", "timeout_error"})
RATE_KINDS = ("requests", "tokens")
NO_CREDIT = "credit balance is too low"
"""What Anthropic's 400 says when the account has no credit left: every request would fail."""
_READ_FAILURES = (ValueError, KeyError, IndexError, TypeError, AttributeError)


class AnthropicDialect:
    """The Anthropic Messages dialect (``provider="anthropic"``). ``clock`` is the wall clock
    the rate-limit headers' reset times are read against (a test's own, else the real one);
    ``marks_prompt_cache``: whether the system prompt is marked for the prompt cache."""

    name = "anthropic"
    stop_field = "stop_reason"
    completions_path = "v1/messages"
    embeddings_path = "v1/embeddings"  # none: embeddings_body refuses before it is used
    batch_path = "/v1/messages"
    models_path = "v1/models"
    embeddings = False
    least_cached_tokens = LEAST_CACHED_TOKENS

    def __init__(
        self, clock: Callable[[], float] = time.time, *, marks_prompt_cache: bool = True
    ) -> None:
        self.clock = clock
        self.marks_prompt_cache = marks_prompt_cache

    def unmarked(self) -> AnthropicDialect:
        """This dialect marking nothing for the prompt cache."""
        return AnthropicDialect(self.clock, marks_prompt_cache=False)

    # -- requests -----------------------------------------------------------------------------

    def headers(self, api_key: str) -> dict[str, str]:
        """JSON both ways, the API's version, and the key as ``x-api-key`` (none without a
        key: the caller's headers carry the credentials)."""
        headers = {
            "accept": "application/json",
            "content-type": "application/json",
            "anthropic-version": API_VERSION,
        }
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def completion_body(self, request: Mapping[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": request["model"]}
        system, messages = _split_system(request["messages"])
        if system:
            blocks: list[dict[str, Any]] = [{"type": "text", "text": text} for text in system]
            if self.marks_prompt_cache:
                blocks[-1]["cache_control"] = dict(CACHE_MARK)
            body["system"] = blocks
        body["messages"] = [_message(message) for message in messages]
        effort = request.get("reasoning_effort")
        budget = THINKING_BUDGETS.get(effort) if isinstance(effort, str) else None
        ceiling = request.get("max_completion_tokens")
        answer = request.get("max_tokens") or DEFAULT_MAX_TOKENS
        if budget is None:
            body["max_tokens"] = ceiling or answer
        else:
            total = ceiling or answer + budget
            body["max_tokens"] = total
            budget = max(THINKING_BUDGETS["minimal"], min(budget, total - 1))
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        for name in ("temperature", "top_p"):
            if request.get(name) is not None:
                body[name] = request[name]
        stop = request.get("stop")
        if stop is not None:
            body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
        response_format = request.get("response_format")
        if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
            asked = response_format["json_schema"]
            body.update(self.structured_output(asked.get("name", "answer"), asked["schema"]))
        return body

    def structured_output(self, name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
        """``output_config.format``: the answer's text is JSON matching ``schema`` (Anthropic
        names no schema: ``name`` is not sent)."""
        return {"output_config": {"format": {"type": "json_schema", "schema": dict(schema)}}}

    def image_part(self, url: str, detail: str | None = None) -> dict[str, Any]:
        """An ``image`` block: a ``data:`` URL's bytes as a ``base64`` source, a remote
        image by its ``url``; ``detail`` has no counterpart."""
        if url.startswith("data:"):
            media_type, data = _data_url(url)
            return {
                "type": "image",
                "source": {"type": "base64", "media_type": media_type, "data": data},
            }
        return {"type": "image", "source": {"type": "url", "url": url}}

    def file_part(self, data: str, filename: str | None = None) -> dict[str, Any]:
        """A ``document`` block: a PDF's ``data:`` URL as a ``base64`` source, titled by its
        file's name."""
        media_type, payload = _data_url(data)
        block: dict[str, Any] = {
            "type": "document",
            "source": {"type": "base64", "media_type": media_type, "data": payload},
        }
        if filename:
            block["title"] = filename
        return block

    def embeddings_body(
        self, model: str, inputs: list[str], params: Mapping[str, Any]
    ) -> dict[str, Any]:
        raise NotImplementedError(  # the dispatcher refuses first (``embeddings = False``)
            "Anthropic's API has no embeddings; embed with another endpoint (an OpenAI-"
            "compatible one, or Gemini's)"
        )

    # -- answers ------------------------------------------------------------------------------

    def read_models(self, payload: bytes) -> frozenset[str]:
        """The ``id`` of each item of the listing's ``data``."""
        try:
            body = orjson.loads(payload)
            return frozenset(
                str(item["id"])
                for item in body.get("data", ())
                if isinstance(item, dict) and "id" in item
            )
        except _READ_FAILURES as exc:
            raise MalformedAnswer(str(exc)) from exc

    def read_completion(self, payload: bytes) -> Reply:
        try:
            body = orjson.loads(payload)
            blocks = body["content"]
            texts = [b["text"] for b in blocks if b.get("type") == "text"]
            thoughts = [b.get("thinking") for b in blocks if b.get("type") == "thinking"]
            stop_reason = body.get("stop_reason")
            said = body.get("usage")
            usage = read_usage(said)
            billed = isinstance(said, dict) and usage is not None
            written = token_count(said.get("cache_creation_input_tokens")) if billed else 0
        except _READ_FAILURES as exc:
            raise MalformedAnswer(str(exc)) from exc
        thinking = "\n\n".join(t for t in thoughts if isinstance(t, str) and t) or None
        if usage is not None and thinking is not None:
            estimated = -(-len(thinking) // CHARS_PER_TOKEN)
            usage = (usage[0], usage[1], usage[2], min(usage[1], estimated))
        text: object = "".join(texts) if all(isinstance(t, str) for t in texts) else None
        if not texts:  # an answer with no text block (a refusal may have none)
            text = "" if STOPS.get(stop_reason) == "filtered" else None
        return Reply(
            text=text,
            stop=STOPS.get(stop_reason, "unfinished"),
            stop_reason=stop_reason,
            usage=usage,
            reasoning=thinking,
            cache_writes=written or 0,
            response_model=named(body.get("model")),
            response_id=named(body.get("id")),
        )

    def read_embeddings(self, payload: bytes) -> Vectors:
        raise MalformedAnswer("Anthropic's API has no embeddings")

    # -- rate limits and errors ---------------------------------------------------------------

    def heard_limits(self, headers: Mapping[str, str]) -> HeardLimits:
        """The ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`` headers; a
        reset is an RFC 3339 time, read against :attr:`clock`."""
        heard: dict[str, HeardLimit] = {}
        for kind in RATE_KINDS:
            limit = headers.get(f"anthropic-ratelimit-{kind}-limit")
            remaining = headers.get(f"anthropic-ratelimit-{kind}-remaining")
            if limit is None and remaining is None:
                continue
            spent = remaining is not None and remaining.strip() == "0"
            reset = headers.get(f"anthropic-ratelimit-{kind}-reset") if spent else None
            heard[kind] = HeardLimit(
                per_minute=header_number(limit),
                remaining=header_count(remaining),
                spent=spent,
                reset=self._seconds_until(reset) if reset is not None else None,
            )
        return HeardLimits(**heard) if heard else _NOTHING

    def _seconds_until(self, text: str) -> float | None:
        """Seconds from now to an RFC 3339 time (or a duration, as a proxy may write it)."""
        try:
            when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            return parse_duration(text)
        if when.tzinfo is None:
            return None
        return max(0.0, when.timestamp() - self.clock())

    def read_error(self, status: int, payload: bytes) -> ErrorReading:
        """Anthropic's ``{"type": "error", "error": {"type", "message"}}``: the credentials
        refused (``authentication_error``, ``permission_error``, 401, 403), a rate limit or
        an overload (``rate_limit_error`` 429, ``overloaded_error`` 529: both slow every
        sender), a server error to try again (``api_error``, 5xx, 408, 409), an account out
        of credit (Anthropic says so in a 400: the quota), else a rejection
        (``invalid_request_error``, ``not_found_error``, ``request_too_large``)."""
        error = error_object(payload)
        kind, message = error.get("type"), error.get("message")
        shown = str(message) if message else None
        if kind in CREDENTIALS or status in (401, 403):
            return ErrorReading("credentials", shown)
        if kind in RATE_LIMITED or status in (429, 529):
            return ErrorReading("rate_limited", shown)
        if kind in RETRYABLE or status >= 500 or status in (408, 409):
            return ErrorReading("retryable", shown)
        if shown is not None and NO_CREDIT in shown.lower():
            return ErrorReading("quota", shown)
        return ErrorReading("rejected", shown)

    # -- batch files --------------------------------------------------------------------------

    def batch_line(self, key: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """One request of a Message Batch: ``{custom_id, params}``, the key as a custom id
        (:func:`custom_id`)."""
        return {"custom_id": custom_id(key), "params": dict(body)}

    def batch_request(self, line: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        key = key_of(line["custom_id"])
        if key is None:
            raise ValueError(f"a custom_id that names no request key: {line['custom_id']!r}")
        return key, dict(line["params"])

    def batch_result(self, line: Mapping[str, Any]) -> BatchResult:
        """One line of a Message Batch's results, ``{custom_id, result}``: ``succeeded`` is
        an answer (HTTP 200 with its message); ``errored`` an error with the HTTP status a
        live request would have had (:data:`BATCH_ERROR_STATUS`, by its error's type);
        ``canceled`` and ``expired`` were not answered (``unanswered``: submitted again); a
        line without a result's type names no request."""
        try:
            key = key_of(line.get("custom_id"))
            result = line["result"]
            kind = result["type"]
        except (AttributeError, KeyError, TypeError):
            return BatchResult(None)
        if kind == "succeeded":
            return BatchResult(key, status=200, body=result.get("message"))
        if kind == "errored":
            error = result.get("error") or {}
            inner = error.get("error", error) if isinstance(error, dict) else {}
            error_type = inner.get("type") if isinstance(inner, dict) else None
            status = BATCH_ERROR_STATUS.get(str(error_type), 500)
            return BatchResult(key, status=status, body=error)
        if kind in ("canceled", "expired"):
            return BatchResult(key, unanswered=True)
        return BatchResult(key, error=f"a result of unknown type {kind!r}")


def custom_id(key: str) -> str:
    """A request key as a Message Batch's ``custom_id``, which must match
    ``^[a-zA-Z0-9_-]{1,64}$``: its 64 hex digits, without the ``v1:`` prefix."""
    return key.removeprefix(KEY_PREFIX)


def key_of(name: object) -> str | None:
    """The request key a :func:`custom_id` names, or ``None`` when it names none."""
    if not isinstance(name, str) or len(name) != 64:
        return None
    try:
        bytes.fromhex(name)
    except ValueError:
        return None
    return KEY_PREFIX + name


_NOTHING = HeardLimits()


def _split_system(messages: list[Mapping[str, Any]]) -> tuple[list[str], list[Mapping[str, Any]]]:
    """The system messages' texts, and the other messages."""
    system = [_text(m["content"]) for m in messages if m.get("role") == "system"]
    return system, [m for m in messages if m.get("role") != "system"]


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message with its parts as Anthropic's content blocks."""
    content = message["content"]
    if isinstance(content, list):
        content = [_block(part) for part in content]
    return {"role": message["role"], "content": content}


def _block(part: Mapping[str, Any]) -> dict[str, Any]:
    """A canonical content part as an Anthropic content block."""
    kind = part.get("type")
    if kind == "image_url":
        return ANTHROPIC.image_part(part["image_url"]["url"])
    if kind == "file":
        file = part["file"]
        return ANTHROPIC.file_part(file["file_data"], file.get("filename"))
    return dict(part)  # text blocks are spelled alike


def _data_url(url: str) -> tuple[str, str]:
    """The media type and base64 payload of a ``data:<type>;base64,<payload>`` URL."""
    head, _, payload = url.partition(",")
    media_type = head.removeprefix("data:").split(";", 1)[0]
    return media_type, payload


def read_usage(usage: object) -> Usage | None:
    """(prompt, completion, cached, reasoning) tokens of Anthropic's ``usage``: the prompt is
    ``input_tokens`` and the cache's reads and writes (Anthropic counts them apart), cached
    is the reads. ``None`` when a count cannot be right; no usage bills none."""
    if usage is None:
        return 0, 0, 0, 0
    if not isinstance(usage, dict):
        return None
    counts = [
        token_count(usage.get(name))
        for name in (
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        )
    ]
    if any(count is None for count in counts):
        return None
    fresh, output, read, written = (count or 0 for count in counts)
    prompt = fresh + read + written
    if prompt > MAX_TOKENS_BELIEVED:
        return None
    return prompt, output, read, 0


ANTHROPIC = AnthropicDialect()
