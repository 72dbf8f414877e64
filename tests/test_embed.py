"""llm_embed: fixed-width float32 vectors, one request per batch of distinct inputs, cached."""

from __future__ import annotations

import functools

import polars as pl
import pytest

from llm_ops import ConfigError, Retries, llm_embed
from llm_ops.testing import embed


@pytest.fixture
def embed_rows(endpoint, cache):
    return functools.partial(
        llm_embed, column="text", model="sim-embed", endpoint=endpoint.base_url, cache=cache
    )


TEXTS = [f"review {i % 50}" for i in range(120)] + [None]


def test_vectors_have_the_right_width_and_values(embed_rows):
    out = pl.DataFrame({"text": ["red wool coat"]}).pipe(embed_rows, dimensions=16)
    assert out.schema["embedding"] == pl.Array(pl.Float32, 16)
    assert out["embedding"][0].to_list() == pytest.approx(embed("red wool coat", 16), rel=1e-6)


def test_one_request_per_batch_of_distinct_inputs(embed_rows, endpoint):
    out = pl.DataFrame({"text": TEXTS}).pipe(embed_rows, inputs_per_request=20)
    stats = endpoint.stats()
    assert (stats["embedding_requests"], stats["embedding_inputs"]) == (3, 50)
    assert out["embedding_status"].value_counts().sort("embedding_status").rows() == [
        ("ok", 120),
        ("skipped", 1),
    ]


def test_a_rerun_is_served_from_the_cache(embed_rows, endpoint):
    first = pl.DataFrame({"text": TEXTS}).pipe(embed_rows)
    endpoint.reset()
    again = pl.DataFrame({"text": TEXTS}).pipe(embed_rows)
    assert endpoint.stats()["embedding_requests"] == 0
    assert again["embedding_status"].to_list()[:3] == ["cached"] * 3
    assert again["embedding"].to_list()[:120] == first["embedding"].to_list()[:120]


def test_batches_over_the_endpoint_limit_are_split_until_they_fit(embed_rows, endpoint):
    endpoint.configure(max_embedding_inputs=10)
    out = pl.DataFrame({"text": TEXTS}).pipe(embed_rows, inputs_per_request=40)
    assert out["embedding_status"].value_counts().sort("embedding_status").rows() == [
        ("ok", 120),
        ("skipped", 1),
    ]


def test_one_input_too_large_for_the_server_fails_alone(embed_rows, endpoint):
    endpoint.configure(max_embedding_chars=100)
    texts = [f"review {i}" for i in range(64)] + ["word " * 100]
    out = pl.DataFrame({"text": texts}).pipe(
        embed_rows, inputs_per_request=64, retries=Retries(max_attempts=2)
    )
    assert out["embedding_status"].to_list() == ["ok"] * 64 + ["failed"]
    assert "too large to process" in out["embedding_error"][64]
    assert endpoint.stats()["embedding_requests"] <= 2 * 8 + 2


def test_a_server_that_ignores_dimensions_gets_nothing_cached(embed_rows, endpoint, cache):
    endpoint.configure(ignore_dimensions=True)
    out = pl.DataFrame({"text": ["red coat"]}).pipe(embed_rows, dimensions=16)
    assert out["embedding_status"].to_list() == ["rejected"]
    assert "ignores dimensions=" in out["embedding_error"][0]
    endpoint.configure()
    again = pl.DataFrame({"text": ["red coat"]}).pipe(embed_rows, dimensions=16)
    assert again["embedding_status"].to_list() == ["ok"]


def test_the_column_is_an_array_even_when_every_row_failed(embed_rows, endpoint):
    endpoint.configure(ignore_dimensions=True)
    out = pl.DataFrame({"text": ["a", "b"]}).pipe(embed_rows, dimensions=16)
    assert out.schema["embedding"] == pl.Array(pl.Float32, 16)


def test_a_lazyframe_sends_nothing_until_it_is_collected(embed_rows, endpoint):
    out = pl.LazyFrame({"text": ["red coat"]}).pipe(embed_rows, dimensions=16)
    assert isinstance(out, pl.LazyFrame) and endpoint.stats()["embedding_requests"] == 0
    out.collect()
    assert endpoint.stats()["embedding_requests"] == 1


def test_a_collected_lazyframe_equals_the_eager_result(embed_rows, tmp_path):
    df = pl.DataFrame({"text": ["red coat", None, "red coat"]})
    lazy = df.lazy().pipe(embed_rows, dimensions=16, cache=tmp_path / "lazy.duckdb")
    eager = df.pipe(embed_rows, dimensions=16, cache=tmp_path / "eager.duckdb")
    assert lazy.collect().equals(eager)


def test_a_lazyframe_without_dimensions_gets_a_list_column_of_the_same_vectors(embed_rows):
    df = pl.DataFrame({"text": ["red coat"]})
    lazy = df.lazy().pipe(embed_rows)
    assert lazy.collect_schema()["embedding"] == pl.List(pl.Float32)
    vectors = lazy.collect()["embedding"].to_list()
    assert vectors == df.pipe(embed_rows)["embedding"].to_list()


def test_a_bad_column_with_a_lazyframe_is_refused_before_it_is_collected(embed_rows, endpoint):
    with pytest.raises(ConfigError, match="column 'title' is not in the table"):
        pl.LazyFrame({"text": ["red coat"]}).pipe(embed_rows, column="title")
    assert endpoint.stats()["embedding_requests"] == 0
