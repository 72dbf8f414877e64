"""The DuckDB SQL functions, and the cache shared with a reader in another process."""

from __future__ import annotations

import subprocess
import sys
import time

import duckdb
import polars as pl
import pytest

from llm_ops import RateLimit, Sampling, open_cache
from llm_ops.sql import register
from llm_ops.testing import expected_reply


@pytest.fixture
def con(endpoint, cache):
    connection = duckdb.connect()
    register(connection, endpoint=endpoint.base_url, cache=cache, model="sim")
    connection.execute(
        "CREATE TABLE reviews AS SELECT * FROM (VALUES (1, 'nice'), (2, 'bad'), "
        "(3, 'nice'), (4, NULL), (5, '[[sim:status=400]]')) t(id, text)"
    )
    yield connection
    connection.close()


def _answers(con, function="llm_complete"):
    return con.sql(f"SELECT {function}('Summarize: ' || text) FROM reviews ORDER BY id").fetchall()


def test_one_request_per_distinct_prompt_and_the_right_answer_per_row(con, endpoint):
    assert [a for (a,) in _answers(con)][:3] == [
        expected_reply(f"Summarize: {t}", model="sim") for t in ("nice", "bad", "nice")
    ]
    assert endpoint.stats()["requests"] == 3


def test_a_second_query_is_served_from_the_cache(con, endpoint):
    _answers(con)
    endpoint.reset()
    assert (
        con.sql(
            "SELECT (llm_complete_result('Summarize: ' || text)).status FROM reviews "
            "WHERE id < 4 ORDER BY id"
        ).fetchall()
        == [("cached",)] * 3
    )
    assert endpoint.stats()["requests"] == 0


def test_failed_and_null_rows_are_null_and_the_result_says_why(con):
    assert [a for (a,) in _answers(con)][3:] == [None, None]
    results = [r for (r,) in _answers(con, "llm_complete_result")]
    assert (results[3]["status"], results[4]["status"]) == ("skipped", "rejected")
    assert results[4]["error"] == "HTTP 400: simulated error 400"


def test_on_error_raise_aborts_the_query(endpoint, cache):
    connection = duckdb.connect()
    register(connection, endpoint=endpoint.base_url, cache=cache, on_error="raise")
    with pytest.raises(duckdb.Error, match="rejected: HTTP 400"):
        connection.sql("SELECT llm_complete('[[sim:status=400]]', model := 'sim')").fetchall()


def test_sql_and_python_compute_the_same_key(con, complete, cache):
    pl.DataFrame({"text": ["nice"]}).pipe(
        complete, prompt="Summarize: {text}", system="Be brief.", sampling=Sampling(temperature=0.5)
    )
    with open_cache(cache) as reader:
        (python_key,) = reader.sql("SELECT key FROM llm_cache").fetchall()[0]
    (sql_key,) = con.sql(
        "SELECT llm_request_key('Summarize: nice', system := 'Be brief.', temperature := 0.5)"
    ).fetchall()[0]
    assert sql_key == python_key


def test_works_on_a_connection_to_the_cache_itself(endpoint, cache):
    connection = duckdb.connect(str(cache))
    register(connection, endpoint=endpoint.base_url, cache=cache, model="sim")
    connection.sql("SELECT llm_complete('hello')").fetchall()
    assert connection.sql("SELECT count(*) FROM llm_cache").fetchall() == [(1,)]


def test_a_missing_model_is_a_clear_error(endpoint, cache):
    connection = duckdb.connect()
    register(connection, endpoint=endpoint.base_url, cache=cache)
    with pytest.raises(duckdb.Error, match="llm_complete needs a model"):
        connection.sql("SELECT llm_complete('hello')").fetchall()


WRITER = """
import sys, polars as pl
from llm_ops import Cache, llm_complete
df = pl.DataFrame({"text": [f"row {i} [[sim:latency=0.02]]" for i in range(600)]})
df.pipe(llm_complete, prompt="{text}", model="sim", endpoint=sys.argv[1],
        cache=Cache(sys.argv[2], flush_every=16, flush_seconds=0.1),
        concurrency=8, progress=False)
"""


def _count(cache) -> int:
    with open_cache(cache) as reader:
        return reader.sql("SELECT count(*) FROM llm_cache").fetchall()[0][0]


def test_a_reader_can_query_while_a_job_writes(endpoint, cache):
    endpoint.configure(hold=300)  # the job is held midway, alive, until told
    writer = subprocess.Popen([sys.executable, "-c", WRITER, endpoint.base_url, str(cache)])
    try:
        deadline = time.monotonic() + 60  # only against a hang
        while not (cache.exists() and _count(cache) == 300):  # its merges so far landed
            if writer.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("the job ended, or merged nothing in a minute, while held")
            time.sleep(0.01)
        counts = [300]
        endpoint.configure()
        while writer.poll() is None:
            counts.append(_count(cache))
            time.sleep(0.05)
    finally:
        writer.kill()  # a failed test must not leave it sending to the next test's endpoint
    assert writer.wait() == 0
    assert counts == sorted(counts)
    assert _count(cache) == 600


def test_one_query_over_many_vectors_stays_under_rpm(endpoint, cache):
    endpoint.configure(rpm=120, rate_window=1.0, rate_limit_headers=False)
    con = duckdb.connect()
    # A little under the endpoint's limit, so that only a limiter made afresh per vector (its
    # bucket full again while the endpoint's is empty) draws a 429.
    register(
        con,
        endpoint=endpoint.base_url,
        rate_limit=RateLimit(rpm=110),
        cache=cache,
        model="sim",
        concurrency=4,
    )
    rows = con.sql(
        "SELECT llm_complete('item ' || (i % 4) || ' of ' || (i // 2048)) FROM range(4096) t(i)"
    ).fetchall()
    assert len(rows) == 4096 and endpoint.stats()["requests"] == 8  # 4 prompts in each vector
    assert "429" not in endpoint.stats()["by_status"]
