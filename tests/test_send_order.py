"""Send order: misses go out grouped by shared prefix, and no row's outcome changes."""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from llm_ops import Budget, Client, ConfigError, Packing
from llm_ops._order import send_order
from llm_ops.tables import Table

GROUPS = [f"Group {g}: " + f"shared context of group {g}. " * 8 for g in "ABCDEFGH"]
GROUPED = pl.DataFrame(
    {"text": [f"{head}Review {n}." for head in GROUPS for n in range(4)]}
).sample(fraction=1.0, shuffle=True, seed=7)
MIXED = pl.DataFrame(
    {
        "id": range(9),
        "text": [
            "b fits well",
            "a runs small",
            None,
            "b fits well",
            "c refused [[sim:status=400]]",
            "a cut short [[sim:finish_reason=length]]",
            "a runs small",
            None,
            "c lovely",
        ],
        "tone": ["calm", "calm", "calm", "calm", "terse", "terse", "calm", "calm", None],
    }
)


def test_prefix_order_keeps_every_rows_answer_status_and_position(complete, tmp_path):
    options = dict(prompt="Summarize: {text}", system="Be {tone}.", concurrency=2)
    prefix = MIXED.pipe(complete, send_order="prefix", **options)
    as_planned = MIXED.pipe(complete, send_order="input", cache=tmp_path / "b.duckdb", **options)
    assert_frame_equal(prefix, as_planned)
    assert prefix["completion_status"].cast(pl.String).to_list() == [
        *["ok", "ok", "skipped", "ok", "rejected", "truncated", "ok", "skipped", "skipped"]
    ]


def test_the_endpoint_receives_misses_in_prefix_order(complete):
    # one at a time, and a budget of three requests: the three sent first are answered
    out = GROUPED.pipe(complete, prompt="{text}", concurrency=1, budget=Budget(max_requests=3))
    answered = out.filter(pl.col("completion_status") == "ok")["text"].sort().to_list()
    assert answered == GROUPED["text"].sort().head(3).to_list()


def test_input_order_sends_misses_in_the_order_of_their_first_rows(complete):
    out = GROUPED.pipe(
        complete,
        prompt="{text}",
        concurrency=1,
        budget=Budget(max_requests=3),
        send_order="input",
    )
    answered = out.filter(pl.col("completion_status") == "ok")["text"].to_list()
    assert answered == GROUPED["text"].head(3).to_list()


def test_prefix_order_is_the_default_and_reuses_the_servers_prefix_cache(complete, endpoint):
    endpoint.configure(prefix_cache_tokens=64)  # the blocks of one prompt
    GROUPED.pipe(complete, prompt="{text}", concurrency=1)
    prefix = endpoint.stats()["cached_tokens"]
    endpoint.reset()
    GROUPED.pipe(complete, prompt="{text}", concurrency=1, send_order="input", cache=False)
    assert prefix > 3 * endpoint.stats()["cached_tokens"]


def test_input_order_leaves_the_misses_as_planned():
    misses = pl.DataFrame(
        {"key": ["k1", "k2", "k3"], "system": ["s", None, "s"], "prompt": ["b", "z", "a"]}
    )
    assert send_order(misses, "input")["key"].to_list() == ["k1", "k2", "k3"]
    assert send_order(misses, "prefix", lanes=1)["key"].to_list() == ["k2", "k3", "k1"]


def test_prefix_order_takes_runs_of_the_sorted_misses_in_turn():
    misses = pl.DataFrame({"key": list("abcdefg"), "system": None, "prompt": list("gfedcba")})
    assert send_order(misses, "prefix", lanes=3)["prompt"].to_list() == list("adgbecf")


def test_table_chunks_are_cut_from_the_send_order(endpoint, tmp_path):
    GROUPED.write_parquet(tmp_path / "in.parquet")
    with Client(endpoint=endpoint.base_url, cache=tmp_path / "c.duckdb") as client:
        table = Table(
            client,
            tmp_path / "in.parquet",
            tmp_path / "out.parquet",
            prompt="{text}",
            model="sim",
            chunk_size=5,
        )
        chunks = [pl.read_parquet(chunk)["prompt"] for chunk in table.plan().chunks]
    assert pl.concat(chunks).to_list() == GROUPED["text"].sort().to_list()


def test_table_chunks_in_input_order_follow_the_first_rows(endpoint, tmp_path):
    GROUPED.write_parquet(tmp_path / "in.parquet")
    with Client(endpoint=endpoint.base_url, cache=tmp_path / "c.duckdb") as client:
        table = Table(
            client,
            tmp_path / "in.parquet",
            tmp_path / "out.parquet",
            prompt="{text}",
            model="sim",
            chunk_size=5,
            rows_per_read=7,  # first rows counted across input batches
            send_order="input",
        )
        chunks = [pl.read_parquet(chunk)["prompt"] for chunk in table.plan().chunks]
    assert pl.concat(chunks).to_list() == GROUPED["text"].to_list()


@pytest.mark.parametrize("value", ["random", "", None, 1])
def test_a_bad_send_order_is_a_config_error_before_sending(complete, endpoint, value):
    with pytest.raises(ConfigError, match="send_order must be 'prefix' or 'input'"):
        MIXED.pipe(complete, prompt="{text}", send_order=value)
    assert endpoint.stats()["requests"] == 0


def test_send_order_in_packing_says_where_it_is_now():
    with pytest.raises(ConfigError, match=r"llm_complete\(\.\.\., send_order='input'\)"):
        Packing(send_order="input")
