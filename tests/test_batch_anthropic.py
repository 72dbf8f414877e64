"""Batch mode against Anthropic's Message Batches API, as the simulator speaks it, over real
HTTP: every row answered as a live request would be, hostile lines given statuses, and a job
killed after submitting resumed without a second batch."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import polars as pl
import pytest

from llm_ops import (
    BatchMode,
    Client,
    ConfigError,
    Endpoint,
    Price,
    Retries,
    Sampling,
    estimate,
    llm_complete,
    open_cache,
)
from llm_ops._dialects import ANTHROPIC, BatchResult
from llm_ops._pipeline.batch_anthropic import AnthropicBatches
from llm_ops._pipeline.batch_service import part_limits
from llm_ops.testing import LocalEndpoint

KEY = "sk-ant-simulated-key"
TEXTS = [f"item {i % 7}" for i in range(20)] + ["bad [[sim:status=400]]", None]
DF = pl.DataFrame({"text": TEXTS})
FAST = {"batch_seconds": 0.3, "batch_validation_seconds": 0.05}
SERVED = {"api_key": KEY, "dialect": "anthropic"}  # configure() keeps the dialect's base URL


@pytest.fixture(scope="module")
def server() -> Iterator[LocalEndpoint]:
    with LocalEndpoint(dialect="anthropic", api_key=KEY) as endpoint:
        yield endpoint


@pytest.fixture
def anthropic(server: LocalEndpoint) -> LocalEndpoint:
    server.configure(**SERVED, **FAST)
    server.reset()
    return server


@pytest.fixture
def batch(anthropic, cache):
    """``llm_complete`` in batch mode against the simulator's Anthropic API."""
    return functools.partial(
        llm_complete,
        prompt="Say {text}",
        model="sim",
        endpoint=Endpoint(anthropic.base_url, api_key=KEY, provider="anthropic"),
        batch=BatchMode(poll_seconds=0.05),
        cache=cache,
    )


def statuses(out: pl.DataFrame) -> dict[str, int]:
    return dict(out["completion_status"].value_counts().iter_rows())


def errors(out: pl.DataFrame) -> list[str]:
    return out["completion_error"].drop_nulls().to_list()


def test_every_row_gets_the_answer_a_live_request_gets(batch, anthropic):
    openai_side = Endpoint(anthropic.base_url + "/v1", api_key=KEY)
    live = DF.pipe(
        llm_complete, prompt="Say {text}", model="sim", endpoint=openai_side, cache=False
    )
    out = DF.pipe(batch)
    assert out["completion"].to_list() == live["completion"].to_list()
    assert anthropic.stats()["batches"] == 1


def test_an_errored_request_is_a_row_status(batch):
    out = DF.pipe(batch)
    assert out.row(20)[2:] == ("rejected", "HTTP 400: simulated error 400")


def test_ok_rows_are_cached_and_a_rerun_sends_nothing(batch, anthropic):
    DF.head(20).pipe(batch)
    again = DF.head(20).pipe(batch)
    assert statuses(again) == {"cached": 20}
    assert anthropic.stats()["batches"] == 1


def test_expired_requests_are_submitted_again(batch, anthropic):
    anthropic.configure(**SERVED, **FAST, batch_expire_share=0.5)
    assert statuses(DF.head(20).pipe(batch)) == {"ok": 20}
    stats = anthropic.stats()
    assert (stats["batches"], stats["lines_uploaded"]) == (2, 7 + 4)


def test_two_different_answers_for_one_request_keep_neither(batch, anthropic):
    anthropic.configure(**SERVED, **FAST, batch_duplicate_lines=1)
    out = DF.head(20).pipe(batch)
    assert statuses(out) == {"ok": 17, "failed": 3}  # item 0, on 3 rows
    assert "returned two different answers for this request" in errors(out)[0]


def test_answers_to_requests_never_sent_are_ignored(batch, anthropic, cache, caplog):
    anthropic.configure(**SERVED, **FAST, batch_unknown_lines=3)
    assert statuses(DF.head(20).pipe(batch)) == {"ok": 20}
    assert "returned 3 line(s) that name no request it was sent" in caplog.text
    with open_cache(cache) as con:
        assert con.execute("SELECT count(*) FROM llm_cache").fetchall() == [(7,)]


def test_requests_an_ended_batch_left_out_are_submitted_again(batch, anthropic):
    anthropic.configure(**SERVED, **FAST, batch_drop_lines=2, batch_hostile_first=1)
    assert statuses(DF.head(20).pipe(batch)) == {"ok": 20}
    assert anthropic.stats()["batches"] == 2


def test_a_failed_batch_rejects_its_rows_with_the_providers_reason(batch, anthropic):
    anthropic.configure(**SERVED, **FAST, batch_fail="invalid_request")
    out = DF.head(6).pipe(batch)
    assert statuses(out) == {"rejected": 6}
    assert errors(out)[0] == "HTTP 400: simulated: invalid_request"


def test_a_create_whose_answer_is_lost_is_found_not_made_twice(batch, anthropic):
    anthropic.configure(**SERVED, **FAST, batch_create_stall="after")
    assert statuses(DF.head(6).pipe(batch, retries=Retries(timeout=0.5))) == {"ok": 6}
    assert (anthropic.stats()["batches"], anthropic.stats()["batch_creates"]) == (1, 1)


KILLED = """
import sys, polars as pl
from llm_ops import BatchMode, Endpoint, llm_complete
df = pl.DataFrame({"text": [f"row {i}" for i in range(300)]})
endpoint = Endpoint(sys.argv[1], api_key="sk-ant-simulated-key", provider='anthropic')
df.pipe(llm_complete, prompt="{text}", model="sim", endpoint=endpoint, cache=sys.argv[2],
        batch=BatchMode(poll_seconds=0.05, requests_per_batch=100), progress=False)
"""


def test_a_job_killed_after_submitting_resumes_without_a_new_batch(anthropic, cache):
    anthropic.configure(**SERVED, batch_seconds=3.0, batch_validation_seconds=0.05)
    job = subprocess.Popen([sys.executable, "-c", KILLED, anthropic.base_url, str(cache)])
    deadline = time.monotonic() + 30
    while anthropic.stats()["batches"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    job.send_signal(signal.SIGKILL)
    job.wait()
    df = pl.DataFrame({"text": [f"row {i}" for i in range(300)]})
    out = df.pipe(
        llm_complete,
        prompt="{text}",
        model="sim",
        endpoint=Endpoint(anthropic.base_url, api_key=KEY, provider="anthropic"),
        batch=BatchMode(poll_seconds=0.05, requests_per_batch=100),
        cache=cache,
    )
    assert statuses(out) == {"ok": 300}
    stats = anthropic.stats()
    assert (stats["batches"], stats["lines_uploaded"], stats["answered"]) == (3, 300, 300)


def test_the_kept_requests_are_removed_once_collected(batch, cache):
    DF.head(20).pipe(batch)
    kept = cache.with_name(cache.name + ".batches")
    assert kept.is_dir() and list(kept.iterdir()) == []


def test_submitted_batches_are_collected_by_a_later_client(anthropic, cache):
    endpoint = Endpoint(anthropic.base_url, api_key=KEY, provider="anthropic")
    with Client(endpoint=endpoint, cache=cache) as client:
        parts = client.submit(DF.head(20), prompt="Say {text}", model="sim")
    assert [p.state for p in parts] == ["submitted"]
    with Client(endpoint=endpoint, cache=cache) as client:
        assert client.collect_batches(poll_seconds=0.05) == 7
        again = client.complete(DF.head(20), prompt="Say {text}", model="sim", batch=True)
    assert statuses(again) == {"cached": 20}
    assert anthropic.stats()["batches"] == 1


def test_a_cancelled_batch_says_so(anthropic, cache):
    anthropic.configure(**SERVED, batch_seconds=30.0, batch_validation_seconds=0.05)
    endpoint = Endpoint(anthropic.base_url, api_key=KEY, provider="anthropic")
    with Client(endpoint=endpoint, cache=cache) as client:
        parts = client.submit(DF.head(20), prompt="Say {text}", model="sim")
        cancelled = client.cancel_batches(job_id=parts[0].job_id)
    assert [p.state for p in cancelled] == ["cancelled"]


KILLED_CREATING = """
import sys, polars as pl
from llm_ops import BatchMode, Endpoint, llm_complete
df = pl.DataFrame({"text": [f"item {i % 7}" for i in range(20)]})
endpoint = Endpoint(sys.argv[1], api_key='sk-ant-simulated-key', provider='anthropic')
df.pipe(llm_complete, prompt="Say {text}", model="sim", endpoint=endpoint, cache=sys.argv[2],
        batch=BatchMode(poll_seconds=0.05), progress=False)
"""


@pytest.mark.parametrize("stall", ["before", "after"])
def test_a_job_killed_while_its_batch_is_created_pays_once_when_rerun(
    batch, anthropic, cache, stall
):
    anthropic.configure(**SERVED, **FAST, batch_create_stall=stall)
    command = [sys.executable, "-c", KILLED_CREATING, anthropic.base_url, str(cache)]
    job = subprocess.Popen(command)
    made = 1 if stall == "after" else 0
    deadline = time.monotonic() + 30
    while (anthropic.stats()["batch_creates"], anthropic.stats()["batches"]) != (1, made):
        if time.monotonic() > deadline:
            raise AssertionError("the job never reached the batch's create in 30 s")
        time.sleep(0.02)
    job.kill()
    job.wait()
    anthropic.configure(**SERVED, **FAST)
    assert statuses(DF.head(20).pipe(batch)) == {"ok": 20}
    stats = anthropic.stats()
    assert (stats["batches"], stats["lines_uploaded"]) == (1, 7)


# -- the dialect spells each line ------------------------------------------------------------

REQUEST_KEY = "v1:" + "ab" * 32


@pytest.mark.parametrize("kind", ["canceled", "expired"])
def test_the_dialect_reads_a_canceled_or_expired_line_as_not_answered(kind):
    line = {"custom_id": "ab" * 32, "result": {"type": kind}}
    assert ANTHROPIC.batch_result(line) == BatchResult(REQUEST_KEY, unanswered=True)


def test_the_dialect_reads_back_the_line_it_spells():
    line = ANTHROPIC.batch_line(REQUEST_KEY, {"model": "sim", "max_tokens": 5})
    assert line["custom_id"] == "ab" * 32
    assert ANTHROPIC.batch_request(line) == (REQUEST_KEY, {"model": "sim", "max_tokens": 5})


# -- a batch's limits are the provider's ------------------------------------------------------


def test_an_anthropic_batch_holds_anthropics_limits_by_default():
    requests, size = part_limits(BatchMode(), AnthropicBatches)  # its limits are the class's
    assert (requests, size) == (100_000, AnthropicBatches.bytes_per_batch)
    assert size > 200_000_000  # more than OpenAI's 200 MB


def test_a_smaller_limit_cuts_the_batches_at_it(batch, anthropic):
    DF.head(7).pipe(batch, batch=BatchMode(poll_seconds=0.05, requests_per_batch=3))
    assert anthropic.stats()["batches"] == 3  # 3 + 3 + 1 lines


def test_a_limit_above_anthropics_is_refused_before_any_request(batch, anthropic):
    with pytest.raises(ConfigError, match="100,000"):
        DF.pipe(batch, batch=BatchMode(requests_per_batch=100_001))
    assert (anthropic.stats()["requests"], anthropic.stats()["batches"]) == (0, 0)


def test_a_marked_system_prompt_is_priced_in_a_batch_as_estimated(anthropic, cache):
    price = Price(3.0, 0.0, 0.30, cache_write_per_million=3.75)  # output free: cost is exact
    short = pl.DataFrame({"text": ["abcd", "efgh", "ijkl"]})
    job = dict(
        prompt="{text}", system="x" * 4096, model="sim", pricing=price, cache=cache,
        endpoint=Endpoint(anthropic.base_url, api_key=KEY, provider="anthropic"),
        sampling=Sampling(max_tokens=16), batch=BatchMode(poll_seconds=0.05),
    )  # fmt: skip
    plan = estimate(short, **job)
    _, report = short.pipe(llm_complete, return_report=True, **job)
    assert (report.cache_write_tokens, report.cached_tokens) == (1028, 2 * 1028)
    assert plan.batch_cost_min == pytest.approx(report.cost) == plan.batch_cost_max
