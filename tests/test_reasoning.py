"""Reasoning models: their options, the max_tokens they refuse, and the thinking they bill."""

import polars as pl
import pytest

from llm_ops import ConfigError, Sampling, options_from_settings

DF = pl.DataFrame({"text": ["alpha", "beta"]})


def test_a_reasoning_effort_that_is_none_of_the_four_is_refused():
    with pytest.raises(ConfigError, match="reasoning_effort must be one of"):
        Sampling(reasoning_effort="extreme")  # type: ignore[arg-type]


def test_max_completion_tokens_must_be_positive():
    with pytest.raises(ConfigError, match="max_completion_tokens"):
        Sampling(max_completion_tokens=0)


def test_the_options_are_part_of_the_cache_key(complete):
    DF.pipe(complete, prompt="{text}", sampling=Sampling(reasoning_effort="low"))
    report = DF.pipe(
        complete, prompt="{text}", sampling=Sampling(reasoning_effort="high"), return_report=True
    )[1]
    assert report.cache_hits == 0


def test_the_flat_settings_make_a_sampling():
    options = options_from_settings({"reasoning_effort": "high", "max_completion_tokens": 9})
    assert options["sampling"] == Sampling(reasoning_effort="high", max_completion_tokens=9)
