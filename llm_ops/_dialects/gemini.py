"""The Gemini dialect: Google's Generative Language API (``generateContent``,
``batchEmbedContents``, the models listing), as ``https://generativelanguage.googleapis.com/v1beta``
serves it and Google's own SDK (``google-genai``) speaks it.

Everything this API spells lives here and nowhere else in ``llm_ops/`` (a test holds it so):
the path ``models/{model}:generateContent``, the ``x-goog-api-key`` header, ``contents`` and
their ``parts``, ``systemInstruction``, ``generationConfig``, the answer's ``candidates`` and
their ``finishReason``, ``usageMetadata``, ``promptFeedback``, and Google's error body
(``{"error": {"code", "message", "status", "details"}}``) with its ``RetryInfo``.

The request a dialect is given is the canonical one (OpenAI-shaped, see :mod:`llm_ops._key`);
it is translated here, so keys are the same whichever dialect sends a request:

- ``messages``: system messages become ``systemInstruction``; ``user`` and ``assistant``
  become ``contents`` of the roles ``user`` and ``model``; a text part is ``{"text"}``, an
  image or a PDF sent as a ``data:`` URL is ``inlineData`` (its MIME type and base64 bytes),
  a remote image URL is ``fileData`` (Google fetches it). An image's ``detail`` has no
  per-part counterpart in ``v1beta`` and is not sent.
- ``max_tokens`` (or ``max_completion_tokens``) is ``maxOutputTokens``, ``top_p`` is
  ``topP``, ``stop`` is ``stopSequences``, ``temperature`` and ``seed`` keep their names.
- Structured output is ``responseMimeType: application/json`` with ``responseJsonSchema``,
  not ``responseSchema``: the latter takes a subset of OpenAPI 3.0's schema object (no
  ``$ref``/``$defs``, no ``additionalProperties``, ``nullable`` instead of a type list), into
  which the JSON Schemas users give (Pydantic's, with ``$defs`` and ``anyOf`` of ``null``)
  would have to be rewritten, losing what does not fit. ``responseJsonSchema`` takes JSON
  Schema itself (``$ref``, ``$defs``, ``anyOf``, ``additionalProperties``, ``enum``,
  ``minimum``... ; keywords it does not enforce are ignored, not refused), so the schema sent
  is the one keyed, as on OpenAI.
- ``reasoning_effort`` is ``thinkingConfig``: a ``thinkingBudget`` of tokens (the numbers
  Google's own OpenAI-compatible endpoint maps the efforts to; ``minimal`` is 512, the least
  every Gemini 2.5 model takes) and ``includeThoughts``, so that the thought summaries come
  back apart from the answer (``Reply.reasoning``). Without it the model thinks as it does by
  default, and says nothing of it but its ``thoughtsTokenCount``.

A request's path names its model (``completions_path`` holds ``{model}``, which the engine
fills in; see :class:`~llm_ops._dialects.base.Dialect`); the model is named as the listing
names it, without Google's ``models/`` prefix (``gemini-2.5-flash``).

Gemini sends no rate-limit headers: a 429's ``RetryInfo`` (``"retryDelay": "30s"`` in
``error.details``) says how long to wait, and is read into :attr:`ErrorReading.retry_after`.
"""

from __future__ import annotations

import math
import mimetypes
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from .base import (
    BatchResult,
    ErrorKind,
    ErrorReading,
    HeardLimits,
    MalformedAnswer,
    Reply,
    Stop,
    Usage,
    Vectors,
    load,
    named,
    parse_duration,
    token_count,
)

BASE_URL = "https://generativelanguage.googleapis.com/v1beta"
"""Where Google serves the API, as its SDK takes the base URL."""
HOST = "generativelanguage.googleapis.com"

STOPS: dict[str, Stop] = {
    "STOP": "done",
    "MAX_TOKENS": "length",
    "SAFETY": "filtered",
    "RECITATION": "filtered",
    "BLOCKLIST": "filtered",
    "PROHIBITED_CONTENT": "filtered",
    "SPII": "filtered",
    "IMAGE_SAFETY": "filtered",
}
"""``finishReason`` values onto stops; any other (``OTHER``, ``LANGUAGE``,
``MALFORMED_FUNCTION_CALL``, none at all) did not finish, and is tried again."""

KINDS: dict[str, ErrorKind] = {
    "UNAUTHENTICATED": "credentials",
    "PERMISSION_DENIED": "credentials",
    "RESOURCE_EXHAUSTED": "rate_limited",
    "UNAVAILABLE": "retryable",
    "INTERNAL": "retryable",
    "DEADLINE_EXCEEDED": "retryable",
    "ABORTED": "retryable",
    "UNKNOWN": "retryable",
    "INVALID_ARGUMENT": "rejected",
    "FAILED_PRECONDITION": "rejected",
    "NOT_FOUND": "rejected",
    "OUT_OF_RANGE": "rejected",
    "UNIMPLEMENTED": "rejected",
}
"""Google's canonical error ``status`` onto what it does to a job. ``FAILED_PRECONDITION`` is
what Google answers where the free tier is not offered (a region, a model): no retry helps."""

BY_HTTP_STATUS: dict[int, ErrorKind] = {401: "credentials", 403: "credentials", 429: "rate_limited"}
"""An error body without a ``status`` (a proxy's page): its HTTP status says; 408, 409 and 5xx
are retried, the rest refused."""

THINKING_BUDGETS = {"minimal": 512, "low": 1024, "medium": 8192, "high": 24576}
"""``reasoning_effort`` onto ``thinkingBudget`` tokens (see the module's documentation)."""

QUOTA_WORDS = ("perday", "per day", "credits are depleted", "prepayment", "billing account")
"""Words of a ``RESOURCE_EXHAUSTED`` body (its message, or its ``QuotaFailure`` and
``ErrorInfo`` details) saying that what is exhausted will not come back within a job: a daily
quota (``GenerateRequestsPerDayPerProjectPerModel``), or prepaid credits spent. Google's message
for a per-minute limit also says "You exceeded your current quota, please check your plan and
billing details", so those words alone are not taken for an empty quota: the job would stop
on every ordinary rate limit."""

RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
API_KEY_INVALID = "API_KEY_INVALID"
"""The ``ErrorInfo`` reason of a key Google does not know: it answers it with a 400
``INVALID_ARGUMENT``, which is the credentials' fault, not the request's."""
BATCH_RPC_STATUS = {
    3: 400,
    4: 504,
    5: 404,
    7: 403,
    8: 429,
    9: 400,
    11: 400,
    13: 500,
    14: 503,
    16: 401,
}
"""The HTTP status of a live request, by the ``google.rpc`` code of a batch's errored one."""
_READ_FAILURES = (ValueError, KeyError, IndexError, TypeError, AttributeError)
_NOTHING = HeardLimits()


class GeminiDialect:
    """The Gemini dialect (``provider="gemini"``)."""

    name = "gemini"
    stop_field = "finishReason"
    completions_path = "models/{model}:generateContent"
    embeddings_path = "models/{model}:batchEmbedContents"
    batch_path = "models/{model}:batchGenerateContent"
    models_path = "models"

    # -- requests -----------------------------------------------------------------------------

    def headers(self, api_key: str) -> dict[str, str]:
        """JSON both ways, and the key in ``x-goog-api-key`` (none without one: the
        caller's headers carry the credentials)."""
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if api_key:
            headers["x-goog-api-key"] = api_key
        return headers

    def completion_body(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """``generateContent``'s body asking what the canonical ``request`` asks (see the
        module's documentation). Parameters Gemini has no counterpart for are not sent."""
        system: list[dict[str, Any]] = []
        contents: list[dict[str, Any]] = []
        for message in request["messages"]:
            parts = _parts(message["content"])
            if message["role"] == "system":
                system += parts
            else:
                role = "model" if message["role"] == "assistant" else "user"
                contents.append({"role": role, "parts": parts})
        body: dict[str, Any] = {"contents": contents}
        if system:
            body["systemInstruction"] = {"parts": system}
        config = _generation_config(request)
        if config:
            body["generationConfig"] = config
        return body

    def structured_output(self, name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
        """``generationConfig`` asking for JSON matching ``schema`` (``responseJsonSchema``:
        see the module's documentation; Gemini takes no name)."""
        return {
            "generationConfig": {
                "responseMimeType": "application/json",
                "responseJsonSchema": dict(schema),
            }
        }

    def image_part(self, url: str, detail: str | None = None) -> dict[str, Any]:
        """An image: ``inlineData`` for a ``data:`` URL, ``fileData`` for a remote one."""
        return _media_part(url)

    def file_part(self, data: str, filename: str | None = None) -> dict[str, Any]:
        """A PDF's ``data:`` URL as ``inlineData`` (Gemini takes no file name)."""
        return _media_part(data, "application/pdf")

    def embeddings_body(
        self, model: str, inputs: list[str], params: Mapping[str, Any]
    ) -> dict[str, Any]:
        """``batchEmbedContents``: one request per input, each naming the model, of
        ``dimensions`` numbers (``outputDimensionality``) when that is asked."""
        dimensions = params.get("dimensions")
        extra = {} if dimensions is None else {"outputDimensionality": dimensions}
        return {
            "requests": [
                {"model": f"models/{model}", "content": {"parts": [{"text": text}]}, **extra}
                for text in inputs
            ]
        }

    # -- answers ------------------------------------------------------------------------------

    def read_models(self, payload: bytes) -> frozenset[str]:
        """The ``name`` of each listed model, without its ``models/`` prefix. A listing that
        says more pages follow (``nextPageToken``) is not all: then none is named, and any
        model is taken as served rather than refused for being on a later page."""
        try:
            body = orjson.loads(payload)
            if body.get("nextPageToken"):
                return frozenset()
            return frozenset(
                str(item["name"]).removeprefix("models/")
                for item in body.get("models", ())
                if isinstance(item, dict) and "name" in item
            )
        except _READ_FAILURES as exc:
            raise MalformedAnswer(str(exc)) from exc

    def read_completion(self, payload: bytes) -> Reply:
        """The first candidate: its text parts joined, its thought parts (``thought: true``)
        apart; a prompt blocked before any candidate (``promptFeedback.blockReason``) is
        ``filtered``."""
        try:
            body = load(payload)
            usage = _usage(body.get("usageMetadata"))
            candidates = body.get("candidates") or []
            if not candidates:
                blocked = (body.get("promptFeedback") or {}).get("blockReason")
                if blocked:
                    return Reply(None, "filtered", f"blockReason {blocked}", usage)
                raise MalformedAnswer("an answer without candidates")
            candidate = candidates[0]
            finish = candidate.get("finishReason")
            texts: list[str] = []
            thoughts: list[str] = []
            for part in (candidate.get("content") or {}).get("parts") or ():
                text = part.get("text")
                if isinstance(text, str):
                    (thoughts if part.get("thought") is True else texts).append(text)
        except _READ_FAILURES as exc:
            raise MalformedAnswer(str(exc)) from exc
        stop = STOPS.get(finish, "unfinished") if isinstance(finish, str) else "unfinished"
        if stop == "done" and not texts:  # a STOP without any text, as Gemini 2.5 can answer:
            stop = "unfinished"  # another attempt answers
        # a cut answer may hold no text (its budget spent thinking): it is truncated, empty
        text = "".join(texts) if texts or stop == "length" else None
        return Reply(
            text=text,
            stop=stop,
            stop_reason=finish if isinstance(finish, str) else None,
            usage=usage,
            reasoning="".join(thoughts) or None,
            response_model=named(body.get("modelVersion")),
            response_id=named(body.get("responseId")),
        )

    def read_embeddings(self, payload: bytes) -> Vectors:
        """``embeddings``, one per request in their order; Google says nothing of their
        tokens (unknown usage), unless a ``usageMetadata`` does."""
        try:
            body = load(payload)
            vectors = [item["values"] for item in body["embeddings"]]
            metadata = body.get("usageMetadata")
            usage = _usage(metadata) if metadata is not None else None
        except _READ_FAILURES as exc:
            raise MalformedAnswer(str(exc)) from exc
        return Vectors(vectors, list(range(len(vectors))), usage)

    # -- rate limits and errors ---------------------------------------------------------------

    def heard_limits(self, headers: Mapping[str, str]) -> HeardLimits:
        """Nothing: Gemini names no rate limits in its headers (a 429 says how long to
        wait in its body: :meth:`read_error`)."""
        return _NOTHING

    def read_error(self, status: int, payload: bytes) -> ErrorReading:
        """Google's error body: its ``status`` says the kind (:data:`KINDS`; a key Google
        does not know is ``credentials`` though it comes as a 400 ``INVALID_ARGUMENT``; an
        exhausted daily quota or spent credits is ``quota``, see :data:`QUOTA_WORDS`), its
        ``message`` is shown, and a ``RetryInfo``'s ``retryDelay`` is the wait it asks for."""
        error = _error_object(payload)
        message = error.get("message")
        shown = str(message) if message else None
        details = error.get("details")
        details = [d for d in details if isinstance(d, dict)] if isinstance(details, list) else []
        google_status = error.get("status")
        kind = KINDS.get(google_status) if isinstance(google_status, str) else None
        if kind is None:
            kind = BY_HTTP_STATUS.get(status) or (
                "retryable" if status in (408, 409) or status >= 500 else "rejected"
            )
        said = orjson.dumps(details).decode().lower() if details else ""
        if any(d.get("reason") == API_KEY_INVALID for d in details):
            kind = "credentials"
        elif kind == "rate_limited":
            text = f"{str(message).lower()} {said}"
            if any(word in text for word in QUOTA_WORDS):
                kind = "quota"
        return ErrorReading(kind, shown, retry_after=_retry_delay(details))

    # -- batch lines (the batch mode's service sends and reads them through these) ------------

    def batch_line(self, key: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A line of a batch's JSONL input file: ``{"key", "request"}``."""
        return {"key": key, "request": dict(body)}

    def batch_inline(self, key: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A request of a batch sent inline (``input_config.requests.requests``):
        ``{"request", "metadata": {"key"}}``, the key in the metadata its answer echoes."""
        return {"request": dict(body), "metadata": {"key": key}}

    def batch_request(self, line: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        return str(line["key"]), dict(line["request"])

    def batch_result(self, line: Mapping[str, Any]) -> BatchResult:
        """An answer of a batch: inline (``{"response" | "error", "metadata": {"key"}}``) or
        a line of its output file (``{"key", "response" | "error"}``). A ``response`` is an
        answer (HTTP 200); an ``error`` (a ``google.rpc.Status``) has the HTTP status a live
        request would have had (:data:`BATCH_RPC_STATUS`, by its code)."""
        metadata = line.get("metadata") or {}
        key = line.get("key") or (metadata.get("key") if isinstance(metadata, dict) else None)
        key = key if isinstance(key, str) else None
        if isinstance(line.get("response"), dict):
            return BatchResult(key, status=200, body=line["response"])
        error = line.get("error")
        if isinstance(error, dict):
            status = BATCH_RPC_STATUS.get(int(error.get("code") or 13), 500)
            body = {"error": {**error, "code": status, "rpc": error.get("code")}}
            return BatchResult(key, status=status, body=body)
        return BatchResult(key, error="an answer with neither a response nor an error")


# -- translation of the canonical request -----------------------------------------------------


def _parts(content: Any) -> list[dict[str, Any]]:
    """A canonical message's content as Gemini's ``parts``."""
    if isinstance(content, str):
        return [{"text": content}]
    parts = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            parts.append({"text": part["text"]})
        elif kind == "image_url":
            image = part["image_url"]
            parts.append(_media_part(image["url"] if isinstance(image, dict) else image))
        elif kind == "file":
            parts.append(_media_part(part["file"]["file_data"], "application/pdf"))
    return parts


def _media_part(url: str, mime_type: str | None = None) -> dict[str, Any]:
    """``inlineData`` for a ``data:<type>;base64,<data>`` URL (its type, unless the caller
    knows better), ``fileData`` for a remote URL (its type guessed from its path, when it
    can be)."""
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        said = head.removeprefix("data:").split(";", 1)[0]
        return {"inlineData": {"mimeType": mime_type or said or "image/jpeg", "data": data}}
    part: dict[str, Any] = {"fileUri": url}
    guessed = mime_type or mimetypes.guess_type(urlsplit(url).path)[0]
    if guessed:
        part["mimeType"] = guessed
    return {"fileData": part}


def _generation_config(request: Mapping[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    limit = request.get("max_completion_tokens", request.get("max_tokens"))
    if limit is not None:
        config["maxOutputTokens"] = limit
    for name, gemini_name in (("temperature", "temperature"), ("top_p", "topP"), ("seed", "seed")):
        if request.get(name) is not None:
            config[gemini_name] = request[name]
    stop = request.get("stop")
    if stop is not None:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    response_format = request.get("response_format")
    if isinstance(response_format, dict):
        if response_format.get("type") == "json_schema":
            config["responseMimeType"] = "application/json"
            config["responseJsonSchema"] = response_format["json_schema"]["schema"]
        elif response_format.get("type") == "json_object":
            config["responseMimeType"] = "application/json"
    effort = request.get("reasoning_effort")
    if effort in THINKING_BUDGETS:
        config["thinkingConfig"] = {
            "thinkingBudget": THINKING_BUDGETS[effort],
            "includeThoughts": True,
        }
    return config


# -- answers ----------------------------------------------------------------------------------


def _usage(metadata: object) -> Usage | None:
    """(prompt, completion, cached, reasoning) tokens of ``usageMetadata``: the completion
    is the candidates' tokens and the thoughts' (billed as output, as OpenAI counts them), the
    reasoning the thoughts', the cached the prompt's served from a cache (of the prompt's).
    No metadata is none billed; counts that cannot be right are ``None``."""
    if metadata is None:
        return 0, 0, 0, 0
    if not isinstance(metadata, dict):
        return None
    prompt = token_count(metadata.get("promptTokenCount"))
    candidates = token_count(metadata.get("candidatesTokenCount"))
    thoughts = token_count(metadata.get("thoughtsTokenCount"))
    cached = token_count(metadata.get("cachedContentTokenCount"))
    if prompt is None or candidates is None or thoughts is None or cached is None:
        return None
    return prompt, candidates + thoughts, min(cached, prompt), thoughts


def _error_object(payload: bytes) -> dict[str, Any]:
    """The ``error`` object of Google's error body (a list of one, as some of Google's
    front ends send it, too), or an empty dict."""
    try:
        body = orjson.loads(payload)
    except ValueError:
        return {}
    if isinstance(body, list) and body:
        body = body[0]
    inner = body.get("error") if isinstance(body, dict) else None
    return inner if isinstance(inner, dict) else {}


def _retry_delay(details: list[dict[str, Any]]) -> float | None:
    """The seconds a ``RetryInfo`` detail asks to wait (``"retryDelay": "30s"``)."""
    for detail in details:
        if detail.get("@type") == RETRY_INFO:
            delay = detail.get("retryDelay")
            seconds = parse_duration(delay) if isinstance(delay, str) else None
            if seconds is not None and math.isfinite(seconds):
                return seconds
    return None


GEMINI = GeminiDialect()
