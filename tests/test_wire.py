"""Jobs against endpoints that frame, break or route their answers as real servers, proxies and
TLS terminators may (raw sockets of 127.0.0.1), and against the simulator where connection
options matter: every row is answered where aiohttp reads the answer, explicitly failed where
it refuses it, never ``ok`` from a malformed frame, and nothing is paid for twice."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import duckdb
import polars as pl
import pytest
import trustme
from raw_http import (
    DROP,
    Proxy,
    RawServer,
    chunked,
    completion,
    endpoint,
    tls_handshakes,
    with_length,
)
from test_transport import serving

from llm_ops import (
    ConfigError,
    Endpoint,
    JobAbortedError,
    MissingApiKeyError,
    Retries,
    llm_complete,
)

ROWS = pl.DataFrame({"text": ["red dress", "blue coat", "green hat"]})


def job(endpoint: str | Endpoint, **options: object) -> pl.DataFrame:
    out: pl.DataFrame = ROWS.pipe(
        llm_complete, prompt="{text}", model="m", endpoint=endpoint, cache=False, **options
    )
    return out


def test_a_chunked_answer_whose_end_comes_later_is_answered_once_per_row():
    def pieces(request: bytes) -> list[bytes]:
        return [chunked(completion()) + b"0\r\n", b"\r\n"]

    with RawServer(respond=endpoint(pieces)) as server:
        out = job(server.base_url)
    assert out["completion_status"].to_list() == ["ok"] * 3 and server.posts == 3


@pytest.mark.parametrize(
    "answer",
    [
        chunked(completion()[:10]) + b"-2\r\n" + completion()[10:] + b"\r\n0\r\n\r\n",
        with_length(b'{"choices": [{"message": {"content": "cut'),
    ],
    ids=["negative-chunk", "broken-json"],
)
def test_a_malformed_answer_fails_its_row_after_one_more_try(answer):
    with RawServer(respond=endpoint(lambda request: answer)) as server:
        out = job(server.base_url)
    assert out["completion_status"].to_list() == ["failed"] * 3
    assert "gave up after 2 attempts" in out["completion_error"][0]
    assert server.posts == 6


def test_a_malformed_answer_is_not_cached(tmp_path: Path):
    answer = chunked(completion()) + b"0x0\r\n\r\n"
    with RawServer(respond=endpoint(lambda request: answer)) as server:
        ROWS.pipe(
            llm_complete,
            prompt="{text}",
            model="m",
            endpoint=server.base_url,
            cache=tmp_path / "cache.duckdb",
        )
    with duckdb.connect(str(tmp_path / "cache.duckdb"), read_only=True) as con:
        assert con.sql("SELECT count(*) FROM llm_cache").fetchall() == [(0,)]


def test_a_raw_deflate_answer_is_answered():
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)  # no zlib header, as early IIS sent
    body = compressor.compress(completion()) + compressor.flush()
    answer = with_length(body).replace(b"\r\n", b"\r\nContent-Encoding: deflate\r\n", 1)
    with RawServer(respond=endpoint(lambda request: answer)) as server:
        assert job(server.base_url)["completion_status"].to_list() == ["ok"] * 3


def test_a_server_writing_each_answer_twice_answers_each_row_with_its_own():
    def twice(request: bytes) -> list[bytes]:
        prompt = json.loads(request.split(b"\r\n\r\n", 1)[1])["messages"][-1]["content"]
        answer = with_length(completion(f"about {prompt}"))
        return [answer, answer]  # the copy stays on the kept-alive connection

    rows = pl.DataFrame({"text": [f"row {i}" for i in range(20)]})
    with RawServer(respond=endpoint(twice)) as server:
        out = rows.pipe(
            llm_complete, prompt="{text}", model="m", endpoint=server.base_url, cache=False
        )
    assert out["completion"].to_list() == [f"about {text}" for text in rows["text"]]


def test_a_lenient_head_is_answered():
    answer = b"HTTP/1.1 200 OK\nContent-Length: %d\n\n%b" % (len(completion()), completion())
    with RawServer(respond=endpoint(lambda request: answer)) as server:
        assert job(server.base_url)["completion_status"].to_list() == ["ok"] * 3


def test_a_connection_dropped_before_the_answer_is_retried_as_usual():
    answers = iter([DROP, DROP])

    def answer(request: bytes) -> bytes:
        return next(answers, with_length(completion()))

    with RawServer(respond=endpoint(answer)) as server:
        out = job(server.base_url, retries=Retries(max_attempts=3))
    assert out["completion_status"].to_list() == ["ok"] * 3


# -- proxies and TLS -------------------------------------------------------------------------


def test_a_proxy_named_without_a_scheme_carries_the_job(environment):
    with (
        RawServer(respond=endpoint(lambda r: with_length(completion()))) as server,
        Proxy() as proxy,
    ):
        environment.setenv("HTTP_PROXY", proxy.address)
        out = job(server.base_url)
    assert out["completion_status"].to_list() == ["ok"] * 3 and len(proxy.heads) >= 1


def test_a_proxy_asking_for_credentials_stops_the_job_once(environment):
    answer = endpoint(lambda r: with_length(completion()))
    stopped = pytest.raises(JobAbortedError)
    with RawServer(respond=answer) as server, Proxy("user:pw") as proxy, stopped as stop:
        job(
            Endpoint(server.base_url, proxy=f"http://user:not-the-password@{proxy.address}"),
        )
    assert f"proxy http://{proxy.address} asks for credentials" in str(stop.value)
    assert "not-the-password" not in str(stop.value)
    assert server.posts == 0 and sum(h.startswith(b"POST") for h in proxy.heads) == 1


def test_a_server_wanting_a_client_certificate_stops_the_job_once(tmp_path: Path):
    authority = trustme.CA()
    bundle = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(bundle))
    stop = pytest.raises(JobAbortedError, match="client certificate")
    with tls_handshakes(serving(authority, ask_for_client=True)) as port, stop:
        job(
            Endpoint(f"https://127.0.0.1:{port}/v1", verify=str(bundle), api_key="sk-test-1234"),
        )


def test_a_client_certificate_reaches_a_server_that_asks_for_one(tmp_path: Path):
    authority = trustme.CA()
    bundle, client = tmp_path / "ca.pem", tmp_path / "client.pem"
    authority.cert_pem.write_to_path(str(bundle))
    authority.issue_cert("client@example").private_key_and_cert_chain_pem.write_to_path(str(client))
    answer = endpoint(lambda r: with_length(completion()))
    with RawServer(respond=answer, tls=serving(authority, ask_for_client=True)) as server:
        out = job(
            Endpoint(server.base_url, verify=str(bundle), cert=str(client), api_key="sk-test-1234"),
        )
    assert out["completion_status"].to_list() == ["ok"] * 3


# -- headers ---------------------------------------------------------------------------------

AZURE_KEY = "azure-key-0123456789"


def azure(endpoint, cache: Path, headers: dict[str, str]) -> pl.DataFrame:
    """A job against an Azure-shaped endpoint: the key in an ``api-key`` header."""
    endpoint.configure(api_key=AZURE_KEY, api_key_header="api-key")
    out: pl.DataFrame = ROWS.pipe(
        llm_complete,
        prompt="{text}",
        model="sim",
        endpoint=Endpoint(endpoint.base_url, headers=headers),
        cache=cache,
    )
    return out


def test_a_key_in_a_header_of_ones_own_is_all_azure_needs(endpoint, cache):
    out = azure(endpoint, cache, headers={"api-key": AZURE_KEY})
    assert out["completion_status"].to_list() == ["ok"] * 3
    assert "authorization" not in [name.lower() for name in endpoint.stats()["header_names"]]


def test_headers_are_not_part_of_the_cache_key(endpoint, cache):
    azure(endpoint, cache, headers={"api-key": AZURE_KEY, "X-Tenant": "a"})
    out = azure(endpoint, cache, headers={"api-key": AZURE_KEY, "X-Tenant": "b"})
    assert out["completion_status"].to_list() == ["cached"] * 3


def test_a_credential_header_never_reaches_the_cache(endpoint, cache):
    azure(endpoint, cache, headers={"api-key": AZURE_KEY})
    assert AZURE_KEY.encode() not in cache.read_bytes()


def test_a_credential_header_is_redacted_from_what_a_server_echoes():
    echo = endpoint(lambda request: with_length(request.split(b"\r\n\r\n")[0], "400 Bad"))
    with RawServer(respond=echo) as server:
        out = job(Endpoint(server.base_url, headers={"X-Gateway-Token": "tok-0123456789"}))
    assert out["completion_status"][0] == "rejected"
    assert "tok-0123456789" not in out["completion_error"][0]


def test_a_remote_endpoint_without_key_or_credential_header_is_refused_before_sending():
    with pytest.raises(MissingApiKeyError, match="headers="):
        job(Endpoint("https://gateway.example/v1", headers={"X-Tenant": "a"}))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"headers": {"X Team": "a"}}, "not a header name"),
        ({"headers": {"X-Team": "a\r\nX-Injected: 1"}}, "line break"),
        ({"headers": {"Content-Length": "1"}}, "set by the HTTP client"),
        ({"verify": "/no/such/bundle.pem"}, "CA bundle that does not exist"),
        ({"cert": "/no/such/client.pem"}, "does not exist"),
        ({"proxy": "socks5://proxy.example:1080"}, "http:// or https:// proxy"),
    ],
)
def test_a_bad_connection_option_is_refused_before_anything_is_sent(options, message):
    with pytest.raises(ConfigError, match=message):
        Endpoint("http://127.0.0.1:9/v1", **options)
