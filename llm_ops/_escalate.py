"""When a cascade sends a row on to the next model: failures always, and what `escalate=` flags."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import polars as pl

from ._schema import OutputSchema
from ._status import STATUSES
from .exceptions import ConfigError


@dataclass(frozen=True)
class ConfidenceBelow:
    """An ``escalate=`` rule: the structured answer's confidence field is below ``threshold``.
    Made by :func:`confidence_below`."""

    threshold: float
    field: str = "confidence"

    def expr(self, output: str, structured: OutputSchema | None) -> pl.Expr:
        dtype = structured.dtype if structured is not None else None
        fields = {f.name: f.dtype for f in dtype.fields} if isinstance(dtype, pl.Struct) else {}
        if not fields.get(self.field, pl.Null()).is_numeric():
            raise ConfigError(
                f"confidence_below reads the number field {self.field!r} of a structured answer: "
                f"pass schema= with such a field (e.g. {self.field}: float), or name the field "
                "with confidence_below(..., field=...)"
            )
        return pl.col(output).struct.field(self.field) < self.threshold


def confidence_below(threshold: float, *, field: str = "confidence") -> ConfidenceBelow:
    """A cascade rule: send a row on when its structured answer's ``field`` < ``threshold``.

    Use it as ``escalate=confidence_below(0.7)`` with a ``schema=`` that has a number field
    named ``confidence`` (or ``field``) which the model fills in.

    Examples
    --------
    >>> confidence_below(0.7)
    ConfidenceBelow(threshold=0.7, field='confidence')
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise ConfigError(f"confidence_below takes a number, got {threshold!r}")
    return ConfidenceBelow(float(threshold), field)


EscalateOption = pl.Expr | ConfidenceBelow | str | None


def escalation_rule(
    escalate: object, output: str, structured: OutputSchema | None, models: int
) -> pl.Expr:
    """``escalate=`` as a boolean Polars expression over the input and answer columns (see
    :func:`check_escalation` for its check against them)."""
    if models < 2:
        raise ConfigError(
            "escalate= decides which rows go on to the next model of a cascade: "
            "pass model=[first, second, ...] too"
        )
    if isinstance(escalate, ConfidenceBelow):
        escalate = escalate.expr(output, structured)
    elif isinstance(escalate, str):  # SQL, for the CLI and flow parameters
        try:
            escalate = pl.sql_expr(escalate)
        except pl.exceptions.PolarsError as exc:
            raise ConfigError(
                f"escalate {escalate!r} is not a SQL expression Polars can read "
                f"({exc}); e.g. \"{output} LIKE 'unsure:%'\""
            ) from exc
    if not isinstance(escalate, pl.Expr):
        raise ConfigError(
            "escalate takes confidence_below(0.7), a Polars expression or a SQL "
            "condition that is true for the rows to send to the next model, e.g. "
            "pl.col('summary').str.contains('not sure')"
        )
    return escalate


def check_escalation(
    rule: pl.Expr, columns: Mapping[str, pl.DataType], output: str, structured: OutputSchema | None
) -> None:
    """Evaluate ``rule`` on an empty frame of the input and answer columns, so that a bad rule
    fails before anything is sent."""
    answer_columns = {
        output: structured.dtype if structured else pl.String,
        f"{output}_status": pl.Enum(STATUSES),
        f"{output}_error": pl.String,
    }
    if structured is not None:
        answer_columns[f"{output}_raw"] = pl.String
    empty = pl.DataFrame(schema={**columns, **answer_columns})
    try:
        dtype = empty.select(rule).to_series().dtype
    except pl.exceptions.PolarsError as exc:
        raise ConfigError(
            f"escalate cannot be evaluated on the input and answer columns "
            f"({', '.join(empty.columns)}): {exc}"
        ) from exc
    if dtype != pl.Boolean:
        raise ConfigError(
            f"escalate must give true/false per row, but gives {dtype}; compare it, e.g. ... < 0.8"
        )
