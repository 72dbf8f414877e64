"""A minimal Gemini ``generateContent`` dialect, for the batch tests until the package's own
(``llm_ops._dialects.gemini``, another branch of issue 49) lands: ``contents`` and ``parts``,
``systemInstruction``, ``generationConfig``, the response and the error read back. Its name is
``"gemini"``, so batch mode speaks Gemini's batch mode for it."""

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

_ROLES = {"assistant": "model"}
STOPS = {"STOP": "done", "MAX_TOKENS": "length", "SAFETY": "filtered"}


class MiniGemini:
    name = "gemini"
    stop_field = "finishReason"
    completions_path = "models/sim:generateContent"
    embeddings_path = "models/sim:embedContent"
    batch_path = ":batchGenerateContent"
    models_path = "models"

    def headers(self, api_key: str) -> dict[str, str]:
        return {"x-goog-api-key": api_key, "content-type": "application/json"}

    def completion_body(self, request: Mapping[str, Any]) -> dict[str, Any]:
        system = [m["content"] for m in request["messages"] if m["role"] == "system"]
        body: dict[str, Any] = {
            "contents": [
                {
                    "role": "model" if m["role"] == "assistant" else "user",
                    "parts": [{"text": m["content"]}],
                }
                for m in request["messages"]
                if m["role"] != "system"
            ]
        }
        if system:
            body["systemInstruction"] = {"parts": [{"text": "\n".join(system)}]}
        config = {}
        if "max_tokens" in request:
            config["maxOutputTokens"] = request["max_tokens"]
        if "temperature" in request:
            config["temperature"] = request["temperature"]
        if config:
            body["generationConfig"] = config
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
            response = json.loads(payload)
            candidate = response["candidates"][0]
            text = "".join(part.get("text", "") for part in candidate["content"]["parts"])
            usage = response["usageMetadata"]
            counts = (
                usage["promptTokenCount"],
                usage.get("candidatesTokenCount", 0),
                usage.get("cachedContentTokenCount", 0),
                usage.get("thoughtsTokenCount", 0),
            )
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise MalformedAnswer(str(exc)) from exc
        reason = candidate.get("finishReason")
        return Reply(text, STOPS.get(reason, "unfinished"), reason, counts)  # type: ignore[arg-type]

    def read_embeddings(self, payload: bytes) -> Vectors:
        raise MalformedAnswer("no embeddings")

    def heard_limits(self, headers: Mapping[str, str]) -> HeardLimits:
        return HeardLimits()

    def read_error(self, status: int, payload: bytes) -> ErrorReading:
        try:
            message = json.loads(payload)["error"].get("message")
        except (ValueError, KeyError, TypeError, AttributeError):
            message = None
        if status in (401, 403):
            return ErrorReading("credentials", message)
        if status == 429:
            return ErrorReading("rate_limited", message)
        if status >= 500:
            return ErrorReading("retryable", message)
        return ErrorReading("rejected", message)

    def batch_line(self, key: str, body: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError("Gemini's batches are a service's, not files")

    def batch_request(self, line: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError("Gemini's batches are a service's, not files")

    def batch_result(self, line: Mapping[str, Any]) -> BatchResult:
        raise NotImplementedError("Gemini's batches are a service's, not files")


MINI_GEMINI = MiniGemini()
