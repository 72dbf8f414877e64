"""Table jobs as plain functions: planning into chunks and writing in batches, no Prefect."""

from __future__ import annotations

import duckdb
import polars as pl
import pytest

from flows.enrich import EnrichConfig, open_table
from llm_ops import ConfigError
from llm_ops.tables import input_files


@pytest.fixture
def job_on(tmp_path, endpoint, cache):
    def make(texts, **config):
        source = tmp_path / "in.parquet"
        pl.DataFrame({"text": texts}).write_parquet(source)
        return open_table(
            EnrichConfig(
                input=str(source),
                output=str(tmp_path / "out.parquet"),
                prompt="{text}",
                base_url=endpoint.base_url,
                cache=str(cache),
                **config,
            )
        )

    return make


def test_plan_writes_one_chunk_file_per_chunk_size_misses(job_on):
    plan = job_on([str(i % 7) for i in range(50)], rows_per_read=8, chunk_size=3).plan()
    assert (plan.rows, plan.distinct, plan.misses) == (50, 7, 7)
    assert len(plan.chunks) == 3


def test_rows_keep_their_order_across_batches(job_on, tmp_path):
    texts = [f"t{i}" for i in range(23)]
    table = job_on(texts, rows_per_read=4, chunk_size=10)
    for chunk in table.plan().chunks:
        table.run_chunk(chunk)
    table.write()
    out = pl.read_parquet(tmp_path / "out.parquet")
    assert out["text"].to_list() == texts
    assert out["summary_status"].to_list() == ["ok"] * 23


def test_a_finished_table_leaves_no_work_directory(job_on, tmp_path):
    job_on(["a", "b"]).run()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("out")] == ["out.parquet"]


def test_globs_expand_to_sorted_files(tmp_path):
    for name in ("b.parquet", "a.parquet"):
        pl.DataFrame({"x": [1]}).write_parquet(tmp_path / name)
    assert [f.name for f in input_files(tmp_path / "*.parquet")] == ["a.parquet", "b.parquet"]


def test_no_matching_input_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no input file matches"):
        input_files(tmp_path / "*.parquet")


def test_table_reports_count_what_dedupe_saved(job_on):
    texts = [f"t{i % 5}" for i in range(15)]  # each one thrice; the simulator is free: priced
    report = job_on(texts, rows_per_read=4, pricing=["0.15,0"]).run()
    assert report.cost and report.cost > 0
    assert report.cost_saved == pytest.approx(2 * report.cost)


def test_the_semantic_cache_works_over_tables(job_on, tmp_path):
    out = tmp_path / "out.parquet"
    for texts in (["red dress, lovely"], ["Lovely red dress!", "blue hat"]):
        report = job_on(texts, semantic_cache="sim-embed", semantic_cache_threshold=0.9).run()
    written = pl.read_parquet(out)
    assert written["summary_status"].to_list() == ["similar", "ok"]
    assert written["summary"][0].endswith("red dress, lovely")
    assert written["summary_similarity"][0] == pytest.approx(1.0)
    assert report.savings["semantic_cache"].requests == 1


def test_a_cascade_runs_over_a_table_batch_by_batch(job_on, tmp_path, cache):
    texts = ["a", "b [[sim:unsure_for=sim-small]]", "c", "a", "d [[sim:fail_for=sim-small]]"]
    report = job_on(
        texts, model=["sim-small", "sim"], escalate="summary LIKE 'unsure:%'", rows_per_read=2
    ).run()
    written = pl.read_parquet(tmp_path / "out.parquet")
    assert written["summary_model"].to_list() == [
        "sim-small",
        "sim",
        "sim-small",
        "sim-small",
        "sim",
    ]
    assert (report.rows, report.models["sim"].rows, report.cache_hits) == (5, 2, 1)
    with duckdb.connect(str(cache), read_only=True) as con:
        assert con.sql("SELECT model FROM llm_runs").fetchall() == [("sim-small > sim",)]


def test_one_client_keeps_its_rate_limit_from_chunk_to_chunk(job_on, endpoint):
    endpoint.configure(rpm=120, rate_window=1.0, rate_limit_headers=False)
    report = job_on([f"t{i}" for i in range(12)], chunk_size=4, rpm=110, concurrency=4).run()
    assert report.statuses["ok"] == 12
    # A limiter made afresh per chunk would start each chunk with a full bucket: a burst the
    # endpoint's bucket, drained by the chunk before, answers with 429s. (The client's limit
    # is a little under the endpoint's, so that timing jitter alone draws none.)
    assert "429" not in endpoint.stats()["by_status"]


def test_a_model_the_endpoint_does_not_list_fails_the_plan(job_on):
    with pytest.raises(ConfigError, match="did you mean 'sim'"):
        job_on(["a"], model="simm").plan()
