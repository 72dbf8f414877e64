"""Against a real inference server: llama.cpp with a tiny random model. Its answers are gibberish
by design; the server, its tokenizer, usage, finish reasons, JSON grammars and error bodies are
real. So these tests assert on statuses, types, request counts and the cache, never on text.

The server is ``LLAMA_SERVER`` (model: ``LLAMA_MODEL``, else ``tiny-llama.gguf`` next to it), else
``../shared/llama/llama-server``; without one the module is skipped.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import LlamaServer, llama_missing
from pydantic import BaseModel, Field

from flows.enrich import EnrichConfig, enrich_table
from llm_ops import (
    Endpoint,
    JobAbortedError,
    Retries,
    RunReport,
    Sampling,
    llm_complete,
    llm_embed,
    open_cache,
)

if (missing := llama_missing()) is not None:
    pytest.skip(missing, allow_module_level=True)

TEXTS = ["red coat", "blue hat", "red coat", "green scarf", "blue hat", "red coat"]  # 3 distinct
TWO_TOKENS = {"sampling": Sampling(max_tokens=2, seed=1)}
"""Answers cut at two tokens. Sampled, an answer ends within two tokens about one time in 15;
with this seed none of these prompts' answers does, every time."""


def complete(
    llama: LlamaServer, texts: list[str], cache: Path, **options: Any
) -> tuple[pl.DataFrame, RunReport]:
    """``llm_complete`` of ``{text}`` on llama.cpp, short answers, 4 at a time; and the report."""
    return llm_complete(
        pl.DataFrame({"text": texts}),
        prompt="{text}",
        model=llama.model,
        cache=cache,
        return_report=True,
        **{
            "endpoint": llama.base_url,
            "sampling": Sampling(max_tokens=8),
            "concurrency": 4,
            "progress": False,
            **options,
        },
    )


def server_work(llama: LlamaServer) -> dict[str, float]:
    """The server's own counters of what it has computed so far."""
    metrics = llama.metrics()
    names = ("prompt_tokens_total", "tokens_predicted_total", "n_decode_total")
    return {name: metrics[f"llamacpp:{name}"] for name in names}


def test_duplicate_rows_are_sent_once(llama, cache):
    before = server_work(llama)["tokens_predicted_total"]
    out, report = complete(llama, TEXTS, cache)
    assert (report.rows, report.distinct_requests, report.requests_sent) == (6, 3, 3)
    assert server_work(llama)["tokens_predicted_total"] - before == report.completion_tokens
    answers = out.group_by("text").agg(pl.col("completion").n_unique())
    assert answers["completion"].to_list() == [1, 1, 1]  # each duplicate got its twin's answer


def test_a_rerun_is_answered_by_the_cache_alone(llama, cache):
    first, _ = complete(llama, TEXTS, cache, sampling=Sampling(max_tokens=32))
    before = server_work(llama)
    again, report = complete(llama, TEXTS, cache, sampling=Sampling(max_tokens=32))
    assert (report.requests_sent, report.cache_hits, report.completion_tokens) == (0, 3, 0)
    assert server_work(llama) == before
    assert again["completion"].to_list() == first["completion"].to_list()
    answered = again.filter(first["completion_status"] == "ok")["completion_status"]
    assert answered.to_list() == ["cached"] * len(answered)


def test_a_truncated_answer_from_the_cache_stays_truncated_and_says_so(llama, cache):
    complete(llama, ["red coat", "blue hat"], cache, **TWO_TOKENS)
    again, report = complete(llama, ["red coat", "blue hat"], cache, **TWO_TOKENS)
    assert (report.requests_sent, report.cache_hits) == (0, 2)
    assert again["completion_status"].to_list() == ["truncated", "truncated"]
    assert again["completion_error"].str.ends_with("(from the cache)").all()


def test_max_tokens_truncates_every_row_as_the_server_says(llama, cache):
    out, report = complete(llama, [f"item {i}" for i in range(6)], cache, **TWO_TOKENS)
    assert out["completion_status"].to_list() == ["truncated"] * 6
    assert out["completion"].null_count() == out["completion_error"].null_count() == 0
    with open_cache(cache) as con:
        rows = con.execute("SELECT finish_reason, status, completion_tokens FROM llm_cache")
        assert rows.fetchall() == [("length", "truncated", 2)] * 6
    assert report.completion_tokens == 12


def test_each_status_is_the_servers_finish_reason(llama, cache):
    _, report = complete(
        llama,
        [f"Tell me about item {i}" for i in range(12)],
        cache,
        sampling=Sampling(max_tokens=16),
    )
    with open_cache(cache) as con:
        cached = con.execute("SELECT finish_reason, status, count(*) FROM llm_cache GROUP BY ALL")
        counts = {(reason, status): n for reason, status, n in cached.fetchall()}
    statuses = report.statuses
    expected = {("stop", "ok"): statuses["ok"], ("length", "truncated"): statuses["truncated"]}
    assert counts == {key: n for key, n in expected.items() if n}
    assert sum(counts.values()) == 12
    assert report.prompt_tokens > 0 and report.completion_tokens > 0


class Label(BaseModel):
    label: str = Field(max_length=16)  # bounded, so the grammar's JSON ends well within max_tokens
    score: int


def test_a_schema_is_enforced_by_the_servers_grammar_into_a_typed_struct(llama, cache):
    texts = [f"Rate review {i}" for i in range(6)]
    out, _ = complete(llama, texts, cache, schema=Label, sampling=Sampling(max_tokens=128))
    assert out.schema["completion"] == pl.Struct({"label": pl.String, "score": pl.Int64})
    assert out["completion_status"].to_list() == ["ok"] * 6, out["completion_error"].to_list()
    assert out["completion"].struct.field("score").null_count() == 0


def test_a_prompt_over_the_context_is_rejected_with_the_servers_message(llama, cache):
    out, _ = complete(
        llama, ["hello", "word " * 1000], cache, endpoint=Endpoint(llama.base_url, api_key="x")
    )
    assert out["completion_status"][0] in ("ok", "truncated")
    assert out["completion_status"][1] == "rejected"
    assert "exceed" in out["completion_error"][1]  # readable, though the key is "x"


def test_one_oversized_embedding_input_fails_alone(llama_embed, cache):
    texts = [f"review {i}" for i in range(30)] + ["word " * 1000]
    out = pl.DataFrame({"text": texts}).pipe(
        llm_embed,
        column="text",
        model=llama_embed.model,
        endpoint=llama_embed.base_url,
        retries=Retries(max_attempts=2),
        cache=cache,
    )
    assert out["embedding_status"].to_list() == ["ok"] * 30 + ["failed"]
    assert "too large to process" in out["embedding_error"][30]
    assert out.schema["embedding"] == pl.Array(pl.Float32, 64)


def test_dimensions_the_server_ignores_are_refused_not_cached(llama_embed, cache):
    out = pl.DataFrame({"text": ["red coat"]}).pipe(
        llm_embed,
        column="text",
        model=llama_embed.model,
        endpoint=llama_embed.base_url,
        cache=cache,
        dimensions=16,
    )
    assert out["embedding_status"].to_list() == ["rejected"]
    assert out.schema["embedding"] == pl.Array(pl.Float32, 16)


def test_batch_mode_on_a_server_without_a_batch_api_is_one_clear_error(llama, cache):
    with pytest.raises(JobAbortedError, match="use batch=False"):
        complete(llama, ["hello"], cache, batch=True)


@pytest.fixture
def reviews(tmp_path: Path) -> Path:
    path = tmp_path / "reviews.parquet"
    pl.DataFrame(
        {"id": range(5), "text": ["red coat", None, "red coat", "blue hat", "hat"]}
    ).write_parquet(path)
    return path


def test_the_command_line_runs_a_file(llama, reviews, tmp_path):
    llm_ops = Path(sys.executable).with_name("llm-ops")
    job = ["--prompt", "{text}", "--model", llama.model, "--base-url", llama.base_url]
    limits = ["--max-tokens", "8", "--concurrency", "4", "--no-progress"]
    files = ["--output", tmp_path / "out.parquet", "--cache", tmp_path / "c.duckdb"]
    done = subprocess.run(
        [llm_ops, "run", reviews, *job, *limits, *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    statuses = pl.read_parquet(tmp_path / "out.parquet")["completion_status"].to_list()
    assert statuses[1] == "skipped"
    assert set(statuses[:1] + statuses[2:]) <= {"ok", "truncated"}


def test_the_prefect_flow_enriches_a_file(prefect, llama, reviews, tmp_path, cache):
    config = EnrichConfig(
        input=str(reviews),
        output=str(tmp_path / "out.parquet"),
        prompt="{text}",
        model=llama.model,
        base_url=llama.base_url,
        cache=str(cache),
        max_tokens=8,
        concurrency=4,
        chunk_size=2,
    )
    report = enrich_table(config)
    statuses = pl.read_parquet(config.output)["summary_status"].to_list()
    assert statuses[1] == "skipped"
    assert set(statuses[:1] + statuses[2:]) <= {"ok", "truncated"}
    assert (report["distinct_requests"], report["requests_sent"]) == (3, 3)


def test_a_classify_expression_gets_only_the_labels_from_the_servers_grammar(llama, cache):
    import llm_ops

    labels = ["clothing", "colour"]
    asked = pl.col("text").llm.classify(
        labels,
        with_status=True,
        model=llama.model,
        endpoint=llama.base_url,
        sampling=Sampling(max_tokens=32),
        cache=cache,
        concurrency=4,
        progress=False,
    )
    out = pl.DataFrame({"text": TEXTS}).lazy().select(asked).collect().unnest("text")
    assert set(out["status"]) <= {"ok", "cached"}, out["error"].to_list()  # cached: a batch on
    assert out.schema["answer"] == pl.Enum(labels) and out["answer"].null_count() == 0
    assert llm_ops.last_report().requests_sent == 3  # one per distinct text
