"""API keys never reach the cache, the runs table, logs or error messages; 401 stops the job."""

from __future__ import annotations

import logging

import polars as pl
import pytest

from llm_ops import ConfigError, Endpoint, JobAbortedError, llm_complete
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
