"""The layers of ARCHITECTURE.md hold: every import in llm_ops/ goes down a layer, or to a
module its row allows in its own layer, and inside a package only to a module listed above it.
Outside the package, flows/, benchmarks/ and scripts/ use only the public API."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from sources import syntax_tree

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "llm_ops"
ROW = re.compile(r"^\| (\d+) \| `([\w]+)` \| [^|]+ \|([^|]*)\|$")
INNER_ROW = re.compile(r"^\| `(\w+)\.(\w+)` \| [^|]+ \|$")
USERS = ("flows", "benchmarks", "scripts")  # code outside the package held to its public API

Import = tuple[str, str | None]  # the module an import names, the name it takes (None: itself)


def _layers() -> dict[str, tuple[int, set[str]]]:
    """Module -> (layer, modules of its layer it may import), from ARCHITECTURE.md's table."""
    rows = {}
    for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines():
        match = ROW.match(line.strip())
        if match:
            layer, module, allowed = match.groups()
            rows[module] = (int(layer), set(re.findall(r"`(\w+)`", allowed)))
    return rows


def _inner_orders() -> dict[str, list[str]]:
    """Package -> its modules, in the order of its table in ARCHITECTURE.md."""
    orders: dict[str, list[str]] = {}
    for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines():
        match = INNER_ROW.match(line.strip())
        if match:
            orders.setdefault(match[1], []).append(match[2])
    return orders


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of this repository."""
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _name_of(path: Path) -> tuple[str, bool]:
    """A file's dotted module name, and whether it is a package's ``__init__``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _collect(source: str, module: str, *, package: bool = False) -> set[Import]:
    """The llm_ops imports of ``source``, the code of ``module`` (``package``: its ``__init__``).

    Every form counts, at the top, under ``if TYPE_CHECKING`` or inside a function:
    ``import llm_ops._x [as y]``, ``from llm_ops._x import y``, ``from llm_ops import _x``,
    relative ones (``from . import _x``, ``from .._x import y``), an attribute reached through
    an imported module (``llm_ops._x.y`` after ``import llm_ops``), and
    ``importlib.import_module("llm_ops._x")`` with the name written out. Each resolves to the
    module it names (``from a import b``: ``a.b`` when that is a module, else ``a`` and the name
    ``b``); a package's ``__init__`` is the package itself.
    """
    here = module.split(".") if package else module.split(".")[:-1]

    def take(base: str, name: str) -> Import:
        if name != "*" and _is_module(f"{base}.{name}"):
            return f"{base}.{name}", None
        return base, name

    found: set[Import] = set()
    bound: dict[str, str] = {}  # a name an import binds -> the module it is
    tree = syntax_tree(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add((alias.name, None))
                top = alias.name.split(".")[0]
                bound[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level > len(here):  # above the top package: not an import of ours
                    continue
                parts = here[: len(here) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                target = take(base, alias.name)
                found.add(target)
                if target[1] is None:
                    bound[alias.asname or alias.name] = target[0]
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in {"__import__", "import_module", "importlib.import_module"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add((node.args[0].value, None))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain: list[str] = []
        value: ast.expr = node
        while isinstance(value, ast.Attribute):
            chain.insert(0, value.attr)
            value = value.value
        if not chain or not isinstance(value, ast.Name) or value.id not in bound:
            continue
        target = bound[value.id]
        for attribute in chain:
            if not _is_module(f"{target}.{attribute}"):
                found.add((target, attribute))
                break
            target = f"{target}.{attribute}"
        else:
            found.add((target, None))
    return {(m, n) for m, n in found if m == "llm_ops" or m.startswith("llm_ops.")}


def _rule_module(dotted: str) -> str:
    """An llm_ops module to the layer rules: its top package or module; ``__init__`` for ours."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> set[str]:
    """The modules of llm_ops (to the layer rules) a file of it imports, its own left out."""
    module, package = _name_of(path)
    targets = {_rule_module(m) for m, _ in _collect(path.read_text(), module, package=package)}
    return targets - {_rule_module(module)}


def _layer_violations(module: str, imports: set[str]) -> list[str]:
    """The imports of ``module`` (to the layer rules) ARCHITECTURE.md's table forbids."""
    rows = _layers()
    layer, allowed = rows[module]
    return [
        target
        for target in sorted(imports)
        if not (rows[target][0] < layer or (rows[target][0] == layer and target in allowed))
    ]


def test_every_module_has_a_row():
    rows = _layers()
    assert {_rule_module(_name_of(path)[0]) for path in _files()} <= set(rows)


def test_imports_go_down_a_layer_or_where_the_table_allows():
    wrong = [
        f"{path.relative_to(ROOT)} imports {target}"
        for path in _files()
        for target in _layer_violations(_rule_module(_name_of(path)[0]), _imports(path))
    ]
    assert wrong == []


def test_the_tables_read_every_row():
    rows = (ROOT / "ARCHITECTURE.md").read_text().count("\n| ")
    tables = 1 + len(_inner_orders())
    assert len(_layers()) + sum(map(len, _inner_orders().values())) == rows - 2 * tables


def _in_package_imports(path: Path) -> set[str]:
    """The modules of its own package a file of a package imports."""
    module, package = _name_of(path)
    prefix = ".".join(module.split(".")[:2]) + "."
    return {
        target[len(prefix) :].split(".")[0]
        for target, _ in _collect(path.read_text(), module, package=package)
        if target.startswith(prefix)
    } - {module.split(".")[-1]}


def test_every_module_of_a_tabled_package_has_a_row():
    for package, order in _inner_orders().items():
        files = {p.stem for p in (PACKAGE / package).glob("*.py")} - {"__init__"}
        assert files == set(order), package


def test_a_package_module_imports_only_those_above_it():
    wrong = []
    for package, order in _inner_orders().items():
        for index, module in enumerate(order):
            path = PACKAGE / package / f"{module}.py"
            for target in sorted(_in_package_imports(path) - set(order[:index])):
                wrong.append(f"{path.relative_to(ROOT)} imports {target}")
    assert wrong == []


# Every form of import a layer-1 module (``_status``) could plant to reach up to ``_client``.
PLANTED = [
    ("import llm_ops._client", ("llm_ops._client", None)),
    ("import llm_ops._client as client", ("llm_ops._client", None)),
    ("from llm_ops._client import Client", ("llm_ops._client", "Client")),
    ("from llm_ops import _client", ("llm_ops._client", None)),
    ("from . import _client", ("llm_ops._client", None)),
    ("from ._client import Client", ("llm_ops._client", "Client")),
    ("def f():\n    from ._client import Client", ("llm_ops._client", "Client")),
    ("if TYPE_CHECKING:\n    import llm_ops._client", ("llm_ops._client", None)),
    ("import llm_ops\nllm_ops._client.Client", ("llm_ops._client", "Client")),
    ("import llm_ops._key\nllm_ops._client.Client", ("llm_ops._client", "Client")),
    ("from llm_ops import Client", ("llm_ops", "Client")),
    ("importlib.import_module('llm_ops._client')", ("llm_ops._client", None)),
]


@pytest.mark.parametrize(("source", "expected"), PLANTED)
def test_every_form_of_import_is_read_and_caught(source, expected):
    found = _collect(source, "llm_ops._status")
    assert expected in found
    assert _layer_violations("_status", {_rule_module(m) for m, _ in found} - {"_status"})


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from .. import _client", ("llm_ops._client", None)),
        ("from .._client import Client", ("llm_ops._client", "Client")),
        ("from .. import Client", ("llm_ops", "Client")),
        ("from . import dispatcher", ("llm_ops._engine.dispatcher", None)),
        ("from .dispatcher import send", ("llm_ops._engine.dispatcher", "send")),
        ("from llm_ops._engine import dispatcher", ("llm_ops._engine.dispatcher", None)),
        ("import llm_ops._engine.dispatcher as d", ("llm_ops._engine.dispatcher", None)),
    ],
)
def test_imports_in_a_package_resolve_from_it(source, expected):
    assert expected in _collect(source, "llm_ops._engine.engine")


def test_a_package_init_is_the_package_and_others_are_left_out():
    assert _collect("from .engine import Engine", "llm_ops._engine", package=True) == {
        ("llm_ops._engine.engine", "Engine")
    }
    assert _collect("import os\nimport polars as pl\nos.path.join\npl.col", "llm_ops._key") == set()
    # the layers allow what goes down, or sideways where the row says so
    assert _layer_violations("_semantic", {"_key", "exceptions"}) == []
    assert _layer_violations("_key", {"_status"}) == ["_status"]


def _all_of(module: str) -> set[str]:
    """A module's ``__all__``, read from its source."""
    path = ROOT.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    for node in syntax_tree(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{module} has no __all__")


def _public_api() -> dict[str, set[str]]:
    """The public modules, those docs/reference/api.md documents, and their names."""
    api = (ROOT / "docs" / "reference" / "api.md").read_text()
    return {m: _all_of(m) for m in re.findall(r"^## `(llm_ops[\w.]*)`$", api, re.MULTILINE)}


def _private_uses(imports: set[Import], public: dict[str, set[str]]) -> list[str]:
    """The imports that go past the public API: a module it does not document, or a name that
    is not in its module's ``__all__`` (``*`` and dunders such as ``__version__`` aside)."""
    return sorted(
        f"{module}.{name}" if name else module
        for module, name in imports
        if module not in public
        or not (name is None or name == "*" or name in public[module] or name.startswith("__"))
    )


def _user_files() -> list[Path]:
    return sorted(p for folder in USERS for p in (ROOT / folder).rglob("*.py"))


def test_the_public_api_is_the_documented_modules():
    public = _public_api()
    assert {"llm_ops", "llm_ops.tables", "llm_ops.ray", "llm_ops.testing"} <= set(public)
    assert not [m for m in public if any(part.startswith("_") for part in m.split("."))]


def test_flows_benchmarks_and_scripts_use_only_the_public_api():
    public = _public_api()
    files = _user_files()
    assert ROOT / "flows" / "enrich.py" in files
    wrong = [
        f"{path.relative_to(ROOT)} uses {use}"
        for path in files
        for use in _private_uses(_collect(path.read_text(), _name_of(path)[0]), public)
    ]
    assert wrong == []


@pytest.mark.parametrize(
    "source",
    [
        "import llm_ops._client",
        "from llm_ops._client import Client",
        "from llm_ops import _client",
        "from llm_ops import _metadata",
        "from llm_ops.tables import _plan",
        "from llm_ops.tables._plan import plan",
        "from llm_ops.ray import _ray",
        "from llm_ops import NoSuchName",
        "import llm_ops.cli",
        "import llm_ops\nllm_ops._client.Client",
        "import llm_ops.tables as tables\ntables._plan",
        "def f():\n    from llm_ops._pipeline.run import run_frame",
    ],
)
def test_a_private_use_outside_the_package_is_caught(source):
    assert _private_uses(_collect(source, "benchmarks.planted"), _public_api())


def test_the_public_api_passes():
    source = (
        "import llm_ops\nfrom llm_ops import Client, __version__\n"
        "from llm_ops.tables import Table\nfrom llm_ops import testing\n"
        "from llm_ops.testing import *\nllm_ops.llm_complete\n"
    )
    assert _private_uses(_collect(source, "flows.planted"), _public_api()) == []
