"""The OpenAI-compatible dialect: Chat Completions, Embeddings and the Batch API's files, as
OpenAI, vLLM, llama.cpp, Ollama, LiteLLM, Azure OpenAI (under ``/openai/v1``) and most gateways
speak them.

Everything this family of APIs spells lives here and nowhere else in ``llm_ops/`` (a test holds
it so): the path ``chat/completions``, the answer's ``choices`` and their ``finish_reason``,
``usage`` and its details, a reasoning model's ``reasoning_content``, the error object, the
``x-ratelimit-*`` headers and the batch files' lines. The canonical request (what a cache key
hashes) is this dialect's request body but for its ``endpoint``, so building a body here costs
no copy of the messages: its shape was this API's before there were dialects, and keys must
never change.

On the hot path only the fields used are read from a body (with ``orjson``), and the usual
``usage`` shape is checked without a call per count: reading answers is, with the HTTP exchange
itself, most of a request's CPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
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
    load,
    named,
    parse_duration,
    token_count,
)

RETRYABLE_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))
CREDENTIALS_STATUS = frozenset({401, 403})
UNSUPPORTED = ("not supported", "unsupported", "mmproj")
"""Words of a 5xx body that refuses the input itself (llama.cpp without ``--mmproj`` answers
an image with ``500 image input is not supported``): the same request fails every time."""
FINISHED = frozenset({"stop", "tool_calls", "function_call"})
"""``finish_reason`` values of a finished answer. ``length`` is ``truncated``,
``content_filter`` is ``filtered``; anything else (``error``, ``abort``, missing) did not
finish and is retried."""
"""Above this, a token count in ``usage`` cannot be right (nor fit the cache's INTEGER)."""
RATE_KINDS = ("requests", "tokens")
_READ_FAILURES = (ValueError, KeyError, IndexError, TypeError, AttributeError)


def _sdk_version() -> str:
    """The ``openai`` package's version, which its clients name in their ``User-Agent``."""
    from openai.version import VERSION

    return VERSION


class OpenAIDialect:
    """The OpenAI-compatible dialect (``provider="openai"``)."""

    name = "openai"
    stop_field = "finish_reason"
    completions_path = "chat/completions"
    embeddings_path = "embeddings"
    batch_path = "/v1/chat/completions"
    models_path = "models"

    # -- requests -----------------------------------------------------------------------------

    def headers(self, api_key: str) -> dict[str, str]:
        """What the ``openai`` SDK's clients send with every request but their telemetry
        (``X-Stainless-*``: seven headers the endpoint must parse too): JSON both ways, the
        SDK's ``User-Agent`` (some gateways route by it), the organization and project the
        environment names, and the key as a bearer token (none without a key: the caller's
        headers carry the credentials)."""
        headers = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            "User-Agent": f"AsyncOpenAI/Python {_sdk_version()}",
        }
        for header, variable in (
            ("OpenAI-Organization", "OPENAI_ORG_ID"),
            ("OpenAI-Project", "OPENAI_PROJECT_ID"),
        ):
            value = os.environ.get(variable)
            if value:
                headers[header] = value
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        return headers

    def completion_body(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return dict(request)

    def structured_output(self, name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
        """``response_format``: a JSON schema the answer must match, named ``name``."""
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema},
            }
        }

    def image_part(self, url: str, detail: str | None = None) -> dict[str, Any]:
        """An ``image_url`` content part: an image's URL (a ``data:`` URL, or a hash as
        keyed), and how closely to look (``detail``) when that is set."""
        part: dict[str, Any] = {"url": url}
        if detail is not None:
            part["detail"] = detail
        return {"type": "image_url", "image_url": part}

    def file_part(self, data: str, filename: str | None = None) -> dict[str, Any]:
        """A ``file`` content part: a PDF's ``data:`` URL (or its hash as keyed), and its
        name when it is sent."""
        named = {} if filename is None else {"filename": filename}
        return {"type": "file", "file": {**named, "file_data": data}}

    def embeddings_body(
        self, model: str, inputs: list[str], params: Mapping[str, Any]
    ) -> dict[str, Any]:
        return {"model": model, "input": inputs, **params}

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
            body = load(payload)
            choice = body["choices"][0]
            message = choice["message"]
            text = message["content"]
            finish_reason = choice.get("finish_reason")
            error = body.get("error")
            usage = read_usage(body.get("usage"))
        except _READ_FAILURES as exc:
            raise MalformedAnswer(str(exc)) from exc
        detail = error.get("message") if isinstance(error, dict) else error
        return Reply(
            text=text,
            stop=_stop(finish_reason),
            stop_reason=finish_reason,
            usage=usage,
            reasoning=thinking(message),
            failed=bool(error),
            error=detail,
            response_model=named(body.get("model")),
            response_id=named(body.get("id")),
        )

    def read_embeddings(self, payload: bytes) -> Vectors:
        try:
            body = load(payload)
            items = sorted(body["data"], key=lambda item: item["index"])
            vectors = [item["embedding"] for item in items]
            indexes = [item["index"] for item in items]
            usage = read_usage(body.get("usage"))
        except _READ_FAILURES as exc:
            raise MalformedAnswer(str(exc)) from exc
        return Vectors(vectors, indexes, usage)

    # -- rate limits and errors ---------------------------------------------------------------

    def heard_limits(self, headers: Mapping[str, str]) -> HeardLimits:
        """The ``x-ratelimit-limit-*``, ``-remaining-*`` and ``-reset-*`` headers of
        requests and tokens."""
        heard: dict[str, HeardLimit] = {}
        for kind in RATE_KINDS:
            limit = headers.get(f"x-ratelimit-limit-{kind}")
            remaining = headers.get(f"x-ratelimit-remaining-{kind}")
            if limit is None and remaining is None:
                continue
            spent = remaining is not None and remaining.strip() == "0"
            reset = headers.get(f"x-ratelimit-reset-{kind}") if spent else None
            heard[kind] = HeardLimit(
                per_minute=header_number(limit),
                remaining=header_count(remaining),
                spent=spent,
                reset=parse_duration(reset) if reset is not None else None,
            )
        return HeardLimits(**heard) if heard else _NOTHING

    def read_error(self, status: int, payload: bytes) -> ErrorReading:
        """An error answer: its ``error`` object's message; the credentials refused (401,
        403), an empty quota (429 ``insufficient_quota``), a rate limit (429), what another
        attempt may change (408, 409, 5xx but for a body saying the input is not supported),
        else a rejection; and whether it asks for ``max_completion_tokens`` instead of
        ``max_tokens`` (HTTP 400, ``param: "max_tokens"``, ``code:
        "unsupported_parameter"``), as OpenAI's reasoning models do."""
        error = error_object(payload)
        message = error.get("message")
        shown = str(message) if message else None
        said = f"{error.get('code')} {message}"
        wants = (
            status == 400
            and error.get("param") == "max_tokens"
            and ("unsupported_parameter" in said or "max_completion_tokens" in said)
        )
        if status in CREDENTIALS_STATUS:
            return ErrorReading("credentials", shown, wants)
        if status == 429:
            quota = "insufficient_quota" in (error.get("code"), error.get("type"))
            return ErrorReading("quota" if quota else "rate_limited", shown, wants)
        if status in RETRYABLE_STATUS:
            text = payload[:2048].decode("utf-8", "replace").lower()
            if status < 500 or not any(word in text for word in UNSUPPORTED):
                return ErrorReading("retryable", shown, wants)
        return ErrorReading("rejected", shown, wants)

    # -- batch files --------------------------------------------------------------------------

    def batch_line(self, key: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return {"custom_id": key, "method": "POST", "url": self.batch_path, "body": dict(body)}

    def batch_request(self, line: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        return str(line["custom_id"]), dict(line["body"])

    def batch_result(self, line: Mapping[str, Any]) -> BatchResult:
        custom_id = line.get("custom_id")
        key = custom_id if isinstance(custom_id, str) else None
        response = line.get("response")
        response = response if isinstance(response, dict) else {}
        status = response.get("status_code")
        error = line.get("error")
        if error or status is None:
            message = error.get("message") if isinstance(error, dict) else error
            return BatchResult(key, error=message)
        return BatchResult(key, status=status, body=response.get("body"))


_NOTHING = HeardLimits()


def _stop(finish_reason: object) -> Stop:
    if finish_reason in FINISHED:
        return "done"
    if finish_reason == "length":
        return "length"
    if finish_reason == "content_filter":
        return "filtered"
    return "unfinished"


def thinking(message: dict[str, Any]) -> str | None:
    """A reasoning model's thinking beside its answer: ``reasoning_content`` (DeepSeek, vLLM,
    llama.cpp) or ``reasoning`` (OpenRouter, newer vLLM); ``None`` when there is none, or it
    is not text (an answer is never failed for its thinking)."""
    for name in ("reasoning_content", "reasoning"):
        value = message.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def read_usage(usage: object) -> Usage | None:
    """(prompt, completion, cached, reasoning) tokens of an answer's ``usage``, or ``None``
    when they cannot be right. No usage is none billed; cached tokens (of the prompt's) and
    reasoning tokens (``completion_tokens_details.reasoning_tokens``, of the completion's)
    that make no sense are none."""
    if usage is None:
        return 0, 0, 0, 0
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens", 0) if type(details) is dict else 0
    thought = usage.get("completion_tokens_details")
    reasoning = thought.get("reasoning_tokens", 0) if type(thought) is dict else 0
    if (  # the common shape, checked without a call per count
        type(prompt) is int
        and type(completion) is int
        and type(cached) is int
        and type(reasoning) is int
        and 0 <= cached <= prompt <= MAX_TOKENS_BELIEVED
        and 0 <= reasoning <= completion <= MAX_TOKENS_BELIEVED
    ):
        return prompt, completion, cached, reasoning
    prompt = token_count(usage.get("prompt_tokens"))
    completion = token_count(usage.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    cached = token_count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    reasoning = token_count(thought.get("reasoning_tokens")) if isinstance(thought, dict) else 0
    return prompt, completion, min(prompt, cached or 0), min(completion, reasoning or 0)


OPENAI = OpenAIDialect()
