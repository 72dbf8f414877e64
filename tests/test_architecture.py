"""The layers of ARCHITECTURE.md hold: every import in llm_ops/ goes down a layer, or to a
module its row allows in its own layer, and inside a package only to a module listed above it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "llm_ops"
ROW = re.compile(r"^\| (\d+) \| `([\w]+)` \| [^|]+ \|([^|]*)\|$")
INNER_ROW = re.compile(r"^\| `(\w+)\.(\w+)` \| [^|]+ \|$")


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


def _module_of(path: Path) -> str:
    """A file's module to the rules: its package for a file in one, ``__init__`` for ours."""
    return path.relative_to(PACKAGE).with_suffix("").parts[0]


def _imports(path: Path) -> set[str]:
    """The llm_ops modules a file imports (relative imports, resolved; in-package ones left
    out)."""
    depth = len(path.relative_to(PACKAGE).parts) - 1  # 1 for a file of a subpackage
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        if node.level - 1 < depth:  # within its own package
            continue
        if node.module:
            found.add(node.module.split(".")[0])
        else:  # ``from . import x``: a module of ours, or a name of the package's face
            found.update(
                a.name
                if (PACKAGE / a.name).exists() or (PACKAGE / f"{a.name}.py").exists()
                else "__init__"
                for a in node.names
            )
    return found - {_module_of(path)}


def _files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_has_a_row():
    rows = _layers()
    assert {_module_of(path) for path in _files()} <= set(rows)


def test_imports_go_down_a_layer_or_where_the_table_allows():
    rows = _layers()
    wrong = []
    for path in _files():
        module = _module_of(path)
        layer, allowed = rows[module]
        for target in sorted(_imports(path)):
            below = rows[target][0] < layer
            if not below and not (rows[target][0] == layer and target in allowed):
                wrong.append(f"{path.relative_to(ROOT)} imports {target}")
    assert wrong == []


def test_the_tables_read_every_row():
    rows = (ROOT / "ARCHITECTURE.md").read_text().count("\n| ")
    tables = 1 + len(_inner_orders())
    assert len(_layers()) + sum(map(len, _inner_orders().values())) == rows - 2 * tables


def _in_package_imports(path: Path) -> set[str]:
    """The modules of its own package a file of a package imports (``from .x import``)."""
    return {
        node.module.split(".")[0]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
    }


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
