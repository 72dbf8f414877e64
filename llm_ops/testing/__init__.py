"""A local OpenAI-compatible endpoint for development, demos and tests.

This is a **simulator**, not a model: it answers ``/v1/chat/completions`` with a deterministic
function of the request (:func:`expected_reply`) and fills in ``usage``, so pipelines can be run,
tested and benchmarked on a laptop with no network, no GPU and no API key.

Start it from Python::

    from llm_ops.testing import LocalEndpoint

    with LocalEndpoint() as endpoint:
        df.pipe(llm_complete, prompt="...", model="sim", base_url=endpoint.base_url)
        endpoint.stats()["requests"]

or from a shell: ``python -m llm_ops.testing --port 8765``.

:data:`PRESETS` are servers with a knee (continuous batching over a fixed number of slots), for
trying how a job's concurrency meets one: ``LocalEndpoint(**PRESETS["gpu"])``, or
``python -m llm_ops.testing --preset llama.cpp``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from dataclasses import asdict
from types import TracebackType
from typing import Any

from ._reading import (
    JUDGMENTS,
    distinct_facts,
    embed,
    expected_reasoning,
    facts_in,
    latent_entity,
    latent_score,
    media_tag,
)
from ._server import (
    BASE_PATHS,
    FAULT_KINDS,
    PRESETS,
    Simulator,
    SimulatorConfig,
    expected_reply,
    reply_for,
    serve,
    structured_reply,
)

__all__ = [
    "BASE_PATHS",
    "DEFAULT_PORT",
    "FAULT_KINDS",
    "JUDGMENTS",
    "PRESETS",
    "LocalEndpoint",
    "Simulator",
    "SimulatorConfig",
    "distinct_facts",
    "embed",
    "expected_reasoning",
    "expected_reply",
    "facts_in",
    "latent_entity",
    "latent_score",
    "media_tag",
    "reply_for",
    "serve",
    "structured_reply",
]

DEFAULT_PORT = 8765
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class LocalEndpoint:
    """The simulator running in its own process on 127.0.0.1, as a context manager.

    Parameters
    ----------
    port
        Port to bind; 0 picks a free one.
    **config
        Fields of :class:`SimulatorConfig`: ``latency``, ``rpm``, ``fault_rate``, ``api_key``,
        ``judge_error``, ``context_tokens``, ...
    """

    name = "llm-ops-simulator"
    """The simulator's name for cache keys (``Endpoint(url, name=...)``): its answers are
    cached under this name, not its URL, so they hit again whatever port it runs on next
    time."""

    def __init__(self, *, port: int = 0, **config: Any):
        self.config = SimulatorConfig(**config)
        self.port = port
        self._process: subprocess.Popen[str] | None = None
        self.root = ""  # http://127.0.0.1:PORT, once started

    def start(self, timeout: float = 30.0) -> LocalEndpoint:
        """Start the server process and wait until it accepts connections (once)."""
        if self._process is not None:
            return self
        command = [
            sys.executable,
            "-m",
            "llm_ops.testing",
            "--port",
            str(self.port),
            "--config",
            json.dumps(asdict(self.config)),
        ]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self._stdout().readline()))
        reader.start()
        reader.join(timeout)
        if not line or not line[0].startswith("listening on "):
            self.stop()
            raise RuntimeError(
                f"the local endpoint did not start on port {self.port} (is it in use?)"
            )
        parts = urllib.parse.urlsplit(line[0].split()[-1])
        self.root = f"{parts.scheme}://{parts.netloc}"  # the /_sim/ calls' (any dialect's)
        return self

    @property
    def base_url(self) -> str:
        """The base URL of the configured dialect's API, as its SDK takes it (see
        :attr:`SimulatorConfig.dialect`): every dialect's paths are served all the same."""
        return self.root + BASE_PATHS[self.config.dialect] if self.root else ""

    def _stdout(self) -> Any:
        assert self._process is not None and self._process.stdout is not None
        return self._process.stdout

    def stats(self) -> dict[str, Any]:
        """Counters since start or the last :meth:`reset`: requests, by_status, ..."""
        return self._call("GET", "stats")

    def reset(self) -> dict[str, Any]:
        """Zero the counters."""
        return self._call("POST", "reset")

    def configure(self, **config: Any) -> None:
        """Replace the running server's behaviour: unnamed fields take their defaults."""
        self.config = SimulatorConfig(**config)
        self._call("POST", "config", asdict(self.config))  # base_url: the dialect's now

    def _call(self, method: str, control: str, payload: Any = None) -> dict[str, Any]:
        root = self.root
        data = json.dumps(payload).encode() if method == "POST" else None
        request = urllib.request.Request(f"{root}/_sim/{control}", method=method, data=data)
        with _NO_PROXY.open(request, timeout=10) as response:
            result: dict[str, Any] = json.load(response)
        return result

    def stop(self) -> None:
        """Stop the server process."""
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            if self._process.stdout is not None:
                self._process.stdout.close()
            self._process = None

    def __enter__(self) -> LocalEndpoint:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
