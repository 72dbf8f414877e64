"""The declared settings (:data:`._settings.DECLARED`) as a command line's flags, as the
parameters a scheduler stores (a pydantic model refusing credentials), and as the tables of the
options page.

Each product is made from a list of declarations passed in (the declared ones by default), so
a setting renamed in the declaration is renamed in every one of them.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from types import UnionType
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    ClassVar,
    Literal,
    TypeVar,
    Union,
    get_args,
    get_origin,
)
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model

from ._cache import parse_duration
from ._endpoint import _CREDENTIAL
from ._options import OPTION_CLASSES, option_type
from ._settings import DECLARED, SECTIONS, Setting
from .exceptions import ConfigError, Words

Model = TypeVar("Model", bound="SettingsModel")

# --- what a setting holds --------------------------------------------------------------------


def class_hint(setting: Setting) -> object:
    """The type its option's class gives it: its field's, or its option's."""
    return option_type(setting.option, setting.field)


def plain_kind(setting: Setting) -> object:
    """What it holds on a command line and in stored parameters: ``int``, ``float``, ``str``,
    ``bool``, a ``Literal`` choice, ``timedelta`` (a duration's text), ``list[str]``,
    ``dict[str, str]`` or ``bool | str``."""
    if setting.kind is not None:
        return setting.kind
    if setting.repeated:
        return list[str]
    hint = class_hint(setting)
    kinds = [arg for arg in (get_args(hint) or (hint,)) if arg is not type(None)]
    if get_origin(hint) is Literal:
        return hint
    if len(kinds) == 1 and get_origin(kinds[0]) is Literal:
        return kinds[0]  # an optional choice: reasoning_effort
    for kind in (timedelta, int, float, str, bool):
        if kind in kinds:
            return kind
    raise TypeError(f"the setting {setting.name} ({hint}) needs a kind= in its declaration")


def class_default(setting: Setting) -> object:
    """Its field's default in its class, ``None`` where there is none."""
    if setting.field is None:
        return None
    kind = OPTION_CLASSES[setting.option]
    if not dataclasses.is_dataclass(kind):
        found = inspect.signature(kind).parameters.get(setting.field)
        return None if found is None or found.default is found.empty else found.default
    for field in dataclasses.fields(kind):
        if field.name == setting.field and field.default is not dataclasses.MISSING:
            return field.default
    return None


def _number(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def default_words(setting: Setting) -> str | None:
    """Its default as a shell and a form say it (the declaration's words, else its class's
    value); ``None`` where that is off, unset or a switch."""
    if setting.default is not None:
        return setting.default
    value = class_default(setting)
    if value is None or isinstance(value, bool):
        return None
    return _number(value)


_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")


def plain(text: str) -> str:
    """A help text as a shell or a form shows it: no backticks, no Markdown links."""
    return _LINK.sub(r"\1", text).replace("`", "")


def help_text(setting: Setting, default: object = None) -> str:
    """Its help with its default, for a shell or a form; ``default`` is a front end's own."""
    own = default is not None and not isinstance(default, bool)
    said = default if own else default_words(setting)
    text = setting.help + (f" (default: {said})" if said is not None else "")
    return plain(text)


# --- flags ------------------------------------------------------------------------------------


def _duration(text: str) -> str:
    """A duration flag's value, checked (argparse shows an ``ArgumentTypeError``'s message)
    and kept as written, as a cache and stored parameters take it."""
    try:
        parse_duration(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def _how(kind: object) -> dict[str, Any]:
    """How argparse reads a value of ``kind`` (see :func:`plain_kind`)."""
    if get_origin(kind) is Literal:
        return {"choices": list(get_args(kind))}
    if kind is bool:
        return {"action": "store_true", "default": None}
    if kind is timedelta:
        return {"type": _duration}
    if kind in (int, float, str):
        return {"type": kind}
    if kind == list[str]:
        return {"action": "append"}
    if kind == dict[str, str]:
        return {"action": "append", "type": _pair}
    if kind == bool | str:
        return {"type": _switch_or_text}
    raise TypeError(f"no flag reads {kind}")


def _pair(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or not name.strip():
        raise argparse.ArgumentTypeError(f"takes NAME=VALUE, got {text!r}")
    return name.strip(), value


def _switch_or_text(text: str) -> bool | str:
    return {"false": False, "true": True}.get(text.lower(), text)


def add_setting_flags(
    parser: argparse.ArgumentParser,
    settings: Iterable[Setting],
    *,
    defaults: Mapping[str, object] | None = None,
) -> dict[str, str]:
    """A flag per setting of ``settings``, in their order; the setting each flag's ``dest``
    holds (dest -> setting). ``defaults``: a front end's own defaults, by parameter, shown in
    the help."""
    dests = {}
    for setting in settings:
        how = _how(plain_kind(setting))
        if setting.repeated:
            how["action"] = "append"
        if how.get("action") != "store_true":
            how["metavar"] = setting.metavar
        default = (defaults or {}).get(setting.parameter)
        text = help_text(setting, default).replace("%", "%%")
        action = parser.add_argument(setting.flag_name, **how, help=text)
        dests[action.dest] = setting.name
    return dests


def cli_settings(declared: Iterable[Setting] = DECLARED) -> list[Setting]:
    """The settings that are flags of ``llm-ops run`` and ``estimate``."""
    return [setting for setting in declared if setting.flat and setting.cli]


def flag_of(setting: str, declared: Iterable[Setting] = DECLARED) -> Setting | None:
    """The declaration of the flat setting ``setting``."""
    return next((s for s in declared if s.flat and s.name == setting), None)


# --- stored parameters ------------------------------------------------------------------------

# Prefect's API stores a flow run's parameters as it receives them, before the flow (and
# Prefect's validation of its parameters) runs, so a key in base_url must be refused before
# the API takes it: in Python by the model, and for a deployment's runs by the API, which
# checks them against the flow's parameter schema, where these patterns sit. Hence one pattern
# for both, in the regex dialect Python and JavaScript share, anchored since JSON Schema
# searches. The engine sends a URL's query with every request (where gateways take keys), so
# no query passes but Azure's `api-version`: a version, not a secret.
BASE_URL_PATTERN = (
    r"^[^@/?#]*//[^@/?#]*"  # scheme and host, without user:password@
    r"(/[^?#]*)?"  # path
    r"(\?api-version=[A-Za-z0-9._-]+)?$"
)
# Header names that hold credentials: their values come from secrets, never from a stored
# parameter. Case-insensitive without an inline flag, which JavaScript lacks.
HEADER_NAME_PATTERN = (
    r"^(?![\s\S]*("
    + "|".join(
        "".join(f"[{c.upper()}{c}]" for c in word) for word in _CREDENTIAL.pattern.split("|")
    )
    + "))"
)
PROXY_PATTERN = "^[^@]*$"  # no user:password@: the proxy's credentials go in HTTPS_PROXY
_WHERE_THE_KEY_GOES = (
    "Prefect stores a flow run's parameters: put the key in OPENAI_API_KEY or in a Prefect "
    "Secret block named by api_key_secret"
)


def _why_refused(name: str, url: str) -> str:
    """What is wrong with a refused URL, without a word of it: a failed run's error is stored
    and shown."""
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return f"{name} is not a URL; write it like 'https://host/v1'"
    if "@" in netloc:
        return f"{name} must not hold credentials (user:password@host). {_WHERE_THE_KEY_GOES}."
    if "?" in url.partition("#")[0]:
        return (
            f"{name} must have no query but '?api-version=<version>'. {_WHERE_THE_KEY_GOES} "
            f"(for a gateway that takes its key only in the query, leave {name} unset and "
            "set OPENAI_BASE_URL, query and all, where the flow runs)."
        )
    if "#" in url:
        return f"{name} must have no fragment ('#...')."
    return f"{name} must be an http(s) URL like 'https://host/v1'."


def _no_url_credentials(name: str) -> Callable[[str | None], str | None]:
    def check(url: str | None) -> str | None:
        if url is None or re.search(BASE_URL_PATTERN, url):
            return url
        raise ValueError(_why_refused(name, url))

    return check


def _no_credential_headers(name: str) -> Callable[[Any], Any]:
    def check(headers: dict[str, str] | None) -> dict[str, str] | None:
        for header in headers or {}:
            if not re.search(HEADER_NAME_PATTERN, header):
                raise ValueError(
                    f"the header {header!r} holds a credential, and Prefect stores a flow run's "
                    "parameters: put its value in a Prefect Secret block and name it in "
                    "header_secrets instead"
                )
        return headers

    return check


def _no_proxy_credentials(name: str) -> Callable[[str | None], str | None]:
    def check(proxy: str | None) -> str | None:
        if proxy is not None and not re.search(PROXY_PATTERN, proxy):
            raise ValueError(
                f"{name} must hold no credentials (user:password@), as Prefect stores a flow "
                "run's parameters: set HTTPS_PROXY (or HTTP_PROXY) where the flow runs instead"
            )
        return proxy

    return check


def _a_duration(age: str | None) -> str | None:
    if age is not None:
        parse_duration(age)  # a ConfigError is a ValueError: pydantic says which field
    return age


# The fields that would hold a credential, and their checks, by (option, field): a renamed
# setting keeps its check.
_CHECKS: Mapping[tuple[str, str | None], tuple[Callable[[str], Any], dict[str, Any]]] = {
    ("endpoint", "base_url"): (_no_url_credentials, {"pattern": BASE_URL_PATTERN}),
    ("endpoint", "headers"): (
        _no_credential_headers,
        {"propertyNames": {"pattern": HEADER_NAME_PATTERN}},
    ),
    ("endpoint", "proxy"): (_no_proxy_credentials, {"pattern": PROXY_PATTERN}),
}


def _parameter_field(setting: Setting, default: object) -> tuple[object, Any]:
    """A setting as a pydantic field: its kind or ``None``, its help, its bounds and checks."""
    kind = plain_kind(setting)
    annotation: Any = str if kind is timedelta else kind
    annotation = annotation | None
    extra: dict[str, Any] = {}
    checks = []
    if kind is timedelta:
        checks.append(AfterValidator(_a_duration))
    if (setting.option, setting.field) in _CHECKS:
        check, extra = _CHECKS[setting.option, setting.field]
        checks.append(AfterValidator(check(setting.parameter)))
    if checks:
        annotation = Annotated[annotation, *checks]
    field = Field(
        default,
        description=help_text(setting, default),
        ge=setting.at_least,
        gt=setting.above,
        le=setting.at_most,
        json_schema_extra=extra or None,
    )
    return annotation, field


class SettingsModel(BaseModel):
    """Parameters a scheduler stores (a Prefect flow's), with a field per flat setting added
    by :func:`with_settings`.

    Its fields are named like the settings (``temperature``, ``max_cost``; ``output_column``
    for ``output``, the answer column), each described by its declaration. As a scheduler
    stores parameters, none may hold a credential: a ``base_url`` with ``user:password@``, a
    fragment or a query but Azure's ``?api-version=``, a header named like a credential, a
    proxy with ``user:password@`` are refused, in Python and, through patterns in the JSON
    schema, by an API checking parameters against it. Errors never show the input.
    """

    model_config = ConfigDict(hide_input_in_errors=True)

    declared: ClassVar[Mapping[str, Setting]] = {}
    """The settings among the fields, by field name."""
    metavars: ClassVar[Mapping[str, str]] = {}
    """What goes after the flag of a field that is no setting (``input``: ``FILE``)."""

    if TYPE_CHECKING:  # the fields with_settings adds, one per setting

        def __getattr__(self, name: str) -> Any: ...

    def settings(self) -> dict[str, Any]:
        """The settings given, by their names (see :data:`llm_ops.SETTINGS`), for
        :func:`llm_ops.options_from_settings`."""
        return {
            setting.name: getattr(self, name)
            for name, setting in self.declared.items()
            if getattr(self, name) is not None
        }

    @classmethod
    def words(cls, **otherwise: str) -> Words:
        """Words naming settings as this model's fields in error messages
        (``output_column=``); ``otherwise`` names the fields that give a setting some other
        way, e.g. ``api_key="api_key_secret"``."""
        names = {setting.name: name for name, setting in cls.declared.items()}
        return _ParameterWords({**names, **otherwise})


class _ParameterWords(Words):
    """Settings named as a model's fields."""

    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = names

    def name(self, setting: str) -> str:
        return self.names.get(setting, setting)

    def set_to(self, setting: str, value: str | None) -> str:
        return f"{self.name(setting)}={value!r}" if value else f"{self.name(setting)}=..."


def with_settings(
    *, defaults: Mapping[str, object] | None = None, declared: Iterable[Setting] = DECLARED
) -> Callable[[type[Model]], type[Model]]:
    """A class decorator adding to a :class:`SettingsModel` a field per flat setting a flow
    takes (those the class does not define itself), after its own.

    Parameters
    ----------
    defaults
        The fields' defaults where a flow's differ (field name to value), the class's own
        fields' included; every setting's field is else ``None``, standing for its option's
        default.
    declared
        The declarations to make the fields from.

    Examples
    --------
    >>> from llm_ops import SettingsModel, with_settings
    >>> @with_settings(defaults={"output_column": "summary"})
    ... class Parameters(SettingsModel):
    ...     input: str = "in.parquet"
    >>> Parameters(temperature=0).settings()
    {'output': 'summary', 'temperature': 0.0}
    """

    def make(model: type[Model]) -> type[Model]:
        flowed = [
            s for s in declared if s.flat and s.flow and s.parameter not in model.model_fields
        ]
        given = defaults or {}
        fields: dict[str, Any] = {
            s.parameter: _parameter_field(s, given.get(s.parameter)) for s in flowed
        }
        for name, default in given.items():
            if name in model.model_fields:  # its own field, with the flow's default
                own = copy.copy(model.model_fields[name])
                own.default = default
                fields[name] = (own.annotation, own)
        made: type[Model] = create_model(
            model.__name__, __base__=model, __module__=model.__module__, __doc__=model.__doc__,
            **fields,
        )  # fmt: skip
        made.declared = {**model.declared, **{s.parameter: s for s in flowed}}
        made.__qualname__ = model.__qualname__
        return made

    return make


def _field_kind(annotation: object) -> object:
    """A field's kind for a flag (see :func:`plain_kind`): ``str | list[str]`` is a list."""
    union = get_origin(annotation) in (Union, UnionType)
    kinds = [k for k in get_args(annotation) if k is not type(None)] if union else [annotation]
    if list[str] in kinds:
        return list[str]
    if len(kinds) == 1:
        return kinds[0]
    return Union[tuple(kinds)]  # noqa: UP007  # bool | str


def settings_parser(
    model: type[SettingsModel],
    *,
    prog: str,
    description: str,
    epilog: str | None = None,
    metavars: Mapping[str, str] | None = None,
) -> argparse.ArgumentParser:
    """A command line with a flag per field of ``model``, in their order.

    A setting's flag is as declared (its name, help, what goes after it, the default of
    ``model`` where it has its own); another field's is ``--`` and its name, with its
    description as help. :func:`parse_settings` reads what it parsed into ``model``.

    Parameters
    ----------
    model
        A :class:`SettingsModel` decorated with :func:`with_settings`.
    prog, description, epilog
        As :class:`argparse.ArgumentParser` takes them.
    metavars
        What goes after the flag of a field that is no setting, by field (besides
        ``model.metavars``); else ``N`` for a number, the field's name in capitals.

    Returns
    -------
    argparse.ArgumentParser
        Every flag optional but a field without a default's; a list field's flag is given
        again for each item, a dict field's as ``NAME=VALUE`` each.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog)
    for name, field in model.model_fields.items():
        setting = model.declared.get(name)
        if setting is not None:
            add_setting_flags(parser, [setting], defaults={name: field.default})
            continue
        how = _how(_field_kind(field.annotation))
        if how.get("action") != "store_true":
            kind = "N" if _field_kind(field.annotation) is int else name.upper()
            how["metavar"] = {**model.metavars, **(metavars or {})}.get(name, kind)
        default = None if field.is_required() else field.default
        text = field.description or ""
        if default is not None and default is not False and "default" not in text:
            text += f" (default: {default})".replace("\n", "\\n")
        flag = "--" + name.replace("_", "-")
        if field.is_required():
            how["required"] = True
        parser.add_argument(flag, **how, help=text.replace("%", "%%"))
    return parser


def parse_settings(
    parser: argparse.ArgumentParser, model: type[Model], argv: Sequence[str]
) -> Model:
    """``model`` from the command line ``argv`` that ``parser`` reads.

    Parameters
    ----------
    parser
        What :func:`settings_parser` made for ``model``.
    model
        The :class:`SettingsModel` to make.
    argv
        The arguments, without the program's name.

    Returns
    -------
    Model
        Made from the flags given; one given once for a field taking a text or a list is the
        text (``--model m``: ``model="m"``).

    Raises
    ------
    SystemExit
        With argparse's usage error, naming each wrong value's flag, as for an unknown flag.
    """
    given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    for name, value in given.items():
        if isinstance(value, list) and value and isinstance(value[0], tuple):
            given[name] = dict(value)  # NAME=VALUE pairs
        elif isinstance(value, list) and len(value) == 1 and _takes_text(model, name):
            given[name] = value[0]
    flags = {name: s.flag_name for name, s in model.declared.items()}

    def flag(error: Any) -> str:
        name = str(error["loc"][0]) if error["loc"] else ""
        return flags.get(name, "--" + name.replace("_", "-"))

    try:
        return model(**given)
    except ValidationError as exc:
        parser.error("; ".join(f"{flag(error)}: {error['msg']}" for error in exc.errors()))


def _takes_text(model: type[SettingsModel], name: str) -> bool:
    """Whether the field ``name`` of ``model`` takes a text as well as a list."""
    field = model.model_fields.get(name)
    return field is not None and str in get_args(field.annotation)


# --- the options page -------------------------------------------------------------------------


def _docs_default(setting: Setting) -> str:
    if setting.default is not None:
        return setting.default
    value = class_default(setting)
    if value is None and (setting.kind or class_hint(setting)) is bool:
        return "`False`"  # a switch, off unless given
    if value is None:
        return "unset"
    if isinstance(value, str | bool):
        return f"`{value!r}`".replace("'", '"')
    return _number(value)


def _meaning(setting: Setting) -> str:
    more = f" ([more]({setting.see}))" if setting.see else ""
    return setting.help.replace("|", "\\|") + more


def _spelled(setting: Setting, declared: Sequence[Setting]) -> str:
    """How the command line and the flow give a field: its setting and flag."""
    if setting.given is not None:
        return setting.given
    if not setting.flat:
        via = flag_of(setting.via, declared) if setting.via else None
        return "-" if via is None else _spelled(via, declared)
    if not setting.cli and not setting.flow:
        return "-"
    again = ", again for each" if setting.repeated else ""
    flag = f" (`{setting.flag_name}`{again})" if setting.cli else ""
    return f"`{setting.parameter}`{flag}"


def options_tables(declared: Sequence[Setting] = DECLARED) -> dict[str, str]:
    """The options page's tables, by the option they describe (``options``: the first)."""
    rows = ["| argument | default | meaning | setting (flag) |", "| --- | --- | --- | --- |"]
    rows += [
        f"| `{s.option}` | {_docs_default(s)} | {_meaning(s)} | {_spelled(s, declared)} |"
        for s in declared
        if s.field is None
    ]
    tables = {"options": "\n".join(rows)}
    for option, _ in SECTIONS:
        rows = ["| field | default | meaning | setting (flag) |", "| --- | --- | --- | --- |"]
        rows += [
            f"| `{s.field}` | {_docs_default(s)} | {_meaning(s)} | {_spelled(s, declared)} |"
            for s in declared
            if s.option == option and s.field is not None
        ]
        tables[option] = "\n".join(rows)
    return tables


_GENERATED = re.compile(r"(<!-- table: (\w+) -->\n).*?(\n<!-- end of table -->)", re.S)


def options_page(page: str, declared: Sequence[Setting] = DECLARED) -> str:
    """``page`` with each generated table (between ``<!-- table: NAME -->`` and
    ``<!-- end of table -->``) made again from ``declared``; its prose kept."""
    tables = options_tables(declared)
    return _GENERATED.sub(lambda m: m[1] + tables[m[2]] + m[3], page)
