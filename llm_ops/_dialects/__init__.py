"""API dialects: how one family of APIs spells requests, answers, errors, rate limits and batch
files, behind one interface the engine calls (:class:`Dialect`).

``Endpoint(provider=...)`` picks one: a name of :data:`DIALECTS` (``"openai"``, the default), or
a :class:`Dialect` object (a test's, or a provider llm-ops does not ship). Without one, the
endpoint's host names it where it is a provider's own (:data:`HOSTS`), else it is ``"openai"``:
what most servers and gateways speak.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..exceptions import ConfigError
from .base import (
    BatchResult,
    Dialect,
    ErrorKind,
    ErrorReading,
    MalformedAnswer,
    Reply,
    Stop,
    Usage,
    Vectors,
)
from .openai import OPENAI

__all__ = [
    "CANONICAL",
    "DEFAULT",
    "DIALECTS",
    "HOSTS",
    "BatchResult",
    "Dialect",
    "ErrorKind",
    "ErrorReading",
    "MalformedAnswer",
    "Reply",
    "Stop",
    "Usage",
    "Vectors",
    "dialect_for",
]

CANONICAL = OPENAI
"""The dialect whose spelling the canonical request (what a key hashes) uses for structured
output and media parts. Keys live in users' caches: this never changes."""
DEFAULT = "openai"
DIALECTS: dict[str, Dialect] = {"openai": OPENAI}
"""The dialects llm-ops ships, by the name ``provider=`` gives them."""
HOSTS: dict[str, str] = {"api.openai.com": "openai"}
"""Hosts whose provider is known: their API's dialect is picked without ``provider=``. (Room
for ``api.anthropic.com`` and ``generativelanguage.googleapis.com`` once their dialects are
written.)"""


def dialect_for(provider: object, base_url: str | None = None) -> Dialect:
    """The dialect ``provider`` names or is; ``None``: the one ``base_url``'s host is known to
    speak, else OpenAI's. :class:`ConfigError` for a name no dialect has, or an object that
    is not one."""
    if provider is None:
        host = (urlsplit(base_url).hostname or "") if base_url else ""
        return DIALECTS[HOSTS.get(host.lower(), DEFAULT)]
    if isinstance(provider, str):
        if provider not in DIALECTS:
            known = ", ".join(repr(name) for name in sorted(DIALECTS))
            raise ConfigError(
                f"provider {provider!r} is not a dialect llm-ops speaks; it knows {known}, or "
                "pass a Dialect object"
            )
        return DIALECTS[provider]
    if not isinstance(provider, Dialect):
        raise ConfigError(
            "provider takes a provider's name such as 'openai', or a Dialect object, got "
            f"{type(provider).__name__}"
        )
    return provider
