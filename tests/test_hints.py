"""Hints and stop messages speak the current vocabulary, and promise no cache a job lacks."""

from __future__ import annotations

import polars as pl
import pytest

from llm_ops import ExprOptions, JobAbortedError, llm_complete
from llm_ops._expr.namespace import LlmNamespace

ONE_ROW = pl.DataFrame({"text": ["a"]})


def test_the_expressions_list_their_real_options():
    listed = LlmNamespace.complete.__doc__
    assert all(f"``{name}``" in listed for name in ExprOptions.__optional_keys__)


def test_the_expressions_list_no_option_that_is_gone():
    listed = LlmNamespace.complete.__doc__
    assert not any(f"``{gone}``" in listed for gone in ("mode", "max_tokens", "temperature"))


def test_an_endpoint_without_a_batch_api_is_told_to_send_live(endpoint, cache):
    nowhere = endpoint.base_url.rstrip("/") + "/nowhere"
    with pytest.raises(JobAbortedError, match=r"use batch=False"):
        llm_complete(ONE_ROW, "{text}", model="sim", endpoint=nowhere, batch=True, cache=cache)


def test_a_stop_without_a_cache_does_not_claim_answers_are_cached(endpoint):
    endpoint.configure(insufficient_quota=True)
    with pytest.raises(JobAbortedError, match="the cache is off") as stopped:
        llm_complete(ONE_ROW, "{text}", model="sim", endpoint=endpoint.base_url, cache=False)
    assert "are cached" not in str(stopped.value)


def test_a_stop_with_a_cache_says_answers_so_far_are_cached(endpoint, cache):
    endpoint.configure(insufficient_quota=True)
    with pytest.raises(JobAbortedError, match="answers so far are cached"):
        llm_complete(ONE_ROW, "{text}", model="sim", endpoint=endpoint.base_url, cache=cache)
