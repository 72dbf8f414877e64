"""Where the HTTP libraries' errors become ours: one mapping, at one boundary.

Two libraries talk to the endpoint: aiohttp on the hot path (:mod:`llm_ops._engine.transport`,
which Anthropic's and Gemini's batch APIs use too) and the ``openai`` SDK for the Files and
Batches API (:mod:`llm_ops._pipeline.batch_openai`). Their exceptions are mapped here, and
only here, to exceptions of the tree rooted at :class:`~llm_ops.exceptions.LlmOpsError`,
chained with ``raise ... from``:

- aiohttp's (and the operating system's), by :func:`no_answer`, to a :class:`TransportError`,
  so the engine decides retries without knowing the HTTP library:

  - :class:`CouldNotConnect`: no connection was made (refused, unresolvable, connect timeout,
    a certificate that does not verify); nothing was sent, so retrying cannot duplicate work;
  - :class:`TimedOut`: the attempt took longer than its timeout;
  - :class:`ConnectionFailed`: the connection broke while sending or reading;
  - :class:`Malformed`: bytes that are not a well-formed HTTP answer (a bad status line or
    header, a broken chunk): retried once, since a torn connection can look so;
  - :class:`Refused`: something on the way refuses every request alike (the proxy asks for
    credentials; the TLS server wants a client certificate, or not ours): the job stops once;
  - :class:`BadBody` (raised by the transport itself): the answer's body was larger than
    allowed (compressed or decompressed), or in an encoding we did not ask for;

- the SDK's, by :func:`provider_errors`, to one :class:`~llm_ops.exceptions.JobAbortedError`
  (after the SDK's own retries), whose message says what to do next.

A message that quotes a server or a library goes through :func:`redact` first, and so do the
SDK's logs (:func:`redact_in_logs`): an API key never reaches an error message or a log.
"""

from __future__ import annotations

import functools
import html
import json
import logging
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import ClassVar

import aiohttp
import openai
from yarl import URL

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


class Malformed(TransportError):
    """The bytes that came back are not a well-formed HTTP answer."""


class Refused(TransportError):
    """Every request would be refused alike by something on the way (a proxy, a TLS server)."""


class BadBody(TransportError):
    """The answer's body was too large, or in an encoding we cannot read; it was not read to
    its end."""


AIOHTTP_FAILURES = (aiohttp.ClientError, OSError)  # TimeoutError is an OSError
"""What aiohttp (or the socket under it) raises when an attempt gets no answer."""

_TORN = "Response payload is not completed"
"""How aiohttp's message of a body cut short by the connection's end begins: a torn
connection, unlike a body that breaks HTTP's framing (its type is the same)."""
_CLIENT_CERTIFICATE = re.compile(r"ALERT_(CERTIFICATE_REQUIRED|BAD_CERTIFICATE|UNKNOWN_CA)")


ANSWER_MAY_BE_LOST = (openai.APIConnectionError, openai.InternalServerError, openai.RateLimitError)
"""The SDK's errors after which the provider may have done what was asked all the same (a
timeout, a dropped connection, a 5xx): a call that is not idempotent is looked up before it
is made again."""


def no_answer(exc: BaseException, timeout: float, proxy: URL | None) -> TransportError:
    """The :class:`TransportError` for one of :data:`AIOHTTP_FAILURES` (through ``proxy``)."""
    if isinstance(exc, aiohttp.ClientHttpProxyError) and proxy is not None:
        if exc.status == 407:
            return proxy_refused(proxy, exc.status)
        return CouldNotConnect(
            f"the proxy {shown_proxy(proxy)} refused a tunnel (HTTP {exc.status})"
        )
    alert = _client_certificate_alert(exc)
    if alert is not None:
        return Refused(
            f"the server refused the connection for want of a client certificate it accepts "
            f"(TLS alert {alert}): pass cert='client.pem' or cert=('client.crt', "
            "'client.key'), signed by an authority the server trusts"
        )
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        return CouldNotConnect(describe(exc))
    if isinstance(exc, TimeoutError):
        return TimedOut(f"timed out after {timeout:g}s")
    if isinstance(exc, aiohttp.ClientPayloadError) and not str(exc).startswith(_TORN):
        return Malformed(f"the answer's body is not well-formed HTTP: {_first_line(exc)}")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return ConnectionFailed("the server closed the connection in the middle of its answer")
    if isinstance(exc, aiohttp.ClientResponseError):  # never a status: we raise for none
        return Malformed(f"not a well-formed HTTP answer: {_first_line(exc)}")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return ConnectionFailed("the server closed the connection before answering")
    return ConnectionFailed(describe(exc))


def is_reset_before_answer(exc: BaseException) -> bool:
    """Whether the connection broke before any of the answer came (not while connecting)."""
    return isinstance(exc, aiohttp.ServerDisconnectedError) or (
        isinstance(exc, aiohttp.ClientOSError) and not isinstance(exc, aiohttp.ClientConnectorError)
    )


def proxy_refused(proxy: URL, status: int) -> Refused:
    return Refused(
        f"the proxy {shown_proxy(proxy)} asks for credentials (HTTP {status}): give them in "
        "the proxy's URL (http://user:password@host:port, in proxy= or HTTPS_PROXY), or name "
        "a proxy that takes these"
    )


def shown_proxy(proxy: URL) -> str:
    """A proxy as a message may show it: scheme, host and port, never its credentials."""
    return f"{proxy.scheme}://{proxy.host}:{proxy.port}"


def _client_certificate_alert(exc: BaseException) -> str | None:
    """The TLS alert by which a server refused us a connection for our client certificate
    (none given, or one it does not accept), if that is what ``exc`` is. aiohttp copies the
    ``ssl`` error's text into its own exceptions, so the text is what is searched."""
    seen: BaseException | None = exc
    while seen is not None:
        found = _CLIENT_CERTIFICATE.search(str(seen))
        if found:
            return found.group(1).replace("_", " ").lower()
        seen = seen.__cause__ or seen.__context__
    return None


def _first_line(exc: BaseException) -> str:
    """aiohttp's message of a parse error, which shows the bytes it stopped at."""
    return one_line(str(getattr(exc, "message", None) or exc), 160)


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
            hint = "the endpoint may have no Files and Batches API: use batch=False"
        else:
            hint = "rerun to pick the recorded batches up where they stopped"
        raise JobAbortedError(f"the Batch API failed ({detail}); {hint}") from exc


def redact(text: str, *secrets: str | None) -> str:
    """Remove secrets (and anything shaped like an API key) from a message.

    A secret is removed in each form a server may echo it in (see :func:`_secret_pattern`),
    only where it stands on its own, not inside a longer word, and only if it is long enough
    to be one, so a server's message stays readable with ``api_key="x"``.
    """
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET_LENGTH:
            text = _secret_pattern(secret).sub("***", text)
    return _SECRET_LIKE.sub("***", text)


@functools.lru_cache(maxsize=64)  # the same few secrets, for every message
def _secret_pattern(secret: str) -> re.Pattern[str]:
    """``secret`` as a server may echo it: as is, or with any of its characters
    percent-encoded (``quote``, ``quote_plus``; hex digits in either case), encoded twice
    (``%252B``), ``+`` for a space, JSON-escaped (``\\/``, ``\\u002b``) or HTML-escaped
    (``&#43;``): a gateway key in the URL's query comes back in an error's echo of the URL,
    encoded as the server writes URLs. A boundary is a character that is not a letter or
    digit, or an escape (``%3D`` in ``key%3D<secret>``)."""
    forms = "".join(f"(?:{'|'.join(_char_forms(char))})" for char in secret)
    before = r"(?:(?<![A-Za-z0-9])|(?<=%[0-9A-Fa-f]{2})|(?<=\\u[0-9A-Fa-f]{4}))"
    return re.compile(f"{before}{forms}(?![A-Za-z0-9])")


def _char_forms(char: str) -> list[str]:
    """Patterns of the forms one character of a secret takes (see :func:`_secret_pattern`)."""
    hexes = [f"{byte:02x}" for byte in char.encode()]
    units = char.encode("utf-16-be")
    json_units = [f"{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2)]
    forms = {
        re.escape(char),
        "".join(f"%(?:25)?{_hex_either(h)}" for h in hexes),
        "".join(rf"\\u{_hex_either(unit)}" for unit in json_units),
        f"&#0*{ord(char)};",
        f"&#[xX]0*{_hex_either(f'{ord(char):x}')};",
        re.escape(html.escape(char)),
        re.escape(json.dumps(char)[1:-1]),
    }
    if char == " ":
        forms.add(r"\+")
    if char == "/":
        forms.add(r"\\/")
    return sorted(forms)


def _hex_either(digits: str) -> str:
    """A pattern of the hex ``digits`` in upper or lower case."""
    return "".join(f"[{d.lower()}{d.upper()}]" if d.isalpha() else d for d in digits)


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
