from __future__ import annotations

import os
import tempfile

# Prefect reads its settings at import: keep test runs hermetic and quiet.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="llm-ops-prefect-")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ.pop("PREFECT_API_URL", None)

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from llm_ops import llm_complete
from llm_ops.testing import LocalEndpoint


@pytest.fixture(scope="session")
def prefect() -> Iterator[None]:
    """One temporary Prefect API for the whole session (it takes seconds to start)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60):
        yield


@pytest.fixture(scope="session")
def server() -> Iterator[LocalEndpoint]:
    with LocalEndpoint() as endpoint:
        yield endpoint


@pytest.fixture
def endpoint(server: LocalEndpoint) -> LocalEndpoint:
    """The session's simulator with default behaviour and its counters zeroed."""
    server.configure()
    server.reset()
    return server


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache.duckdb"


@pytest.fixture
def complete(endpoint: LocalEndpoint, cache: Path) -> Callable[..., Any]:
    """``llm_complete`` pointed at the simulator and a fresh cache file, model ``sim``."""
    return functools.partial(llm_complete, model="sim", base_url=endpoint.base_url, cache=cache)


@pytest.fixture(autouse=True)
def _no_ambient_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "LLM_OPS_CACHE"):
        monkeypatch.delenv(name, raising=False)


LLAMA = Path(__file__).resolve().parents[2] / "shared" / "llama"


class LlamaServer:
    """llama.cpp's real server with the tiny test model, on a free port of 127.0.0.1."""

    def __init__(self, alias: str, *extra: str):
        import subprocess

        self.process = subprocess.Popen(
            [
                str(LLAMA / "llama-server"),
                "-m",
                str(LLAMA / "tiny-llama.gguf"),
                "--alias",
                alias,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--ctx-size",
                "2048",
                "--parallel",
                "4",
                "--threads",
                "2",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if "listening on http://" in line:
                self.base_url = line.rsplit(" ", 1)[-1].strip() + "/v1"
                break
        else:
            raise RuntimeError("llama-server did not start")
        self.model = alias

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def _llama(alias: str, *extra: str) -> Iterator[LlamaServer]:
    if not (LLAMA / "llama-server").exists():
        pytest.skip(f"no llama.cpp server in {LLAMA}")
    server = LlamaServer(alias, *extra)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def llama() -> Iterator[LlamaServer]:
    """llama.cpp serving chat completions (real tokenizer, usage, finish reasons)."""
    yield from _llama("tiny", "--metrics")


@pytest.fixture(scope="session")
def llama_embed() -> Iterator[LlamaServer]:
    """llama.cpp serving 64-dimensional embeddings; inputs over 512 tokens fail with a 500."""
    yield from _llama("tiny-embed", "--embeddings", "--pooling", "mean")
