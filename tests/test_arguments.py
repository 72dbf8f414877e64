"""Misuse is a clear LlmOpsError raised before any request is sent."""

from __future__ import annotations

import polars as pl
import pytest

from llm_ops import (
    ConfigError,
    Endpoint,
    MissingApiKeyError,
    TemplateError,
    llm_complete,
    options_from_settings,
)

DF = pl.DataFrame({"text": ["x"], "tags": [["a", "b"]]})


@pytest.fixture(autouse=True)
def _nothing_sent(endpoint):
    yield
    assert endpoint.stats()["requests"] == 0


def test_unknown_column_names_it_and_lists_the_available_ones(complete):
    with pytest.raises(TemplateError, match=r"'txt'.*available columns: text, tags"):
        DF.pipe(complete, prompt="{txt}")


@pytest.mark.parametrize(
    "template",
    ["{text", "text}", "{}", "{0}", "{text.upper}", "{text[0]}", "{text!r}", "{text:>10}"],
)
def test_malformed_or_non_plain_templates_are_rejected(complete, template):
    with pytest.raises(TemplateError):
        DF.pipe(complete, prompt=template)


def test_unrenderable_column_type(complete):
    with pytest.raises(TemplateError, match=r"'tags' of type List\(String\).*cast"):
        DF.pipe(complete, prompt="{tags}")


@pytest.mark.parametrize("model", ["", "  ", None])
def test_empty_model(complete, model):
    with pytest.raises(ConfigError, match="model must be a model name"):
        DF.pipe(complete, prompt="{text}", model=model)


@pytest.mark.parametrize("concurrency", [0, -1, 2.5, True])
def test_bad_concurrency(complete, concurrency):
    with pytest.raises(ConfigError, match="concurrency must be a positive integer"):
        DF.pipe(complete, prompt="{text}", concurrency=concurrency)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("temperature", 3),
        ("top_p", -0.1),
        ("max_tokens", 0),
        ("timeout", 0),
        ("on_error", "ignore"),
        ("max_attempts", 0),
    ],
)
def test_bad_parameters(complete, name, value):
    with pytest.raises(ConfigError, match=name):
        DF.pipe(complete, prompt="{text}", **options_from_settings({name: value}))


def test_output_column_collision(complete):
    with pytest.raises(ConfigError, match="already has a column 'text'"):
        DF.pipe(complete, prompt="{text}", output="text")


def test_missing_api_key_for_a_remote_endpoint():
    with pytest.raises(MissingApiKeyError, match="OPENAI_API_KEY"):
        DF.pipe(
            llm_complete,
            prompt="{text}",
            model="m",
            endpoint="https://example.invalid/v1",
            cache=False,
        )


def test_not_a_dataframe(complete):
    with pytest.raises(ConfigError, match="polars DataFrame"):
        complete({"text": ["x"]}, prompt="{text}")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("concurrency", 10**9),
        ("max_attempts", 10**6),
        ("stop", 123),
        ("stop", ["ok", 5]),
        ("stop", []),
        ("seed", "x"),
        ("seed", True),
        ("timeout", float("nan")),
        ("timeout", float("inf")),
        ("flush_seconds", float("inf")),
        ("rpm", float("nan")),
        ("temperature", float("nan")),
        ("max_cost", float("inf")),
    ],
)
def test_out_of_range_or_mistyped_values(complete, name, value):
    with pytest.raises(ConfigError, match=name):
        DF.pipe(complete, prompt="{text}", **options_from_settings({name: value}))


@pytest.mark.parametrize("key", ["sk-abc\n", "sk abc", "sk-ключ"])
def test_an_api_key_an_http_header_cannot_carry(key):
    with pytest.raises(ConfigError, match="api_key holds") as info:
        Endpoint(api_key=key)
    assert key.strip() not in str(info.value)


@pytest.mark.parametrize("prompt", ["", "   ", "\n"])
def test_an_empty_prompt(complete, prompt):
    with pytest.raises(TemplateError, match="prompt template is empty"):
        DF.pipe(complete, prompt=prompt)
