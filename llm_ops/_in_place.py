"""Which of llm-ops' own blocking work runs in place on the thread driving an expression's
event loop, rather than on a worker thread: a typed mark its own code sets, not a guess from
a function's module.

Polars work started from another thread waits for a free worker of Polars' pool, and an
expression's batch may be running on one of those workers, so the pipeline's Polars and
cache work (handed to ``asyncio.to_thread``) must run on the thread Polars called (see
:mod:`llm_ops._expr.runtime`). Work marked here runs there; everything else handed to the
loop's executor (host name lookups, the journal's merges, which wait for the cache file)
runs on a worker thread. Outside an expression, a job's loop sends all of it to threads.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any, TypeVar

W = TypeVar("W")

_MARK = "__llm_ops_runs_in_place__"


def in_place(work: W) -> W:
    """Mark ``work``, a function or a class (all its methods), as the pipeline's own blocking
    work that runs in place in an expression; ``work`` itself is returned (a decorator)."""
    setattr(work, _MARK, True)
    return work


def runs_in_place(submitted: Any) -> bool:
    """Whether ``submitted``, as an executor is handed it, is work marked by :func:`in_place`:
    a marked function, a method of a marked class, or either wrapped in partials
    (``asyncio.to_thread`` submits ``partial(context.run, work, ...)``)."""
    target = submitted
    while isinstance(target, functools.partial):
        in_context = isinstance(getattr(target.func, "__self__", None), contextvars.Context)
        target = target.args[0] if in_context and target.args else target.func
    owner = getattr(target, "__self__", None)
    return getattr(target, _MARK, False) is True or getattr(owner, _MARK, False) is True
