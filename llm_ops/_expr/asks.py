"""What an expression asks the model for, and the shape of what it returns.

``complete`` asks for text (or the caller's schema); ``classify``, ``extract`` and ``filter``
ask for JSON by a schema of their own, and their result is a field of it. Either way the
result is the answer alone, or (``with_status=True``) the answer with its status, its error and
the other columns :func:`~llm_ops.llm_complete` would add.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast

import polars as pl
from pydantic import BaseModel

from .._options import Columns, Job
from .._status import STATUS_DTYPE
from ..exceptions import ConfigError
from .values import escaped

Output = Literal["answer", "struct"]
"""What an ``llm`` expression returns: the answer alone (null where a row failed), or a
struct of the answer with its ``status`` and ``error`` (and the other columns
:func:`~llm_ops.llm_complete` would add)."""


@dataclasses.dataclass(frozen=True)
class Ask:
    """What an expression asks the model for, and how its answer becomes the result."""

    schema: type[BaseModel] | Mapping[str, Any] | None = None  # on the wire
    prompt: str | None = None  # the default prompt, ``{}`` standing for the value
    field: str | None = None  # the field of the structured answer that is the result
    dtype: pl.DataType | None = None  # the result's type, when not the schema's

    def result(self, answer: pl.Expr) -> pl.Expr:
        if self.field is not None:
            answer = answer.struct.field(self.field)
        return answer if self.dtype is None else answer.cast(self.dtype)

    def result_dtype(self, job: Job) -> pl.DataType:
        if self.dtype is not None:
            return self.dtype
        schema = job.spec.schema
        if schema is None:
            return pl.String()
        if self.field is None:
            return schema.dtype
        dtype = cast(pl.Struct, schema.dtype).to_schema()[self.field]
        return dtype if isinstance(dtype, pl.DataType) else dtype()


def text() -> Ask:
    return Ask()


def classification(labels: Sequence[str], value: str = "{}") -> Ask:
    """One of ``labels``, constrained by the schema's enum; ``value`` is where the text goes."""
    chosen = labels_of(labels)
    return Ask(
        schema={
            "title": "classification",
            "type": "object",
            "properties": {"label": {"type": "string", "enum": chosen}},
            "required": ["label"],
            "additionalProperties": False,
        },
        prompt=(
            f"Classify the text as exactly one of these labels: "
            f"{escaped(', '.join(chosen))}.\n\nText: {value}"
        ),
        field="label",
        dtype=pl.Enum(chosen),
    )


def labels_of(labels: object) -> list[str]:
    if (
        isinstance(labels, str)
        or not isinstance(labels, Sequence)
        or not labels
        or not all(isinstance(label, str) and label for label in labels)
    ):
        raise ConfigError(
            f"labels must be a list of label names such as ['positive', 'negative'], got {labels!r}"
        )
    if len(set(labels)) != len(labels):
        raise ConfigError(f"labels must name each label once, got {list(labels)!r}")
    return list(labels)


def extraction(schema: object, value: str = "{}") -> Ask:
    if schema is None or isinstance(schema, str):
        raise ConfigError(
            f"schema must be a pydantic model class or a JSON schema dict, got {schema!r}"
        )
    return Ask(
        schema=cast("type[BaseModel] | Mapping[str, Any]", schema),
        prompt=f"Extract the fields of the JSON schema from the text.\n\nText: {value}",
    )


def verdict() -> Ask:
    return Ask(
        schema={
            "title": "verdict",
            "type": "object",
            "properties": {"answer": {"type": "boolean"}},
            "required": ["answer"],
            "additionalProperties": False,
        },
        field="answer",
    )


# -- the result's shape -----------------------------------------------------------------------


def shaped(output: Output, columns: Columns, answer: pl.Expr) -> pl.Expr:
    """The result: the answer, or the struct of it with the other columns."""
    if output == "answer":
        return answer
    return pl.struct(
        [
            (answer if field == "answer" else pl.col(name)).alias(field)
            for field, name in struct_fields(columns).items()
        ]
    )


_FIELD_DTYPES: dict[str, pl.DataType] = {
    "status": STATUS_DTYPE,
    "error": pl.String(),
    "raw": pl.String(),
    "similar_to": pl.String(),
    "similarity": pl.Float64(),
    "model": pl.String(),
    "reasoning": pl.String(),
}


def shaped_dtype(output: Output, columns: Columns, answer: pl.DataType) -> pl.DataType:
    """The type of :func:`shaped`'s result."""
    if output == "answer":
        return answer
    dtypes = {"answer": answer, **_FIELD_DTYPES}
    return pl.Struct({field: dtypes[field] for field in struct_fields(columns)})


def struct_fields(columns: Columns) -> dict[str, str]:
    """The struct form's fields and the columns they come from, in ``llm_complete``'s order."""
    fields = {"answer": columns.output}
    for name in columns.names[1:]:
        suffix = name[len(columns.output) + 1 :]
        assert suffix in _FIELD_DTYPES
        fields[suffix] = name
    return fields
