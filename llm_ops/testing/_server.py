"""A local OpenAI-compatible endpoint that simulates an LLM, for development, demos and tests.

It is not a model: every answer is a deterministic function of the request (see
:func:`expected_reply`), so a test can check that each row got the answer to its own prompt.

Per-request behaviour is set by directives inside the user message:

``[[sim:status=400]]``
    answer with this HTTP status and an OpenAI-shaped error body
``[[sim:latency=0.2]]``
    wait this many seconds before answering
``[[sim:fail_times=2]]`` (with optional ``[[sim:fail_status=503]]``, default 500)
    fail the first two requests carrying this exact prompt, then answer normally
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, cast

from aiohttp import web

_DIRECTIVE = re.compile(r"\[\[sim:(\w+)=([^\]]*)\]\]")
REPLY_WORDS = 12


@dataclass
class SimulatorConfig:
    """How the simulated endpoint behaves.

    Attributes
    ----------
    latency
        Seconds every answer waits before it is sent.
    api_key
        When set, requests without ``Authorization: Bearer <api_key>`` get HTTP 401.
    """

    latency: float = 0.0
    api_key: str | None = None


def _user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def _digest(messages: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()


def reply_for(
    messages: list[dict[str, Any]], *, model: str, max_tokens: int | None = None
) -> tuple[str, str, int]:
    """The simulator's answer: ``(text, finish_reason, completion_tokens)``.

    The text names the model, carries a digest of all the messages and echoes the first
    words of the last user message; one word is one token.
    """
    words = [f"{model}", f"#{_digest(messages)[:8]}:", *_user_text(messages).split()[:REPLY_WORDS]]
    if max_tokens is not None and len(words) > max_tokens:
        return " ".join(words[:max_tokens]), "length", max_tokens
    return " ".join(words), "stop", len(words)


def expected_reply(
    prompt: str, *, model: str, system: str | None = None, max_tokens: int | None = None
) -> str:
    """The text the simulator answers to ``prompt`` (and ``system``), for assertions.

    Examples
    --------
    >>> expected_reply("Summarize: nice dress", model="sim")
    'sim #c61cbfec: Summarize: nice dress'
    """
    messages = [{"role": "user", "content": prompt}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return reply_for(messages, model=model, max_tokens=max_tokens)[0]


def _estimate_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content", ""))) for m in messages) // 4 + 4 * len(messages)


def _error(status: int, message: str, kind: str, code: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status)


class Simulator:
    """The request handlers and the counters they keep."""

    def __init__(self, config: SimulatorConfig):
        self.config = config
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.by_status: Counter[int] = Counter()
        self.prompts: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0

    def stats(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "distinct_prompts": len(self.prompts),
            "max_prompt_repeats": max(self.prompts.values(), default=0),
            "max_in_flight": self.max_in_flight,
            "config": asdict(self.config),
        }

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/_sim/stats", self.get_stats)
        app.router.add_post("/_sim/reset", self.post_reset)
        return app

    async def get_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def post_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response(self.stats())

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "sim", "object": "model", "owned_by": "llm-ops"}]}
        )

    async def chat_completions(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            response = await self._answer(request)
        finally:
            self.in_flight -= 1
        self.by_status[response.status] += 1
        return response

    async def _answer(self, request: web.Request) -> web.Response:
        key = self.config.api_key
        if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
            return _error(401, "Incorrect API key provided.", "invalid_request_error",
                              "invalid_api_key")
        try:
            body = json.loads(await request.read())
            model = body["model"]
            messages = body["messages"]
        except (ValueError, KeyError, TypeError):
            return _error(400, "body must be JSON with 'model' and 'messages'",
                          "invalid_request_error")
        text = _user_text(messages)
        digest = _digest(messages)
        self.prompts[digest] += 1
        directives = dict(_DIRECTIVE.findall(text))
        latency = float(directives.get("latency", self.config.latency))
        if latency > 0:
            await asyncio.sleep(latency)
        if "status" in directives:
            status = int(directives["status"])
            return _error(status, f"simulated error {status}", "invalid_request_error")
        if self.prompts[digest] <= int(directives.get("fail_times", 0)):
            status = int(directives.get("fail_status", 500))
            return _error(status, f"simulated transient error {status}", "server_error")
        reply, finish_reason, completion_tokens = reply_for(
            messages, model=model, max_tokens=body.get("max_tokens")
        )
        prompt_tokens = _estimate_tokens(messages)
        return web.json_response(
            {
                "id": f"chatcmpl-sim-{self.requests}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": reply},
                        "finish_reason": finish_reason,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )


async def serve(config: SimulatorConfig, *, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve until cancelled; prints ``listening on <base_url>`` once the socket is bound."""
    runner = web.AppRunner(Simulator(config).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    server = cast(asyncio.Server, site._server)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on http://{host}:{bound}/v1", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
