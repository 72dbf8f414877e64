"""What an endpoint's answer says: an outcome, or why not, and what to do about it.

Everything here reads; nothing here sends, waits or changes how the job goes on. The dispatcher
(:mod:`llm_ops._engine.dispatcher`) acts on what is read: it retries an attempt that ended in
:class:`Retryable`, keeps the outcome of one that ended in :class:`Final`, pauses every sender
for a ``Retry-After`` and stops the job when an answer refuses the whole of it.

What a body says is read by the endpoint's dialect (:mod:`llm_ops._dialects`), in neutral
terms: text, stop reason, usage, reasoning, the kind of an error; here those become outcomes.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from yarl import URL

from .._dialects import Dialect, ErrorReading, MalformedAnswer, Reply, Usage
from .._outcome import (
    TRUNCATED_MESSAGE,
    Counters,
    EmbeddingsRequest,
    Outcome,
    Pack,
    Request,
    Sent,
    images_in,
)
from .._pack import unpack
from .._schema import InvalidOutput
from ..exceptions import setting, setting_to
from .boundary import one_line, redact


class Retryable(Exception):
    """An attempt that may succeed if made again; ``retry_after`` is the wait it asked for.
    A ``malformed`` answer (broken framing or JSON) may be a torn connection, or a server
    that answers every attempt so: it is made again once, not every attempt."""

    def __init__(
        self,
        message: str,
        retry_after: float | None = None,
        http_status: int | None = None,
        *,
        malformed: bool = False,
    ):
        super().__init__(message)
        self.retry_after = retry_after
        self.http_status = http_status
        self.malformed = malformed


class Final(Exception):
    """An attempt whose outcome stands: ``status``, with this message as its error."""

    def __init__(self, status: Sent, message: str, http_status: int | None = None):
        super().__init__(message)
        self.status = status
        self.http_status = http_status


# -- answers that are not a 200 ---------------------------------------------------------------


def base_url_hint(status: int, message: str, base_url: str) -> str | None:
    """What to type when a refusal comes from a base URL that is wrong: Azure OpenAI answers
    ``404 Resource not found`` under ``https://NAME.openai.azure.com`` without
    ``/openai/v1``; ``None`` otherwise."""
    if status != 404 or "resource not found" not in message.lower():
        return None
    url = URL(base_url)
    if not (url.host or "").endswith("openai.azure.com") or "/openai/v1" in url.path:
        return None
    return (
        f"Azure OpenAI serves the OpenAI API under /openai/v1/: use "
        f"--base-url {url.origin()}/openai/v1/ (base_url={str(url.origin()) + '/openai/v1/'!r})"
    )


def rejection_hint(message: str) -> str:
    """What to do about a request the endpoint refuses (a 4xx, or a 5xx that says the input
    is not supported) the same way on every row."""
    said = message.lower()
    takes_none = ("not supported", "unsupported", "does not support")
    if "mmproj" in said or ("image" in said and any(words in said for words in takes_none)):
        return (
            "The model takes no images: serve one that does (llama.cpp: llama-server "
            "--mmproj FILE), or send no images (drop images= / --images)."
        )
    return (
        "Every row would be refused so: fix what it says (the model, the columns sent, "
        "the options), then rerun."
    )


def refusal(
    status: int,
    error: ErrorReading,
    payload: bytes,
    secrets: Sequence[str | None],
    *,
    kept: str = "answers so far are cached",
    key_variable: str = "OPENAI_API_KEY",
) -> tuple[str, str | None]:
    """An error answer's one-line message, and, when it refuses the whole job (the
    credentials, an empty quota), why the job stops; else ``None``. ``kept`` says what
    became of the answers so far (the cache is off: they are not kept); ``key_variable``
    names the variable a key is read from (the dialect's)."""
    message = one_line(redact(f"HTTP {status}: {error.message or preview(payload)}", *secrets))
    if error.kind == "credentials":
        return message, (
            f"the endpoint refused the credentials ({message}); the job was stopped and "
            f"nothing more was sent. Check the API key ({setting_to('api_key')} or "
            f"{key_variable}) and "
            "its permissions for this model."
        )
    if error.kind == "quota":
        return message, (
            f"the account is out of quota ({message}); the job was stopped and nothing more "
            f"was sent. Add credit or raise the quota, then rerun: {kept}."
        )
    return message, None


def redirection(status: int, headers: Mapping[str, str], base_url: str) -> tuple[str, str]:
    """A 3xx's message, and why the job stops: a redirect is never followed (it could carry
    the key to another host), and every request would be sent there too."""
    target = headers.get("location")
    where = "without a Location"
    if target:
        try:
            to = URL(base_url).join(URL(target))
            where = f"to {to.origin()}{to.path}"  # no credentials, no query
        except ValueError:
            where = "to an address that is not a URL"
    message = f"HTTP {status}: the endpoint redirects {where}"
    return message, (
        f"{message}; redirects are not followed (they could carry the API key elsewhere), "
        f"so the job was stopped and nothing more was sent. Set {setting('base_url')} to the "
        "address it points to, then rerun."
    )


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds an answer asks to wait: ``retry-after-ms``, else ``Retry-After`` in seconds or
    as an HTTP date; ``None`` when absent or unreadable (a date in the past is 0)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        wait = _number(millis)
        if wait is not None:
            return wait / 1000
    text = headers.get("retry-after")
    if text is None:
        return None
    wait = _number(text)
    if wait is not None:
        return wait
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:  # HTTP dates are GMT
        return None
    return max(0.0, moment.timestamp() - time.time())


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value >= 0 and value == value and value != float("inf") else None


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``24 h``: a wait as a person reads it."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h".replace(".0 h", " h")


# -- answers: completions and embeddings --------------------------------------------------


class Reader:
    """Reads one dispatch's answers into outcomes, by the endpoint's ``dialect``, and counts
    what each answer billed."""

    def __init__(self, counters: Counters, secrets: Sequence[str | None], dialect: Dialect):
        self.counters = counters
        self.secrets = secrets
        self.dialect = dialect

    def read(self, request: Request, payload: bytes) -> Outcome:
        """The outcome of an answer; :class:`Retryable` or :class:`Final` when it is none."""
        raise NotImplementedError

    def count(self, tokens: Usage | None) -> Usage | None:
        """Count an answer (billed, whatever becomes of it) and its tokens, when they can be
        right; tokens that cannot (negative, absurd: ``None``) are counted as unknown."""
        self.counters.answered += 1
        if tokens is None:
            self.counters.usage_unknown += 1
            return None
        self.counters.prompt_tokens += tokens[0]
        self.counters.completion_tokens += tokens[1]
        self.counters.cached_tokens += tokens[2]
        self.counters.reasoning_tokens += tokens[3]
        return tokens


def malformed(payload: bytes) -> Retryable:
    return Retryable(f"malformed response body: {preview(payload)!r}", malformed=True)


class CompletionReader(Reader):
    """Reads completions; ``validate`` checks a structured answer against its schema."""

    def __init__(
        self,
        counters: Counters,
        secrets: Sequence[str | None],
        dialect: Dialect,
        validate: Callable[[str], str] | None = None,
    ):
        super().__init__(counters, secrets, dialect)
        self.validate = validate

    def read(self, request: Request, payload: bytes) -> Outcome:
        try:
            reply = self.dialect.read_completion(payload)
        except MalformedAnswer as exc:
            raise malformed(payload) from exc
        usage = self.count(reply.usage)
        writes = min(reply.cache_writes, usage[0]) if usage is not None else 0
        self.counters.cache_write_tokens += writes
        self.counters.images += images_in(request.messages)  # billed with the answer
        self._check(reply)
        text = reply.text
        assert isinstance(text, str)  # _check refused any other
        prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens = usage or (0, 0, 0, 0)
        truncated = reply.stop == "length"
        outcome = Outcome(
            key=request.key,
            status="truncated" if truncated else "ok",
            text=text,
            error=TRUNCATED_MESSAGE if truncated else None,
            stop_reason=reply.stop_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            reasoning_tokens=reasoning_tokens,
            reasoning=reply.reasoning,
            usage_known=usage is not None,
            cache_write_tokens=writes,
            response_model=reply.response_model,
            response_id=reply.response_id,
        )
        if truncated:
            return outcome
        if isinstance(request, Pack):
            outcome.items = _unpacked(request, outcome, text)
        elif self.validate is not None:
            _validated(outcome, text, self.validate)
        return outcome

    def _check(self, reply: Reply) -> None:
        """Raise for a 200 that is no answer: an error in its body, an answer that was
        filtered or did not finish, or one without text."""
        if reply.failed:
            raise Retryable(
                one_line(
                    redact(f"the endpoint answered with an error: {reply.error}", *self.secrets)
                )
            )
        said = f"{self.dialect.stop_field} {reply.stop_reason!r}"
        if reply.stop == "filtered":
            raise Final("filtered", f"the endpoint's content filter stopped the answer ({said})")
        if reply.stop == "unfinished":
            raise Retryable(f"the answer did not finish ({said})")
        if not isinstance(reply.text, str):
            raise Final("rejected", f"the answer has no text content ({said})")


def _unpacked(pack: Pack, outcome: Outcome, text: str) -> list[tuple[Request, Outcome]] | None:
    """Each member's outcome, with its share of the tokens, unless the answer did not give
    every id exactly once (the caller splits the pack)."""
    answers = unpack(text, len(pack.members))
    if answers is None:
        return None
    share = len(pack.members)
    return [
        (
            member,
            Outcome(
                key=member.key,
                status="ok",
                text=answer,
                stop_reason=outcome.stop_reason,
                prompt_tokens=outcome.prompt_tokens // share,
                completion_tokens=outcome.completion_tokens // share,
                cached_tokens=outcome.cached_tokens // share,
                reasoning_tokens=outcome.reasoning_tokens // share,
                cache_write_tokens=outcome.cache_write_tokens // share,
                usage_known=outcome.usage_known,
            ),
        )
        for member, answer in zip(pack.members, answers, strict=True)
    ]


def _validated(outcome: Outcome, text: str, validate: Callable[[str], str]) -> None:
    """The structured answer, normalised; ``invalid`` when it does not match the schema."""
    try:
        outcome.json = validate(text)
    except InvalidOutput as exc:
        outcome.status = "invalid"
        outcome.error = one_line(f"the answer does not match the schema: {exc}")


class EmbeddingReader(Reader):
    """Reads embeddings answers: one finite vector per input of an
    :class:`EmbeddingsRequest`, of ``dimensions`` numbers when that was asked for."""

    def __init__(
        self,
        counters: Counters,
        secrets: Sequence[str | None],
        dialect: Dialect,
        dimensions: int | None = None,
    ):
        super().__init__(counters, secrets, dialect)
        self.dimensions = dimensions

    def read(self, request: Request, payload: bytes) -> Outcome:
        expected = len(request.inputs) if isinstance(request, EmbeddingsRequest) else 0
        try:
            answer = self.dialect.read_embeddings(payload)
        except MalformedAnswer as exc:
            raise malformed(payload) from exc
        vectors = answer.vectors
        if len(vectors) != expected or answer.indexes != list(range(expected)):
            raise Retryable(
                f"the endpoint returned {len(vectors)} embeddings for {expected} inputs"
            )
        if not _finite_vectors(vectors):
            raise Retryable("the endpoint returned embeddings that are not lists of numbers")
        usage = self.count(answer.usage)
        wanted = self.dimensions
        if wanted is not None and any(len(vector) != wanted for vector in vectors):
            raise Final(
                "rejected",
                f"asked for dimensions={wanted}, the endpoint returned "
                f"{len(vectors[0])}: it ignores dimensions=; drop it for "
                "this endpoint",
            )
        return Outcome(
            key=request.key,
            status="ok",
            vectors=vectors,
            prompt_tokens=0 if usage is None else usage[0],
            usage_known=usage is not None,
        )


def _finite_vectors(vectors: list[Any]) -> bool:
    """Vectors of one width, of finite numbers only: what the cache can store and search."""
    try:
        values = np.asarray(vectors, dtype=np.float64)
    except (ValueError, TypeError):
        return False
    return values.ndim == 2 and values.shape[1] > 0 and bool(np.isfinite(values).all())


# -- bodies -------------------------------------------------------------------------------------


def preview(payload: bytes, limit: int = 80) -> str:
    """The start of a body, on one line, to quote in a message."""
    return one_line(payload[:limit].decode("utf-8", "replace"), limit) or "(empty body)"
