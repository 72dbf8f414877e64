"""The grouped plan: rows are rendered, keyed and joined back once per distinct combination of
the values the templates read, and each row gathers its group's columns."""

from __future__ import annotations

import polars as pl

from llm_ops._key import build_request, messages_for, request_key
from llm_ops._options import Columns, make_job
from llm_ops._pipeline.join import join_back
from llm_ops._pipeline.plan import key_rows
from llm_ops._spec import RequestSpec
from llm_ops._status import RESULTS
from llm_ops.testing import expected_reply

ENDPOINT = "http://127.0.0.1:9/v1"


def spec_for(prompt: str, system: str | None = None) -> RequestSpec:
    options = {"progress": False} | ({"system": system} if system else {})
    return make_job(prompt=prompt, model="m", endpoint=ENDPOINT, cached=False, options=options).spec


def reference(prompt: str, system: str | None = None) -> str:
    return request_key(
        build_request(
            endpoint=ENDPOINT, model="m", messages=messages_for(system, prompt), params={}
        )
    )


def test_rows_are_keyed_per_group_of_the_values_the_templates_read():
    df = pl.DataFrame({"a": ["x", "y", "x", None, "y", "x"], "unused": range(6)})
    keyed = key_rows(df, spec_for("Say {a}"))
    assert keyed.groups.height == 3  # x, y, null: the unused column does not split groups
    assert keyed.row_group.to_list() == [0, 1, 0, 2, 1, 0]
    assert keyed.rows["key"].to_list() == [
        reference("Say x"),
        reference("Say y"),
        reference("Say x"),
        None,
        reference("Say y"),
        reference("Say x"),
    ]
    assert keyed.rows["skip_reason"][3] == "column 'a' is null; row not sent"
    # the distinct requests come in order of first appearance, with their row counts
    assert keyed.distinct.select("prompt", "rows").rows() == [("Say x", 3), ("Say y", 2)]


def test_groups_rendering_alike_share_one_request():
    df = pl.DataFrame({"a": ["x", "xy", "x"], "b": ["yz", "z", "yz"]})
    keyed = key_rows(df, spec_for("{a}{b}"))
    assert keyed.groups.height == 2
    assert keyed.distinct.select("prompt", "rows").rows() == [("xyz", 3)]
    assert keyed.rows["key"].to_list() == [reference("xyz")] * 3


def test_float_values_are_grouped_by_their_text():
    df = pl.DataFrame({"f": [0.0, -0.0, 0.0, float("nan"), None]})
    keyed = key_rows(df, spec_for("{f}", system="n={f}"))
    prompts = ["0.0", "-0.0", "0.0", "NaN"]
    assert keyed.rows["key"].to_list() == [reference(p, f"n={p}") for p in prompts] + [None]
    assert keyed.distinct["rows"].to_list() == [2, 1, 1]


def test_a_template_without_columns_is_one_group():
    keyed = key_rows(pl.DataFrame({"a": [1, 2, 3]}), spec_for("hello"))
    assert keyed.row_group.to_list() == [0, 0, 0]
    assert keyed.distinct.select("prompt", "rows").rows() == [("hello", 3)]
    empty = key_rows(pl.DataFrame({"a": []}, schema={"a": pl.Int64}), spec_for("hello"))
    assert (empty.rows.height, empty.distinct.height) == (0, 0)


def test_repeated_rows_get_their_own_answers_in_order(complete, endpoint):
    texts = ["b", "a", None, "c", "a", "b", None, "a"] * 50
    df = pl.DataFrame({"id": range(len(texts)), "text": texts})
    out, report = df.pipe(complete, prompt="Q: {text}", return_report=True)
    assert endpoint.stats()["requests"] == 3
    assert out.select("id", "text").equals(df)
    expected = [None if t is None else expected_reply(f"Q: {t}", model="sim") for t in texts]
    assert out["completion"].to_list() == expected
    statuses = ["skipped" if t is None else "ok" for t in texts]
    assert out["completion_status"].cast(pl.String).to_list() == statuses
    assert report.statuses["ok"] == 300 and report.statuses["skipped"] == 100
    assert report.models["sim"].rows == 300


def test_joining_back_per_group_equals_joining_back_per_row():
    df = pl.DataFrame({"a": ["x", "y", None, "x", "z"]})
    keyed = key_rows(df, spec_for("{a}"))
    x, y, _ = keyed.distinct["key"].to_list()
    results = pl.DataFrame(
        [
            (x, "X", None, "ok", None, 1, 1, None, None, None),
            (y, None, None, "rejected", "400: no", 1, 0, None, None, None),
        ],
        schema=RESULTS,
        orient="row",
    )
    columns = Columns()
    per_row = join_back(keyed.rows, results, columns, None)
    per_group = join_back(keyed.groups, results, columns, None, row_group=keyed.row_group)
    assert per_group.equals(per_row)
    assert per_group["completion_status"].cast(pl.String).to_list() == [
        "ok",
        "rejected",
        "skipped",
        "ok",
        "failed",  # z was never dispatched
    ]
    # a key settled twice (never expected) gives what the per-row join gives
    twice = pl.concat([results, results.head(1)])
    per_row = join_back(keyed.rows, twice, columns, None)
    assert join_back(keyed.groups, twice, columns, None, row_group=keyed.row_group).equals(per_row)
