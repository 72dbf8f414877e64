"""Which endpoint and model a job names: endpoint identity in keys, models checked up front."""

from __future__ import annotations

import polars as pl
import pytest
from yarl import URL

from llm_ops import ConfigError, Endpoint, llm_complete
from llm_ops._engine.transport import proxy_for

DF = pl.DataFrame({"text": ["red dress", "blue coat"]})


def test_a_model_the_endpoint_does_not_list_is_refused_before_sending(complete, endpoint):
    with pytest.raises(ConfigError, match="did you mean 'sim-small'"):
        DF.pipe(complete, prompt="{text}", model="sim-smal")
    assert endpoint.stats()["requests"] == 0


def test_every_model_of_a_cascade_is_checked_before_the_first_is_sent(complete, endpoint):
    with pytest.raises(ConfigError, match="'gpt-4o'"):
        DF.pipe(complete, prompt="{text}", model=["sim", "gpt-4o"])
    assert endpoint.stats()["requests"] == 0


def test_an_endpoint_without_a_model_list_is_trusted(complete, endpoint):
    endpoint.configure(models=())
    out = DF.pipe(complete, prompt="{text}", model="anything")
    assert out["completion_status"].to_list() == ["ok", "ok"]


def test_one_server_under_two_urls_shares_answers_by_its_name(endpoint, cache):
    port = endpoint.base_url.rsplit(":", 1)[1]
    for url in (endpoint.base_url, f"http://localhost:{port}"):
        out = DF.pipe(
            llm_complete,
            prompt="{text}",
            model="sim",
            endpoint=Endpoint(url, name="shop"),
            cache=cache,
        )
    assert out["completion_status"].to_list() == ["cached", "cached"]


def test_an_endpoint_name_that_looks_like_a_url_is_refused():
    with pytest.raises(ConfigError, match="an endpoint's name must be"):
        Endpoint(name="http://x")


def test_the_report_says_where_the_cache_is(complete, cache):
    _, report = DF.pipe(complete, prompt="{text}", return_report=True)
    assert f"cache              {cache}" in str(report)


def test_a_proxy_from_the_environment_is_used(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert proxy_for(URL("https://api.example/v1")) == URL("http://proxy.example:3128")


def test_no_proxy_is_respected(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    assert proxy_for(URL("http://127.0.0.1:8000/v1")) is None
