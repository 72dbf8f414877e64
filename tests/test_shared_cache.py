"""Jobs sharing one cache file pay for each request once: what one job has in flight, the
other waits for, and takes over if its owner dies (real processes, real files, real HTTP)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import polars as pl
from clocks import VirtualTime

from llm_ops._claims import ALIVE_SECONDS, Claims
from llm_ops._journal import JournalWriter

JOB = """
import os, sys, time
import polars as pl
from llm_ops import llm_complete
base_url, cache, go, rows, concurrency = sys.argv[1:6]
texts = pl.DataFrame({"text": [f"shared {i}" for i in range(int(rows))]})
while not os.path.exists(go):
    time.sleep(0.005)
out = texts.pipe(llm_complete, prompt="{text}", model="sim", endpoint=base_url, cache=cache,
                 concurrency=int(concurrency), progress=False)
print(out["completion_status"].value_counts().sort("completion_status").rows())
"""


def _start(endpoint, cache, go, rows=600, concurrency=16):
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            JOB,
            endpoint.base_url,
            str(cache),
            str(go),
            str(rows),
            str(concurrency),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_claims_of_two_jobs(cache, seconds=60.0):
    log = cache.parent / f"{cache.name}.journal" / "claims.log"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if log.exists() and len({line.split()[0] for line in log.read_text().splitlines()}) > 1:
            return
        time.sleep(0.01)
    raise AssertionError(f"no second job claimed anything in {seconds} s")


def _statuses(job) -> dict[str, int]:
    out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err
    return dict(eval(out))  # the (status, count) pairs it printed


def test_two_identical_jobs_at_once_pay_for_each_request_once(endpoint, cache, tmp_path):
    # No answer until more requests are in flight than one job sends: the jobs overlap.
    endpoint.configure(latency=0.02, gather=17)
    go = tmp_path / "go"
    go.touch()
    jobs = [_start(endpoint, cache, go) for _ in range(2)]
    for job in jobs:
        assert sum(_statuses(job).values()) == 600  # every row, each ok or cached
    assert endpoint.stats()["max_in_flight"] > 16
    assert endpoint.stats()["requests"] <= 600 + 2 * 16
    assert endpoint.stats()["distinct_answered"] == 600


def test_a_killed_owner_leaves_no_key_that_no_one_sends(endpoint, cache, tmp_path):
    endpoint.configure(latency=0.05)
    go = tmp_path / "go"
    go.touch()
    owner = _start(endpoint, cache, go, rows=200, concurrency=4)
    while endpoint.stats()["answered"] < 20:
        time.sleep(0.02)
    endpoint.configure(latency=2.0)  # the owner outlives the other's start, however slow
    other = _start(endpoint, cache, go, rows=200, concurrency=4)
    _wait_for_claims_of_two_jobs(cache)  # the other has claimed after the owner, and defers
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    endpoint.configure(latency=0.05)
    assert _statuses(other).keys() <= {"ok", "cached"}
    assert endpoint.stats()["distinct_answered"] == 200


def test_a_key_claimed_by_a_live_writer_is_deferred(tmp_path):
    first = JournalWriter(tmp_path, merge=lambda files, wait: None, merge_every=10)
    second = JournalWriter(tmp_path, merge=lambda files, wait: None, merge_every=10)
    keys = [f"v1:{i:064x}" for i in range(3)]
    mine, theirs = Claims(tmp_path, first.id), Claims(tmp_path, second.id)
    assert list(mine.take(keys[:2], key=str)) == keys[:2]
    assert list(theirs.take(keys, key=str)) == keys[2:]
    assert theirs.deferred == keys[:2]


def test_a_key_whose_claimer_is_gone_is_looked_up_before_it_is_sent(tmp_path):
    gone = JournalWriter(tmp_path, merge=lambda files, wait: None, merge_every=10)
    live = JournalWriter(tmp_path, merge=lambda files, wait: None, merge_every=10)
    key = "v1:" + "a" * 64
    assert list(Claims(tmp_path, gone.id).take([key], key=str)) == [key]
    gone.close(wait=0)
    claims = Claims(tmp_path, live.id)
    assert (list(claims.take([key], key=str)), claims.deferred) == ([], [key])
    assert claims.held_by_others([key]) == set()
    assert list(claims.take([key], key=str, checked={key})) == [key]


def test_an_owner_seen_alive_is_believed_alive_until_its_lease_runs_out(tmp_path):
    owner = JournalWriter(tmp_path, merge=lambda files, wait: None, merge_every=10)
    waiter = JournalWriter(tmp_path, merge=lambda files, wait: None, merge_every=10)
    key = "v1:" + "b" * 64
    assert list(Claims(tmp_path, owner.id).take([key], key=str)) == [key]
    clock = VirtualTime()
    claims = Claims(tmp_path, waiter.id, clock=clock)
    assert list(claims.take([key], key=str)) == []
    assert claims.held_by_others([key]) == {key}  # the owner is alive: checked, and believed
    owner.close(wait=0)  # gone, but not looked at again until the lease runs out
    clock.now = ALIVE_SECONDS * 0.99
    assert claims.held_by_others([key]) == {key}
    clock.now = ALIVE_SECONDS
    assert claims.held_by_others([key]) == set()


def test_the_claims_log_is_removed_when_the_last_job_ends(complete, cache):
    pl.DataFrame({"text": ["a", "b"]}).pipe(complete, prompt="{text}")
    assert not (cache.parent / "cache.duckdb.journal" / "claims.log").exists()
