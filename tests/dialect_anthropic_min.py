"""A minimal Anthropic Messages dialect, for the batch tests until the package's own
(``llm_ops._dialects.anthropic``, another branch of issue 49) lands: the body (``system`` at
the top level, ``max_tokens`` always), the Message read back, the error object. Its name is
``"anthropic"``, so batch mode speaks Anthropic's Message Batches API for it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from llm_ops._dialects import (
    BatchResult,
    ErrorReading,
    HeardLimits,
    MalformedAnswer,
    Reply,
    Vectors,
)

DEFAULT_MAX_TOKENS = 1024
STOPS = {"end_turn": "done", "stop_sequence": "done", "max_tokens": "length", "refusal": "filtered"}


class MiniAnthropic:
    name = "anthropic"
    stop_field = "stop_reason"
    completions_path = "v1/messages"
    embeddings_path = "v1/embeddings"
    batch_path = "/v1/messages"
    models_path = "v1/models"

    def headers(self, api_key: str) -> dict[str, str]:
        return {
            "x-api-key": api_key,
            "anthropic-version": "2023-06-01",
            "content-type": "application/json",
        }

    def completion_body(self, request: Mapping[str, Any]) -> dict[str, Any]:
        system = [m["content"] for m in request["messages"] if m["role"] == "system"]
        body: dict[str, Any] = {
            "model": request["model"],
            "max_tokens": request.get("max_tokens") or DEFAULT_MAX_TOKENS,
            "messages": [m for m in request["messages"] if m["role"] != "system"],
        }
        if system:
            body["system"] = "\n".join(system)
        if "temperature" in request:
            body["temperature"] = request["temperature"]
        return body

    def structured_output(self, name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def image_part(self, url: str, detail: str | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def file_part(self, data: str, filename: str | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def embeddings_body(
        self, model: str, inputs: list[str], params: Mapping[str, Any]
    ) -> dict[str, Any]:
        raise NotImplementedError

    def read_models(self, payload: bytes) -> frozenset[str]:
        return frozenset()

    def read_completion(self, payload: bytes) -> Reply:
        try:
            message = json.loads(payload)
            text = "".join(b["text"] for b in message["content"] if b["type"] == "text")
            usage = message["usage"]
            cached = usage.get("cache_read_input_tokens") or 0
            counts = (usage["input_tokens"] + cached, usage["output_tokens"], cached, 0)
        except (ValueError, KeyError, TypeError) as exc:
            raise MalformedAnswer(str(exc)) from exc
        reason = message.get("stop_reason")
        return Reply(text, STOPS.get(reason, "unfinished"), reason, counts)  # type: ignore[arg-type]

    def read_embeddings(self, payload: bytes) -> Vectors:
        raise MalformedAnswer("no embeddings")

    def heard_limits(self, headers: Mapping[str, str]) -> HeardLimits:
        return HeardLimits()

    def read_error(self, status: int, payload: bytes) -> ErrorReading:
        try:
            error = json.loads(payload)["error"]
            message = error.get("message")
        except (ValueError, KeyError, TypeError, AttributeError):
            message = None
        if status in (401, 403):
            return ErrorReading("credentials", message)
        if status in (429, 529):
            return ErrorReading("rate_limited", message)
        if status >= 500:
            return ErrorReading("retryable", message)
        return ErrorReading("rejected", message)

    def batch_line(self, key: str, body: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError("Anthropic's batches are a service's, not files")

    def batch_request(self, line: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError("Anthropic's batches are a service's, not files")

    def batch_result(self, line: Mapping[str, Any]) -> BatchResult:
        raise NotImplementedError("Anthropic's batches are a service's, not files")


MINI_ANTHROPIC = MiniAnthropic()
