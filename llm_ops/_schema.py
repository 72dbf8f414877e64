"""Structured output: a pydantic model or JSON schema → request format, validator, Polars dtype.

Supported JSON schema: ``object`` (``properties``, ``required``), ``array`` (``items``),
``string`` (``enum`` too), ``integer``, ``number``, ``boolean``, ``null``, nullable types
(``["string", "null"]`` or ``anyOf`` with ``null``) and ``$ref`` into ``$defs``, which covers
what pydantic models (nested models, lists, optionals, enums) produce.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl
from pydantic import BaseModel, ValidationError

from .exceptions import ConfigError, LlmOpsError

_SCALARS: dict[str, pl.DataType] = {
    "string": pl.String(),
    "integer": pl.Int64(),
    "number": pl.Float64(),
    "boolean": pl.Boolean(),
    "null": pl.Null(),
}
_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "object": (dict,),
    "array": (list,),
}


class InvalidOutput(LlmOpsError, ValueError):
    """The answer is not JSON or does not match the schema (internal: the engine catches it
    and the row's status is ``invalid``, with this message as its error)."""


@dataclass(frozen=True)
class OutputSchema:
    """Everything the pipeline needs to ask for, check and type structured answers."""

    name: str
    json_schema: dict[str, Any]
    dtype: pl.DataType
    model: type[BaseModel] | None

    def validate(self, text: str) -> str:
        """The answer as normalised JSON; :class:`InvalidOutput` when it does not conform."""
        if self.model is not None:
            try:
                return self.model.model_validate_json(text).model_dump_json()
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(map(str, e['loc'])) or 'answer'}: {e['msg']}"
                    for e in exc.errors()[:5]
                )
                raise InvalidOutput(problems) from exc
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise InvalidOutput(f"not JSON: {exc}") from exc
        _check(value, self.json_schema, self.json_schema, "answer")
        return json.dumps(value, ensure_ascii=False)


def output_schema(schema: type[BaseModel] | Mapping[str, Any]) -> OutputSchema:
    """Build an :class:`OutputSchema`; :class:`ConfigError` for what cannot become a column."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        json_schema, name, model = schema.model_json_schema(), schema.__name__, schema
    elif isinstance(schema, Mapping):
        json_schema = dict(schema)
        name, model = str(json_schema.get("title", "answer")), None
    else:
        raise ConfigError(
            f"schema must be a pydantic model class or a JSON schema dict, got "
            f"{type(schema).__name__}"
        )
    if _resolve(json_schema, json_schema).get("type") != "object":
        raise ConfigError("schema must describe a JSON object (its fields become the struct's)")
    return OutputSchema(
        name=_safe_name(name),
        json_schema=json_schema,
        dtype=_dtype(json_schema, json_schema, "answer"),
        model=model,
    )


def _safe_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)
    return cleaned[:64] or "answer"


def _resolve(node: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in node:
        reference = str(node["$ref"])
        if not reference.startswith("#/"):
            raise ConfigError(f"schema reference {reference!r} is not local; inline it")
        target: Any = root
        for part in reference[2:].split("/"):
            target = target[part]
        node = target
    return node


def _variants(node: Mapping[str, Any], root: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The non-null alternatives of a node (``anyOf``, ``oneOf`` or a list of types)."""
    node = _resolve(node, root)
    options = node.get("anyOf") or node.get("oneOf")
    if options:
        found = [_resolve(o, root) for o in options]
    elif isinstance(node.get("type"), list):
        found = [{**node, "type": t} for t in node["type"]]
    else:
        return [node]
    return [o for o in found if o.get("type") != "null"] or [{"type": "null"}]


def _dtype(node: Mapping[str, Any], root: Mapping[str, Any], where: str) -> pl.DataType:
    variants = _variants(node, root)
    if len(variants) != 1:
        raise ConfigError(
            f"schema field {where} may hold several types; structured output "
            "columns need one type per field (nullable is fine)"
        )
    node = variants[0]
    kind = node.get("type", "string" if "enum" in node else None)
    if kind == "object":
        properties = node.get("properties") or {}
        if not properties:
            raise ConfigError(f"schema object {where} has no properties")
        return pl.Struct(
            [
                pl.Field(name, _dtype(sub, root, f"{where}.{name}"))
                for name, sub in properties.items()
            ]
        )
    if kind == "array":
        return pl.List(_dtype(node.get("items", {"type": "string"}), root, f"{where}[]"))
    if kind in _SCALARS:
        return _SCALARS[kind]
    raise ConfigError(f"schema field {where} has unsupported type {kind!r}")


def _check(value: Any, node: Mapping[str, Any], root: Mapping[str, Any], where: str) -> None:
    resolved = _resolve(node, root)
    options = resolved.get("anyOf") or resolved.get("oneOf")
    if options or isinstance(resolved.get("type"), list):
        alternatives = options or [{**resolved, "type": t} for t in resolved["type"]]
        errors = []
        for option in alternatives:
            try:
                _check(value, option, root, where)
                return
            except InvalidOutput as exc:
                errors.append(str(exc))
        raise InvalidOutput(errors[0])
    if "enum" in resolved and value not in resolved["enum"]:
        raise InvalidOutput(f"{where}: {value!r} is not one of {resolved['enum']}")
    kind = resolved.get("type")
    if kind is None:
        return
    allowed = _PYTHON_TYPES.get(kind, ())
    if not isinstance(value, allowed) or (isinstance(value, bool) and kind != "boolean"):
        raise InvalidOutput(f"{where}: expected {kind}, got {type(value).__name__}")
    if isinstance(value, dict):
        for name in resolved.get("required", []):
            if name not in value:
                raise InvalidOutput(f"{where}: missing required field {name!r}")
        for name, sub in (resolved.get("properties") or {}).items():
            if name in value:
                _check(value[name], sub, root, f"{where}.{name}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check(item, resolved.get("items", {}), root, f"{where}[{index}]")
