from __future__ import annotations

import os
import tempfile

# The default cache of whoever runs the tests, which no test may touch; and the home of every
# test and of the processes they start, so that a job given no cache= writes its default cache
# there. Set at import, before anything reads them; every process a test starts inherits them.
os.environ["LLM_OPS_TESTS_USERS_CACHE"] = os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llm-ops"
)
os.environ["HOME"] = tempfile.mkdtemp(prefix="llm-ops-tests-")
os.environ["XDG_CACHE_HOME"] = os.path.join(os.environ["HOME"], ".cache")
# Prefect reads its settings at import: keep test runs hermetic and quiet.
os.environ["PREFECT_HOME"] = os.path.join(os.environ["HOME"], ".prefect")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ.pop("PREFECT_API_URL", None)

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from llm_ops import llm_complete
from llm_ops.testing import LocalEndpoint

REPOSITORY = Path(__file__).resolve().parents[1]
USERS_CACHE = Path(os.environ["LLM_OPS_TESTS_USERS_CACHE"])
SANDBOX = Path(os.environ["HOME"])
_WRITTEN_BY_TOOLS = {
    ".git",
    ".venv",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    ".mypy_cache",
    ".ruff_cache",
}


def _files_outside_the_sandbox() -> dict[Path, tuple[int, int]]:
    """Every file of the user's cache and of the repository (but what git, Python and the test
    tools keep there), with its size and time of change."""
    found = {}
    for root in (USERS_CACHE, REPOSITORY):
        for folder, names, files in os.walk(root):
            names[:] = [n for n in names if n not in _WRITTEN_BY_TOOLS and ".egg-info" not in n]
            for name in files:
                path = Path(folder, name)
                with contextlib.suppress(OSError):
                    stat = path.stat()
                    found[path] = (stat.st_size, stat.st_mtime_ns)
    return found


_BEFORE = _files_outside_the_sandbox()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a test wrote outside its temporary folders (checked once, by the process
    that started the workers)."""
    if hasattr(session.config, "workerinput"):
        return
    after = _files_outside_the_sandbox()
    changed = after.keys() | _BEFORE.keys()
    touched = sorted(str(p) for p in changed if after.get(p) != _BEFORE.get(p))
    if touched:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("tests wrote outside their temporary folders:", red=True)
            for path in touched[:20]:
                reporter.write_line(f"  {path}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
def environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No proxy setting of the machine's: each test that uses it names its own."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache.duckdb"


@pytest.fixture
def complete(endpoint: LocalEndpoint, cache: Path) -> Callable[..., Any]:
    """``llm_complete`` pointed at the simulator and a fresh cache file, model ``sim``."""
    return functools.partial(llm_complete, model="sim", endpoint=endpoint.base_url, cache=cache)


@pytest.fixture(autouse=True)
def _no_ambient_provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_ops._endpoint import KEY_VARIABLES

    keys = {name for names in KEY_VARIABLES.values() for name in names}
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "LLM_OPS_CACHE", *keys):
        monkeypatch.delenv(name, raising=False)


LLAMA = Path(__file__).resolve().parents[2] / "shared" / "llama"
"""Where llama.cpp's server and the tiny model are unless ``LLAMA_SERVER`` says otherwise."""


def llama_paths() -> tuple[Path, Path]:
    """(server, model): ``LLAMA_SERVER``, else ``../shared/llama/llama-server``; ``LLAMA_MODEL``,
    else ``tiny-llama.gguf`` next to the server."""
    server = Path(os.environ.get("LLAMA_SERVER") or LLAMA / "llama-server").expanduser()
    model = os.environ.get("LLAMA_MODEL") or server.with_name("tiny-llama.gguf")
    return server, Path(model).expanduser()


def llama_missing() -> str | None:
    """Why the llama.cpp tests cannot run here (one line), or None when they can."""
    server, model = llama_paths()
    if not (server.is_file() and os.access(server, os.X_OK)):
        return (
            f"llama.cpp server not found ({server}): set LLAMA_SERVER or put it in ../shared/llama"
        )
    if not model.is_file():
        return f"llama.cpp model not found ({model}): set LLAMA_MODEL"
    return None


class LlamaServer:
    """llama.cpp's real server with the tiny test model, on a free port of 127.0.0.1.

    Its output is read all along by a thread (a chatty server never blocks on a full pipe);
    if it exits or is not listening within ``timeout`` seconds, the error shows its last lines.
    """

    url: str
    """The server's root, e.g. ``http://127.0.0.1:PORT`` (``/health``, ``/metrics``)."""
    base_url: str
    """The OpenAI-compatible API: the root and ``/v1``."""

    def __init__(self, alias: str, *extra: str, timeout: float = 60.0):
        import collections
        import subprocess
        import threading

        server, model = llama_paths()
        self.model = alias
        self.output: collections.deque[str] = collections.deque(maxlen=30)
        self._url: str | None = None
        self._done = threading.Event()
        self.process = subprocess.Popen(
            [
                str(server),
                "-m",
                str(model),
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
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        self._reader = threading.Thread(target=self._read, name=f"llama-{alias}", daemon=True)
        self._reader.start()
        if not self._done.wait(timeout):
            self._fail(f"was not listening after {timeout:g} s")
        elif self._url is None:
            self._fail(f"exited with code {self.process.wait(timeout=10)}")
        assert self._url is not None
        self.url = self._url
        self.base_url = f"{self.url}/v1"
        self._wait_until_healthy(timeout)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line.rstrip())
            if self._url is None and "listening on http://" in line:
                self._url = line.rsplit(" ", 1)[-1].strip()
                self._done.set()
        self._done.set()  # the server exited

    def _fail(self, why: str) -> None:
        self.stop()
        self._reader.join(timeout=5)
        last = "\n".join(self.output)
        raise RuntimeError(f"llama-server {self.model!r} {why}; its last output:\n{last}")

    def get(self, path: str) -> str:
        """The body of ``GET <server root><path>`` (no proxy: it is on loopback)."""
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(self.url + path, timeout=10) as response:
            body: bytes = response.read()
        return body.decode()

    def _wait_until_healthy(self, timeout: float) -> None:
        # Some builds listen before the model is loaded and answer 503 until it is.
        import time

        deadline = time.monotonic() + timeout
        while True:
            try:
                self.get("/health")
                return
            except OSError as error:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self._fail(f"was not healthy: {error}")
            time.sleep(0.05)

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus counters (with ``--metrics``), e.g.
        ``llamacpp:tokens_predicted_total``."""
        lines = self.get("/metrics").splitlines()
        pairs = (line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))
        return {name: float(value) for name, value in pairs}

    def stop(self) -> None:
        import subprocess

        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def _llama(alias: str, *extra: str) -> Iterator[LlamaServer]:
    reason = llama_missing()
    if reason is not None:
        pytest.skip(reason)
    server = LlamaServer(alias, *extra)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def llama() -> Iterator[LlamaServer]:
    """llama.cpp serving chat completions (real tokenizer, usage, finish reasons, JSON schemas
    by grammar) with ``metrics()``."""
    yield from _llama("tiny", "--metrics")


@pytest.fixture(scope="session")
def llama_embed() -> Iterator[LlamaServer]:
    """llama.cpp serving 64-dimensional embeddings; inputs over 512 tokens fail with a 500."""
    yield from _llama("tiny-embed", "--embeddings", "--pooling", "mean")


_HOLD = """
import sys, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
print("holding", flush=True)
sys.stdin.read()
"""


class Reader:
    """Another process holding a DuckDB file open read-only, as the DuckDB CLI would: no
    one can write the file until :meth:`release`."""

    def __init__(self, path: Path):
        import subprocess
        import sys

        self.process = subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline() == "holding\n"

    def release(self) -> None:
        if self.process.poll() is None:
            self.process.communicate("")


@pytest.fixture
def hold() -> Iterator[Callable[[Path], Reader]]:
    """``reader = hold(path)``: a reader holding ``path`` until ``reader.release()`` (or the
    end of the test)."""
    readers: list[Reader] = []

    def start(path: Path) -> Reader:
        readers.append(Reader(path))
        return readers[-1]

    yield start
    for reader in readers:
        reader.release()


@pytest.fixture
def exporter() -> Iterator[Any]:
    """llm-ops's spans, kept in memory: a provider of the test's own, since OpenTelemetry's
    global one can be set once per process."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from llm_ops import _telemetry

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    _telemetry.use_tracer_provider(provider)
    yield exported
    _telemetry.use_tracer_provider(None)


@pytest.fixture
def metrics() -> Iterator[Any]:
    """llm-ops's metrics, read in memory (a meter provider of the test's own)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from llm_ops import _telemetry

    reader = InMemoryMetricReader()
    _telemetry.use_meter_provider(MeterProvider(metric_readers=[reader]))
    yield reader
    _telemetry.use_meter_provider(None)
