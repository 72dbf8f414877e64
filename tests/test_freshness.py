"""Freshness (issue 39): ``Cache(path, max_age=...)`` reuses answers at most that old; an older
one is sent again, and the new answer is kept beside it (over HTTP, a real cache file)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import duckdb
import polars as pl
import pytest
from pydantic import ValidationError

from flows.enrich import EnrichConfig
from llm_ops import (
    Cache,
    Client,
    ConfigError,
    SemanticCache,
    estimate,
    open_cache,
    options_from_settings,
    parse_duration,
)
from llm_ops._cache._store import MAX_AGE_LIMIT
from llm_ops.cli import main
from llm_ops.polars import llm  # noqa: F401  (the .llm namespace)
from llm_ops.sql import register
from llm_ops.tables import Table, WorkerStore, send_chunk

TEXTS = pl.DataFrame({"text": ["alpha", "beta"]})


def _backdate(cache, days):
    with duckdb.connect(str(cache)) as con:
        con.execute(f"UPDATE llm_cache SET created_at = created_at - INTERVAL {days} DAY")


@pytest.fixture
def aged(complete, cache, endpoint):
    """The texts answered two days ago, and the endpoint's counters zeroed since."""
    TEXTS.pipe(complete, prompt="{text}")
    _backdate(cache, 2)
    endpoint.reset()
    return Cache(cache, max_age=timedelta(days=1))


def test_an_answer_younger_than_the_max_age_is_reused(complete, cache, endpoint):
    TEXTS.pipe(complete, prompt="{text}")
    endpoint.reset()
    out = TEXTS.pipe(complete, prompt="{text}", cache=Cache(cache, max_age=3600))
    assert out["completion_status"].to_list() == ["cached", "cached"]
    assert endpoint.stats()["requests"] == 0


def test_an_older_answer_is_sent_again_once(complete, aged, endpoint):
    out = TEXTS.pipe(complete, prompt="{text}", cache=aged)
    assert out["completion_status"].to_list() == ["ok", "ok"]
    assert endpoint.stats()["requests"] == 2


def test_the_report_counts_the_answers_refreshed_for_age(complete, aged):
    _, report = TEXTS.pipe(complete, prompt="{text}", cache=aged, return_report=True)
    assert (report.cache_hits, report.refreshed_for_age, report.requests_sent) == (0, 2, 2)
    assert "refreshed for age           2" in str(report)


def test_the_cache_keeps_the_old_answer_as_history(complete, cache, aged):
    TEXTS.pipe(complete, prompt="{text}", cache=aged)
    with open_cache(cache) as con:
        history = con.sql(
            "SELECT key, created_at FROM llm_cache UNION ALL "
            "SELECT key, created_at FROM llm_cache_history ORDER BY key, created_at"
        ).fetchall()
        assert con.sql("SELECT count(*) FROM llm_cache").fetchall() == [(2,)]
    assert len(history) == 4 and history[0][0] == history[1][0]
    assert history[1][1] - history[0][1] > timedelta(days=1)


def test_a_later_job_without_max_age_reuses_the_newest(complete, cache, aged, endpoint):
    TEXTS.pipe(complete, prompt="{text}", cache=aged)
    endpoint.reset()
    TEXTS.pipe(complete, prompt="{text}", cache=Cache(cache, max_age=timedelta(days=1)))
    out = TEXTS.pipe(complete, prompt="{text}")
    assert out["completion_status"].to_list() == ["cached", "cached"]
    assert endpoint.stats()["requests"] == 0


def test_a_job_without_max_age_reuses_an_old_answer(complete, aged, endpoint):
    out = TEXTS.pipe(complete, prompt="{text}")
    assert out["completion_status"].to_list() == ["cached", "cached"]
    assert endpoint.stats()["requests"] == 0


def test_a_refresh_merged_twice_adds_no_history(complete, cache, aged):
    TEXTS.pipe(complete, prompt="{text}", cache=aged)
    TEXTS.pipe(complete, prompt="{text}", cache=aged)  # fresh now: reused, nothing added
    with open_cache(cache) as con:
        assert con.sql("SELECT count(*) FROM llm_cache_history").fetchall() == [(2,)]


@pytest.mark.parametrize(
    ("text", "seconds"), [("1d", 86400), ("6h", 21600), ("30m", 1800), ("45s", 45), ("90", 90)]
)
def test_a_duration_is_read_as_the_cli_and_the_flow_spell_it(text, seconds):
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("age", [0, -1, "soon", "1w", True, timedelta(0)])
def test_a_max_age_that_is_no_positive_duration_is_refused(cache, age):
    with pytest.raises(ConfigError, match=r"max_age|duration"):
        Cache(cache, max_age=age)


@pytest.mark.parametrize(
    "age", [float("inf"), "inf", "999999d", 1e11, 10**400, timedelta.max], ids=repr
)
def test_a_max_age_beyond_what_the_cache_holds_is_refused_with_the_range(cache, age):
    with pytest.raises(ConfigError, match="at most 365,000 days"):
        Cache(cache, max_age=age)


def test_a_max_age_at_its_limit_reuses_an_old_answer(complete, aged, endpoint):
    TEXTS.pipe(complete, prompt="{text}", cache=Cache(aged.path, max_age=MAX_AGE_LIMIT))
    assert endpoint.stats()["requests"] == 0


def test_the_cli_refuses_a_max_age_beyond_the_limit(capsys):
    with pytest.raises(SystemExit):
        main(["run", "in.parquet", "--prompt", "{text}", "--model", "sim", "--max-age", "1e11"])
    assert "at most 365,000 days" in capsys.readouterr().err


def test_the_cli_takes_max_age(cache, aged, endpoint, tmp_path, capsys):
    TEXTS.write_parquet(tmp_path / "in.parquet")
    job = [str(tmp_path / "in.parquet"), "--prompt", "{text}", "--model", "sim", "--cache"]
    job += [str(cache), "--base-url", endpoint.base_url, "--output", str(tmp_path / "o.parquet")]
    assert main(["run", *job, "--max-age", "1d", "--no-progress"]) == 0
    assert endpoint.stats()["requests"] == 2
    assert "refreshed for age" in capsys.readouterr().out


def test_the_cli_refuses_a_max_age_it_cannot_read(capsys):
    with pytest.raises(SystemExit):
        main(["run", "in.parquet", "--prompt", "{text}", "--model", "sim", "--max-age", "1w"])
    assert "--max-age" in capsys.readouterr().err


def test_the_flow_passes_max_age_on_as_a_setting():
    config = EnrichConfig(max_age="6h")
    assert options_from_settings(config.settings())["cache"].max_age == timedelta(hours=6)


def test_the_flow_refuses_a_max_age_it_cannot_read():
    with pytest.raises(ValidationError, match="max_age"):
        EnrichConfig(max_age="soon")


def test_estimate_prices_the_answers_too_old_as_requests_to_send(aged, endpoint):
    found = estimate(TEXTS, prompt="{text}", model="sim", endpoint=endpoint.base_url, cache=aged)
    assert (found.cache_hits, found.requests, found.refreshed_for_age) == (0, 2, 2)
    assert "refreshed for age" in str(found)


REFRESH = """
import os, sys, time
import polars as pl
from llm_ops import Cache, llm_complete
base_url, cache, go = sys.argv[1:4]
texts = pl.DataFrame({"text": [f"shared {i}" for i in range(300)]})
while not os.path.exists(go):
    time.sleep(0.005)
out = texts.pipe(llm_complete, prompt="{text}", model="sim", endpoint=base_url, progress=False,
                 cache=Cache(cache, max_age=3600), concurrency=16)
print(sorted(set(out["completion_status"])))
"""


def test_two_jobs_refreshing_the_same_old_answers_pay_for_each_once(
    complete, cache, endpoint, tmp_path
):
    pl.DataFrame({"text": [f"shared {i}" for i in range(300)]}).pipe(complete, prompt="{text}")
    _backdate(cache, 2)
    endpoint.reset()
    endpoint.configure(latency=0.02, gather=17)  # no answer until both jobs have some in flight
    (go := tmp_path / "go").touch()
    command = [sys.executable, "-c", REFRESH, endpoint.base_url, str(cache), str(go)]
    jobs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    assert all(
        job.communicate(timeout=120)[0].strip() in {"['ok']", "['cached', 'ok']"} for job in jobs
    )
    assert endpoint.stats()["requests"] <= 300 + 2 * 16
    assert endpoint.stats()["distinct_answered"] == 300


def test_the_semantic_cache_reuses_no_similar_answer_older_than_the_max_age(
    complete, cache, endpoint
):
    similar = SemanticCache("sim-embed", threshold=0.9)
    pl.DataFrame({"text": ["the red dress is lovely"]}).pipe(
        complete, prompt="{text}", semantic_cache=similar
    )
    _backdate(cache, 2)
    near = pl.DataFrame({"text": ["The red dress is LOVELY!"]})
    out = near.pipe(complete, prompt="{text}", semantic_cache=similar, cache=aged_cache(cache))
    assert out["completion_status"].to_list() == ["ok"]


def test_the_semantic_cache_reuses_a_similar_answer_younger_than_the_max_age(complete, cache):
    similar = SemanticCache("sim-embed", threshold=0.9)
    pl.DataFrame({"text": ["the red dress is lovely"]}).pipe(
        complete, prompt="{text}", semantic_cache=similar
    )
    near = pl.DataFrame({"text": ["The red dress is LOVELY!"]})
    out = near.pipe(complete, prompt="{text}", semantic_cache=similar, cache=aged_cache(cache))
    assert out["completion_status"].to_list() == ["similar"]


def aged_cache(cache):
    return Cache(cache, max_age=timedelta(days=1))


KILLED_REFRESH = """
import sys, polars as pl
from llm_ops import Cache, llm_complete
df = pl.DataFrame({"text": [f"row {i} [[sim:latency=0.02]]" for i in range(1200)]})
df.pipe(llm_complete, prompt="{text}", model="sim", endpoint=sys.argv[1], progress=False,
        cache=Cache(sys.argv[2], max_age=3600), concurrency=16)
"""


def test_a_killed_refresh_resumes_without_paying_twice(complete, cache, endpoint):
    rows = pl.DataFrame({"text": [f"row {i} [[sim:latency=0.02]]" for i in range(1200)]})
    rows.pipe(complete, prompt="{text}", concurrency=64)
    _backdate(cache, 2)
    endpoint.reset()
    job = subprocess.Popen([sys.executable, "-c", KILLED_REFRESH, endpoint.base_url, str(cache)])
    while endpoint.stats()["answered"] < 600 and job.poll() is None:
        time.sleep(0.02)
    job.send_signal(signal.SIGKILL)
    job.wait()
    answered = endpoint.stats()["answered"]
    endpoint.reset()
    out = rows.pipe(complete, prompt="{text}", cache=aged_cache(cache), concurrency=16)
    assert set(out["completion_status"]) == {"ok", "cached"}  # the refreshes it kept
    assert endpoint.stats()["requests"] - (1200 - answered) <= 16 + 64


def test_sql_functions_refresh_answers_older_than_the_max_age(aged, endpoint):
    con = duckdb.connect()
    register(con, endpoint=endpoint.base_url, cache=aged, model="sim")
    con.sql("SELECT llm_complete(text) FROM (VALUES ('alpha'), ('beta')) t(text)").fetchall()
    assert endpoint.stats()["requests"] == 2


def test_expressions_refresh_answers_older_than_the_max_age(aged, endpoint):
    asked = pl.col("text").llm.complete("{}", model="sim", endpoint=endpoint.base_url, cache=aged)
    TEXTS.select(asked)
    assert endpoint.stats()["requests"] == 2


def test_expressions_without_max_age_reuse_the_old_answers(cache, aged, endpoint):
    asked = pl.col("text").llm.complete("{}", model="sim", endpoint=endpoint.base_url, cache=cache)
    TEXTS.select(asked)
    assert endpoint.stats()["requests"] == 0


def test_a_snapshot_takes_a_refresh_still_in_the_journal(cache, aged, tmp_path):
    with open_cache(cache) as con:
        row = con.sql("SELECT * EXCLUDE (created_at) FROM llm_cache LIMIT 1").pl().to_dicts()[0]
    writer = aged.writer()  # alive: what it journals waits there, unmerged
    writer.answer({**row, "response_text": "new", "refresh": True, "created_at": datetime.now(UTC)})
    writer.write()
    aged.snapshot(tmp_path / "snap.duckdb")
    writer.close(wait=None)
    with duckdb.connect(str(tmp_path / "snap.duckdb"), read_only=True) as con:
        now = con.execute("SELECT response_text FROM llm_cache WHERE key = ?", [row["key"]])
        assert now.fetchall() == [("new",)]
        assert con.sql("SELECT count(*) FROM llm_cache_history").fetchall() == [(1,)]


def test_a_cluster_workers_refreshes_replace_the_old_answers_once_adopted(
    aged, cache, endpoint, tmp_path
):
    TEXTS.write_parquet(tmp_path / "in.parquet")
    with Client(endpoint=endpoint.base_url, cache=aged) as driver:
        table = Table(
            driver, tmp_path / "in.parquet", tmp_path / "o.parquet", prompt="{text}", model="sim"
        )
        chunk = table.plan().chunks[0]
        store = WorkerStore(
            table.answers_dir, flush_every=32, flush_seconds=2, max_age=aged.max_age
        )
        with Client(endpoint=endpoint.base_url, cache=False) as worker:
            send_chunk(worker, table.job, store, chunk)
        aged.adopt(table.answers_dir, wait=2.0)
    with open_cache(cache) as con:
        assert con.sql("SELECT count(*) FROM llm_cache_history").fetchall() == [(2,)]
