"""API keys never reach the cache, the runs table, logs or error messages; 401 stops the job."""

from __future__ import annotations

import logging

import polars as pl
import pytest

from llm_ops import JobAbortedError, llm_complete
from llm_ops.testing import LocalEndpoint

SECRET = "sk-test-do-not-leak-0123456789"


@pytest.fixture(scope="module")
def guarded():
    with LocalEndpoint(api_key=SECRET) as endpoint:
        yield endpoint


def test_the_key_is_stored_nowhere(guarded, cache, caplog):
    caplog.set_level(logging.DEBUG)
    df = pl.DataFrame({"text": ["a", "[[sim:status=400]]"]})
    out = df.pipe(llm_complete, prompt="{text}", model="sim", base_url=guarded.base_url,
                  api_key=SECRET, cache=cache)
    assert out["completion_status"].to_list() == ["ok", "rejected"]
    assert SECRET.encode() not in cache.read_bytes()
    assert SECRET not in caplog.text
    assert SECRET not in str(out.rows())


def test_a_401_stops_the_job_with_one_error_and_no_key_in_it(guarded, cache):
    guarded.reset()
    df = pl.DataFrame({"text": [str(i) for i in range(100)]})
    with pytest.raises(JobAbortedError, match="refused the credentials") as info:
        df.pipe(llm_complete, prompt="{text}", model="sim", base_url=guarded.base_url,
                api_key=SECRET + "-wrong", cache=cache, concurrency=4)
    assert SECRET not in str(info.value)
    assert guarded.stats()["requests"] <= 4
