"""What a :class:`~llm_ops.Client` lends each job it runs."""

from __future__ import annotations

from dataclasses import dataclass

from ._cache import Cache
from ._engine import Engine


@dataclass(frozen=True)
class Backend:
    """The client's engine (on the client's event loop) and its cache, if any."""

    engine: Engine
    cache: Cache | None
