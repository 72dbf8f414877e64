"""llm_aggregate against a real llama.cpp (512-token slots): the context is read from its
``/props`` and no request overflows it. Its answers are gibberish; its tokenizer and its
context errors are real. Skipped without ``../shared/llama`` (see tests/test_llama.py)."""

from __future__ import annotations

import random

import polars as pl
import pytest
from conftest import LlamaServer, llama_missing

from llm_ops import llm_aggregate

if (missing := llama_missing()) is not None:
    pytest.skip(missing, allow_module_level=True)

WORDS = [
    "the",
    "parcel",
    "came",
    "late",
    "and",
    "the",
    "box",
    "was",
    "torn",
    "but",
    "the",
    "coat",
    "fits",
    "well",
    "soft",
    "warm",
]


def reviews(groups: int, seed: int = 0) -> pl.DataFrame:
    """Reviews of 4-30 words with an entity and a score fact each (digits and brackets: what
    LLaMA's tokenizer counts most over four characters a token), 5 to 80 to a group."""
    draw = random.Random(seed)
    rows = [
        (
            g,
            " ".join(draw.choices(WORDS, k=draw.randint(4, 30)))
            + f" [entity={draw.randint(0, 999)}] [score={draw.random():.2f}]",
        )
        for g in range(groups)
        for _ in range(draw.randint(5, 80))
    ]
    return pl.DataFrame(rows, schema=["shop", "text"], orient="row")


def test_no_fold_overflows_a_512_token_slot(llama: LlamaServer, tmp_path):
    out, report = llm_aggregate(
        reviews(5),
        "text",
        "Summarize the reviews",
        by="shop",
        model=llama.model,
        endpoint=llama.base_url,
        cache=tmp_path / "cache.duckdb",
        concurrency=4,
        return_report=True,
        progress=False,
    )
    assert "512-token requests (the endpoint's /props)" in (report.plan_why or "")
    assert report.waves >= 2  # the groups did not fit one request each: a real fold
    assert set(out["aggregate_status"].cast(pl.String)) <= {"ok", "truncated"}
