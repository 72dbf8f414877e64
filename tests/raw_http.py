"""Servers on 127.0.0.1 that answer with exact bytes, as real servers, proxies and TLS
terminators may: each way an answer can be framed, broken, split or routed is seen on the
wire. Each runs its own event loop in a thread, so sync jobs and async tests use it alike."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
DROP = b""  # the server closes the connection instead of answering
HANG = b"-"  # the server never answers

Answer = bytes | list[bytes]
"""What the server writes: bytes, or pieces written one after another with a pause between, so
the client reads them in separate reads."""


class RawServer:
    """A server answering the n-th request with ``answers[n]`` (the last one again once they
    run out), or with ``respond(request)``; it records every request and connection.

    ``close_after_each``: close the connection after each answer; ``tls``: an
    :class:`ssl.SSLContext` to serve with; ``host``/``port``: where to listen.
    """

    def __init__(
        self,
        *answers: Answer,
        respond: Callable[[bytes], Answer] | None = None,
        close_after_each: bool = False,
        tls: ssl.SSLContext | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        self.answers = list(answers)
        self.respond = respond
        self.close_after_each = close_after_each
        self.tls = tls
        self.host, self.port = host, port
        self.requests: list[bytes] = []
        self.answered = 0  # answers written to their last byte
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> RawServer:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        self.server = started.result(10)
        self.port = self.server.sockets[0].getsockname()[1]
        scheme = "https" if self.tls else "http"
        self.base_url = f"{scheme}://{self.host}:{self.port}/v1"
        self.url = f"{self.base_url}/chat/completions"
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self.server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._serve, self.host, self.port, ssl=self.tls)

    def _next(self, request: bytes) -> Answer:
        if self.respond is not None:
            return self.respond(request)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                request = await read_request(reader)
                self.requests.append(request)
                answer = self._next(request)
                if answer == DROP:
                    break
                if answer == HANG:
                    await asyncio.sleep(3600)
                for piece in [answer] if isinstance(answer, bytes) else answer:
                    writer.write(piece)
                    await writer.drain()
                    if not isinstance(answer, bytes):
                        await asyncio.sleep(0.01)
                self.answered += 1
                if self.close_after_each:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        writer.close()

    @property
    def posts(self) -> int:
        """The requests that asked for a completion."""
        return sum(1 for request in self.requests if request.startswith(b"POST "))


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


_ids = itertools.count()


def completion(text: str = "fine") -> bytes:
    """The JSON body of a chat completion answering ``text``, with an id of its own, as a real
    server's answers have: an answer read twice is a copy (see ``RecentAnswers``)."""
    return json.dumps(
        {
            "id": f"chatcmpl-{next(_ids)}",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
    ).encode()


def with_length(body: bytes, status: str = "200 OK") -> bytes:
    return b"HTTP/1.1 %b\r\nContent-Length: %d\r\n\r\n%b" % (status.encode(), len(body), body)


def chunked(*chunks: bytes) -> bytes:
    """A chunked answer's head and its chunks, up to the last chunk's size line."""
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(
        b"%x\r\n%b\r\n" % (len(chunk), chunk) for chunk in chunks
    )


def endpoint(answer: Callable[[bytes], Answer]) -> Callable[[bytes], Answer]:
    """``respond`` for an OpenAI-compatible endpoint: ``/models`` is not served (so any model
    is trusted); every completion is answered by ``answer(request)``."""

    def respond(request: bytes) -> Answer:
        if request.startswith(b"GET "):
            return with_length(b'{"error": {"message": "no"}}', "404 Not Found")
        return answer(request)

    return respond


class Proxy(RawServer):
    """A forward proxy on 127.0.0.1: it forwards plain requests and tunnels ``CONNECT``
    requests, recording their heads; with ``credentials`` ("user:password") it answers 407 to
    a request without them."""

    def __init__(self, credentials: str | None = None) -> None:
        super().__init__()
        self.credentials = credentials
        self.heads: list[bytes] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _allowed(self, head: bytes) -> bool:
        if self.credentials is None:
            return True
        token = base64.b64encode(self.credentials.encode()).lower()
        return b"\r\nproxy-authorization: basic " + token in head.lower()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_request(reader)
        self.heads.append(head)
        if not self._allowed(head):
            writer.write(
                b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n"
                b"Content-Length: 0\r\n\r\n"
            )
            await writer.drain()
            writer.close()
            return
        target = head.split(b" ")[1].decode()
        tunnel = head.startswith(b"CONNECT ")
        host, port = (target if tunnel else target.split("/")[2]).rsplit(":", 1)
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        if tunnel:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            upstream_writer.write(head)
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    writer.close()


@contextmanager
def unanswering(host: str, port: int) -> Iterator[None]:
    """A listener on ``host:port`` that never completes a connection: its queue of pending
    connections is full, so new ones wait for an answer that never comes, as behind a
    firewall that drops packets."""
    listener = socket.socket()
    listener.bind((host, port))
    listener.listen(0)
    filler = socket.create_connection((host, port))  # a queue of none is full with one
    try:
        yield
    finally:
        filler.close()
        listener.close()


def addresses(name: str, *hosts: str) -> Callable[..., Iterable[Any]]:
    """A ``socket.getaddrinfo`` under which ``name`` resolves to ``hosts``, in this order."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Iterable[Any]:
        if host != name:
            return real(host, port, *args, **kwargs)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port))) for address in hosts
        ]

    return getaddrinfo


def _linger(connection: socket.socket) -> None:
    """Close as nginx's lingering close does: what the client sent meanwhile (its request,
    right after its side of a TLS 1.3 handshake) is read first, so the close comes after the
    alert as a FIN, never as a reset that can reach the client before the alert is read."""
    with suppress(OSError):
        connection.shutdown(socket.SHUT_WR)  # a TLS socket's: plain TCP from here on
        connection.settimeout(2.0)
        while connection.recv(65536):
            pass
    connection.close()


@contextmanager
def tls_handshakes(context: ssl.SSLContext) -> Iterator[int]:
    """A TLS server (its port) that only shakes hands, on blocking sockets: unlike asyncio's,
    they send the alert that ends a failed handshake, as nginx or OpenSSL's servers do."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed
                return
            tls = context.wrap_socket(connection, server_side=True, do_handshake_on_connect=False)
            with suppress(ssl.SSLError, OSError):
                tls.do_handshake()
                tls.recv(1)
            _linger(tls)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
