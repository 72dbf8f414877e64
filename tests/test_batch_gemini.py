"""Batch mode against Gemini's batch mode (``batchGenerateContent``, inline or a file), as the
simulator speaks it, through the Gemini dialect, over real HTTP: every row answered as a live
request would be, hostile lines given statuses, and a job killed after submitting resumed
without a second batch."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import polars as pl
import pytest

from llm_ops import BatchMode, Client, Endpoint, Retries, llm_complete, open_cache
from llm_ops.testing import LocalEndpoint

KEY = "gemini-simulated-key"
TEXTS = [f"item {i % 7}" for i in range(20)] + ["bad [[sim:status=400]]", None]
DF = pl.DataFrame({"text": TEXTS})
FAST = {"batch_seconds": 0.3, "batch_validation_seconds": 0.05}
SERVED = {"api_key": KEY, "dialect": "gemini"}  # configure() keeps the dialect's base URL


@pytest.fixture(scope="module")
def server() -> Iterator[LocalEndpoint]:
    with LocalEndpoint(dialect="gemini", api_key=KEY) as endpoint:
        yield endpoint


@pytest.fixture
def gemini(server: LocalEndpoint) -> LocalEndpoint:
    server.configure(**SERVED, **FAST)
    server.reset()
    return server


@pytest.fixture
def batch(gemini, cache):
    """``llm_complete`` in batch mode against the simulator's Gemini API."""
    return functools.partial(
        llm_complete,
        prompt="Say {text}",
        model="sim",
        endpoint=Endpoint(gemini.base_url, api_key=KEY, provider="gemini"),
        batch=BatchMode(poll_seconds=0.05),
        cache=cache,
    )


def statuses(out: pl.DataFrame) -> dict[str, int]:
    return dict(out["completion_status"].value_counts().iter_rows())


def errors(out: pl.DataFrame) -> list[str]:
    return out["completion_error"].drop_nulls().to_list()


def test_every_row_gets_the_answer_a_live_request_gets(batch, gemini):
    openai_side = Endpoint(gemini.base_url.removesuffix("/v1beta") + "/v1", api_key=KEY)
    live = DF.pipe(
        llm_complete, prompt="Say {text}", model="sim", endpoint=openai_side, cache=False
    )
    out = DF.pipe(batch)
    assert out["completion"].to_list() == live["completion"].to_list()
    assert gemini.stats()["batches"] == 1


def test_an_errored_request_is_a_row_status(batch):
    out = DF.pipe(batch)
    assert out.row(20)[2:] == ("rejected", "HTTP 400: simulated error 400")


def test_ok_rows_are_cached_and_a_rerun_sends_nothing(batch, gemini):
    DF.head(20).pipe(batch)
    again = DF.head(20).pipe(batch)
    assert statuses(again) == {"cached": 20}
    assert gemini.stats()["batches"] == 1


def test_expired_requests_are_submitted_again(batch, gemini):
    gemini.configure(**SERVED, **FAST, batch_expire_share=0.5)
    assert statuses(DF.head(20).pipe(batch)) == {"ok": 20}
    stats = gemini.stats()
    assert (stats["batches"], stats["lines_uploaded"]) == (2, 7 + 4)


def test_two_different_answers_for_one_request_keep_neither(batch, gemini):
    gemini.configure(**SERVED, **FAST, batch_duplicate_lines=1)
    out = DF.head(20).pipe(batch)
    assert statuses(out) == {"ok": 17, "failed": 3}  # item 0, on 3 rows
    assert "returned two different answers for this request" in errors(out)[0]


def test_answers_to_requests_never_sent_are_ignored(batch, gemini, cache, caplog):
    gemini.configure(**SERVED, **FAST, batch_unknown_lines=3)
    assert statuses(DF.head(20).pipe(batch)) == {"ok": 20}
    assert "returned 3 line(s) that name no request it was sent" in caplog.text
    with open_cache(cache) as con:
        assert con.execute("SELECT count(*) FROM llm_cache").fetchall() == [(7,)]


def test_requests_an_ended_batch_left_out_are_submitted_again(batch, gemini):
    gemini.configure(**SERVED, **FAST, batch_drop_lines=2, batch_hostile_first=1)
    assert statuses(DF.head(20).pipe(batch)) == {"ok": 20}
    assert gemini.stats()["batches"] == 2


def test_a_failed_batch_fails_its_rows_with_the_providers_reason(batch, gemini):
    gemini.configure(**SERVED, **FAST, batch_fail="invalid_request")
    out = DF.head(6).pipe(batch)
    assert statuses(out) == {"failed": 6}
    assert "failed (simulated: invalid_request); nothing was paid for it" in errors(out)[0]
    assert gemini.stats()["batches"] == 1


def test_a_create_whose_answer_is_lost_is_found_not_made_twice(batch, gemini):
    gemini.configure(**SERVED, **FAST, batch_create_stall="after")
    assert statuses(DF.head(6).pipe(batch, retries=Retries(timeout=0.5))) == {"ok": 6}
    assert (gemini.stats()["batches"], gemini.stats()["batch_creates"]) == (1, 1)


KILLED = """
import sys, polars as pl
from llm_ops import BatchMode, Endpoint, llm_complete
df = pl.DataFrame({"text": [f"row {i}" for i in range(300)]})
endpoint = Endpoint(sys.argv[1], api_key="gemini-simulated-key", provider="gemini")
df.pipe(llm_complete, prompt="{text}", model="sim", endpoint=endpoint, cache=sys.argv[2],
        batch=BatchMode(poll_seconds=0.05, requests_per_batch=100), progress=False)
"""


def test_a_job_killed_after_submitting_resumes_without_a_new_batch(gemini, cache):
    gemini.configure(**SERVED, batch_seconds=3.0, batch_validation_seconds=0.05)
    job = subprocess.Popen([sys.executable, "-c", KILLED, gemini.base_url, str(cache)])
    deadline = time.monotonic() + 30
    while gemini.stats()["batches"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    job.send_signal(signal.SIGKILL)
    job.wait()
    df = pl.DataFrame({"text": [f"row {i}" for i in range(300)]})
    out = df.pipe(
        llm_complete,
        prompt="{text}",
        model="sim",
        endpoint=Endpoint(gemini.base_url, api_key=KEY, provider="gemini"),
        batch=BatchMode(poll_seconds=0.05, requests_per_batch=100),
        cache=cache,
    )
    assert statuses(out) == {"ok": 300}
    stats = gemini.stats()
    assert (stats["batches"], stats["lines_uploaded"], stats["answered"]) == (3, 300, 300)


def test_submitted_batches_are_collected_by_a_later_client(gemini, cache):
    endpoint = Endpoint(gemini.base_url, api_key=KEY, provider="gemini")
    with Client(endpoint=endpoint, cache=cache) as client:
        parts = client.submit(DF.head(20), prompt="Say {text}", model="sim")
    assert [p.state for p in parts] == ["submitted"]
    with Client(endpoint=endpoint, cache=cache) as client:
        assert client.collect_batches(poll_seconds=0.05) == 7
        again = client.complete(DF.head(20), prompt="Say {text}", model="sim", batch=True)
    assert statuses(again) == {"cached": 20}
    assert gemini.stats()["batches"] == 1
    assert list(cache.with_name(cache.name + ".batches").iterdir()) == []  # kept until collected


def test_requests_over_20_mb_go_in_a_jsonl_file(batch, gemini):
    big = pl.DataFrame({"text": [f"{i} " + "x" * 7_000_000 for i in range(3)]})
    out = big.pipe(batch)
    assert statuses(out) == {"ok": 3}
    stats = gemini.stats()
    assert (stats["batches"], stats["lines_uploaded"], stats["files"]) == (1, 3, 2)  # in, out


KILLED_CREATING = """
import sys, polars as pl
from llm_ops import BatchMode, Endpoint, llm_complete
df = pl.DataFrame({"text": [f"item {i % 7}" for i in range(20)]})
endpoint = Endpoint(sys.argv[1], api_key='gemini-simulated-key', provider="gemini")
df.pipe(llm_complete, prompt="Say {text}", model="sim", endpoint=endpoint, cache=sys.argv[2],
        batch=BatchMode(poll_seconds=0.05), progress=False)
"""


@pytest.mark.parametrize("stall", ["before", "after"])
def test_a_job_killed_while_its_batch_is_created_pays_once_when_rerun(batch, gemini, cache, stall):
    gemini.configure(**SERVED, **FAST, batch_create_stall=stall)
    command = [sys.executable, "-c", KILLED_CREATING, gemini.base_url, str(cache)]
    job = subprocess.Popen(command)
    made = 1 if stall == "after" else 0
    deadline = time.monotonic() + 30
    while (gemini.stats()["batch_creates"], gemini.stats()["batches"]) != (1, made):
        if time.monotonic() > deadline:
            raise AssertionError("the job never reached the batch's create in 30 s")
        time.sleep(0.02)
    job.kill()
    job.wait()
    gemini.configure(**SERVED, **FAST)
    assert statuses(DF.head(20).pipe(batch)) == {"ok": 20}
    stats = gemini.stats()
    assert (stats["batches"], stats["lines_uploaded"]) == (1, 7)


def test_a_batch_asks_for_structured_output_as_a_live_call_does(batch):
    schema = {"type": "object", "properties": {"mood": {"type": "string"}}, "required": ["mood"]}
    out = pl.DataFrame({"text": ["great fit", "runs small"]}).pipe(batch, schema=schema)
    assert out["completion_status"].to_list() == ["ok", "ok"]
    assert all(isinstance(answer["mood"], str) for answer in out["completion"].to_list())
