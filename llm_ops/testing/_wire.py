"""The seam between the simulator and the dialects it speaks besides OpenAI's.

:class:`Wire` is what a dialect's call gives the simulator's chat answers; :class:`ChatHost`
is what a dialect's routes (:mod:`llm_ops.testing._anthropic`,
:mod:`llm_ops.testing._gemini`) use of the simulator that serves them. Both are protocols, so
the dialects' modules need not import :mod:`llm_ops.testing._server`, which imports them: the
imports of the simulator's package run one way, down.
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web


class Wire(Protocol):
    """Another API's dialect over the simulator's chat answers (see
    :mod:`llm_ops.testing._gemini`): it refuses a request's key its own way, reads its body
    into the OpenAI-shaped one :meth:`Simulator._reply` answers, and writes the answer back
    in its own shape."""

    def refuse_key(self) -> web.Response | None: ...

    def read(self, raw: bytes) -> dict[str, Any] | web.Response: ...

    def written(self, response: web.StreamResponse) -> web.StreamResponse: ...


class DialectSettings(Protocol):
    """The settings of the simulator (``SimulatorConfig``) a dialect's routes read."""

    @property
    def api_key(self) -> str | None: ...

    @property
    def models(self) -> tuple[str, ...]: ...

    @property
    def reasoning_models(self) -> tuple[str, ...]: ...

    @property
    def ignore_dimensions(self) -> bool: ...

    @property
    def embed_noise(self) -> float: ...


class ChatHost(Protocol):
    """The simulator (``Simulator``) as a dialect's routes use it: its settings, the header
    names it has seen, its embedding counters, and its chat answers behind a :class:`Wire`."""

    embedding_requests: int
    embedding_inputs: int

    @property
    def config(self) -> DialectSettings: ...

    @property
    def header_names(self) -> set[str]: ...

    async def chat_completions(
        self, request: web.Request, wire: Wire | None = None
    ) -> web.StreamResponse: ...
