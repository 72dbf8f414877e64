"""What a :class:`~llm_ops.Client` lends each job it runs."""

from __future__ import annotations

from dataclasses import dataclass

from .._cache import Cache
from .._engine.engine import Engine


@dataclass(frozen=True)
class Backend:
    """The client's engine (on the client's event loop) and its cache, if any.

    ``settles``: the job merges its writers' journal files into the cache at its end, with
    its run record, in one transaction (:meth:`~llm_ops.Cache.settle`), so a dispatch ending
    before then need not merge its own.
    """

    engine: Engine
    cache: Cache | None
    settles: bool = False
