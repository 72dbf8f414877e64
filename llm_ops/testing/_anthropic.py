"""Anthropic's Messages API, played by the simulator: ``POST /v1/messages`` and ``GET
/v1/models`` (with an ``anthropic-version`` header), strictly.

A request is checked as Anthropic checks it and refused with Anthropic's error body
(``{"type": "error", "error": {"type", "message"}}``): no or an unknown ``anthropic-version``
header, a missing or wrong ``x-api-key`` (when ``SimulatorConfig.api_key`` is set), a body
without ``model``, ``messages`` or ``max_tokens``, a ``system`` role inside ``messages``, a
field the API does not take (``response_format``, ``seed``...), a thinking budget under 1,024
tokens or not under ``max_tokens``. An accepted request is translated into the OpenAI-shaped
body the simulator answers (:meth:`Simulator._reply`), so the judge, facts, directives,
latency, faults, rate limits and stats behave as in every dialect; its answer is written back
in Anthropic's shape: content blocks, ``stop_reason`` (``end_turn``, ``max_tokens``,
``refusal``; a ``[[sim:finish_reason=...]]`` directive naming one of Anthropic's own, such as
``pause_turn``, is said as it is), ``usage`` with the cache's counts, and the
``anthropic-ratelimit-*`` headers. Error answers are Anthropic's: a 429 keeps its
``retry-after``, and a ``529`` (the fault kind ``"529"``, or ``[[sim:fail_status=529]]``) is
``overloaded_error``.

**Prompt caching.** A request whose system prompt or message blocks carry ``cache_control``
caches its prefix up to the last mark, if it holds at least :data:`LEAST_CACHED_TOKENS` tokens
(counted as the simulator counts a prompt: four characters a token, four more a message): the
first time it is written (``usage.cache_creation_input_tokens``), then read
(``cache_read_input_tokens``) for as long as the simulator runs (:meth:`Simulator.reset`
forgets it). Without a mark, the automatic prefix cache of
``SimulatorConfig.prefix_cache_tokens`` reports its hits as reads. ``input_tokens`` is the
prompt less both, as Anthropic counts it.

**Extended thinking.** ``thinking: {"type": "enabled", "budget_tokens": n}`` answers a
``thinking`` block before the text (the text :func:`expected_reasoning` gives for the prompt),
of :data:`REASONING_TOKENS_PER_TOKEN` tokens per answer token (at most the budget), counted in
``output_tokens`` as Anthropic bills them.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from ..exceptions import LlmOpsError
from ._reading import REASONING_TOKENS_PER_TOKEN, _normalise, _reasoning_for
from ._wire import ChatHost

VERSIONS = frozenset({"2023-06-01", "2023-01-01"})
"""The ``anthropic-version`` values Anthropic takes."""
FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "stream",
        "metadata",
        "thinking",
        "output_config",
        "tools",
        "tool_choice",
        "service_tier",
    }
)
"""The fields of a Messages request; any other is refused, as Anthropic does."""
LEAST_THINKING_BUDGET = 1024
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "content_filter": "refusal"}
"""OpenAI's ``finish_reason`` as Anthropic's ``stop_reason``; another word is said as it is."""
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
"""Anthropic's error type for each status; any other (a 5xx) is ``api_error``."""
NO_CREDIT = (
    "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing "
    "to upgrade or purchase credits."
)
CACHE_ENTRIES = 4096
LEAST_CACHED_TOKENS = 1024
"""The shortest prefix the prompt cache takes, as Anthropic's does for Claude Sonnet and Opus."""


def error(status: int, message: str, kind: str | None = None) -> web.Response:
    """Anthropic's error answer."""
    kind = kind or ERROR_TYPES.get(status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return web.json_response(body, status=status)


class _Refusal(LlmOpsError):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class AnthropicApi:
    """The Messages API over ``simulator``'s replies, and what its prompt cache holds."""

    def __init__(self, simulator: ChatHost) -> None:
        self.simulator = simulator
        self.reset()

    def reset(self) -> None:
        """Zero the counters and empty the prompt cache."""
        self.cached: OrderedDict[bytes, int] = OrderedDict()  # marked prefixes, LRU
        self.requests = 0
        self.cache_creation_tokens = 0
        self.cache_read_tokens = 0

    def stats(self) -> dict[str, Any]:
        return {
            "anthropic_requests": self.requests,
            "cache_creation_tokens": self.cache_creation_tokens,
            "cache_read_tokens": self.cache_read_tokens,
        }

    # -- the routes ---------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        refused = self._refuse(request)
        if refused is not None:
            return refused
        names = self.simulator.config.models
        data = [
            {
                "type": "model",
                "id": name,
                "display_name": name,
                "created_at": "2025-01-01T00:00:00Z",
            }
            for name in names
        ]
        return web.json_response(
            {
                "data": data,
                "has_more": False,
                "first_id": names[0] if names else None,
                "last_id": names[-1] if names else None,
            }
        )

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/messages``: counted, gathered, held and answered as every chat request
        is, through a :class:`Messages` call (the simulator's ``Wire``)."""
        self.requests += 1
        return await self.simulator.chat_completions(request, Messages(self, request))

    def _refuse(self, request: web.Request) -> web.Response | None:
        """The version header and the key, as Anthropic checks them."""
        self.simulator.header_names.update(request.headers.keys())
        version = request.headers.get("anthropic-version")
        if version is None:
            return error(400, "anthropic-version: header is required")
        if version not in VERSIONS:
            return error(400, f"anthropic-version: invalid version {version!r}")
        key = self.simulator.config.api_key
        if key is not None:
            given = request.headers.get("x-api-key")
            if given is None:
                return error(401, "x-api-key header is required")
            if given != key:
                return error(401, "invalid x-api-key")
        return None

    # -- the answer, in Anthropic's shape -----------------------------------------------------

    def _anthropic(
        self, response: web.StreamResponse, asked: dict[str, Any], body: dict[str, Any]
    ) -> web.StreamResponse:
        """``response`` (the simulator's, OpenAI-shaped) in Anthropic's shape; a body that is
        not JSON (a hostile fault's) as it is."""
        if not isinstance(response, web.Response) or response.status in range(300, 400):
            return response
        try:
            said = json.loads(response.body)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return response
        if isinstance(said, dict) and said.get("type") == "error":  # Anthropic's already
            return response
        headers = _anthropic_headers(response.headers)
        if response.status >= 400:
            inner = said.get("error") if isinstance(said, dict) else None
            message = inner.get("message") if isinstance(inner, dict) else None
            if isinstance(inner, dict) and inner.get("type") == "insufficient_quota":
                return error(400, NO_CREDIT)  # how Anthropic says the account is spent
            answer = error(response.status, str(message or "simulated error"))
            answer.headers.update(headers)
            return answer
        if not isinstance(said, dict) or "choices" not in said:
            return response
        return web.json_response(self._message(said, asked, body), headers=headers)

    def _message(
        self, said: dict[str, Any], asked: dict[str, Any], body: dict[str, Any]
    ) -> dict[str, Any]:
        choice = said["choices"][0]
        usage = said.get("usage") or {}
        model = said["model"]
        details = usage.get("completion_tokens_details") or {}
        answer_tokens = usage.get("completion_tokens", 0) - details.get("reasoning_tokens", 0)
        content: list[dict[str, Any]] = []
        output_tokens = answer_tokens
        thinking = asked.get("thinking") or {}
        if thinking.get("type") == "enabled":
            messages = _normalise(body["messages"]).messages
            budget = int(thinking["budget_tokens"])
            thought = min(budget, REASONING_TOKENS_PER_TOKEN * max(1, answer_tokens))
            output_tokens += thought
            content.append(
                {
                    "type": "thinking",
                    "thinking": _reasoning_for(messages, model),
                    "signature": "sim-signature",
                }
            )
        content.append({"type": "text", "text": choice["message"].get("content") or ""})
        prompt_tokens = usage.get("prompt_tokens", 0)
        read, written = self._cache(asked, model, prompt_tokens, usage)
        reason = choice.get("finish_reason")
        return {
            "id": f"msg_sim{self.requests:08d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": STOP_REASONS.get(reason, reason),
            "stop_sequence": None,
            "usage": {
                "input_tokens": max(0, prompt_tokens - read - written),
                "output_tokens": output_tokens,
                "cache_creation_input_tokens": written,
                "cache_read_input_tokens": read,
            },
        }

    def _cache(
        self, asked: dict[str, Any], model: str, prompt_tokens: int, usage: dict[str, Any]
    ) -> tuple[int, int]:
        """(read, written) tokens of the prompt cache for an answered request."""
        marked = _marked_prefix(asked)
        if marked is None:
            automatic = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            return int(automatic), 0
        text, tokens = marked
        tokens = min(prompt_tokens, tokens)
        if tokens < LEAST_CACHED_TOKENS:
            return 0, 0
        digest = hashlib.sha256(model.encode() + b"\0" + text.encode()).digest()
        if digest in self.cached:
            self.cached.move_to_end(digest)
            self.cache_read_tokens += tokens
            return tokens, 0
        self.cached[digest] = tokens
        if len(self.cached) > CACHE_ENTRIES:
            self.cached.popitem(last=False)
        self.cache_creation_tokens += tokens
        return 0, tokens


class Messages:
    """One ``POST /v1/messages`` call, as the simulator's ``Wire``: Anthropic's checks of the
    key and the body, the body as the OpenAI-shaped one the simulator answers, and the answer
    written back in Anthropic's shape."""

    def __init__(self, api: AnthropicApi, request: web.Request) -> None:
        self.api = api
        self.request = request
        self.asked: dict[str, Any] = {}
        self.body: dict[str, Any] = {}

    def refuse_key(self) -> web.Response | None:
        return self.api._refuse(self.request)

    def read(self, raw: bytes) -> dict[str, Any] | web.Response:
        try:
            self.asked = _checked(json.loads(raw))
        except ValueError:
            return error(400, "There was an error parsing the body of your request.")
        except _Refusal as refusal:
            return error(refusal.status, str(refusal))
        self.body = _as_openai(self.asked, self.api.simulator.config.reasoning_models)
        return self.body

    def written(self, response: web.StreamResponse) -> web.StreamResponse:
        return self.api._anthropic(response, self.asked, self.body)


def _checked(asked: Any) -> dict[str, Any]:
    """The request, if Anthropic would take it; else :class:`_Refusal` with its message."""
    if not isinstance(asked, dict):
        raise _Refusal("The request body must be a JSON object.")
    for name in ("model", "messages", "max_tokens"):
        if name not in asked:
            raise _Refusal(f"{name}: Field required")
    extra = sorted(set(asked) - FIELDS)
    if extra:
        raise _Refusal(f"{extra[0]}: Extra inputs are not permitted")
    max_tokens = asked["max_tokens"]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _Refusal("max_tokens: Input should be a valid integer greater than 0")
    messages = asked["messages"]
    if not isinstance(messages, list) or not messages:
        raise _Refusal("messages: at least one message is required")
    for n, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "system":
            raise _Refusal(
                f'messages.{n}.role: Unexpected role "system". The Messages API accepts a '
                'top-level `system` parameter, not "system" as an input message role.'
            )
        if role not in ("user", "assistant"):
            raise _Refusal(f"messages.{n}.role: Input should be 'user' or 'assistant'")
        if "content" not in message:
            raise _Refusal(f"messages.{n}.content: Field required")
    temperature = asked.get("temperature")
    if temperature is not None and not 0 <= temperature <= 1:
        raise _Refusal("temperature: Input should be less than or equal to 1")
    thinking = asked.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < LEAST_THINKING_BUDGET:
            raise _Refusal(
                "thinking.enabled.budget_tokens: Input should be greater than or "
                f"equal to {LEAST_THINKING_BUDGET}"
            )
        if budget >= max_tokens:
            raise _Refusal("`max_tokens` must be greater than `thinking.budget_tokens`")
    return asked


def _as_openai(asked: dict[str, Any], reasoning_models: tuple[str, ...]) -> dict[str, Any]:
    """The OpenAI-shaped body the simulator answers, asking what ``asked`` asks."""
    messages: list[dict[str, Any]] = []
    system = asked.get("system")
    if system:
        messages.append({"role": "system", "content": _text(system)})
    messages += [{"role": m["role"], "content": _parts(m["content"])} for m in asked["messages"]]
    room = asked["max_tokens"]  # the answer's, less the thinking's when it thinks
    thinking = asked.get("thinking") or {}
    if thinking.get("type") == "enabled":
        room = max(1, room - thinking["budget_tokens"])
    model = asked["model"]
    limit = "max_completion_tokens" if model in reasoning_models else "max_tokens"
    body: dict[str, Any] = {"model": model, "messages": messages, limit: room}
    for name in ("temperature", "top_p"):
        if name in asked:
            body[name] = asked[name]
    if asked.get("stop_sequences"):
        body["stop"] = asked["stop_sequences"]
    wanted = (asked.get("output_config") or {}).get("format") or {}
    if wanted.get("type") == "json_schema":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": wanted.get("schema")},
        }
    return body


def _text(system: Any) -> str:
    if isinstance(system, list):
        return "".join(b.get("text", "") for b in system if isinstance(b, dict))
    return str(system)


def _parts(content: Any) -> Any:
    """A message's content blocks as OpenAI's parts (a string stays one)."""
    if not isinstance(content, list):
        return content
    return [_part(block) for block in content]


def _part(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    kind = block.get("type")
    source = block.get("source") or {}
    if kind == "text":
        return {"type": "text", "text": block.get("text")}
    if kind == "image" and source.get("type") == "url":
        return {"type": "image_url", "image_url": {"url": source.get("url")}}
    if kind == "image":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "document":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
        return {"type": "file", "file": {"file_data": url}}
    return block  # refused by the simulator as a part of an unknown type


def _marked_prefix(asked: dict[str, Any]) -> tuple[str, int] | None:
    """The request up to its last ``cache_control`` mark (system blocks, then the messages'
    blocks, in order), and its tokens as the simulator counts a prompt's (the texts' characters
    over four, and four a message); ``None`` when nothing is marked."""
    seen: list[str] = []
    chars = 0
    prefix = None
    system = asked.get("system")
    if isinstance(system, str):
        system = [{"type": "text", "text": system}]
    blocks = [(0, "system", b) for b in system] if isinstance(system, list) else []
    for n, message in enumerate(asked["messages"], 1):
        content = message.get("content")
        if not isinstance(content, list):
            content = [{"type": "text", "text": content}]
        blocks += [(n, message.get("role", ""), block) for block in content]
    for n, role, block in blocks:
        seen.append(role + ":" + json.dumps(block, sort_keys=True))
        text = block.get("text") if isinstance(block, dict) else None
        chars += len(text) if isinstance(text, str) else 0
        if isinstance(block, dict) and block.get("cache_control"):
            messages = n + (1 if system else 0)  # a system prompt is one message more
            prefix = "\n".join(seen), chars // 4 + 4 * messages
    return prefix


def _anthropic_headers(headers: Any) -> dict[str, str]:
    """The simulator's rate-limit headers as Anthropic's (a reset an RFC 3339 time), and its
    ``retry-after``."""
    said: dict[str, str] = {}
    for kind in ("requests", "tokens"):
        limit = headers.get(f"x-ratelimit-limit-{kind}")
        if limit is None:
            continue
        said[f"anthropic-ratelimit-{kind}-limit"] = limit
        said[f"anthropic-ratelimit-{kind}-remaining"] = headers[f"x-ratelimit-remaining-{kind}"]
        seconds = float(headers[f"x-ratelimit-reset-{kind}"].rstrip("s"))
        reset = datetime.fromtimestamp(time.time() + seconds, UTC)
        said[f"anthropic-ratelimit-{kind}-reset"] = reset.isoformat().replace("+00:00", "Z")
    for name in ("retry-after", "Retry-After"):
        if name in headers:
            said["retry-after"] = headers[name]
    return said
