"""Prompt templates: ``"Summarize: {text}"`` rendered per row, vectorised in Polars.

Only plain column references are allowed. Attribute access (``{a.b}``), indexing (``{a[0]}``),
conversions (``{a!r}``), format specs (``{a:>10}``) and positional fields (``{}``, ``{0}``) are
rejected, so data can never reach into Python objects or change how a template is formatted.
``{{`` and ``}}`` stand for literal braces.

How a value becomes text is part of the request key, so it is defined here, once
(:func:`render`), for every entry point: frames, LazyFrames, Arrow tables, Parquet tables, the
``llm`` expressions, ``llm_embed`` and ``estimate``. It depends on the value only, never on the
time unit or the container the value came in:

- String, Categorical, Enum: the text itself.
- Integers: their digits (``-42``).
- Floats: the shortest text that reads back as the same value of the column's width, so a
  Float32 and a Float64 of ``0.1`` both give ``0.1``; ``2.0``, ``1e+20``, ``NaN``, ``-0.0``.
- Decimal: the digits without trailing fractional zeros, whatever the scale: ``19.90`` and
  ``19.9000`` give ``19.9``, ``2.00`` gives ``2``.
- Boolean: ``true``, ``false``. Date: ``2024-01-02``.
- Datetime, in ms, us or ns: ``2024-01-02 03:04:05.000000``, six fractional digits (what
  Polars writes for its default unit, us); nine (``03:04:05.123456789``) only where a ns value
  has a part finer than a microsecond, as that is a different value. A zoned datetime is
  written in its own zone with its offset (``2024-01-02 04:04:05.000000+01:00``): the same
  instant in another zone is other text.
- Time: ``03:04:05``; a fraction of a second adds six digits (``03:04:05.500000``), or nine
  where it is finer than a microsecond.
- Duration, in ms, us or ns: ISO 8601 with days of 24 hours (``PT1H2M3S``, ``P2DT1H``,
  ``PT0.5S``, ``-PT0.001S``).
- Null (or a null value of any type): no text; the row is skipped.

List, Array, Struct, Binary, Object and any other type are a :class:`TemplateError` before
anything is sent, saying how to make one text column of them.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass

import polars as pl

from .exceptions import TemplateError

# Rendered as Polars casts them, as they always were: any other text would change their keys
# and orphan every answer cached for them.
_AS_CAST = (pl.String, pl.Categorical, pl.Enum, pl.Boolean, pl.Date, pl.Null)


def render(column: str, dtype: pl.DataType, *, used_by: str = "prompt") -> pl.Expr:
    """The values of ``column`` (of type ``dtype``) as prompt text, as the module's docstring
    defines it; null where the value is null.

    Raises
    ------
    TemplateError
        ``dtype`` cannot be rendered (see :func:`unrenderable`).

    Examples
    --------
    >>> from datetime import datetime
    >>> when = datetime(2024, 1, 2, 3, 4, 5)
    >>> units = pl.DataFrame([pl.Series(u, [when], pl.Datetime(u)) for u in ("ms", "us", "ns")])
    >>> units.select(render(u, units.schema[u]) for u in units.columns).row(0)
    ('2024-01-02 03:04:05.000000', '2024-01-02 03:04:05.000000', '2024-01-02 03:04:05.000000')
    """
    value = pl.col(column)
    if isinstance(dtype, pl.Datetime):
        return _datetime(value, dtype)
    if isinstance(dtype, pl.Time):
        return _time(value)
    if isinstance(dtype, pl.Duration):
        # Polars cannot cast a Duration to text; its ISO form is the same in every unit.
        return value.dt.to_string("iso")
    if isinstance(dtype, pl.Decimal):
        return _decimal(value, dtype)
    if dtype.is_numeric() or isinstance(dtype, _AS_CAST):
        return value.cast(pl.String)
    raise TemplateError(unrenderable(column, dtype, used_by=used_by))


def _datetime(value: pl.Expr, dtype: pl.Datetime) -> pl.Expr:
    # us is Polars' default unit, whose text keys most cached answers: the other units are
    # written as it writes us. ms -> us is exact (and within chrono's range, never overflows).
    if dtype.time_unit == "us":
        return value.cast(pl.String)
    micro = value.dt.cast_time_unit("us").cast(pl.String)
    if dtype.time_unit == "ms":
        return micro
    # A ns value off the microsecond grid is a different instant: it keeps all nine digits.
    return pl.when(value.to_physical() % 1_000 == 0).then(micro).otherwise(value.cast(pl.String))


def _time(value: pl.Expr) -> pl.Expr:
    # Polars' own cast drops the fraction (03:04:05.5 -> 03:04:05), so distinct times would share
    # a key; whole seconds keep that text, and the keys cached for them.
    nanoseconds = value.to_physical()
    return (
        pl.when(nanoseconds % 1_000_000_000 == 0)
        .then(value.cast(pl.String))
        .when(nanoseconds % 1_000 == 0)
        .then(value.dt.to_string("%H:%M:%S%.6f"))
        .otherwise(value.dt.to_string("%H:%M:%S%.9f"))
    )


def _decimal(value: pl.Expr, dtype: pl.Decimal) -> pl.Expr:
    text = value.cast(pl.String)
    if not dtype.scale:
        return text  # no point, so no fractional zeros: "100" must stay "100"
    # Polars writes all `scale` digits (1.50 in a scale-2 column, 1.500 in a scale-3 one).
    return text.str.strip_chars_end("0").str.strip_suffix(".")


def unrenderable(column: str, dtype: pl.DataType, *, used_by: str) -> str:
    """Why ``column`` of type ``dtype`` cannot be rendered, and how to make it text."""
    ref = f"pl.col({column!r})"
    if isinstance(dtype, pl.List | pl.Array):
        fix = f"join its items: df.with_columns({ref}.cast(pl.List(pl.String)).list.join(', '))"
    elif isinstance(dtype, pl.Struct):
        fix = (
            f"pick a field, e.g. {ref}.struct.field('name'), or write it as JSON: "
            f"df.with_columns({ref}.struct.json_encode())"
        )
    elif isinstance(dtype, pl.Binary):
        fix = (
            f"if it holds images or PDFs, send them with images={column!r} or "
            f"documents={column!r} and leave {{{column}}} out of the prompt; if it holds "
            f"UTF-8 text, decode it: df.with_columns({ref}.cast(pl.String))"
        )
    else:
        fix = f"convert it to text first, e.g. df.with_columns({ref}.map_elements(str))"
    return (
        f"{used_by} references column {column!r} of type {dtype}, which cannot be rendered as "
        f"text; {fix}"
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

    def expr(self, schema: Mapping[str, pl.DataType], *, argument: str = "prompt") -> pl.Expr:
        """A Polars expression rendering the template over columns of ``schema``'s types (see
        :func:`render`); null when any referenced column is null.

        Raises
        ------
        TemplateError
            A referenced column's type cannot be rendered.
        """
        pieces: list[pl.Expr] = []
        for literal, column in self.parts:
            if literal:
                pieces.append(pl.lit(literal, dtype=pl.String))
            if column is not None:
                pieces.append(render(column, schema[column], used_by=f"{argument} template"))
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


def parse_template(source: str, *, argument: str = "prompt") -> Template:
    """Parse ``source``, raising :class:`TemplateError` if it is not a plain-column template."""
    if not isinstance(source, str):
        raise TemplateError(
            f"{argument} must be a string template like 'Summarize: {{text}}', "
            f"got {type(source).__name__}"
        )
    if not source.strip():
        raise TemplateError(
            f"{argument} template is empty; write what to ask, e.g. "
            "'Summarize: {text}' (a template without {column} references is "
            "fine: every row then gets the one answer)"
        )
    parts: list[tuple[str, str | None]] = []
    for literal, field, spec, conversion in fields_of(source, argument=argument):
        if field is None:
            parts.append((literal, None))
            continue
        if field == "" or field.isdigit():
            raise TemplateError(
                f"{argument} template {source!r} has a positional field {{{field}}}; "
                "name a column instead, e.g. {text}"
            )
        if "." in field or "[" in field or conversion is not None or spec:
            shown = field_text(field, spec, conversion)
            raise TemplateError(
                f"{argument} template {source!r} uses {{{shown}}}; only plain column names are "
                "allowed. Compute the value into its own column first (e.g. with "
                "df.with_columns(...)) and reference that column."
            )
        parts.append((literal, field))
    return Template(source=source, parts=tuple(parts))


Field = tuple[str, str | None, str | None, str | None]
"""A template's piece as :meth:`string.Formatter.parse` reads it: literal text, then the
field's name, format spec and conversion (``None`` after the last field)."""


def fields_of(source: str, *, argument: str) -> list[Field]:
    """``source``'s pieces, raising :class:`TemplateError` where its braces do not match."""
    try:
        return list(string.Formatter().parse(source))
    except ValueError as exc:
        raise TemplateError(
            f"{argument} template {source!r} is malformed ({exc}); "
            "write literal braces as {{ and }}"
        ) from exc


def field_text(field: str, spec: str | None, conversion: str | None) -> str:
    """A field as it was written between its braces: ``name!r:>10``."""
    return field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")


def check_columns(template: Template, schema: Mapping[str, pl.DataType], *, argument: str) -> None:
    """Raise :class:`TemplateError` for unknown columns or values that cannot become text."""
    for column in template.columns:
        if column not in schema:
            available = ", ".join(schema) or "(none)"
            raise TemplateError(
                f"{argument} template references column {column!r}, which is not in the table; "
                f"available columns: {available}"
            )
        render(column, schema[column], used_by=f"{argument} template")
