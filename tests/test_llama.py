"""Against a real inference server: llama.cpp with a tiny random model (answers are gibberish;
the server, its tokenizer, usage, finish reasons and error bodies are real)."""

from __future__ import annotations

import polars as pl
import pytest

from llm_ops import JobAbortedError, llm_complete, llm_embed, open_cache


def test_every_row_is_answered_or_truncated_and_only_those_are_cached(llama, cache):
    df = pl.DataFrame({"text": [f"Tell me about item {i}" for i in range(12)]})
    out, report = df.pipe(
        llm_complete,
        prompt="{text}",
        model=llama.model,
        base_url=llama.base_url,
        cache=cache,
        max_tokens=16,
        concurrency=4,
        return_report=True,
    )
    assert set(out["completion_status"].unique()) <= {"ok", "truncated"}
    assert report.prompt_tokens > 0 and report.completion_tokens > 0
    with open_cache(cache) as con:
        reasons = dict(
            con.execute("SELECT finish_reason, count(*) FROM llm_cache GROUP BY ALL").fetchall()
        )
    assert set(reasons) <= {"stop", "length"} and sum(reasons.values()) == 12


def test_a_prompt_over_the_context_is_rejected_with_the_servers_message(llama, cache):
    df = pl.DataFrame({"text": ["hello", "word " * 1000]})
    out = df.pipe(
        llm_complete,
        prompt="{text}",
        model=llama.model,
        base_url=llama.base_url,
        cache=cache,
        max_tokens=8,
        api_key="x",
    )
    assert out["completion_status"].to_list()[1] == "rejected"
    assert "exceed" in out["completion_error"][1]  # readable, though the key is "x"


def test_one_oversized_embedding_input_fails_alone(llama_embed, cache):
    texts = [f"review {i}" for i in range(30)] + ["word " * 1000]
    out = pl.DataFrame({"text": texts}).pipe(
        llm_embed,
        column="text",
        model=llama_embed.model,
        base_url=llama_embed.base_url,
        cache=cache,
        max_attempts=2,
    )
    assert out["embedding_status"].to_list() == ["ok"] * 30 + ["failed"]
    assert "too large to process" in out["embedding_error"][30]
    assert out.schema["embedding"] == pl.Array(pl.Float32, 64)


def test_dimensions_the_server_ignores_are_refused_not_cached(llama_embed, cache):
    out = pl.DataFrame({"text": ["red coat"]}).pipe(
        llm_embed,
        column="text",
        model=llama_embed.model,
        base_url=llama_embed.base_url,
        cache=cache,
        dimensions=16,
    )
    assert out["embedding_status"].to_list() == ["rejected"]
    assert out.schema["embedding"] == pl.Array(pl.Float32, 16)


def test_batch_mode_on_a_server_without_a_batch_api_is_one_clear_error(llama, cache):
    with pytest.raises(JobAbortedError, match="mode='live'"):
        pl.DataFrame({"text": ["hello"]}).pipe(
            llm_complete,
            prompt="{text}",
            model=llama.model,
            base_url=llama.base_url,
            cache=cache,
            mode="batch",
        )
