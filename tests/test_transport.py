"""The hot path's HTTP client on real sockets of 127.0.0.1, against servers that answer with
exact bytes (:mod:`raw_http`): where aiohttp and httpx read an answer, so does llm-ops; where
they refuse it, llm-ops raises, and never makes an answer up."""

from __future__ import annotations

import asyncio
import gzip
import socket
import ssl
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable

import pytest
import trustme
from raw_http import (
    DROP,
    HANG,
    OK,
    Proxy,
    RawServer,
    addresses,
    chunked,
    tls_handshakes,
    unanswering,
    with_length,
)
from yarl import URL

from llm_ops import ConfigError, HttpAnswer
from llm_ops._engine.boundary import (
    BadBody,
    ConnectionFailed,
    CouldNotConnect,
    Malformed,
    Refused,
    TimedOut,
)
from llm_ops._engine.transport import RecentAnswers, Transport


def post(url: str, *, max_bytes: int = 1000, timeout: float = 5.0, **options: object) -> HttpAnswer:
    """One POST through a new transport, closed after."""
    return exchange(lambda transport: post_on(transport, url, max_bytes, timeout), url, **options)


def exchange(
    test: Callable[[Transport], Awaitable[HttpAnswer]], url: str, **options: object
) -> HttpAnswer:
    async def main() -> HttpAnswer:
        transport = Transport(
            limit=4, headers={"Authorization": "Bearer k"}, base_url=url, **options
        )
        try:
            return await test(transport)
        finally:
            await transport.close()

    return asyncio.run(main())


async def post_on(
    transport: Transport, url: str, max_bytes: int = 1000, timeout: float = 5.0
) -> HttpAnswer:
    return await transport.request("POST", URL(url), b'{"a": 1}', timeout, max_bytes)


def twice(url: str) -> list[HttpAnswer]:
    async def both(transport: Transport) -> list[HttpAnswer]:
        return [await post_on(transport, url) for _ in range(2)]

    result: list[HttpAnswer] = []

    async def keep(transport: Transport) -> HttpAnswer:
        result.extend(await both(transport))
        return result[0]

    exchange(keep, url)
    return result


def test_a_request_carries_its_headers_and_body():
    with RawServer(OK) as server:
        post(server.url)
    head, body = server.requests[0].lower().split(b"\r\n\r\n")
    assert head.startswith(b"post /v1/chat/completions http/1.1\r\n")
    assert b"\r\nauthorization: bearer k\r\n" in head
    assert b"\r\naccept-encoding: gzip, deflate\r\n" in head
    assert b"\r\ncontent-length: 8\r\n" in head and body == b'{"a": 1}'


def test_answers_keep_their_connection_alive():
    with RawServer(OK) as server:
        answers = twice(server.url)
    assert [a.body for a in answers] == [b"ok", b"ok"] and server.connections == 1


def test_header_names_are_read_in_any_case():
    answer = b"HTTP/1.1 429 Slow\r\nRetry-After: 2\r\nContent-Length: 0\r\n\r\n"
    with RawServer(answer) as server:
        got = post(server.url)
    assert got.status == 429 and got.headers["retry-after"] == "2"


def test_a_chunked_answer_is_put_together():
    with RawServer(chunked(b"abc", b"de") + b"0\r\n\r\n") as server:
        assert post(server.url).body == b"abcde"


@pytest.mark.parametrize(
    "pieces",
    [
        [chunked(b"ok") + b"0\r\n", b"\r\n"],  # the final CRLF in a later read
        [chunked(b"ok") + b"0\r\n", b"X-Trailer: 1\r\n", b"\r\n"],  # trailers too
        [chunked(b"ok")[:-3], b"k\r\n0\r", b"\n\r\n"],  # inside a chunk and a size line
    ],
)
def test_a_chunked_answer_read_in_pieces_is_put_together(pieces):
    with RawServer(pieces) as server:
        assert post(server.url).body == b"ok"


def test_a_body_sent_a_byte_at_a_time_is_read():
    answer = with_length(b"0123456789")
    with RawServer([answer[:-10], *(bytes([b]) for b in answer[-10:])]) as server:
        assert post(server.url).body == b"0123456789"


@pytest.mark.parametrize(
    "answer",
    [
        chunked(b"ok") + b"-2\r\nxx\r\n0\r\n\r\n",  # a negative size
        chunked(b"ok") + b"-7fffffffffffffff\r\n" + b"x" * 2000 + b"\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX0\r\n\r\n",
    ],
    ids=["negative", "negative-huge", "0x-size", "no-crlf-after-data"],
)
def test_a_malformed_chunk_is_refused(answer):
    with RawServer(answer, close_after_each=True) as server, pytest.raises(Malformed):
        post(server.url, max_bytes=1000)


def test_one_byte_chunks_take_memory_in_proportion_to_their_bytes():
    size = 2**18  # our own parser held 160 bytes for each byte sent so
    answer = chunked() + b"1\r\nx\r\n" * size + b"0\r\n\r\n"
    with RawServer(answer) as server:
        tracemalloc.start()
        try:
            body = post(server.url, max_bytes=size, timeout=60).body
            _, peak = tracemalloc.get_traced_memory()  # the server's copies included
        finally:
            tracemalloc.stop()
    assert len(body) == size and peak < 48 * size


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",  # bare LF line ends
        b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\nok",  # obs-fold
    ],
    ids=["bare-lf", "obs-fold"],
)
def test_a_lenient_head_is_read_as_aiohttp_reads_it(answer):
    with RawServer(answer) as server:
        assert post(server.url).body == b"ok"


def test_an_answer_without_a_length_ends_with_its_connection():
    with RawServer(b"HTTP/1.1 200 OK\r\n\r\nall of it", close_after_each=True) as server:
        assert post(server.url).body == b"all of it"


def test_an_informational_answer_is_read_past():
    with RawServer(b"HTTP/1.1 100 Continue\r\n\r\n" + OK) as server:
        assert post(server.url).status == 200


def test_connection_close_is_honoured():
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    with RawServer(closing, OK) as server:
        twice(server.url)
    assert server.connections == 2


def test_a_reused_connection_reset_before_its_answer_is_replaced_once():
    with RawServer(OK, DROP, OK) as server:
        answers = twice(server.url)
    assert [a.body for a in answers] == [b"ok", b"ok"]
    assert (server.posts, server.connections) == (3, 2)


def answered_twice(number: int) -> list[bytes]:
    """The ``number``-th answer, written twice with a pause between, as a broken server may."""
    answer = with_length(b'{"id": "a%d"}' % number)
    return [answer, answer]


def posts_in_turn(url: str, *, recent: RecentAnswers | None, after=None) -> list[bytes]:
    """The bodies of two POSTs on one transport, one after the other (``after``: awaited in
    between)."""

    async def both(transport: Transport) -> list[bytes]:
        first = await transport.request("POST", URL(url), b"{}", 5.0, 1000, recent=recent)
        if after is not None:
            await after()
        second = await transport.request("POST", URL(url), b"{}", 5.0, 1000, recent=recent)
        return [first.body, second.body]

    bodies: list[bytes] = []

    async def keep(transport: Transport) -> HttpAnswer:
        bodies.extend(await both(transport))
        return HttpAnswer(200, {}, b"")

    exchange(keep, url)
    return bodies


def test_a_copy_of_an_answer_is_not_taken_for_the_next_requests():
    answers = iter(range(10))
    with RawServer(respond=lambda request: answered_twice(next(answers))) as server:
        bodies = posts_in_turn(server.url, recent=RecentAnswers())
    assert server.posts > 1  # the second request was sent after the copy came
    # which of the later posts the server numbered first depends on its threads, not the client
    later = [b'{"id": "a%d"}' % n for n in range(1, server.posts)]
    assert bodies[0] == b'{"id": "a0"}' and bodies[1] in later


def test_an_idle_connection_that_received_bytes_is_not_reused():
    late = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n"
    with RawServer([OK, late], OK) as server:

        async def until_written() -> None:
            while server.answered < 1:  # both pieces of the first answer were written
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.01)  # and read off the socket by the client's loop

        bodies = posts_in_turn(server.url, recent=None, after=until_written)
    assert bodies == [b"ok", b"ok"] and server.connections == 2


def test_answers_that_repeat_byte_for_byte_are_taken_from_a_new_connection():
    with RawServer(with_length(b'{"id": "same"}')) as server:
        bodies = posts_in_turn(server.url, recent=RecentAnswers())
    assert bodies == [b'{"id": "same"}'] * 2 and (server.posts, server.connections) == (3, 2)


def test_answers_without_an_id_may_repeat():
    with RawServer(OK) as server:
        assert posts_in_turn(server.url, recent=RecentAnswers()) == [b"ok", b"ok"]
    assert server.posts == 2


def test_a_new_connection_reset_before_its_answer_is_not_sent_again():
    with RawServer(DROP) as server, pytest.raises(ConnectionFailed, match="before answering"):
        post(server.url)
    assert server.posts == 1


def test_gzip_is_inflated():
    body = gzip.compress(b'{"x": 1}')
    answer = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%b"
    with RawServer(answer % (len(body), body)) as server:
        assert post(server.url).body == b'{"x": 1}'


@pytest.mark.parametrize("wbits", [zlib.MAX_WBITS, -zlib.MAX_WBITS], ids=["zlib", "raw"])
def test_deflate_is_inflated_with_or_without_its_zlib_header(wbits):
    compressor = zlib.compressobj(wbits=wbits)
    body = compressor.compress(b'{"x": 1}') + compressor.flush()
    answer = b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: %d\r\n\r\n%b"
    with RawServer(answer % (len(body), body)) as server:
        assert post(server.url).body == b'{"x": 1}'


def test_a_gzip_bomb_stops_at_the_bound():
    body = gzip.compress(bytes(10**6))
    answer = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%b"
    too_large = pytest.raises(BadBody, match="larger than 100,000 bytes")
    with RawServer(answer % (len(body), body)) as server, too_large:
        post(server.url, max_bytes=100_000)


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (DROP, ConnectionFailed),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf", ConnectionFailed),
        (b"SSH-2.0-OpenSSH\r\n\r\n", Malformed),
        (b"HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\nok", Malformed),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", Malformed),
        (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20_000 + b"\r\n", Malformed),
    ],
    ids=["drop", "half", "not-http", "two-digit-status", "bad-length", "endless-head"],
)
def test_a_broken_answer_is_a_failure_of_its_kind(answer, error):
    with RawServer(answer, close_after_each=True) as server, pytest.raises(error):
        post(server.url)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n",
        chunked(b"x" * 2048),
        b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 2048,
    ],
    ids=["announced", "chunked", "until-close"],
)
def test_a_body_over_the_bound_is_not_read(answer):
    too_large = pytest.raises(BadBody, match="larger than 1,000 bytes")
    with RawServer(answer, close_after_each=True) as server, too_large:
        post(server.url)


def test_a_server_that_does_not_answer_times_out():
    with RawServer(HANG) as server, pytest.raises(TimedOut, match=r"after 0\.2s"):
        post(server.url, timeout=0.2)


def test_a_port_nobody_listens_on_is_a_connection_not_made():
    with RawServer(OK) as server:
        url = server.url
    with pytest.raises(CouldNotConnect):
        post(url)


def test_a_host_whose_first_address_never_answers_is_reached_at_its_second(monkeypatch):
    with RawServer(OK) as server, unanswering("127.0.0.2", server.port):
        monkeypatch.setattr(socket, "getaddrinfo", addresses("api.test", "127.0.0.2", "127.0.0.1"))
        answer = post(f"http://api.test:{server.port}/v1/chat/completions", timeout=10)
    assert answer.body == b"ok"


# -- proxies ------------------------------------------------------------------------------------


def test_an_http_proxy_gets_the_whole_url_and_its_credentials(environment):
    with RawServer(OK) as server, Proxy("user:pw") as proxy:
        environment.setenv("HTTP_PROXY", f"http://user:pw@{proxy.address}")
        assert post(server.url).body == b"ok"
    head = proxy.heads[0].lower()
    assert head.startswith(f"post {server.url} http/1.1\r\n".lower().encode())
    assert b"\r\nproxy-authorization: basic dxnlcjpwdw==\r\n" in head
    assert b"\r\nauthorization: bearer k\r\n" in head  # for the endpoint, not the proxy


def test_a_proxy_without_a_scheme_is_an_http_proxy(environment):
    with RawServer(OK) as server, Proxy() as proxy:
        environment.setenv("HTTP_PROXY", proxy.address)
        assert post(server.url).body == b"ok"
    assert len(proxy.heads) == 1


def test_all_proxy_is_used_when_no_proxy_of_the_scheme_is_named(environment):
    with RawServer(OK) as server, Proxy() as proxy:
        environment.setenv("ALL_PROXY", f"http://{proxy.address}")
        post(server.url)
    assert len(proxy.heads) == 1


@pytest.mark.parametrize("excluded", ["127.0.0.1", "*", "example.com,127.0.0.1:{port}"])
def test_no_proxy_names_hosts_reached_directly(environment, excluded):
    with RawServer(OK) as server, Proxy() as proxy:
        environment.setenv("HTTP_PROXY", f"http://{proxy.address}")
        environment.setenv("NO_PROXY", excluded.format(port=server.port))
        post(server.url)
    assert proxy.heads == []


def test_an_explicit_proxy_wins_over_the_environment(environment):
    with RawServer(OK) as server, Proxy() as proxy:
        environment.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nobody listens there
        post(server.url, proxy=f"http://{proxy.address}")
    assert len(proxy.heads) == 1


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_proxy_asking_for_credentials_refuses_every_request_naming_itself(scheme, authority):
    tls = serving(authority) if scheme == "https" else None
    with RawServer(OK, tls=tls) as server, Proxy("user:pw") as proxy:
        proxy_url = f"http://user:wrong-secret@{proxy.address}"
        with pytest.raises(Refused) as refused:
            post(server.url, proxy=proxy_url, tls=trusting(authority))
    assert f"proxy http://{proxy.address} asks for credentials" in str(refused.value)
    assert "wrong-secret" not in str(refused.value)


def test_a_proxy_llm_ops_cannot_speak_to_is_refused_before_anything_is_sent(environment):
    environment.setenv("HTTPS_PROXY", "socks5://user:secret@proxy.example:1080")
    with pytest.raises(ConfigError, match="not an http:// or https:// proxy") as refused:
        Transport(limit=1, headers={}, base_url="https://api.example/v1")
    assert "secret" not in str(refused.value)


# -- TLS ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


def trusting(authority: trustme.CA, client: trustme.LeafCert | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    authority.configure_trust(context)
    if client is not None:
        client.configure_cert(context)
    return context


def serving(authority: trustme.CA, *, ask_for_client: bool = False) -> ssl.SSLContext:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server)
    if ask_for_client:
        server.verify_mode = ssl.CERT_REQUIRED
        authority.configure_trust(server)
    return server


def test_https_verifies_the_servers_certificate(authority):
    with RawServer(OK, tls=serving(authority)) as server:
        assert post(server.url, tls=trusting(authority)).body == b"ok"
        with pytest.raises(CouldNotConnect, match="CERTIFICATE_VERIFY_FAILED"):
            post(server.url)


def test_https_through_a_proxy_goes_through_a_tunnel(authority, environment):
    with RawServer(OK, tls=serving(authority)) as server, Proxy() as proxy:
        environment.setenv("HTTPS_PROXY", f"http://{proxy.address}")
        assert post(server.url, tls=trusting(authority)).body == b"ok"
    connect = proxy.heads[0]
    assert connect.startswith(f"CONNECT 127.0.0.1:{server.port} HTTP/1.1".encode())
    assert b"bearer k" not in connect.lower()  # the key goes only through the tunnel
    assert server.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")


def test_a_client_certificate_opens_a_server_that_asks_for_one(authority):
    client = authority.issue_cert("client@example")
    with RawServer(OK, tls=serving(authority, ask_for_client=True)) as server:
        assert post(server.url, tls=trusting(authority, client)).body == b"ok"


def test_a_server_asking_for_a_client_certificate_refuses_every_request_saying_so(authority):
    refused = pytest.raises(Refused, match="want of a client certificate")
    with tls_handshakes(serving(authority, ask_for_client=True)) as port, refused:
        post(f"https://127.0.0.1:{port}/v1/chat/completions", tls=trusting(authority))
