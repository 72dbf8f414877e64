"""Templates over an expression's value: ``{}`` stands for it, or a struct's fields are named.

A batch becomes a frame (the value as one column, or a struct's fields as columns), and the
expression's templates become ``llm_complete`` templates over that frame's columns, so the
prompt renders, and is keyed, exactly as ``llm_complete``'s would.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .._template import field_text, fields_of
from ..exceptions import TemplateError

VALUE = "value"
"""The column a value is known by when its own name cannot be one."""

_NAME = re.compile(r"[^{}\[\].!:]+")


def escaped(text: str) -> str:
    """``text`` as literal template text."""
    return text.replace("{", "{{").replace("}", "}}")


def value_name(name: str, reserved: Sequence[str]) -> str:
    """The column the value is known by in templates and messages: its own name when it can be
    one (``column 'text' is null`` reads as in ``llm_complete``), else ``value``."""
    if _NAME.fullmatch(name) and not name.isdigit() and name not in reserved:
        return name
    return VALUE


def templates_for(
    prompt: str, system: str | None, name: str, *, value: bool | None, caller: str
) -> tuple[str, str | None]:
    """``prompt`` and ``system`` as templates over a batch whose value is the column ``name``
    (``value=True``), or whose struct's fields are the columns (``value=False``; ``None``: not
    known yet, as when the expression is made), raising :class:`TemplateError` where they do
    not fit that batch."""
    rendered, in_prompt = with_value(prompt, name, argument="prompt")
    system_rendered, in_system = (
        (None, False) if system is None else with_value(system, name, argument="system")
    )
    named = named_fields(prompt) + named_fields(system or "")
    if value is True and named:
        raise TemplateError(
            f"{caller}: the prompt names {{{named[0]}}}, but the expression's value is "
            "one column: write {} for it (e.g. 'Summarize: {}'), or ask of a struct of "
            f"the columns, e.g. pl.struct({named[0]!r}, ...).llm.{caller}(...)"
        )
    if value is True and not in_prompt:
        raise TemplateError(
            f"{caller}: the prompt {prompt!r} does not use the value: write {{}} "
            "where it goes, e.g. 'Summarize: {}'"
        )
    if value is False and (in_prompt or in_system):
        raise TemplateError(
            f"{caller}: the expression is a struct, so the prompt names its fields, "
            "e.g. '{title}: {text}'; {} stands for a single column's value"
        )
    if value is None and named and (in_prompt or in_system):
        raise TemplateError(
            f"{caller}: the prompt uses both {{}} and {{{named[0]}}}: use {{}} for a "
            "single column's value, or field names for a struct's fields"
        )
    return rendered, system_rendered


def with_value(source: str, name: str, *, argument: str) -> tuple[str, bool]:
    """``source`` with every ``{}`` standing for the column ``name``, and whether it has one."""
    if not isinstance(source, str):
        raise TemplateError(
            f"{argument} must be a string template like 'Summarize: {{}}', "
            f"got {type(source).__name__}"
        )
    pieces: list[str] = []
    used = False
    for literal, field, spec, conversion in fields_of(source, argument=argument):
        pieces.append(escaped(literal))
        if field is None:
            continue
        if field == "" and not spec and conversion is None:
            pieces.append("{" + name + "}")
            used = True
        else:  # left for parse_template to accept (a struct's field) or explain
            pieces.append("{" + field_text(field, spec, conversion) + "}")
    return "".join(pieces), used


def named_fields(source: str) -> list[str]:
    return [field for _, field, _, _ in fields_of(source, argument="prompt") if field]
