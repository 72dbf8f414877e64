"""The simulator speaking Gemini (Google's Generative Language API, ``/v1beta``), strictly.

``POST /v1beta/models/{model}:generateContent`` is read and checked as Google reads it, then
translated into the OpenAI-shaped body :meth:`Simulator._reply` answers, so the judge, the
facts, latency, faults, rate limits and the counters behave as they do for the OpenAI
dialect: only the wire differs. The answer (or the error) is then written as Google writes
it: ``candidates`` with their ``finishReason``, ``usageMetadata``, and Google's error body
``{"error": {"code", "message", "status", "details"}}``.

What Google refuses is refused here, with Google's status and words: a missing key (403
``PERMISSION_DENIED``) or a wrong one (400 ``INVALID_ARGUMENT``, ``ErrorInfo`` reason
``API_KEY_INVALID``), a field the API does not have (``Unknown name "..."``), a ``system``
role (or any but ``user`` and ``model``) in ``contents``, empty ``parts``, a
``responseSchema`` outside the OpenAPI subset it takes (``additionalProperties``, ``$ref``, an
unknown ``type``), a schema without ``responseMimeType: application/json``, both schema
fields at once, out-of-range sampling. A rate limit is a 429 ``RESOURCE_EXHAUSTED`` whose
``RetryInfo`` says how long to wait (Gemini sends no rate-limit headers, nor
``Retry-After``); an exhausted quota one whose ``QuotaFailure`` names a per-day limit; a fault
``503`` is ``UNAVAILABLE`` and ``500`` ``INTERNAL``.

``[[sim:finish_reason=content_filter]]`` in a prompt is answered ``SAFETY``,
``length`` ``MAX_TOKENS``, and ``prompt_blocked`` with no candidate and a
``promptFeedback.blockReason``. A reasoning model (``SimulatorConfig.reasoning_models``)
reports ``thoughtsTokenCount``, and its thoughts as ``thought: true`` parts when
``thinkingConfig.includeThoughts`` asks for them.

``POST /v1beta/models/{model}:batchEmbedContents`` (at most 100 requests, each naming the
path's model) and ``GET /v1beta/models`` are served too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from ..exceptions import LlmOpsError
from ._reading import embed
from ._wire import ChatHost

GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
FINISH_REASONS = {
    "stop": "STOP",
    "length": "MAX_TOKENS",
    "content_filter": "SAFETY",
    "recitation": "RECITATION",
}
"""The simulator's finish reasons (its directives') as Gemini says them; any other is
``OTHER``, and ``none`` leaves ``finishReason`` out."""
MAX_EMBED_REQUESTS = 100
MAX_STOP_SEQUENCES = 5
KEY_INVALID = "API key not valid. Please pass a valid API key."
NO_KEY = (
    "Method doesn't allow unregistered callers (callers without established identity). "
    "Please use API Key or other form of API consumer identity to call this API."
)
QUOTA_MESSAGE = (
    "You exceeded your current quota, please check your plan and billing details. For more "
    "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits."
)

REQUEST_FIELDS = frozenset(
    (
        "contents",
        "systemInstruction",
        "generationConfig",
        "safetySettings",
        "tools",
        "toolConfig",
        "cachedContent",
    )
)
CONTENT_FIELDS = frozenset(("role", "parts"))
PART_FIELDS = frozenset(("text", "inlineData", "fileData", "thought", "thoughtSignature"))
BLOB_FIELDS = frozenset(("mimeType", "data"))
FILE_FIELDS = frozenset(("mimeType", "fileUri"))
CONFIG_FIELDS = frozenset(
    (
        "stopSequences",
        "responseMimeType",
        "responseSchema",
        "responseJsonSchema",
        "candidateCount",
        "maxOutputTokens",
        "temperature",
        "topP",
        "topK",
        "seed",
        "presencePenalty",
        "frequencyPenalty",
        "thinkingConfig",
        "mediaResolution",
    )
)
THINKING_FIELDS = frozenset(("thinkingBudget", "includeThoughts", "thinkingLevel"))
EMBED_FIELDS = frozenset(("model", "content", "taskType", "title", "outputDimensionality"))
SCHEMA_FIELDS = frozenset(
    (
        "type",
        "format",
        "title",
        "description",
        "nullable",
        "enum",
        "maxItems",
        "minItems",
        "properties",
        "required",
        "minProperties",
        "maxProperties",
        "minLength",
        "maxLength",
        "pattern",
        "example",
        "anyOf",
        "propertyOrdering",
        "default",
        "items",
        "minimum",
        "maximum",
    )
)
"""The fields of ``responseSchema`` (a subset of OpenAPI 3.0's schema object)."""
SCHEMA_TYPES = frozenset(("STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"))
JSON_SCHEMA_TYPES = frozenset(("string", "number", "integer", "boolean", "array", "object", "null"))
RESPONSE_MIME_TYPES = frozenset(("text/plain", "application/json", "text/x.enum"))
_SNAKE = re.compile(r"_([a-z])")


class Refusal(LlmOpsError):
    """A request Google would refuse: its answer, ready to send."""

    def __init__(self, response: web.Response):
        super().__init__(response.status)
        self.response = response


def google_error(
    status: int, message: str, details: list[dict[str, Any]] | None = None
) -> web.Response:
    """Google's error body, with the canonical status of the HTTP ``status``."""
    error: dict[str, Any] = {
        "code": status,
        "message": message,
        "status": GOOGLE_STATUS.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION"),
    }
    if details:
        error["details"] = details
    return web.json_response({"error": error}, status=status)


def invalid(message: str) -> Refusal:
    return Refusal(google_error(400, message))


def key_of(request: web.Request) -> str | None:
    """The key of a Gemini request: its ``x-goog-api-key`` header, or its ``key`` query
    parameter (Google takes either)."""
    return request.headers.get("x-goog-api-key") or request.query.get("key")


def _fields(value: Any, allowed: frozenset[str], where: str) -> dict[str, Any]:
    """``value``'s fields, named as Google names them (its JSON parser takes the proto's
    snake_case names too); an unknown one is refused as Google refuses it."""
    if not isinstance(value, dict):
        raise invalid(f"Invalid value at '{where}': expected an object.")
    fields = {}
    for name, item in value.items():
        camel = _SNAKE.sub(lambda m: m[1].upper(), name)
        if camel not in allowed:
            at = f" at '{where}'" if where else ""
            raise invalid(
                f'Invalid JSON payload received. Unknown name "{name}"{at}: Cannot find field.'
            )
        fields[camel] = item
    return fields


class GeminiApi:
    """The Gemini routes of a :class:`Simulator`."""

    def __init__(self, simulator: ChatHost):
        self.sim = simulator

    def routes(self) -> list[tuple[str, str, Callable[[web.Request], Any]]]:
        return [
            ("POST", "/v1beta/models/{model}:generateContent", self.generate_content),
            ("POST", "/v1beta/models/{model}:batchEmbedContents", self.batch_embed_contents),
            ("GET", "/v1beta/models", self.list_models),
        ]

    def refuse_key(self, request: web.Request) -> web.Response | None:
        """Google's refusal of a missing or wrong key, when the config sets one."""
        expected = self.sim.config.api_key
        given = key_of(request)
        if expected is None or given == expected:
            return None
        if given is None:
            return google_error(403, NO_KEY)
        detail = {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "API_KEY_INVALID",
            "domain": "googleapis.com",
            "metadata": {"service": "generativelanguage.googleapis.com"},
        }
        return google_error(400, KEY_INVALID, [detail])

    async def generate_content(self, request: web.Request) -> web.StreamResponse:
        call = GenerateContent(self, request.match_info["model"], request)
        return await self.sim.chat_completions(request, call)

    async def list_models(self, request: web.Request) -> web.Response:
        refused = self.refuse_key(request)
        if refused is not None:
            return refused
        return web.json_response(
            {
                "models": [
                    {
                        "name": f"models/{name}",
                        "displayName": name,
                        "supportedGenerationMethods": ["generateContent", "embedContent"],
                    }
                    for name in self.sim.config.models
                ]
            }
        )

    async def batch_embed_contents(self, request: web.Request) -> web.Response:
        refused = self.refuse_key(request)
        if refused is not None:
            return refused
        model = f"models/{request.match_info['model']}"
        try:
            texts, dimensions = _embedding_inputs(await request.read(), model)
        except Refusal as refusal:
            return refusal.response
        sim = self.sim
        sim.embedding_requests += 1
        sim.embedding_inputs += len(texts)
        if sim.config.ignore_dimensions or dimensions is None:
            dimensions = 256
        noise = sim.config.embed_noise
        return web.json_response(
            {"embeddings": [{"values": embed(text, dimensions, noise=noise)} for text in texts]}
        )


def _embedding_inputs(raw: bytes, model: str) -> tuple[list[str], int | None]:
    """The texts of a ``batchEmbedContents`` body, and the dimensions it asks for."""
    body = _fields(_json(raw), frozenset(("requests",)), "")
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        raise invalid("* BatchEmbedContentsRequest.requests: requests is not specified")
    if len(requests) > MAX_EMBED_REQUESTS:
        raise invalid(
            f"* BatchEmbedContentsRequest.requests: at most {MAX_EMBED_REQUESTS} requests can "
            "be in one batch"
        )
    texts, dimensions = [], None
    for n, item in enumerate(requests):
        fields = _fields(item, EMBED_FIELDS, f"requests[{n}]")
        if fields.get("model") != model:
            raise invalid(
                f"* BatchEmbedContentsRequest.requests[{n}].model: the model of each request "
                f"must be the batch's ({model})"
            )
        content = _fields(fields.get("content"), CONTENT_FIELDS, f"requests[{n}].content")
        parts = content.get("parts")
        if not isinstance(parts, list) or not parts:
            raise invalid(f"* BatchEmbedContentsRequest.requests[{n}].content.parts: empty")
        text = ""
        for k, part in enumerate(parts):
            fields_of_part = _fields(part, PART_FIELDS, f"requests[{n}].content.parts[{k}]")
            if not isinstance(fields_of_part.get("text"), str):
                raise invalid("Only text parts can be embedded.")
            text += fields_of_part["text"]
        texts.append(text)
        wanted = fields.get("outputDimensionality")
        if wanted is not None:
            if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted <= 0:
                raise invalid("outputDimensionality must be a positive integer")
            dimensions = wanted
    return texts, dimensions


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise invalid("Invalid JSON payload received. Unexpected token.") from None


class GenerateContent:
    """One ``generateContent`` call: its body read into the OpenAI-shaped body the
    simulator answers (:meth:`read`), and that answer written as Google writes it
    (:meth:`written`)."""

    def __init__(self, api: GeminiApi, model: str, request: web.Request | None = None):
        self.api = api
        self.request = request  # None: a line of a batch, whose batch's key was checked
        self.model = model
        self.include_thoughts = False

    def refuse_key(self) -> web.Response | None:
        return None if self.request is None else self.api.refuse_key(self.request)

    def read(self, raw: bytes) -> dict[str, Any] | web.Response:
        """The OpenAI-shaped body asking what this call asks, or Google's refusal of it."""
        try:
            return self._read(raw)
        except Refusal as refusal:
            return refusal.response

    def _read(self, raw: bytes) -> dict[str, Any]:
        return self.asked(_json(raw))

    def asked(self, request: Any) -> dict[str, Any]:
        """The OpenAI-shaped body a ``GenerateContentRequest`` asks for; :class:`Refusal`
        where Google refuses it."""
        body = _fields(request, REQUEST_FIELDS, "")
        messages: list[dict[str, Any]] = []
        if "systemInstruction" in body:
            system = _fields(body["systemInstruction"], CONTENT_FIELDS, "system_instruction")
            texts = _parts(system.get("parts"), "system_instruction")
            if any(not isinstance(part, str) for part in texts):
                raise invalid("* GenerateContentRequest.system_instruction: only text is allowed")
            messages.append({"role": "system", "content": _content(texts)})
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            raise invalid("* GenerateContentRequest.contents: contents is not specified")
        for n, item in enumerate(contents):
            content = _fields(item, CONTENT_FIELDS, f"contents[{n}]")
            role = content.get("role", "user")
            if role not in ("user", "model"):
                raise invalid("Please use a valid role: user, model.")
            parts = _parts(content.get("parts"), f"contents[{n}]")
            messages.append(
                {"role": "assistant" if role == "model" else "user", "content": _content(parts)}
            )
        asked: dict[str, Any] = {"model": self.model, "messages": messages}
        config = _fields(body.get("generationConfig", {}), CONFIG_FIELDS, "generation_config")
        asked.update(self._generation(config))
        return asked

    def _generation(self, config: dict[str, Any]) -> dict[str, Any]:
        """The OpenAI parameters of a ``generationConfig``, checked as Google checks it."""
        params: dict[str, Any] = {}
        limit = config.get("maxOutputTokens")
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
                raise invalid("max_output_tokens must be a positive integer")
            reasoning = self.model in self.api.sim.config.reasoning_models
            params["max_completion_tokens" if reasoning else "max_tokens"] = limit
        for name, openai_name, high in (
            ("temperature", "temperature", 2.0),
            ("topP", "top_p", 1.0),
        ):
            value = config.get(name)
            if value is None:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 <= value <= high
            ):
                raise invalid(f"{name} must be a number between 0 and {high:g}, got {value!r}")
            params[openai_name] = value
        if config.get("candidateCount", 1) != 1:
            raise invalid("Only one candidate can be specified in the current model")
        if "seed" in config:
            params["seed"] = config["seed"]
        stops = config.get("stopSequences")
        if stops is not None:
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise invalid("stop_sequences must be a list of strings")
            if len(stops) > MAX_STOP_SEQUENCES:
                raise invalid(f"stop_sequences can have at most {MAX_STOP_SEQUENCES} items")
            params["stop"] = stops
        schema = _response_schema(config)
        if schema is not None:
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": schema},
            }
        if "thinkingConfig" in config:
            thinking = _fields(config["thinkingConfig"], THINKING_FIELDS, "thinking_config")
            self.include_thoughts = thinking.get("includeThoughts") is True
        return params

    # -- the answer, as Google writes it -------------------------------------------------------

    def written(self, response: web.StreamResponse) -> web.StreamResponse:
        """The simulator's OpenAI-shaped ``response`` as Google's: an answer's
        ``candidates``, an error's body; a response already sent (a dropped connection, a
        chunked body), a redirect or a body that is no JSON (a fault's) goes as it is."""
        if not isinstance(response, web.Response) or response.prepared:
            return response
        if 300 <= response.status < 400 or response.content_type != "application/json":
            return response
        try:
            body = json.loads(response.body)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return response  # half a body: a fault's, sent as it is
        if response.status >= 400:
            said = body.get("error") if isinstance(body, dict) else None
            if isinstance(said, dict) and "status" in said:  # Google's already
                return response
            return self._error(response, body)
        try:
            answer = self._answer(body)
        except (KeyError, IndexError, TypeError, AttributeError):
            return response
        return web.json_response(answer)

    def _answer(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.answer(body)

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The simulator's OpenAI-shaped answer as a ``GenerateContentResponse``."""
        choice = body["choices"][0]
        message = choice["message"]
        usage = body.get("usage") or {}
        reasoning_tokens = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
        completion = usage.get("completion_tokens", 0)
        metadata: dict[str, Any] = {
            "promptTokenCount": usage.get("prompt_tokens", 0),
            "candidatesTokenCount": (
                completion - reasoning_tokens if isinstance(completion, int) else completion
            ),
            "totalTokenCount": usage.get("total_tokens", 0),
        }
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        if cached:
            metadata["cachedContentTokenCount"] = cached
        if reasoning_tokens:
            metadata["thoughtsTokenCount"] = reasoning_tokens
        answer: dict[str, Any] = {
            "usageMetadata": metadata,
            "modelVersion": body.get("model", self.model),
            "responseId": body.get("id", "sim"),
        }
        finish = choice.get("finish_reason")
        if finish == "prompt_blocked":
            answer["promptFeedback"] = {"blockReason": "SAFETY"}
            return answer
        parts: list[dict[str, Any]] = []
        thought = message.get("reasoning_content")
        if self.include_thoughts and thought:
            parts.append({"text": thought, "thought": True})
        if message.get("content"):
            parts.append({"text": message["content"]})
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish is not None:
            candidate["finishReason"] = FINISH_REASONS.get(finish, "OTHER")
        answer["candidates"] = [candidate]
        return answer

    def _error(self, response: web.Response, body: Any) -> web.Response:
        """The simulator's error as Google says it: a refused key as Google refuses it, an
        exhausted quota with a per-day ``QuotaFailure``, a rate limit with ``RetryInfo``."""
        status = response.status
        error = body.get("error") if isinstance(body, dict) else None
        error = error if isinstance(error, dict) else {}
        message = str(error.get("message") or "")
        if status == 429 and error.get("code") == "insufficient_quota":
            violation = {
                "quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
                "quotaId": "GenerateRequestsPerDayPerProjectPerModel",
            }
            quota = {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [violation],
            }
            return google_error(429, QUOTA_MESSAGE, [quota])
        if status == 429:
            return google_error(429, *_rate_limited(response.headers, message))
        return google_error(status, message or GOOGLE_STATUS.get(status, "error"))


def _rate_limited(headers: Mapping[str, str], message: str) -> tuple[str, list[dict[str, Any]]]:
    """A 429's message and details: with a ``Retry-After``, Google's per-minute quota and the
    ``RetryInfo`` saying when to come back (where OpenAI sends headers); without one, the bare
    "Resource has been exhausted" Google sends when overloaded."""
    millis = headers.get("retry-after-ms")
    seconds = headers.get("retry-after")
    if millis is None and seconds is None:
        return "Resource has been exhausted (e.g. check quota).", []
    delay = f"{int(millis) / 1000:g}s" if millis is not None else f"{seconds}s"
    violation = {
        "quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
        "quotaId": "GenerateRequestsPerMinutePerProjectPerModel",
    }
    return f"{QUOTA_MESSAGE} {message}".strip(), [
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [violation]},
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay},
    ]


# -- reading a request ---------------------------------------------------------------------------


def _parts(parts: Any, where: str) -> list[str | dict[str, Any]]:
    """A content's parts: each text as a string, each image or PDF as the OpenAI content
    part the simulator reads."""
    if not isinstance(parts, list) or not parts:
        raise invalid(f"* GenerateContentRequest.{where}.parts: contents.parts must not be empty.")
    read: list[str | dict[str, Any]] = []
    for n, part in enumerate(parts):
        fields = _fields(part, PART_FIELDS, f"{where}.parts[{n}]")
        data = [name for name in ("text", "inlineData", "fileData") if name in fields]
        if len(data) != 1:
            raise invalid(
                f"* GenerateContentRequest.{where}.parts[{n}].data: required oneof field 'data' "
                "must have one initialized field"
            )
        if "text" in fields:
            if not isinstance(fields["text"], str):
                raise invalid(f"Invalid value at '{where}.parts[{n}].text': expected a string.")
            read.append(fields["text"])
        elif "inlineData" in fields:
            read.append(_inline(_fields(fields["inlineData"], BLOB_FIELDS, f"{where}.inline_data")))
        else:
            read.append(_file(_fields(fields["fileData"], FILE_FIELDS, f"{where}.file_data")))
    return read


def _inline(blob: dict[str, Any]) -> dict[str, Any]:
    mime, data = blob.get("mimeType"), blob.get("data")
    if not isinstance(mime, str) or not isinstance(data, str):
        raise invalid("* inline_data: mime_type and data are required")
    url = f"data:{mime};base64,{data}"
    if mime.startswith("image/"):
        return {"type": "image_url", "image_url": {"url": url}}
    if mime == "application/pdf":
        return {"type": "file", "file": {"file_data": url}}
    raise invalid(f"Unsupported MIME type: {mime}")


def _file(file: dict[str, Any]) -> dict[str, Any]:
    uri, mime = file.get("fileUri"), file.get("mimeType")
    if not isinstance(uri, str) or not uri.startswith(("http://", "https://", "gs://")):
        raise invalid("* file_data.file_uri: a URI is required")
    if mime is not None and not str(mime).startswith("image/"):
        raise invalid(f"Unsupported MIME type: {mime} (the simulator fetches images only)")
    return {"type": "image_url", "image_url": {"url": uri}}


def _content(parts: list[str | dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Parts as an OpenAI message's content: one text is a string (as the canonical request
    sends it, so the simulator's digests and answers are the OpenAI dialect's)."""
    if len(parts) == 1 and isinstance(parts[0], str):
        return parts[0]
    return [{"type": "text", "text": p} if isinstance(p, str) else p for p in parts]


def _response_schema(config: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema a ``generationConfig`` asks the answer to match, checked as Google
    checks it; ``None`` when it asks for none."""
    mime = config.get("responseMimeType")
    if mime is not None and mime not in RESPONSE_MIME_TYPES:
        raise invalid(
            f"* GenerateContentRequest.generation_config.response_mime_type: allowed mimetypes "
            f"are {', '.join(sorted(RESPONSE_MIME_TYPES))}"
        )
    openapi, json_schema = config.get("responseSchema"), config.get("responseJsonSchema")
    if openapi is None and json_schema is None:
        return None
    if openapi is not None and json_schema is not None:
        raise invalid("response_schema and response_json_schema cannot both be set")
    if mime != "application/json":
        raise invalid(
            "* GenerateContentRequest.generation_config.response_mime_type: it must be "
            "application/json when a response schema is set"
        )
    if openapi is not None:
        return _openapi_schema(openapi, "generation_config.response_schema")
    _check_json_schema(json_schema, "generation_config.response_json_schema")
    return json_schema if isinstance(json_schema, dict) else {}


def _openapi_schema(node: Any, where: str) -> dict[str, Any]:
    """A ``responseSchema`` (OpenAPI's subset) as the JSON schema it means (types in lower
    case); refused where Google refuses it."""
    fields = _fields(node, SCHEMA_FIELDS, where)
    schema: dict[str, Any] = dict(fields)
    kind = fields.get("type")
    if kind is None and "anyOf" not in fields:
        raise invalid(f"* GenerateContentRequest.{where}.type: must be specified")
    if kind is not None:
        if not isinstance(kind, str) or kind.upper() not in SCHEMA_TYPES:
            raise invalid(f"Invalid value at '{where}.type' ({kind!r}): not a Type")
        schema["type"] = kind.lower()
    properties = fields.get("properties")
    if properties is not None:
        if not isinstance(properties, dict):
            raise invalid(f"Invalid value at '{where}.properties': expected an object.")
        schema["properties"] = {
            name: _openapi_schema(sub, f"{where}.properties[{name}].value")
            for name, sub in properties.items()
        }
    for name in fields.get("required") or ():
        if name not in (properties or {}):
            raise invalid(
                f"* GenerateContentRequest.{where}.required[{name}]: property is not defined"
            )
    if "items" in fields:
        schema["items"] = _openapi_schema(fields["items"], f"{where}.items")
    if "anyOf" in fields:
        if not isinstance(fields["anyOf"], list):
            raise invalid(f"Invalid value at '{where}.any_of': expected a list.")
        schema["anyOf"] = [
            _openapi_schema(sub, f"{where}.any_of[{n}]") for n, sub in enumerate(fields["anyOf"])
        ]
    return schema


def _check_json_schema(node: Any, where: str) -> None:
    """A ``responseJsonSchema``: JSON Schema, whose keywords Gemini does not enforce are let
    be; refused when it is no schema (not an object, an unknown ``type``)."""
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        raise invalid(f"Invalid value at '{where}': a JSON schema must be an object.")
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [] if kind is None else [kind]
    if any(k not in JSON_SCHEMA_TYPES for k in kinds):
        raise invalid(f"* GenerateContentRequest.{where}.type: {kind!r} is not a JSON type")
    for name in ("properties", "$defs", "definitions"):
        children = node.get(name)
        if isinstance(children, dict):
            for key, sub in children.items():
                _check_json_schema(sub, f"{where}.{name}.{key}")
    for name in ("items", "additionalProperties", "not"):
        if isinstance(node.get(name), dict):
            _check_json_schema(node[name], f"{where}.{name}")
    for name in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for n, sub in enumerate(node.get(name) or ()):
            _check_json_schema(sub, f"{where}.{name}[{n}]")
