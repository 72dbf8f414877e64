"""The README's and the docs' examples run, the site builds, and CI runs the README's second
command.

Every ```python, ```console and ```sql block of README.md and docs/**/*.md runs, each as its
own test named by file, language and index. A ```text block right after a Python or console
block is what it prints. A block that cannot run offline (a real key, a cluster) has the
comment ``<!-- not run: why -->`` on the line before it, and its test is skipped saying why
(a Python one is compiled first, so it is at least valid Python).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import llm_ops.testing
from llm_ops.testing import LocalEndpoint

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(
    r"(?:^<!-- not run: (?P<skip>.*?) -->\n)?"
    r"^```(?P<lang>\w+)[^\n]*\n(?P<code>.*?)^```\n"
    r"(?:\n```text\n(?P<shown>.*?)^```\n)?",
    re.S | re.M,
)


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    lang: str
    index: int  # among the page's blocks of this language
    code: str
    shown: str  # the ```text block after it, if any
    skip: str | None  # why it is not run

    @property
    def id(self) -> str:
        return f"{self.page}:{self.lang}{self.index}"


def _blocks(lang: str) -> list[Block]:
    found = []
    for path in PAGES:
        matches = [m for m in FENCE.finditer(path.read_text()) if m["lang"] == lang]
        for index, m in enumerate(matches):
            page = str(path.relative_to(ROOT))
            found.append(Block(page, lang, index, m["code"], m["shown"] or "", m["skip"]))
    return found


def _params(blocks: list[Block]) -> list[Any]:
    return [pytest.param(block, id=block.id) for block in blocks]


def _python_blocks() -> list[Block]:
    """Each Python example once: a README example the docs show too is run there."""
    blocks, seen = [], set()
    for block in sorted(_blocks("python"), key=lambda b: b.page == "README.md"):
        if (block.code, block.shown) not in seen:
            seen.add((block.code, block.shown))
            blocks.append(block)
    return blocks


def _skip_if_marked(block: Block) -> None:
    if block.skip is not None:
        pytest.skip(f"not run: {block.skip}")


class _Shared:
    """``LocalEndpoint(**config)`` inside an example: the module's simulator, configured so.

    Starting a simulator process for each run of each example would take most of these
    tests' time; each example still gets a simulator behaving as it asked, counters zeroed.
    """

    def __init__(self, server: LocalEndpoint) -> None:
        self._server = server

    def __call__(self, *, port: int = 0, **config: Any) -> LocalEndpoint:
        self._server.configure(**config)
        self._server.reset()
        return self._server


@pytest.fixture(scope="module")
def shared_server() -> Iterator[LocalEndpoint]:
    with LocalEndpoint() as endpoint:
        yield endpoint


@pytest.fixture
def shared_endpoint(shared_server: LocalEndpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Examples' ``with LocalEndpoint(...) as endpoint`` get the module's simulator, which a
    ``with`` block then leaves running."""
    monkeypatch.setattr(llm_ops.testing, "LocalEndpoint", _Shared(shared_server))
    monkeypatch.setattr(LocalEndpoint, "__exit__", lambda self, *exc: None)
    monkeypatch.setattr(LocalEndpoint, "stop", lambda self: None)


@pytest.mark.parametrize("block", _params(_python_blocks()))
@pytest.mark.usefixtures("shared_endpoint")
def test_each_python_example_runs_on_its_own_and_prints_what_it_shows(
    block, tmp_path, monkeypatch, capsys
):
    compiled = compile(block.code, block.page, "exec")
    _skip_if_marked(block)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLM_OPS_CACHE", str(tmp_path / "default-cache.duckdb"))
    exec(compiled, {})
    assert capsys.readouterr().out == block.shown
    exec(compiled, {})  # and again, as a reader would: from the cache


@pytest.mark.parametrize("block", _params(_blocks("sql")))
def test_each_sql_block_runs_in_the_duckdb_cli_on_a_new_cache(block, complete, cache):
    import polars as pl

    _skip_if_marked(block)
    pl.DataFrame({"text": ["a", "b"]}).pipe(complete, prompt="{text}")
    cli = Path(sys.executable).with_name("duckdb")  # duckdb-cli, a DuckDB 1.x
    result = subprocess.run(
        [str(cli), "-readonly", str(cache), "-c", block.code],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert result.stdout.strip()


@pytest.mark.parametrize("block", _params(_blocks("console")))
def test_each_console_session_prints_what_it_shows(block, tmp_path):
    _skip_if_marked(block)
    (tmp_path / "data").symlink_to(ROOT / "data", target_is_directory=True)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("LLM_OPS_CACHE", None)
    llm_ops_command = str(Path(sys.executable).with_name("llm-ops"))
    for session in re.split(r"^\$ ", block.code, flags=re.M)[1:]:
        command, _, expected = session.partition("\n")
        result = subprocess.run(
            command.replace("llm-ops", llm_ops_command, 1),
            shell=True,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.stdout + result.stderr == expected


def test_the_readme_has_the_two_commands_and_ci_runs_the_second():
    commands = re.findall(r"^(python3 -m venv .*)$", README, re.M)
    assert commands == [
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[prefect]' "
        "&& .venv/bin/python flows/enrich.py",
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' "
        "&& .venv/bin/python -m pytest",
    ]
    assert commands[1] in (ROOT / ".ci" / "run").read_text()
    index = (ROOT / "docs" / "index.md").read_text()
    assert re.findall(r"^(python3 -m venv .*)$", index, re.M) == commands


def test_the_readme_stays_short():
    assert len(README.splitlines()) <= 250


def test_the_api_reference_lists_every_public_name():
    import llm_ops

    api = (ROOT / "docs" / "reference" / "api.md").read_text()
    listed = re.findall(r"^ {8}- (\w+)$", api, re.M)
    assert sorted(listed) == sorted(llm_ops.__all__)


def test_the_site_builds_strictly_with_every_command_in_the_cli_reference(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import cli_reference
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    page = (site / "reference" / "cli" / "index.html").read_text()
    for words, parser in cli_reference.commands(cli_reference.build_parser()):
        assert " ".join(("llm-ops", *words)) in page
        assert parser.description is None or parser.description.split()[0] in page
