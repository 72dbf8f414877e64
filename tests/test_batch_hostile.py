"""Batch mode against a provider that gets things wrong: the simulator's hostile Files and
Batches API, over real HTTP. Nothing is cached under the wrong key, nothing is paid twice,
and every row says what happened."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable

import openai
import polars as pl
import pytest

from llm_ops import BatchMode, Client, JobAbortedError, Retries, Sampling, llm_complete, open_cache

DF = pl.DataFrame({"text": [f"item {i}" for i in range(6)]})
FAST = {"batch_seconds": 0.2, "batch_validation_seconds": 0.05}


@pytest.fixture
def batch(endpoint, cache):
    """``llm_complete`` in batch mode against the simulator, polling every 0.05 s."""
    endpoint.configure(**FAST)
    return functools.partial(
        llm_complete,
        prompt="Say {text}",
        model="sim",
        endpoint=endpoint.base_url,
        batch=BatchMode(poll_seconds=0.05),
        cache=cache,
    )


def statuses(out: pl.DataFrame) -> dict[str, int]:
    return dict(out["completion_status"].value_counts().iter_rows())


def errors(out: pl.DataFrame) -> list[str]:
    return out["completion_error"].drop_nulls().to_list()


def test_two_different_answers_for_one_request_keep_neither(batch, endpoint):
    endpoint.configure(**FAST, batch_duplicate_lines=1)
    out = DF.pipe(batch)
    assert statuses(out) == {"ok": 5, "failed": 1}
    assert "returned two different answers for this request" in errors(out)[0]
    endpoint.configure(**FAST)
    assert statuses(DF.pipe(batch)) == {"cached": 5, "ok": 1}  # nothing was cached from it


def test_the_same_answer_twice_is_taken_once(batch, endpoint):
    endpoint.configure(**FAST, batch_duplicate_lines=2, batch_duplicate_differ=False)
    assert statuses(DF.pipe(batch)) == {"ok": 6}


def test_answers_to_requests_never_sent_are_ignored_with_one_warning(
    batch, endpoint, cache, caplog
):
    endpoint.configure(**FAST, batch_unknown_lines=3)
    assert statuses(DF.pipe(batch)) == {"ok": 6}
    assert "returned 3 line(s) that name no request it was sent" in caplog.text
    with open_cache(cache) as con:
        assert con.execute("SELECT count(*) FROM llm_cache").fetchall() == [(6,)]


def test_lines_a_completed_batch_left_out_are_submitted_again(batch, endpoint):
    endpoint.configure(**FAST, batch_drop_lines=2, batch_hostile_first=1)
    assert statuses(DF.pipe(batch)) == {"ok": 6}
    stats = endpoint.stats()
    assert (stats["batches"], stats["lines_uploaded"]) == (2, 6 + 2)


def test_lines_a_completed_batch_left_out_can_be_sent_live(batch, endpoint):
    endpoint.configure(**FAST, batch_drop_lines=2)
    assert statuses(DF.pipe(batch, batch=BatchMode(poll_seconds=0.05, on_expired="live"))) == {
        "ok": 6
    }
    assert (endpoint.stats()["batches"], endpoint.stats()["requests"]) == (1, 2)


def test_a_line_no_batch_ever_answers_fails_after_three_batches(batch, endpoint):
    endpoint.configure(**FAST, batch_drop_lines=1)
    out = DF.pipe(batch)
    assert statuses(out) == {"ok": 5, "failed": 1}
    assert errors(out)[0].startswith("no answer after 3 batches (the last, batch-sim-")
    assert endpoint.stats()["batches"] == 3


def test_a_failed_batch_fails_its_rows_with_the_providers_reason(batch, endpoint):
    endpoint.configure(**FAST, batch_fail="token_limit_exceeded")
    out = DF.pipe(batch)
    assert statuses(out) == {"failed": 6}
    assert "(token_limit_exceeded: simulated: the input file was refused)" in errors(out)[0]
    assert endpoint.stats()["batches"] == 1  # not resubmitted by the same run


def test_a_batch_refused_for_an_invalid_line_rejects_its_rows(batch, endpoint):
    endpoint.configure(**FAST, batch_fail="invalid_request", batch_fail_line=2)
    out = DF.pipe(batch)
    assert statuses(out) == {"rejected": 6}
    assert "the input file was refused (line 2)); nothing was paid" in errors(out)[0]


def test_a_rerun_after_a_failed_batch_submits_it_again(batch, endpoint):
    endpoint.configure(**FAST, batch_fail="token_limit_exceeded", batch_hostile_first=1)
    DF.pipe(batch)
    assert statuses(DF.pipe(batch)) == {"ok": 6}
    assert endpoint.stats()["batches"] == 2


def test_a_create_whose_answer_is_lost_is_looked_up_not_made_twice(batch, endpoint):
    endpoint.configure(**FAST, batch_create_stall="after")
    assert statuses(DF.pipe(batch, retries=Retries(timeout=0.5))) == {"ok": 6}
    assert (endpoint.stats()["batches"], endpoint.stats()["batch_creates"]) == (1, 1)


def test_a_batch_list_answering_500_stops_the_job_without_a_second_batch(batch, endpoint):
    endpoint.configure(**FAST, batch_create_stall="after", batch_list_status=500)
    with pytest.raises(JobAbortedError, match=r"the Batch API failed .*; rerun to pick"):
        DF.pipe(batch, retries=Retries(timeout=0.5))
    stats = endpoint.stats()
    assert (stats["batches"], stats["batch_creates"], stats["batch_lists"]) == (1, 1, 5)
    endpoint.configure(**FAST)
    assert statuses(DF.pipe(batch)) == {"ok": 6}
    assert endpoint.stats()["batches"] == 1


KILLED = """
import sys, polars as pl
from llm_ops import BatchMode, llm_complete
df = pl.DataFrame({"text": [f"item {i}" for i in range(6)]})
df.pipe(llm_complete, prompt="Say {text}", model="sim", endpoint=sys.argv[1], cache=sys.argv[2],
        batch=BatchMode(poll_seconds=0.05), progress=False)
"""


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.parametrize("stall", ["before", "after"])
def test_a_job_killed_while_its_batch_is_created_pays_once_when_rerun(
    batch, endpoint, cache, stall
):
    endpoint.configure(**FAST, batch_create_stall=stall)
    job = subprocess.Popen([sys.executable, "-c", KILLED, endpoint.base_url, str(cache)])
    made = 1 if stall == "after" else 0
    wait_for(lambda: (endpoint.stats()["batch_creates"], endpoint.stats()["batches"]) == (1, made))
    job.kill()
    job.wait()
    endpoint.configure(**FAST)
    assert statuses(DF.pipe(batch)) == {"ok": 6}
    stats = endpoint.stats()
    assert (stats["batches"], stats["lines_uploaded"]) == (1, 6)


def test_a_line_submitted_again_by_collect_is_the_line_first_submitted(endpoint, cache):
    endpoint.configure(**FAST, batch_drop_lines=1, batch_hostile_first=1)
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        client.submit(DF, prompt="Say {text}", model="sim", sampling=Sampling(temperature=0.5))
        assert client.collect_batches(poll_seconds=0.05) == 6
    sdk = openai.OpenAI(base_url=endpoint.base_url, api_key="unused")
    inputs = [sdk.files.content(b.input_file_id).text for b in sdk.batches.list()]
    resent = json.loads(min(inputs, key=len))
    assert resent["body"]["temperature"] == 0.5
