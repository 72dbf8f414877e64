"""Check that llm-ops works with the lower bounds its pyproject.toml declares.

The core ``[project] dependencies`` of ``pyproject.toml`` say ``name>=X``. This script makes a
fresh virtual environment, installs the package there with every direct dependency pinned to
``name==X`` (what a resolver picking the lowest direct versions would install), plus the test
tools, runs the fast part of the test suite against it, and prints a table::

    package | lower bound | installed | result

Run it before raising or lowering a bound; ``--try polars=1.20`` tries a candidate without
editing pyproject.toml, and ``--venv DIR --keep`` reuses one environment between tries (pip then
only swaps the packages that changed), which is how the bounds were bisected.

The fast part leaves out the tests that need Prefect, Ray, llama.cpp, the DuckDB CLI or the docs
tools, and the benchmarks: the core must work without them.

Examples
--------
    python scripts/lowest_versions.py
    python scripts/lowest_versions.py --try duckdb=1.1.0 --try numpy=1.26.0
    python scripts/lowest_versions.py --venv /tmp/lowest --keep --try polars=1.10.0
    python scripts/lowest_versions.py --tests tests/test_cache.py tests/test_sql.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAST_TESTS = [
    "llm_ops",  # the doctests
    "tests/test_architecture.py",
    "tests/test_arguments.py",
    "tests/test_batch.py",
    "tests/test_broken_files.py",
    "tests/test_cache.py",
    "tests/test_cached_tokens.py",
    "tests/test_cascade.py",
    "tests/test_cli.py",
    "tests/test_complete.py",
    "tests/test_cost.py",
    "tests/test_embed.py",
    "tests/test_endpoints.py",
    "tests/test_engine.py",
    "tests/test_expr.py",
    "tests/test_keys.py",
    "tests/test_package.py",
    "tests/test_packing.py",
    "tests/test_rendering.py",
    "tests/test_secrets.py",
    "tests/test_semantic.py",
    "tests/test_sql.py",
    "tests/test_structured.py",
    "tests/test_transport.py",
    "tests/test_wire.py",
]
"""The doctests of llm_ops/ and the test files of the core: frames, expressions, the cache, the
engine, the wire and its transport, SQL, the CLI, keys, batches, rendering. Left out: what needs
Prefect (flows, tables), Ray, llama.cpp, the DuckDB CLI or mkdocs (docs), the benchmarks, the
linters (quality), and the slow or load-timed files (concurrency, durability, hostile,
batch_hostile, long_lines, memory_path, send_order, shared_cache, simulator_knee), which test
the engine's timing more than what it asks of its dependencies."""

TEST_TOOLS = ["pytest", "pytest-xdist", "hypothesis", "trustme"]
"""What the fast tests import besides the package: their specs are taken from the dev extra."""

REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*(;.*)?$")
LOWER = re.compile(r">=\s*([^,\s]+)")


@dataclass(frozen=True)
class Dependency:
    """One core dependency: its name, extras (``[aiohttp]``) and the version it is pinned to."""

    name: str
    extras: str
    bound: str | None
    pin: str | None

    @property
    def requirement(self) -> str:
        """What pip is asked for: ``name[extras]==pin``, or the name alone with no bound."""
        return f"{self.name}{self.extras}" + (f"=={self.pin}" if self.pin else "")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(requirement: str) -> tuple[str, str, str | None]:
    """``"openai[aiohttp]>=3.57"`` -> ``("openai", "[aiohttp]", "3.57")``."""
    match = REQUIREMENT.match(requirement)
    if match is None:
        raise SystemExit(f"cannot read the requirement {requirement!r}")
    name, extras, spec, _marker = match.groups()
    lower = LOWER.search(spec or "")
    return name, extras or "", lower[1] if lower else None


def read_pyproject(tries: dict[str, str]) -> tuple[list[Dependency], list[str]]:
    """The core dependencies pinned to their lower bounds (or to ``tries``), and the test tools'
    specs from the dev extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dependencies = []
    for requirement in project["dependencies"]:
        name, extras, bound = parse(requirement)
        pin = tries.pop(normalize(name), bound)
        dependencies.append(Dependency(name, extras, bound, pin))
    if tries:
        raise SystemExit(f"--try names no core dependency: {', '.join(sorted(tries))}")
    dev = {normalize(parse(r)[0]): r for r in project["optional-dependencies"].get("dev", [])}
    tools = [dev.get(normalize(tool), tool) for tool in TEST_TOOLS]
    return dependencies, tools


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run a command, its output captured as text."""
    return subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload, no-any-return]


def make_venv(venv: Path, python: str, uv: str | None) -> Path:
    """A virtual environment at ``venv`` (kept if it already has a Python); its Python."""
    bin_python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if bin_python.exists():
        return bin_python
    command = (
        [uv, "venv", "--python", python, str(venv)] if uv else [python, "-m", "venv", str(venv)]
    )
    made = run(command)
    if made.returncode != 0:
        raise SystemExit(f"could not make a venv at {venv}:\n{made.stderr}")
    return bin_python


def install(
    python: Path, requirements: list[str], uv: str | None
) -> subprocess.CompletedProcess[str]:
    """Install the package (editable, without its dependencies: a ``--try`` pin may lie outside
    the range pyproject.toml declares) and ``requirements`` into the venv of ``python``."""
    if uv:
        command = [uv, "pip", "install", "--python", str(python)]
    else:
        command = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    package = run([*command, "--no-deps", "-e", str(ROOT)])
    if package.returncode != 0:
        return package
    return run([*command, *requirements])


def installed_versions(python: Path) -> dict[str, str]:
    """Every distribution in the venv of ``python``: normalized name -> version."""
    code = (
        "import json, importlib.metadata as m\n"
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    found = run([str(python), "-c", code])
    return {normalize(k): v for k, v in json.loads(found.stdout or "{}").items()}


def same_version(wanted: str, got: str) -> bool:
    """``1.20`` and ``1.20.0`` are one version."""

    def parts(version: str) -> list[str]:
        items = version.split(".")
        while len(items) > 1 and items[-1] == "0":
            items.pop()
        return items

    return parts(wanted) == parts(got)


def summary_line(output: str) -> str:
    """Pytest's closing line (``12 passed, 1 failed in 3.2s``), or the last line it wrote."""
    lines = [line.strip("= ").strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.search(r"\b(passed|failed|error|errors|no tests ran)\b", line):
            return line
    return lines[-1] if lines else "(no output)"


def table(rows: list[tuple[str, str, str, str]]) -> str:
    """Rows as a Markdown table, columns padded."""
    header = ("package", "lower bound", "installed", "result")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]

    def line(row: tuple[str, ...]) -> str:
        return "| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |"

    rule = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "Install llm-ops with each core dependency pinned to its lower bound in a fresh "
            "venv, run the fast part of the tests there, and print package | lower bound | "
            "installed | result."
        ),
    )
    parser.add_argument(
        "--try",
        dest="tries",
        action="append",
        default=[],
        metavar="PACKAGE=VERSION",
        help="pin PACKAGE to VERSION instead of its bound in pyproject.toml (repeatable)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the venv and print its path")
    parser.add_argument(
        "--venv",
        type=Path,
        help="use (or make) the venv at this path, which implies --keep: a second run with "
        "other --try pins only swaps the packages that changed",
    )
    parser.add_argument(
        "--tests",
        nargs="+",
        metavar="PATH",
        help="test files or node ids to run instead of the fast part of the suite",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter to make the venv with (default: the one running this script)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1200.0,
        help="stop the tests after this many seconds (default: %(default)s)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="print pytest's whole output, not only failures"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    tries = {}
    for item in args.tries:
        name, sep, version = item.partition("=")
        if not sep or not version:
            raise SystemExit(f"--try wants PACKAGE=VERSION, not {item!r}")
        tries[normalize(name)] = version.lstrip("=")
    dependencies, tools = read_pyproject(tries)
    uv = shutil.which("uv")
    keep = args.keep or args.venv is not None
    venv = args.venv or Path(tempfile.mkdtemp(prefix="llm-ops-lowest-")) / "venv"
    started = time.monotonic()
    try:
        python = make_venv(venv, args.python, uv)
        requirements = [d.requirement for d in dependencies] + tools
        print(f"installing with {'uv' if uv else 'pip'} into {venv}:", " ".join(requirements))
        installed = install(python, requirements, uv)
        versions = installed_versions(python)
        if installed.returncode != 0:
            print(installed.stdout[-3000:], installed.stderr[-3000:], sep="\n")
            outcome, passed = "install failed", False
        else:
            tests = args.tests or FAST_TESTS
            print(f"installed in {time.monotonic() - started:.0f} s; running {len(tests)} paths")
            pytest = [str(python), "-m", "pytest", "-p", "no:cacheprovider"]
            # A test stuck on an old version prints its stacks after 2 minutes; the whole run
            # is stopped after --timeout seconds.
            pytest += ["-o", "faulthandler_timeout=120", *tests]
            try:
                ran = run(pytest, cwd=ROOT, timeout=args.timeout)
            except subprocess.TimeoutExpired as stuck:
                out = stuck.stdout.decode() if isinstance(stuck.stdout, bytes) else stuck.stdout
                ran = subprocess.CompletedProcess(stuck.cmd, 1, out or "", "")
                ran.stdout += f"\ntimed out after {args.timeout} s"
            passed = ran.returncode == 0
            if args.verbose or not passed:
                print(ran.stdout[-20000:], ran.stderr[-5000:], sep="\n")
            outcome = summary_line(ran.stdout)
        rows = []
        for dependency in dependencies:
            got = versions.get(normalize(dependency.name), "-")
            pinned = dependency.pin is None or same_version(dependency.pin, got)
            result = "pass" if passed and pinned else "fail" if pinned else "not pinned"
            bound = dependency.bound or "-"
            if dependency.pin != dependency.bound:
                bound = f"{bound} (try {dependency.pin})"
            rows.append((dependency.name, bound, got, result))
        print()
        print(table(rows))
        print()
        python_version = run([str(python), "-c", "import sys; print(sys.version.split()[0])"])
        print(f"python {python_version.stdout.strip()}; tests: {outcome}")
        print(f"took {time.monotonic() - started:.0f} s")
        return 0 if passed and all(row[3] == "pass" for row in rows) else 1
    finally:
        if keep:
            print(f"venv kept at {venv}")
        elif args.venv is None:
            shutil.rmtree(venv.parent, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
