"""A JSON-lines echo API and its dialect, to show a dialect plugs in from outside the package.

The API is nothing like OpenAI's: a request is ``POST /say`` with ``{"who": model, "lines":
[...], "budget": n}`` and the key in ``X-Echo-Key``; its answer is JSON lines, one event a line
(``{"event": "text", "value": ...}``, then ``stop`` and ``spent``); its rate limit is in
``Echo-Per-Minute``; an error is ``{"trouble": ..., "again": bool}``. Batches and embeddings
are not spoken.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from llm_ops._dialects import (
    BatchResult,
    ErrorReading,
    HeardLimit,
    HeardLimits,
    MalformedAnswer,
    Reply,
    Vectors,
)

ECHO_KEY = "echo-secret"


class EchoDialect:
    name = "echo"
    stop_field = "stop"
    completions_path = "say"
    embeddings_path = "embed"
    batch_path = "say"
    models_path = "who"  # the echo API lists none: any model is taken

    def headers(self, api_key: str) -> dict[str, str]:
        return {"X-Echo-Key": api_key, "Content-Type": "application/json"}

    def completion_body(self, request: Mapping[str, Any]) -> dict[str, Any]:
        body = {
            "who": request["model"],
            "lines": [message["content"] for message in request["messages"]],
            "budget": request.get("max_tokens"),
        }
        asked = request.get("response_format")  # the canonical request's structured output
        if asked is not None:
            body.update(self.structured_output(**asked["json_schema"]))
        return body

    def structured_output(self, name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
        return {"shape": {"called": name, "fields": sorted(schema.get("properties", {}))}}

    def image_part(self, url: str, detail: str | None = None) -> dict[str, Any]:
        return {"picture": url}

    def file_part(self, data: str, filename: str | None = None) -> dict[str, Any]:
        return {"document": data}

    def embeddings_body(
        self, model: str, inputs: list[str], params: Mapping[str, Any]
    ) -> dict[str, Any]:
        raise NotImplementedError("the echo API has no embeddings")

    def read_models(self, payload: bytes) -> frozenset[str]:
        return frozenset()

    def read_completion(self, payload: bytes) -> Reply:
        try:
            events = {e["event"]: e["value"] for e in map(json.loads, payload.splitlines())}
            stop, spent = events["stop"], events["spent"]
        except (ValueError, KeyError, TypeError) as exc:
            raise MalformedAnswer(str(exc)) from exc
        return Reply(
            text=events.get("text"),
            stop="length" if stop == "cut" else "done" if stop == "end" else "unfinished",
            stop_reason=stop,
            usage=(spent["in"], spent["out"], 0, 0),
        )

    def read_embeddings(self, payload: bytes) -> Vectors:
        raise MalformedAnswer("the echo API has no embeddings")

    def heard_limits(self, headers: Mapping[str, str]) -> HeardLimits:
        per_minute = headers.get("echo-per-minute")
        if per_minute is None:
            return HeardLimits()
        return HeardLimits(requests=HeardLimit(per_minute=float(per_minute)))

    def read_error(self, status: int, payload: bytes) -> ErrorReading:
        said = json.loads(payload)
        if status == 401:
            return ErrorReading("credentials", said["trouble"])
        return ErrorReading("retryable" if said["again"] else "rejected", said["trouble"])

    def batch_line(self, key: str, body: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError("the echo API has no batches")

    def batch_request(self, line: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError("the echo API has no batches")

    def batch_result(self, line: Mapping[str, Any]) -> BatchResult:
        raise NotImplementedError("the echo API has no batches")


ECHO = EchoDialect()


def echoed(prompt: str) -> str:
    """What the echo API answers to ``prompt``."""
    return prompt.upper()


class EchoServer:
    """The echo API on 127.0.0.1, on an event loop in a thread of its own. ``refuse_first``
    answers that many requests with a 503 to be retried."""

    def __init__(self, refuse_first: int = 0) -> None:
        self.refuse_first = refuse_first
        self.requests: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def __enter__(self) -> EchoServer:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _start(self) -> int:
        app = web.Application()
        app.router.add_post("/api/say", self._say)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    async def _say(self, request: web.Request) -> web.Response:
        if request.headers.get("X-Echo-Key") != ECHO_KEY:
            return web.json_response({"trouble": "who are you?", "again": False}, status=401)
        asked = await request.json()
        self.requests.append(asked)
        if len(self.requests) <= self.refuse_first:
            return web.json_response({"trouble": "busy", "again": True}, status=503)
        prompt = asked["lines"][-1]
        events = [
            {"event": "text", "value": echoed(prompt)},
            {"event": "stop", "value": "end"},
            {"event": "spent", "value": {"in": len(prompt.split()), "out": 1}},
        ]
        body = "".join(json.dumps(event) + "\n" for event in events)
        return web.Response(
            text=body, content_type="application/jsonl", headers={"Echo-Per-Minute": "6000"}
        )
