"""Prompt templates: ``"Summarize: {text}"`` rendered per row, vectorised in Polars.

Only plain column references are allowed. Attribute access (``{a.b}``), indexing (``{a[0]}``),
conversions (``{a!r}``), format specs (``{a:>10}``) and positional fields (``{}``, ``{0}``) are
rejected, so data can never reach into Python objects or change how a template is formatted.
``{{`` and ``}}`` stand for literal braces.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass

import polars as pl

from .exceptions import TemplateError

_RENDERABLE = (
    pl.String,
    pl.Categorical,
    pl.Enum,
    pl.Boolean,
    pl.Date,
    pl.Datetime,
    pl.Time,
    pl.Duration,
    pl.Decimal,
    pl.Null,
)


@dataclass(frozen=True)
class Template:
    """A parsed template: literal text interleaved with column references."""

    source: str
    parts: tuple[tuple[str, str | None], ...]  # (literal, column or None)

    @property
    def columns(self) -> tuple[str, ...]:
        """The referenced columns, each once, in order of first use."""
        return tuple(dict.fromkeys(col for _, col in self.parts if col is not None))

    def expr(self) -> pl.Expr:
        """A Polars expression rendering the template; null when any referenced column is null."""
        pieces: list[pl.Expr] = []
        for literal, column in self.parts:
            if literal:
                pieces.append(pl.lit(literal, dtype=pl.String))
            if column is not None:
                pieces.append(pl.col(column).cast(pl.String))
        if not pieces:
            return pl.lit("", dtype=pl.String)
        return pl.concat_str(pieces, ignore_nulls=False)

    def values_in(self, rendered: pl.Expr) -> pl.Expr:
        """The column values inside ``rendered`` prompts, one per line, without the template's
        literal text: what the semantic cache embeds, so that the words every row shares do
        not make every row look alike.

        Examples
        --------
        >>> template = parse_template("Title: {title}. Say more:")
        >>> pl.select(template.values_in(pl.lit("Title: Love it!. Say more:"))).item()
        'Love it!'
        """
        if not self.columns:
            return rendered
        pattern = "".join(
            pl.escape_regex(literal) + ("(.*?)" if column else "") for literal, column in self.parts
        )
        groups = rendered.str.extract_groups(f"(?s)^{pattern}$")
        count = sum(1 for _, column in self.parts if column is not None)
        return pl.concat_str([groups.struct[i] for i in range(count)], separator="\n")


def parse_template(source: str, *, what: str = "prompt") -> Template:
    """Parse ``source``, raising :class:`TemplateError` if it is not a plain-column template."""
    if not isinstance(source, str):
        raise TemplateError(
            f"{what} must be a string template like 'Summarize: {{text}}', "
            f"got {type(source).__name__}"
        )
    if not source.strip():
        raise TemplateError(
            f"{what} template is empty; write what to ask, e.g. "
            "'Summarize: {text}' (a template without {column} references is "
            "fine: every row then gets the one answer)"
        )
    parts: list[tuple[str, str | None]] = []
    for literal, field, spec, conversion in fields_of(source, what=what):
        if field is None:
            parts.append((literal, None))
            continue
        if field == "" or field.isdigit():
            raise TemplateError(
                f"{what} template {source!r} has a positional field {{{field}}}; "
                "name a column instead, e.g. {text}"
            )
        if "." in field or "[" in field or conversion is not None or spec:
            shown = field_text(field, spec, conversion)
            raise TemplateError(
                f"{what} template {source!r} uses {{{shown}}}; only plain column names are "
                "allowed. Compute the value into its own column first (e.g. with "
                "df.with_columns(...)) and reference that column."
            )
        parts.append((literal, field))
    return Template(source=source, parts=tuple(parts))


Field = tuple[str, str | None, str | None, str | None]
"""A template's piece as :meth:`string.Formatter.parse` reads it: literal text, then the
field's name, format spec and conversion (``None`` after the last field)."""


def fields_of(source: str, *, what: str) -> list[Field]:
    """``source``'s pieces, raising :class:`TemplateError` where its braces do not match."""
    try:
        return list(string.Formatter().parse(source))
    except ValueError as exc:
        raise TemplateError(
            f"{what} template {source!r} is malformed ({exc}); "
            "write literal braces as {{ and }}"
        ) from exc


def field_text(field: str, spec: str | None, conversion: str | None) -> str:
    """A field as it was written between its braces: ``name!r:>10``."""
    return field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")


def check_columns(template: Template, schema: Mapping[str, pl.DataType], *, what: str) -> None:
    """Raise :class:`TemplateError` for unknown columns or values that cannot become text."""
    for column in template.columns:
        if column not in schema:
            available = ", ".join(schema) or "(none)"
            raise TemplateError(
                f"{what} template references column {column!r}, which is not in the table; "
                f"available columns: {available}"
            )
        dtype = schema[column]
        if not (dtype.is_numeric() or isinstance(dtype, _RENDERABLE)):
            raise TemplateError(
                f"{what} template references column {column!r} of type {dtype}, which cannot be "
                f"rendered as text; convert it first, e.g. "
                f"df.with_columns(pl.col({column!r}).cast(pl.String)) or pick its fields"
            )
