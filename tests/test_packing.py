"""Multi-row requests: fewer requests, every row still gets exactly its single-row answer."""

from __future__ import annotations

import polars as pl
import pytest

from llm_ops import ConfigError, Packing
from llm_ops.testing import expected_reply

TEXTS = [f"item number {i}" for i in range(64)]


def _expected(system=None):
    return [expected_reply(t, model="sim", system=system) for t in TEXTS]


def test_packs_cut_requests_by_about_k(complete, endpoint):
    out = pl.DataFrame({"text": TEXTS}).pipe(
        complete, prompt="{text}", packing=Packing(rows_per_request=8)
    )
    assert endpoint.stats()["requests"] == 8
    assert out["completion"].to_list() == _expected()


def test_shuffled_and_dropped_items_never_cross_rows(complete, endpoint):
    endpoint.configure(pack_shuffle=True, pack_drop_rate=0.5, seed=3)
    out = pl.DataFrame({"text": TEXTS}).pipe(
        complete, prompt="{text}", packing=Packing(rows_per_request=16)
    )
    assert out["completion"].to_list() == _expected()
    assert out["completion_status"].to_list() == ["ok"] * 64
    assert endpoint.stats()["faults"]["pack_item_dropped"] > 0


def test_packed_answers_are_cached_per_row_for_single_row_jobs(complete, endpoint):
    df = pl.DataFrame({"text": TEXTS})
    df.pipe(complete, prompt="{text}", system="Be brief.", packing=Packing(rows_per_request=32))
    endpoint.reset()
    out = df.pipe(complete, prompt="{text}", system="Be brief.")
    assert endpoint.stats()["requests"] == 0
    assert out["completion"].to_list() == _expected(system="Be brief.")


def test_a_token_budget_bounds_packs_too(complete, endpoint):
    pl.DataFrame({"text": TEXTS}).pipe(
        complete,
        prompt="{text}",
        packing=Packing(rows_per_request=32, pack_tokens=20),
    )
    # 20 tokens are about 80 characters, so about five 14-character prompts per pack
    assert endpoint.stats()["requests"] >= sum(map(len, TEXTS)) // 80 > 64 // 32


def test_packing_and_schemas_do_not_mix(complete):
    with pytest.raises(ConfigError, match="packing cannot be combined"):
        pl.DataFrame({"text": ["x"]}).pipe(
            complete,
            prompt="{text}",
            packing=Packing(rows_per_request=4),
            schema={"type": "object", "properties": {"a": {"type": "string"}}},
        )
