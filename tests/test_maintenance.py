"""Maintenance that rewrites the cache file (vacuum) never loses an answer a job paid for:
it waits for, or refuses during, a job's merge, and the job's merges wait for it (real
processes, real files, real HTTP)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

import duckdb
import polars as pl
import pytest

from llm_ops import Cache, CacheError, CacheLockedError, open_cache

JOB = """
import sys
import polars as pl
from llm_ops import Cache, llm_complete
base_url, path, rows = sys.argv[1:4]
texts = pl.DataFrame({"text": [f"paid {i}" for i in range(int(rows))]})
# small, frequent merges: many windows for a vacuum to race
cache = Cache(path, flush_every=5, flush_seconds=0.02, merge_wait=120)
out = texts.pipe(llm_complete, prompt="{text}", model="sim", endpoint=base_url, cache=cache,
                 concurrency=16, progress=False)
assert out["completion_status"].eq("ok").all(), out["completion_status"].value_counts()
"""


def _answers_in_file(path) -> int:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute("SELECT count(DISTINCT key) FROM llm_cache").fetchall()[0][0]


def test_vacuums_racing_a_job_keep_every_answer_it_paid_for(endpoint, cache):
    endpoint.configure(latency=0.005)
    Cache(cache).prepare()
    job = subprocess.Popen(
        [sys.executable, "-c", JOB, endpoint.base_url, str(cache), "600"],
        stderr=subprocess.PIPE,
        text=True,
    )
    while job.poll() is None:  # vacuum for as long as the job runs, refused or not
        with contextlib.suppress(CacheLockedError):
            Cache(cache).vacuum()
    assert job.wait() == 0, job.stderr.read() if job.stderr else ""
    assert endpoint.stats()["distinct_answered"] == 600
    assert _answers_in_file(cache) == 600
    assert not list(Cache(cache).journal.glob("*.jsonl"))


def test_vacuum_refuses_at_once_while_a_job_merges_and_names_it(complete, cache):
    complete(pl.DataFrame({"text": ["a"]}), prompt="{text}", progress=False)
    store = Cache(cache)
    writer = store.writer()  # a job's, alive
    try:
        merging = pytest.raises(CacheLockedError, match=f"process {os.getpid()} on .*--wait")
        with store.connect(read_only=False), merging:  # ... merging into the file
            store.vacuum()
    finally:
        writer.close(wait=None)
    assert _answers_in_file(cache) == 1


def test_vacuum_with_wait_runs_once_the_merge_is_over(complete, cache):
    complete(pl.DataFrame({"text": ["a", "b"]}), prompt="{text}", progress=False)
    store = Cache(cache)
    sizes: list[tuple[int, int]] = []
    merging = store.connect(read_only=False)
    merging.__enter__()
    vacuum = threading.Thread(target=lambda: sizes.append(store.vacuum(wait=120)))
    vacuum.start()
    merging.__exit__(None, None, None)
    vacuum.join()
    assert len(sizes) == 1
    assert _answers_in_file(cache) == 2


def test_vacuum_refuses_while_this_process_has_the_file_open(complete, cache):
    complete(pl.DataFrame({"text": ["a"]}), prompt="{text}", progress=False)
    with open_cache(cache, read_only=False) as mine:
        mine.execute("CREATE TABLE mine AS SELECT 1 AS x")
        with pytest.raises(CacheError, match="open_cache"):
            Cache(cache).vacuum()
        mine.execute("INSERT INTO mine VALUES (2)")  # into the file that stays
    with duckdb.connect(str(cache), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM mine").fetchall() == [(2,)]
    assert _answers_in_file(cache) == 1
