"""Where the HTTP libraries' errors become ours: one mapping, at one boundary.

Two stacks talk to the endpoint: our own HTTP/1.1 on asyncio's sockets on the hot path
(:mod:`llm_ops._engine.transport`) and the ``openai`` SDK for the Files and Batches API
(:mod:`llm_ops._pipeline.batch`). Their exceptions are mapped here, and only here, to exceptions
of the tree rooted at :class:`~llm_ops.exceptions.LlmOpsError`, chained with ``raise ... from``:

- the operating system's (sockets, name lookups, TLS), by :func:`refused` and
  :func:`no_answer`, to a :class:`TransportError`, so the engine decides retries without
  knowing how the bytes travel:

  - :class:`CouldNotConnect`: no connection was made (refused, unresolvable, connect timeout);
    nothing was sent, so retrying cannot duplicate work;
  - :class:`TimedOut`: the attempt took longer than its timeout;
  - :class:`ConnectionFailed`: the connection broke while sending or reading;
  - :class:`BadBody` (raised by the transport itself): the answer's body was larger than
    allowed (compressed or decompressed), or in an encoding we did not ask for; the transport
    also raises :class:`ConnectionFailed` itself for bytes that are not an HTTP answer;

- the SDK's, by :func:`provider_errors`, to one :class:`~llm_ops.exceptions.JobAbortedError`
  (after the SDK's own retries), whose message says what to do next.

A message that quotes a server or a library goes through :func:`redact` first, and so do the
SDK's logs (:func:`redact_in_logs`): an API key never reaches an error message or a log.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import ClassVar

import openai

from ..exceptions import JobAbortedError, LlmOpsError

MIN_SECRET_LENGTH = 8  # shorter keys ("x", "local") cannot be told from words in a message
_SECRET_LIKE = re.compile(r"\b(sk-[A-Za-z0-9_\-*]{4,}|Bearer\s+\S+)")


class TransportError(LlmOpsError):
    """An attempt that got no HTTP answer (internal: the engine retries it, or its row fails)."""


class CouldNotConnect(TransportError):
    """No connection could be made; nothing was sent."""


class TimedOut(TransportError):
    """The attempt took longer than its timeout."""


class ConnectionFailed(TransportError):
    """The connection broke while the request was sent or the answer read."""


class BadBody(TransportError):
    """The answer's body was too large, or in an encoding we cannot read; it was not read to
    its end."""


ANSWER_MAY_BE_LOST = (openai.APIConnectionError, openai.InternalServerError, openai.RateLimitError)
"""The SDK's errors after which the provider may have done what was asked all the same (a
timeout, a dropped connection, a 5xx): a call that is not idempotent is looked up before it
is made again."""


def refused(exc: OSError) -> CouldNotConnect:
    """No connection: refused, a name that does not resolve, a failed TLS handshake."""
    return CouldNotConnect(describe(exc))


def no_answer(exc: OSError) -> ConnectionFailed:
    """A connection that broke while the request was sent or its answer read."""
    return ConnectionFailed(describe(exc))


@contextmanager
def provider_errors(secrets: Iterable[str | None]) -> Iterator[None]:
    """The SDK's errors from the Files and Batches API, as one :class:`JobAbortedError`
    (after its own retries): what is recorded and cached so far stays."""
    try:
        yield
    except openai.APIError as exc:
        detail = one_line(redact(str(exc), *secrets))
        if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
            hint = "check the API key and its access to the Batch API"
        elif isinstance(exc, openai.NotFoundError):
            hint = "the endpoint may have no Files and Batches API: use mode='live'"
        else:
            hint = "rerun to pick the recorded batches up where they stopped"
        raise JobAbortedError(f"the Batch API failed ({detail}); {hint}") from exc


def redact(text: str, *secrets: str | None) -> str:
    """Remove secrets (and anything shaped like an API key) from a message.

    A secret is only removed where it stands on its own, not inside a longer word, and only if
    it is long enough to be one, so a server's message stays readable with ``api_key="x"``.
    """
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET_LENGTH:
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", "***", text)
    return _SECRET_LIKE.sub("***", text)


class _RedactingFilter(logging.Filter):
    """httpx2 logs every request's URL at INFO, query included; a gateway's key may be there."""

    secrets: ClassVar[set[str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            record.msg, record.args = redact(record.getMessage(), *self.secrets), ()
        return True


logging.getLogger("httpx2").addFilter(_RedactingFilter())


def redact_in_logs(secrets: Iterable[str | None]) -> None:
    """Keep ``secrets`` (say, a key in the base URL's query) out of the SDK's logs."""
    _RedactingFilter.secrets.update(secret for secret in secrets if secret)


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line of at most ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(exc: BaseException) -> str:
    """An exception's message, or its type's name when it has none."""
    return str(exc) or type(exc).__name__
