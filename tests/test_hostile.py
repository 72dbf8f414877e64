"""Endpoints that misbehave on purpose: no value they send may crash a job, stall it, make its
cost negative or be cached as a plausible answer (real HTTP against the simulator)."""

from __future__ import annotations

import email.utils
import logging
import subprocess
import sys
import time

import duckdb
import polars as pl
import pytest

from llm_ops import BatchMode, Budget, ConfigError, Endpoint, JobAbortedError, Price, llm_complete
from llm_ops._engine.answers import retry_after
from llm_ops._engine.engine import join_url
from llm_ops.testing import expected_reply


def _one(complete, prompt, **options):
    out, report = pl.DataFrame({"text": [prompt]}).pipe(
        complete, prompt="{text}", return_report=True, **options
    )
    return out.row(0, named=True), report


def test_an_absurd_token_count_keeps_the_answer_with_its_usage_unknown(complete, cache):
    prompt = "hi [[sim:prompt_tokens=1000000000000000000000000000000]]"
    row, report = _one(complete, prompt)
    assert (row["completion"], row["completion_status"]) == (
        expected_reply(prompt, model="sim"),
        "ok",
    )
    assert (report.usage_unknown, report.prompt_tokens) == (1, 0)
    with duckdb.connect(str(cache), read_only=True) as con:
        assert con.sql("SELECT prompt_tokens FROM llm_cache").fetchall() == [(None,)]


def test_an_answer_with_unknown_usage_is_taken_from_the_cache_on_a_rerun(complete, endpoint):
    prompt = "hi [[sim:completion_tokens=1e30]]"
    _one(complete, prompt)
    row, report = _one(complete, prompt)
    assert (row["completion_status"], report.requests_sent) == ("cached", 0)


def test_negative_usage_never_makes_cost_negative_nor_defeats_max_cost(complete):
    rows = pl.DataFrame({"text": [f"row {i} [[sim:prompt_tokens=-1000000]]" for i in range(40)]})
    price = Price(0.15, 0.60)  # the simulator is free: a budget needs a price to reach
    out, report = rows.pipe(
        complete, prompt="{text}", pricing=price, budget=Budget(max_cost=0.001), return_report=True
    )
    assert report.cost is not None and report.cost >= 0 and report.prompt_tokens >= 0
    assert report.budget_stop is not None and report.requests_sent < 10
    assert out["completion_status"].value_counts().height == 2  # ok and skipped


def test_an_absurd_token_count_in_a_batch_line_keeps_the_answer(complete, endpoint):
    endpoint.configure(batch_seconds=0.1, batch_validation_seconds=0.05)
    row, report = _one(
        complete,
        "hi [[sim:prompt_tokens=1e30]]",
        batch=BatchMode(poll_seconds=0.05),
    )
    assert (row["completion_status"], report.usage_unknown) == ("ok", 1)


def test_unknown_usage_is_said_in_the_report(complete):
    _, report = _one(complete, "hi [[sim:prompt_tokens=-5]]")
    assert "usage unknown               1  answers reported token counts" in str(report)


def test_a_retry_after_over_the_cap_fails_that_request_at_once(complete, endpoint):
    rows = pl.DataFrame({"text": ["wait [[sim:retry_after=86400]]", "fine"]})
    out = rows.pipe(complete, prompt="{text}")
    assert out["completion_status"].to_list() == ["failed", "ok"]
    assert "asked to wait 24 h before a retry" in out["completion_error"][0]
    assert "max_retry_after=120s" in out["completion_error"][0]
    assert endpoint.stats()["requests"] == 2


def test_a_job_whose_every_request_must_wait_too_long_stops_once(complete, endpoint):
    rows = pl.DataFrame({"text": [f"{i} [[sim:retry_after=3600]]" for i in range(100)]})
    with pytest.raises(JobAbortedError, match="asks every request to wait 60 min"):
        rows.pipe(complete, prompt="{text}", concurrency=4)
    assert endpoint.stats()["requests"] < 16


def test_a_retry_after_under_the_cap_is_honoured_and_a_long_pause_logged(complete, caplog):
    caplog.set_level(logging.WARNING, logger="llm_ops")
    row, _ = _one(complete, "x [[sim:retry_after=5]] [[sim:fail_times=1]]")
    assert row["completion_status"] == "ok"
    assert "asked to wait 5 s (HTTP 429, Retry-After)" in caplog.text


def test_retry_after_reads_seconds_milliseconds_and_http_dates():
    # An HTTP date is absolute, so it is made from the wall clock retry_after reads; an hour
    # ahead, a slow machine's minutes between the two readings cannot matter.
    in_an_hour = email.utils.formatdate(time.time() + 3600, usegmt=True)
    assert retry_after({"retry-after": "7"}) == 7.0
    assert retry_after({"retry-after-ms": "250", "retry-after": "7"}) == 0.25
    assert 3000 < (retry_after({"retry-after": in_an_hour}) or 0) <= 3600
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after({"retry-after": "soon"}) is None


@pytest.mark.parametrize("chunked", ["", "[[sim:chunked=1]]"])
def test_a_body_over_the_size_cap_fails_its_request(complete, chunked):
    row, _ = _one(complete, f"big [[sim:body_bytes=9000000]] {chunked}")
    assert row["completion_status"] == "failed"
    assert "response larger than 8,388,608 bytes" in row["completion_error"]


def test_a_gzip_bomb_fails_its_request(complete):
    row, _ = _one(complete, "boom [[sim:gzip_bomb=2147483648]]")
    assert row["completion_status"] == "failed"
    assert "response larger than 8,388,608 bytes (inflated)" in row["completion_error"]


def test_one_gzip_member_over_a_small_cap_fails_its_request(complete, endpoint):
    capped = Endpoint(endpoint.base_url, max_response_bytes=100_000)
    row, _ = _one(complete, "boom [[sim:gzip_bomb=1048576]]", endpoint=capped)
    assert "response larger than 100,000 bytes (inflated)" in row["completion_error"]


def test_32_concurrent_gzip_bombs_keep_the_clients_memory_small(endpoint, tmp_path):
    script = f"""
import resource, polars as pl
from llm_ops import llm_complete
rows = pl.DataFrame({{"text": [f"{{i}} [[sim:gzip_bomb=2147483648]]" for i in range(32)]}})
out = rows.pipe(llm_complete, prompt="{{text}}", model="sim", endpoint={endpoint.base_url!r},
                cache={str(tmp_path / "c.duckdb")!r}, concurrency=32)
assert out["completion_status"].to_list() == ["failed"] * 32
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) < 700  # MB; unbounded, it would be 64 GB


def test_a_redirect_stops_the_job_naming_its_target_without_the_query(complete, endpoint):
    rows = pl.DataFrame({"text": [f"{i} [[sim:redirect=302]]" for i in range(20)]})
    with pytest.raises(JobAbortedError) as stopped:
        rows.pipe(complete, prompt="{text}")
    message = str(stopped.value)
    assert "HTTP 302: the endpoint redirects to https://elsewhere.example:8443/v1/chat" in message
    assert "token" not in message and "sk-secret" not in message
    assert endpoint.stats()["requests"] == 1


@pytest.mark.parametrize("suffix", ["", "/"])
def test_a_base_url_without_v1_is_a_config_error_that_says_what_to_write(endpoint, suffix):
    root = endpoint.base_url.removesuffix("/v1")
    with pytest.raises(ConfigError, match=f"did you mean endpoint='{root}/v1'"):
        pl.DataFrame({"t": ["a"]}).pipe(
            llm_complete, prompt="{t}", model="sim", endpoint=root + suffix, cache=False
        )
    assert endpoint.stats()["requests"] == 0


def test_a_base_url_with_a_trailing_slash_works(endpoint):
    out = pl.DataFrame({"t": ["a"]}).pipe(
        llm_complete, prompt="{t}", model="sim", endpoint=endpoint.base_url + "/", cache=False
    )
    assert out["completion_status"].to_list() == ["ok"]


def test_request_urls_join_base_urls_with_or_without_slashes():
    for base in ("https://host:8443/v1", "https://host:8443/v1/"):
        assert str(join_url(base, "chat/completions")) == "https://host:8443/v1/chat/completions"
    assert str(join_url("http://h:1", "models", "?k=1")) == "http://h:1/models?k=1"
