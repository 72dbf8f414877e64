"""The hot path's HTTP client on real sockets of 127.0.0.1: servers that answer with exact
bytes, so each way an answer can be framed, broken or routed is seen on the wire."""

from __future__ import annotations

import asyncio
import gzip
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trustme
from yarl import URL

from llm_ops import ConfigError
from llm_ops._engine.boundary import BadBody, ConnectionFailed, CouldNotConnect, TimedOut
from llm_ops._engine.transport import Answer, Transport

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
DROP = b""  # the server closes the connection instead of answering
HANG = b"-"  # the server never answers


class Scripted:
    """A server on 127.0.0.1 answering the n-th request with ``answers[n]`` (bytes, sent as
    they are; :data:`DROP` closes the connection, :data:`HANG` never answers), that records
    what it received."""

    def __init__(self, *answers: bytes, close_after_each: bool = False, tls: Any = None):
        self.answers = list(answers)
        self.close_after_each = close_after_each
        self.tls = tls
        self.requests: list[bytes] = []
        self.connections = 0

    async def __aenter__(self) -> Scripted:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self.server.sockets[0].getsockname()[1]
        scheme = "https" if self.tls else "http"
        self.url = URL(f"{scheme}://127.0.0.1:{self.port}/v1/chat/completions")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                self.requests.append(await read_request(reader))
                answer = self.answers.pop(0)
                if answer == DROP:
                    break
                if answer == HANG:
                    await asyncio.sleep(3600)
                writer.write(answer)
                await writer.drain()
                if self.close_after_each:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


def run(test: Callable[[Transport], Awaitable[None]], url: str = "http://127.0.0.1/") -> None:
    async def main() -> None:
        transport = Transport(limit=4, headers={"Authorization": "Bearer k"}, base_url=url)
        try:
            await test(transport)
        finally:
            await transport.close()

    asyncio.run(main())


async def post(transport: Transport, url: URL, *, max_bytes: int = 1000) -> Answer:
    return await transport.request("POST", url, b'{"a": 1}', 5.0, max_bytes)


def test_a_request_carries_its_headers_and_body():
    async def test(transport: Transport) -> None:
        async with Scripted(OK) as server:
            await post(transport, server.url)
        head, body = server.requests[0].split(b"\r\n\r\n")
        assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert b"\r\nAuthorization: Bearer k\r\nAccept-Encoding: gzip, deflate\r\n" in head
        assert b"\r\nContent-Length: 8" in head and body == b'{"a": 1}'

    run(test)


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "clé"])
def test_a_header_http_cannot_carry_is_refused_before_anything_is_sent(value):
    with pytest.raises(ConfigError, match="X-Team"):
        Transport(limit=1, headers={"X-Team": value}, base_url="http://127.0.0.1/")


def test_a_proxy_llm_ops_cannot_speak_to_is_refused_before_anything_is_sent(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "socks5://user:secret@proxy.example:1080")
    with pytest.raises(ConfigError, match="not an http:// proxy") as refused:
        Transport(limit=1, headers={}, base_url="https://api.example/v1")
    assert "secret" not in str(refused.value)


def test_answers_keep_their_connection_alive():
    async def test(transport: Transport) -> None:
        async with Scripted(OK, OK) as server:
            answers = [await post(transport, server.url) for _ in range(2)]
        assert [a.body for a in answers] == [b"ok", b"ok"] and server.connections == 1

    run(test)


def test_header_names_are_lower_case_and_repeats_joined():
    answer = b"HTTP/1.1 429 Slow\r\nRetry-After: 2\r\nVia: a\r\nVIA: b\r\nContent-Length: 0\r\n\r\n"

    async def test(transport: Transport) -> None:
        async with Scripted(answer) as server:
            got = await post(transport, server.url)
        assert got.status == 429 and got.headers == {
            "retry-after": "2",
            "via": "a, b",
            "content-length": "0",
        }

    run(test)


def test_a_chunked_answer_is_put_together():
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"
    )

    async def test(transport: Transport) -> None:
        async with Scripted(chunked, OK) as server:
            first, second = await post(transport, server.url), await post(transport, server.url)
        assert (first.body, second.body, server.connections) == (b"abcde", b"ok", 1)

    run(test)


def test_an_answer_without_a_length_ends_with_its_connection():
    async def test(transport: Transport) -> None:
        unframed = b"HTTP/1.1 200 OK\r\n\r\nall of it"
        async with Scripted(unframed, close_after_each=True) as server:
            assert (await post(transport, server.url)).body == b"all of it"

    run(test)


def test_an_informational_answer_is_read_past():
    async def test(transport: Transport) -> None:
        async with Scripted(b"HTTP/1.1 100 Continue\r\n\r\n" + OK) as server:
            assert (await post(transport, server.url)).status == 200

    run(test)


def test_connection_close_is_honoured():
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"

    async def test(transport: Transport) -> None:
        async with Scripted(closing, OK) as server:
            await post(transport, server.url)
            await post(transport, server.url)
        assert server.connections == 2

    run(test)


def test_a_connection_the_server_closed_while_idle_is_not_reused():
    async def test(transport: Transport) -> None:
        async with Scripted(OK, OK, close_after_each=True) as server:
            await post(transport, server.url)
            await asyncio.sleep(0.05)  # the server's close arrives
            assert (await post(transport, server.url)).body == b"ok"
        assert server.connections == 2

    run(test)


def test_gzip_is_inflated():
    body = gzip.compress(b'{"x": 1}')
    answer = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%b"

    async def test(transport: Transport) -> None:
        async with Scripted(answer % (len(body), body)) as server:
            assert (await post(transport, server.url)).body == b'{"x": 1}'

    run(test)


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (DROP, "closed the connection before answering"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf", "in the middle of its answer"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "malformed Content-Length"),
        (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20_000, "head is longer than"),
    ],
)
def test_a_broken_answer_is_a_connection_failure(answer, error):
    async def test(transport: Transport) -> None:
        async with Scripted(answer, close_after_each=True) as server:
            with pytest.raises(ConnectionFailed, match=error):
                await post(transport, server.url)

    run(test)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" + b"x" * 2048 + b"\r\n",
    ],
)
def test_a_body_over_the_bound_is_not_read(answer):
    async def test(transport: Transport) -> None:
        async with Scripted(answer, close_after_each=True) as server:
            with pytest.raises(BadBody, match="larger than 1,000 bytes"):
                await post(transport, server.url)

    run(test)


def test_a_server_that_does_not_answer_times_out():
    async def test(transport: Transport) -> None:
        async with Scripted(HANG) as server:
            with pytest.raises(TimedOut, match=r"after 0\.2s"):
                await transport.request("POST", server.url, b"{}", 0.2, 1000)

    run(test)


def test_a_port_nobody_listens_on_is_a_connection_not_made():
    async def test(transport: Transport) -> None:
        async with Scripted() as server:
            url = server.url
        with pytest.raises(CouldNotConnect):
            await post(transport, url)

    run(test)


class Proxy:
    """A forward proxy on 127.0.0.1: it answers plain requests itself (recording them) and
    tunnels ``CONNECT`` requests to their target."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []

    async def __aenter__(self) -> Proxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://user:pw@127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_request(reader)
        self.heads.append(head)
        if not head.startswith(b"CONNECT "):
            writer.write(OK)
            await writer.drain()
            writer.close()
            return
        host, port = head.split(b" ")[1].decode().split(":")
        target_reader, target_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(pipe(reader, target_writer), pipe(target_reader, writer))


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    writer.close()


def test_an_http_proxy_gets_the_whole_url_and_its_credentials(monkeypatch):
    async def test() -> None:
        async with Proxy() as proxy:
            monkeypatch.setenv("HTTP_PROXY", proxy.url)
            target = URL("http://api.example:8080/v1/chat/completions")
            transport = Transport(limit=1, headers={}, base_url=str(target))
            answer = await post(transport, target)
            await transport.close()
        assert answer.body == b"ok"
        head = proxy.heads[0]
        assert head.startswith(b"POST http://api.example:8080/v1/chat/completions HTTP/1.1\r\n")
        assert b"\r\nHost: api.example:8080\r\n" in head
        assert b"\r\nProxy-Authorization: Basic dXNlcjpwdw==\r\n" in head

    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    asyncio.run(test())


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


def trusting(authority: trustme.CA) -> Callable[[], ssl.SSLContext]:
    def context() -> ssl.SSLContext:
        client = ssl.create_default_context()
        authority.configure_trust(client)
        return client

    return context


def serving(authority: trustme.CA) -> ssl.SSLContext:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server)
    return server


def test_https_verifies_the_servers_certificate(authority):
    async def test() -> None:
        async with Scripted(OK, tls=serving(authority)) as server:
            trusted = Transport(
                limit=1, headers={}, base_url=str(server.url), tls=trusting(authority)
            )
            assert (await post(trusted, server.url)).body == b"ok"
            await trusted.close()
            untrusted = Transport(limit=1, headers={}, base_url=str(server.url))
            with pytest.raises(CouldNotConnect, match="CERTIFICATE_VERIFY_FAILED"):
                await post(untrusted, server.url)
            await untrusted.close()

    asyncio.run(test())


def test_https_through_a_proxy_goes_through_a_tunnel(authority, monkeypatch):
    async def test() -> None:
        async with Scripted(OK, tls=serving(authority)) as server, Proxy() as proxy:
            monkeypatch.setenv("HTTPS_PROXY", proxy.url)
            transport = Transport(
                limit=1, headers={}, base_url=str(server.url), tls=trusting(authority)
            )
            answer = await post(transport, server.url)
            await transport.close()
        assert answer.body == b"ok"
        assert proxy.heads[0].startswith(f"CONNECT 127.0.0.1:{server.port} HTTP/1.1".encode())
        assert server.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")

    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    asyncio.run(test())
