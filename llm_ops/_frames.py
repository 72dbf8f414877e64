"""Frames in and out: Polars DataFrames and LazyFrames and pyarrow Tables, one kind inside."""

from __future__ import annotations

from typing import Any, TypeVar, cast

import polars as pl
import pyarrow as pa

from .exceptions import ConfigError

Frame = TypeVar("Frame", pl.DataFrame, pl.LazyFrame, pa.Table)
PolarsFrame = TypeVar("PolarsFrame", pl.DataFrame, pl.LazyFrame)
"""The Polars kinds of :data:`Frame`, for the public signatures: pyarrow has no type hints, so
``pa.Table`` is ``Any`` to a type checker, and a type variable one of whose kinds is ``Any``
makes every result ``Any``; each function has an overload of its own for a ``pa.Table``."""


def to_polars(df: Any) -> pl.DataFrame:
    """The input as an eager Polars frame (a LazyFrame is collected)."""
    if isinstance(df, pl.DataFrame):
        return df
    if isinstance(df, pl.LazyFrame):
        return df.collect()
    if isinstance(df, pa.Table):
        return from_arrow(df)
    raise ConfigError(
        f"llm_complete takes a polars DataFrame or LazyFrame or a pyarrow Table, got "
        f"{type(df).__name__}; convert it first, e.g. pl.from_pandas(df)"
    )


def schema_of(df: Any) -> pl.Schema:
    """The columns of the input, without collecting a LazyFrame."""
    if isinstance(df, pl.LazyFrame):
        return df.collect_schema()
    return to_polars(df).schema


def same_kind(original: Frame, result: pl.DataFrame) -> Frame:
    """``result`` as the kind of frame ``original`` is."""
    if isinstance(original, pl.LazyFrame):
        return result.lazy()
    if isinstance(original, pa.Table):
        return cast(Frame, result.to_arrow())
    return result


def from_arrow(table: pa.Table) -> pl.DataFrame:
    """An Arrow table as a Polars frame; :class:`ConfigError` naming the column for text that
    is not valid UTF-8 (Polars would panic on it, taking the whole job down)."""
    for name, column in zip(table.column_names, table.columns, strict=True):
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            continue
        try:
            column.validate(full=True)
        except pa.ArrowInvalid:
            rows = [
                i
                for i, value in enumerate(column.cast(pa.binary()).to_pylist())
                if value is not None and not _is_utf8(value)
            ]
            raise ConfigError(
                f"column {name!r} holds text that is not valid UTF-8 in {len(rows):,} row(s) "
                f"(first: row {rows[0] if rows else '?'}); repair or drop those rows first, e.g. "
                "decode the source bytes with errors='replace'"
            ) from None
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
