"""Paid answers survive whatever else holds the cache file, and crashes; an unusable cache is
found before anything is sent."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime

import duckdb
import polars as pl
import pytest
from clocks import VirtualTime

from llm_ops import Cache, CacheError, llm_complete, llm_embed, open_cache
from llm_ops._pipeline.persist import CacheSink

ROWS = pl.DataFrame({"text": [f"row {i}" for i in range(200)]})

HOLD = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
print("holding", flush=True)
sys.stdin.read()
"""


def _count(cache) -> int:
    with open_cache(cache) as con:
        return con.execute("SELECT count(*) FROM llm_cache").fetchall()[0][0]


@pytest.fixture
def blocked_dir(tmp_path):
    """A cache path whose folder cannot be created: its parent is a file."""
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file" / "cache.duckdb"


def test_an_unusable_cache_path_fails_before_sending(complete, endpoint, blocked_dir):
    with pytest.raises(CacheError, match=r"a-file/cache\.duckdb.*cache=False"):
        ROWS.pipe(complete, prompt="{text}", cache=blocked_dir)
    assert endpoint.stats()["requests"] == 0


def test_an_unusable_cache_path_fails_embeddings_before_sending(endpoint, blocked_dir):
    with pytest.raises(CacheError, match="a-file"):
        ROWS.pipe(
            llm_embed,
            column="text",
            model="sim-embed",
            endpoint=endpoint.base_url,
            cache=blocked_dir,
        )
    assert endpoint.stats()["embedding_requests"] == 0


def test_a_file_that_is_not_a_cache_fails_before_sending(complete, endpoint, tmp_path):
    (tmp_path / "notes.duckdb").write_text("not a database")
    with pytest.raises(CacheError, match=r"notes\.duckdb"):
        ROWS.pipe(complete, prompt="{text}", cache=tmp_path / "notes.duckdb")
    assert endpoint.stats()["requests"] == 0


def _hold(cache):
    reader = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(cache)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert reader.stdout is not None and reader.stdout.readline() == "holding\n"
    return reader


def test_a_reader_holding_the_file_costs_no_answer_and_no_job(complete, endpoint, cache):
    ROWS.head(1).pipe(complete, prompt="{text}")  # the file exists, so a reader can hold it
    reader = _hold(cache)
    try:
        out = ROWS.pipe(
            complete,
            prompt="{text}",
            cache=Cache(cache, flush_every=16, flush_seconds=0.1, merge_wait=0.1),
        )
    finally:
        reader.communicate("")
    assert out["completion_status"].to_list() == ["cached"] + ["ok"] * 199
    assert _count(cache) == 200  # merged from the journal once the reader let go
    endpoint.reset()
    again = ROWS.pipe(complete, prompt="{text}")
    assert again["completion_status"].to_list() == ["cached"] * 200
    assert endpoint.stats()["requests"] == 0


def test_answers_in_the_journal_are_cache_hits_before_they_are_merged(complete, endpoint, cache):
    ROWS.head(1).pipe(complete, prompt="{text}")
    reader = _hold(cache)
    try:
        ROWS.pipe(complete, prompt="{text}", cache=Cache(cache, merge_wait=0.1))
        endpoint.reset()
        again = ROWS.pipe(complete, prompt="{text}", cache=Cache(cache, merge_wait=0.1))
    finally:
        reader.communicate("")
    assert again["completion_status"].to_list() == ["cached"] * 200
    assert endpoint.stats()["requests"] == 0


WRITER = """
import sys, polars as pl
from llm_ops import Cache, llm_complete
df = pl.DataFrame({"text": [f"row {i} [[sim:latency=0.02]]" for i in range(600)]})
df.pipe(llm_complete, prompt="{text}", model="sim", endpoint=sys.argv[1],
        cache=Cache(sys.argv[2], flush_every=16, flush_seconds=0.05),
        concurrency=16, progress=False)
"""


def test_open_cache_reads_while_a_job_writes(endpoint, cache):
    pl.DataFrame({"text": ["first"]}).pipe(
        llm_complete, prompt="{text}", model="sim", endpoint=endpoint.base_url, cache=cache
    )
    endpoint.reset()
    endpoint.configure(hold=300)  # the job is held midway, alive, until told
    job = subprocess.Popen([sys.executable, "-c", WRITER, endpoint.base_url, str(cache)])
    counts = [_count_while(job, until=lambda count: count == 1 + 300)]  # its merges landed
    endpoint.configure()
    while job.poll() is None:
        counts.append(_count(cache))  # waits out a merge instead of failing
        time.sleep(0.01)
    assert job.returncode == 0
    assert counts == sorted(counts)
    assert _count(cache) == 601


def _count_while(job, until, seconds=60.0) -> int:
    """Read the cache's count through ``open_cache`` until ``until`` holds of it, while ``job``
    is alive: it must still be when the count is reached."""
    deadline = time.monotonic() + seconds
    while not until(count := _count(job.args[-1])):
        if time.monotonic() > deadline:
            raise AssertionError(f"the count was still {count} after {seconds} s")
        time.sleep(0.01)
    assert job.poll() is None
    return count


KILLED = """
import sys, polars as pl
from llm_ops import Cache, llm_complete
df = pl.DataFrame({"text": [f"row {i} [[sim:latency=0.02]]" for i in range(3000)]})
df.pipe(llm_complete, prompt="{text}", model="sim", endpoint=sys.argv[1], cache=sys.argv[2],
        concurrency=16, progress=False)
"""


def _wait_for_answers(endpoint, count):
    deadline = time.monotonic() + 60
    while endpoint.stats()["answered"] < count and time.monotonic() < deadline:
        time.sleep(0.02)


def _resent_after(endpoint, cache, sig) -> tuple[int, subprocess.Popen[str]]:
    """Answers the endpoint gave the job before ``sig`` that a rerun asks for again."""
    job = subprocess.Popen(
        [sys.executable, "-c", KILLED, endpoint.base_url, str(cache)],
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_answers(endpoint, 1500)
    job.send_signal(sig)
    job.communicate(timeout=60)
    answered = endpoint.stats()["answered"]
    endpoint.reset()
    df = pl.DataFrame({"text": [f"row {i} [[sim:latency=0.02]]" for i in range(3000)]})
    out = df.pipe(
        llm_complete,
        prompt="{text}",
        model="sim",
        endpoint=endpoint.base_url,
        cache=cache,
        concurrency=16,
    )
    assert set(out["completion_status"].unique()) == {"ok", "cached"}
    return endpoint.stats()["requests"] - (3000 - answered), job


def test_after_sigkill_a_rerun_resends_at_most_concurrency_plus_64(endpoint, cache):
    resent, _ = _resent_after(endpoint, cache, signal.SIGKILL)
    assert resent <= 16 + 64


def test_after_sigterm_a_rerun_resends_nothing_answered(endpoint, cache):
    resent, job = _resent_after(endpoint, cache, signal.SIGTERM)
    assert job.returncode != 0
    assert resent == 0
    with open_cache(cache) as con:
        assert con.execute("SELECT outcome FROM llm_runs ORDER BY started_at").fetchall()[0] == (
            "interrupted",
        )


def test_a_crashed_jobs_journal_is_merged_on_the_next_open(endpoint, cache):
    job = subprocess.Popen([sys.executable, "-c", KILLED, endpoint.base_url, str(cache)])
    _wait_for_answers(endpoint, 500)
    job.kill()
    job.wait()
    with duckdb.connect(str(cache), read_only=True) as con:
        before = con.execute("SELECT count(*) FROM llm_cache").fetchall()[0][0]
    assert _count(cache) >= before  # open_cache merged what the journal held
    assert not list(cache.with_name(cache.name + ".journal").glob("*.jsonl"))


def test_a_snapshot_holds_what_the_journal_holds(complete, cache, tmp_path):
    ROWS.head(1).pipe(complete, prompt="{text}")
    reader = _hold(cache)
    try:
        ROWS.pipe(complete, prompt="{text}", cache=Cache(cache, merge_wait=0.1))
        Cache(cache).snapshot(tmp_path / "copy.duckdb")
    finally:
        reader.communicate("")
    with duckdb.connect(str(tmp_path / "copy.duckdb"), read_only=True) as copy:
        assert copy.execute("SELECT count(*) FROM llm_cache").fetchall() == [(200,)]


def _in_the_file(path) -> int:
    """Rows merged into the cache file itself (``open_cache`` would merge the journal too)."""
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute("SELECT count(*) FROM llm_cache").fetchall()[0][0]


def _answer_row(key: str) -> dict[str, object]:
    """An ``llm_cache`` row as a dispatch writes it."""
    return {
        "key": key,
        "model": "sim",
        "endpoint": "llm-ops-simulator",
        "request": "{}",
        "status": "ok",
        "response_text": "an answer",
        "response_json": None,
        "reasoning_text": None,
        "finish_reason": "stop",
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
        "latency_ms": 1.0,
        "attempts": 1,
        "created_at": datetime.now(UTC),
    }


def test_the_flush_timer_merges_the_journal_once_flush_seconds_have_passed(tmp_path):
    clock = VirtualTime()
    cache = Cache(tmp_path / "cache.duckdb", flush_every=1000, flush_seconds=2.0)
    cache.prepare()
    # merge_at_close=False: closing only seals the journal, so a merged row is the timer's
    sink = CacheSink(cache, merge_at_close=False, sleep=clock.sleep)

    async def trickle() -> tuple[int, int]:
        timer = asyncio.create_task(sink.merge_periodically())
        sink.answer(_answer_row("v1:" + "c" * 64))  # one row: far from flush_every
        await clock.advance(1.99)
        merged_before = _in_the_file(cache.path)  # no merge has begun: the file is free
        await clock.advance(0.01)
        timer.cancel()
        await sink.close()  # waits for the timer's merge under way
        return merged_before, _in_the_file(cache.path)

    assert asyncio.run(trickle()) == (0, 1)
