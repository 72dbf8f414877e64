"""API keys never reach the cache, the runs table, logs or error messages; 401 stops the job."""

from __future__ import annotations

import html
import json
import logging
import re
import warnings
from urllib.parse import quote, quote_plus, unquote

import polars as pl
import pytest
from raw_http import RawServer, endpoint, with_length

from llm_ops import ConfigError, Endpoint, JobAbortedError, Retries, llm_complete
from llm_ops._engine.boundary import redact
from llm_ops.testing import LocalEndpoint

SECRET = "sk-test-do-not-leak-0123456789"


@pytest.fixture(scope="module")
def guarded():
    with LocalEndpoint(api_key=SECRET) as endpoint:
        yield endpoint


def test_the_key_is_stored_nowhere(guarded, cache, caplog):
    caplog.set_level(logging.DEBUG)
    df = pl.DataFrame({"text": ["a", "[[sim:status=400]]"]})
    out = df.pipe(
        llm_complete,
        prompt="{text}",
        model="sim",
        endpoint=Endpoint(guarded.base_url, api_key=SECRET),
        cache=cache,
    )
    assert out["completion_status"].to_list() == ["ok", "rejected"]
    assert SECRET.encode() not in cache.read_bytes()
    assert SECRET not in caplog.text
    assert SECRET not in str(out.rows())


def test_a_401_stops_the_job_with_one_error_and_no_key_in_it(guarded, cache):
    guarded.reset()
    df = pl.DataFrame({"text": [str(i) for i in range(100)]})
    with pytest.raises(JobAbortedError, match="refused the credentials") as info:
        df.pipe(
            llm_complete,
            prompt="{text}",
            model="sim",
            endpoint=Endpoint(guarded.base_url, api_key=SECRET + "-wrong"),
            cache=cache,
            concurrency=4,
        )
    assert SECRET not in str(info.value)
    assert guarded.stats()["requests"] <= 4


def test_a_key_in_the_url_query_is_sent_but_kept_nowhere(endpoint, cache, caplog):
    caplog.set_level(logging.DEBUG)
    url = f"{endpoint.base_url}?key={SECRET}"
    df = pl.DataFrame({"text": ["a", "[[sim:status=400]]"]})
    out, report = df.pipe(
        llm_complete, prompt="{text}", model="sim", endpoint=url, cache=cache, return_report=True
    )
    assert out["completion_status"].to_list() == ["ok", "rejected"]
    assert SECRET not in str(report) + str(report.as_dict()) + str(out.rows()) + caplog.text
    assert SECRET.encode() not in cache.read_bytes()
    assert report.endpoint == endpoint.base_url


def test_credentials_in_the_url_are_refused_without_repeating_them(endpoint, cache):
    url = endpoint.base_url.replace("http://", f"http://user:{SECRET}@")
    with pytest.raises(ConfigError, match="must not hold credentials") as info:
        pl.DataFrame({"text": ["a"]}).pipe(
            llm_complete, prompt="{text}", model="sim", endpoint=url, cache=cache
        )
    assert SECRET not in str(info.value)


def test_a_short_key_does_not_garble_the_servers_message(endpoint, cache):
    out = pl.DataFrame({"text": ["[[sim:status=400]]"]}).pipe(
        llm_complete,
        prompt="{text}",
        model="sim",
        endpoint=Endpoint(endpoint.base_url, api_key="e"),
        cache=cache,
    )
    assert out["completion_error"].to_list() == ["HTTP 400: simulated error 400"]


def test_a_refused_key_costs_one_request_whatever_the_concurrency(guarded, cache):
    guarded.reset()
    with pytest.raises(JobAbortedError):
        pl.DataFrame({"text": [str(i) for i in range(100)]}).pipe(
            llm_complete,
            prompt="{text}",
            model="sim",
            endpoint=Endpoint(guarded.base_url, api_key="wrong-key-0123456789"),
            cache=cache,
            concurrency=64,
        )
    assert guarded.stats()["requests"] == 1


GATEWAY_KEY = "gw+Key/0123=="  # a key whose characters a URL's query encodes (%2B, %2F, %3D)


@pytest.mark.parametrize(
    "echo",
    [
        lambda path: path,
        lambda path: re.sub(rb"%[0-9A-F]{2}", lambda hexes: hexes[0].lower(), path),
        lambda path: path.replace(b"%", b"%25"),
        lambda path: json.dumps(unquote(path.decode())).encode().replace(b"/", b"\\/"),
    ],
    ids=["as-sent", "lower-case-hex", "encoded-twice", "json-escaped"],
)
@pytest.mark.parametrize("status", ["400 Bad Request", "500 Oops"])
def test_a_key_in_the_url_query_is_redacted_in_every_form_a_server_echoes(echo, status, caplog):
    caplog.set_level(logging.DEBUG)

    def echoed(request: bytes) -> bytes:
        path = request.split(b" ")[1]
        return with_length(b'{"error": {"message": "no route: %b"}}' % echo(path), status)

    with (
        RawServer(respond=endpoint(echoed)) as server,
        warnings.catch_warnings(record=True) as seen,
    ):
        warnings.simplefilter("always")
        out, report = pl.DataFrame({"text": ["a"]}).pipe(
            llm_complete,
            prompt="{text}",
            model="m",
            endpoint=f"{server.base_url}?key={quote(GATEWAY_KEY, safe='')}",
            cache=False,
            retries=Retries(max_attempts=1),
            return_report=True,
        )
    assert b"%2B" in server.requests[-1].split(b"\r\n")[0]  # the key was sent, encoded
    said = str(out.rows()) + str(report) + str(report.as_dict()) + caplog.text
    said += "".join(str(warning.message) for warning in seen)
    assert "no route" in said and "***" in said
    for form in (GATEWAY_KEY, quote(GATEWAY_KEY, safe=""), "gw%2Bkey", "gw%252B", "gw+Key\\/"):
        assert form.lower() not in said.lower()


@pytest.mark.parametrize(
    "form",
    [
        quote_plus("tok en/0123+="),
        json.dumps("tok en/0123+=")[1:-1].replace("+", "\\u002b"),
        html.escape("tok en/0123+=").replace("+", "&#43;"),
    ],
    ids=["quote-plus", "json-unicode-escape", "html"],
)
def test_a_secret_is_redacted_in_the_encodings_servers_write(form):
    assert redact(f"echo: key={form}&next", "tok en/0123+=") == "echo: key=***&next"
