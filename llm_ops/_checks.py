"""Checks of one value, shared by the option objects (:mod:`llm_ops._config`) and the request
specs (:mod:`llm_ops._spec`): each returns the value checked, or raises
:class:`~llm_ops.ConfigError` naming the option."""

from __future__ import annotations

import math

from .exceptions import ConfigError

MAX_SECONDS = 24 * 3600.0


def positive_int(name: str, value: object, *, most: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if most is not None and value > most:
        raise ConfigError(f"{name} must be at most {most:,}, got {value:,}")
    return value


def is_number(value: object) -> bool:
    """A finite int or float (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def seconds(name: str, value: object) -> float:
    if not is_number(value) or not 0 < value <= MAX_SECONDS:  # type: ignore[operator]
        raise ConfigError(
            f"{name} must be a positive number of seconds (at most "
            f"{MAX_SECONDS:,.0f}), got {value!r}"
        )
    return float(value)  # type: ignore[arg-type]
