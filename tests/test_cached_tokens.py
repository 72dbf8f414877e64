"""Input tokens a server reads from its prefix cache: reported, recorded and priced.

Every prompt below starts with the same 251 characters; with the user role in front, that is
four full 64-character blocks of the simulator's prefix cache, so each row after the first has
64 of its 68 prompt tokens cached (rows are sent one at a time, so the order is fixed).
"""

from __future__ import annotations

import json
import urllib.request

import duckdb
import polars as pl
import pytest

from llm_ops import Price
from llm_ops._cache import LATEST_VERSION, MIGRATIONS

PREFIX = ("Summarize this customer review in one short sentence, keeping its tone. " * 4)[:251]
PROMPT = PREFIX + "{text}"
ROWS = pl.DataFrame({"text": [f"review {i}" for i in range(4)]})
# 4 rows x 68 prompt tokens, 3 rows x 64 cached, 4 rows x 14 completion tokens
PROMPT_TOKENS, CACHED_TOKENS, COMPLETION_TOKENS = 272, 192, 56


@pytest.fixture
def prefix_cached(endpoint):
    endpoint.configure(prefix_cache_tokens=4096)
    return endpoint


def _run(complete, frame=ROWS, **options):
    return frame.pipe(complete, prompt=PROMPT, concurrency=1, return_report=True, **options)[1]


def _query(path, sql):
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(sql).fetchall()


def _chat(endpoint, content):
    body = {"model": "sim", "messages": [{"role": "user", "content": content}]}
    request = urllib.request.Request(
        f"{endpoint.base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
        return json.load(response)["usage"]


def test_the_simulator_reports_cached_tokens_for_a_repeated_prefix(prefix_cached):
    assert _chat(prefix_cached, PREFIX + "one")["prompt_tokens_details"] == {"cached_tokens": 0}
    assert _chat(prefix_cached, PREFIX + "two")["prompt_tokens_details"] == {"cached_tokens": 64}
    assert prefix_cached.stats()["cached_tokens"] == 64


def test_without_a_prefix_cache_no_tokens_are_cached(endpoint):
    _chat(endpoint, PREFIX + "one")
    assert _chat(endpoint, PREFIX + "two")["prompt_tokens_details"] == {"cached_tokens": 0}


def test_a_jobs_report_and_llm_runs_count_cached_tokens(complete, prefix_cached, cache):
    report = _run(complete)
    assert (report.prompt_tokens, report.cached_tokens) == (PROMPT_TOKENS, CACHED_TOKENS)
    assert f"({CACHED_TOKENS} in cached)" in str(report)
    assert _query(cache, "SELECT cached_tokens FROM llm_runs") == [(CACHED_TOKENS,)]


def test_the_cache_rows_carry_their_cached_tokens(complete, prefix_cached, cache):
    _run(complete)
    rows = _query(cache, "SELECT cached_tokens FROM llm_cache ORDER BY cached_tokens")
    assert rows == [(0,), (64,), (64,), (64,)]


def test_cached_tokens_are_billed_at_the_cached_rate(complete, prefix_cached):
    report = _run(complete, pricing=Price(2.0, 8.0, cached_input_per_million=0.5))
    # (2.00 x 80 uncached + 0.50 x 192 cached + 8.00 x 56 out) / 1M
    assert report.cost == pytest.approx(0.000704, abs=1e-12)
    assert report.cost_saved == pytest.approx(0.0, abs=1e-12)  # the server's discount, no lever's


def test_without_a_cached_rate_cached_tokens_cost_the_input_rate(complete, prefix_cached):
    report = _run(complete, pricing=Price(2.0, 8.0))
    assert report.cost == pytest.approx(0.000992, abs=1e-12)  # (2.00 x 272 + 8.00 x 56) / 1M


def test_a_rerun_from_the_cache_adds_no_cached_tokens(complete, prefix_cached, cache):
    _run(complete)
    rerun = _run(complete, pricing=Price(2.0, 8.0, cached_input_per_million=0.5))
    assert (rerun.cache_hits, rerun.cached_tokens, rerun.cost) == (4, 0, 0)
    assert _query(cache, "SELECT cached_tokens FROM llm_runs ORDER BY started_at") == [
        (CACHED_TOKENS,),
        (0,),
    ]


def test_a_cache_made_before_cached_tokens_migrates(complete, prefix_cached, cache, tmp_path):
    _run(complete)
    old = tmp_path / "old.duckdb"  # the same answers, in a cache at schema version 7
    with duckdb.connect(str(old)) as con:
        con.execute(
            "CREATE TABLE llm_ops_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp)"
        )
        for version, name, sql in MIGRATIONS[:7]:
            con.execute(sql)
            con.execute("INSERT INTO llm_ops_migrations VALUES (?, ?, now())", [version, name])
        con.execute(f"ATTACH '{cache}' AS new (READ_ONLY)")
        con.execute(
            "INSERT INTO llm_cache SELECT * EXCLUDE (cached_tokens, reasoning_tokens, "
            "reasoning_text, cache_write_tokens) FROM new.llm_cache"
        )

    more = pl.concat([ROWS, pl.DataFrame({"text": ["review 4"]})])
    report = _run(complete, frame=more, cache=old)
    assert (report.cache_hits, report.requests_sent, report.cached_tokens) == (4, 1, 64)
    assert _query(old, "SELECT max(version) FROM llm_ops_migrations") == [(LATEST_VERSION,)]
    cached = _query(old, "SELECT cached_tokens FROM llm_cache ORDER BY cached_tokens NULLS FIRST")
    assert cached == [(None,)] * 4 + [(64,)]
