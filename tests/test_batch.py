"""Provider batch mode against the simulator's Files and Batches API, over real HTTP."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import time

import openai
import polars as pl
import pytest

from llm_ops import (
    BatchMode,
    Cache,
    ConfigError,
    Price,
    Sampling,
    estimate,
    llm_complete,
    open_cache,
    request_key,
)

TEXTS = [f"item {i % 7}" for i in range(20)] + ["bad [[sim:status=400]]", None]
DF = pl.DataFrame({"text": TEXTS})


@pytest.fixture
def batch(endpoint, cache):
    """``llm_complete`` in batch mode against the simulator, polling every 0.05 s."""
    endpoint.configure(batch_seconds=0.3, batch_validation_seconds=0.05)
    return functools.partial(
        llm_complete,
        prompt="Say {text}",
        model="sim",
        endpoint=endpoint.base_url,
        batch=BatchMode(poll_seconds=0.05),
        cache=cache,
    )


def test_a_batch_job_gives_the_frame_a_live_job_gives(batch, endpoint):
    live = DF.pipe(
        llm_complete, prompt="Say {text}", model="sim", endpoint=endpoint.base_url, cache=False
    )
    assert DF.pipe(batch).equals(live)
    assert endpoint.stats()["batches"] == 1


def test_per_line_failures_are_row_statuses(batch):
    out = DF.pipe(batch)
    assert out.row(20)[1:] == (None, "rejected", "HTTP 400: simulated error 400")


def test_a_second_identical_job_needs_no_batch(batch, endpoint):
    DF.head(20).pipe(batch)
    again = DF.head(20).pipe(batch)
    assert again["completion_status"].to_list() == ["cached"] * 20
    assert endpoint.stats()["batches"] == 1


def test_an_expired_batch_keeps_its_answers_and_resubmits_the_rest(batch, endpoint):
    endpoint.configure(batch_seconds=0.3, batch_validation_seconds=0.05, batch_expire_share=0.5)
    out = DF.head(20).pipe(batch)
    assert out["completion_status"].to_list() == ["ok"] * 20
    stats = endpoint.stats()
    assert (stats["batches"], stats["lines_uploaded"]) == (2, 7 + 4)  # the 4 not answered


def test_the_rest_of_an_expired_batch_can_be_sent_live(batch, endpoint):
    endpoint.configure(batch_seconds=0.3, batch_validation_seconds=0.05, batch_expire_share=0.5)
    out = DF.head(20).pipe(batch, batch=BatchMode(poll_seconds=0.05, on_expired="live"))
    assert out["completion_status"].to_list() == ["ok"] * 20
    assert (endpoint.stats()["batches"], endpoint.stats()["requests"]) == (1, 4)


def test_the_lines_uploaded_are_the_estimates_requests_at_half_the_price(batch, endpoint):
    prices = {"sim": Price(0.15, 0.60)}
    plan = estimate(
        DF,
        prompt="Say {text}",
        model="sim",
        sampling=Sampling(max_tokens=20),
        endpoint=endpoint.base_url,
        batch=True,
        pricing=prices,
    )
    DF.pipe(batch, pricing=prices, sampling=Sampling(max_tokens=20))
    assert endpoint.stats()["lines_uploaded"] == plan.requests == 8
    assert plan.batch_cost_max == pytest.approx(plan.cost_max / 2)
    assert plan.batch_cost_min == pytest.approx(plan.cost_min / 2)


def test_the_report_and_the_runs_table_say_batch_and_what_it_saved(batch, cache):
    _, report = DF.head(20).pipe(batch, pricing={"sim": Price(1.0, 4.0)}, return_report=True)
    assert report.mode == "batch"
    assert report.savings["batch"].cost == pytest.approx(report.cost)  # it cost half
    with open_cache(cache) as con:
        assert con.execute("SELECT mode, savings['batch'].cost > 0 FROM llm_runs").fetchall() == [
            ("batch", True)
        ]


KILLED = """
import sys, polars as pl
from llm_ops import BatchMode, llm_complete
df = pl.DataFrame({"text": [f"row {i}" for i in range(300)]})
df.pipe(llm_complete, prompt="{text}", model="sim", endpoint=sys.argv[1], cache=sys.argv[2],
        batch=BatchMode(poll_seconds=0.05, requests_per_batch=100), progress=False)
"""


def test_a_job_killed_after_submitting_resumes_without_a_new_batch(endpoint, cache):
    endpoint.configure(batch_seconds=3.0, batch_validation_seconds=0.05)
    job = subprocess.Popen([sys.executable, "-c", KILLED, endpoint.base_url, str(cache)])
    deadline = time.monotonic() + 30
    while endpoint.stats()["batches"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    job.send_signal(signal.SIGKILL)
    job.wait()
    df = pl.DataFrame({"text": [f"row {i}" for i in range(300)]})
    out = df.pipe(
        llm_complete,
        prompt="{text}",
        model="sim",
        endpoint=endpoint.base_url,
        batch=BatchMode(poll_seconds=0.05, requests_per_batch=100),
        cache=cache,
    )
    assert out["completion_status"].to_list() == ["ok"] * 300
    assert endpoint.stats()["batches"] == 3


def test_a_batch_made_but_not_recorded_is_found_by_its_metadata(batch, endpoint, cache):
    """The window between creating a batch and recording it: a rerun finds the batch in the
    provider's list by its metadata instead of making another."""
    messages = [{"role": "user", "content": "Say x"}]
    key = request_key({"endpoint": endpoint.base_url, "model": "sim", "messages": messages})
    line = {
        "custom_id": key,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "sim", "messages": messages},
    }
    sdk = openai.OpenAI(base_url=endpoint.base_url, api_key="unused")
    file = sdk.files.create(file=("in.jsonl", json.dumps(line).encode()), purpose="batch")
    part = {
        "job_id": "llmops-crashed",
        "part": 0,
        "endpoint": endpoint.base_url,
        "model": "sim",
        "requests": 1,
        "input_file_id": file.id,
    }
    store = Cache(cache)
    store.prepare()
    store.record_batch({**part, "state": "preparing"}, keys=[key])
    store.record_batch({**part, "state": "uploaded"})
    sdk.batches.create(
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"llm_ops_job": "llmops-crashed", "llm_ops_part": "0"},
    )
    out = pl.DataFrame({"text": ["x"]}).pipe(batch)
    assert out["completion_status"].to_list() == ["ok"]
    assert endpoint.stats()["batches"] == 1


def test_batch_mode_needs_a_cache(endpoint):
    with pytest.raises(ConfigError, match="cache=False"):
        DF.pipe(
            llm_complete,
            prompt="{text}",
            model="sim",
            endpoint=endpoint.base_url,
            batch=True,
            cache=False,
        )


def test_submit_returns_at_once_and_a_later_run_collects_without_resubmitting(endpoint, cache):
    from llm_ops import Client

    endpoint.configure(batch_seconds=0.5, batch_validation_seconds=0.05)
    df = DF.head(20)
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        parts = client.submit(df, prompt="Say {text}", model="sim")
        assert [p.state for p in parts] == ["submitted"]
        out = client.complete(
            df,
            prompt="Say {text}",
            model="sim",
            batch=BatchMode(poll_seconds=0.05),
        )
        assert [p.state for p in client.batches()] == ["collected"]
    assert out["completion_status"].to_list() == ["ok"] * 20
    assert endpoint.stats()["batches"] == 1


def test_the_command_line_lists_and_collects_batches(endpoint, cache, capsys):
    from llm_ops import Client
    from llm_ops.cli import main

    endpoint.configure(batch_seconds=0.3, batch_validation_seconds=0.05)
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        parts = client.submit(DF.head(20), prompt="Say {text}", model="sim")
    where = ["--base-url", endpoint.base_url, "--cache", str(cache)]
    assert main(["batches", "list", *where]) == 0
    assert parts[0].job_id in capsys.readouterr().out
    assert main(["batches", "collect", *where]) == 0
    assert "collected 7 answer(s)" in capsys.readouterr().out
    again = DF.head(20).pipe(
        llm_complete,
        prompt="Say {text}",
        model="sim",
        endpoint=endpoint.base_url,
        batch=True,
        cache=cache,
    )
    assert again["completion_status"].to_list() == ["cached"] * 20


def test_a_table_in_batch_mode_submits_every_chunk_before_waiting(endpoint, cache, tmp_path):
    from llm_ops import Client
    from llm_ops.tables import Table

    endpoint.configure(batch_seconds=0.3, batch_validation_seconds=0.05)
    DF.write_parquet(tmp_path / "in.parquet")
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        report = Table(
            client,
            tmp_path / "in.parquet",
            tmp_path / "out.parquet",
            prompt="Say {text}",
            model="sim",
            batch=BatchMode(poll_seconds=0.05),
            chunk_size=3,
        ).run()
    live = DF.pipe(
        llm_complete, prompt="Say {text}", model="sim", endpoint=endpoint.base_url, cache=False
    )
    assert pl.read_parquet(tmp_path / "out.parquet").equals(live)
    assert (report.mode, endpoint.stats()["batches"]) == ("batch", 3)


def test_files_are_cut_at_the_byte_limit(batch, endpoint):
    small_files = BatchMode(poll_seconds=0.05, bytes_per_batch=700)  # a line is about 230 bytes
    out = DF.head(20).pipe(batch, batch=small_files)
    assert out["completion_status"].to_list() == ["ok"] * 20
    assert (endpoint.stats()["batches"], endpoint.stats()["lines_uploaded"]) == (3, 7)


def test_a_dialect_without_a_batch_api_is_a_config_error(cache):
    from dialect_echo import ECHO, ECHO_KEY, EchoServer

    from llm_ops import Endpoint

    with EchoServer() as server, pytest.raises(ConfigError, match="has no provider batches"):
        DF.head(2).pipe(
            llm_complete,
            prompt="{text}",
            model="echo-1",
            endpoint=Endpoint(server.base_url, api_key=ECHO_KEY, provider=ECHO),
            batch=True,
            cache=cache,
        )
    assert server.requests == []
