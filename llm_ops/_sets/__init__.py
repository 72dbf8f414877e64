"""Operators over sets of rows: aggregate, top-k and rank, join, resolve.

Each decides what to ask from what it was already told, so it asks in rounds (waves, see
:mod:`._waves`); each has a naive plan (every pair, the nested loop) and cheaper ones with
stated guarantees, chosen and reported (``RunReport.plan``, ``plan_why``), and a planner that
prices it before it runs (:func:`estimate_set`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..exceptions import ConfigError
from ._waves import Answers, SetEstimate, SetOptions, Waves, priced

Planner = Callable[..., SetEstimate]
_planners: dict[Callable[..., Any], Planner] = {}


def plans(operator: Callable[..., Any]) -> Callable[[Planner], Planner]:
    """Register the decorated function as ``operator``'s planner: what :func:`estimate_set`
    calls with the operator's arguments."""

    def register(planner: Planner) -> Planner:
        _planners[operator] = planner
        return planner

    return register


def estimate_set(
    operator: Callable[..., Any], df: Any, /, *positional: Any, **arguments: Any
) -> SetEstimate:
    """What a set operator would send and cost on ``df``, without sending anything.

    Parameters
    ----------
    operator
        The operator: :func:`~llm_ops.llm_aggregate`, :func:`~llm_ops.llm_top_k`,
        :func:`~llm_ops.llm_join` or :func:`~llm_ops.llm_resolve`.
    df
        Its input frame (``llm_join``'s left one).
    *positional, **arguments
        The other arguments the operator would be called with, as it takes them.
    """
    planner = _planners.get(operator)
    if planner is None:
        names = ", ".join(sorted(getattr(f, "__name__", repr(f)) for f in _planners))
        raise ConfigError(
            f"estimate_set prices a set operator ({names}), "
            f"got {getattr(operator, '__name__', operator)!r}: for a row-wise one, use "
            "llm_ops.estimate"
        )
    return planner(df, *positional, **arguments)


__all__ = ["Answers", "SetEstimate", "SetOptions", "Waves", "estimate_set", "plans", "priced"]
