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
    return functools.partial(
        llm_complete, model="sim", base_url=endpoint.base_url, cache=cache
    )


@pytest.fixture(autouse=True)
def _no_ambient_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "LLM_OPS_CACHE"):
        monkeypatch.delenv(name, raising=False)
