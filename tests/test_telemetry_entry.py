"""Where a job is entered from elsewhere: the flow's progress lines while a chunk is sent,
and the caller's span carried to Ray workers and SQL queries."""

from __future__ import annotations

import logging

import polars as pl

from flows.enrich import EnrichConfig, ProgressLog, enrich_table
from llm_ops import Progress

TEXTS = ["great fit", "runs small", None, "love it"] * 5


def _snapshot(rows_done: int, *, failed: int = 0, elapsed: float = 1.0) -> Progress:
    return Progress(
        rows=100,
        rows_done=rows_done,
        requests=100,
        requests_done=rows_done,
        sent=rows_done,
        retries=0,
        rate_limited=0,
        timeouts=0,
        prompt_tokens=0,
        completion_tokens=0,
        concurrency=4,
        elapsed=elapsed,
        failed=failed,
    )


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_progress_log_writes_one_line_per_interval_however_many_snapshots_come():
    clock, lines = FakeClock(), []
    log = ProgressLog(lines.append, "chunk 1/1", every=30, clock=clock)
    for tick in range(1, 181):  # 90 s of snapshots, twice a second
        clock.now = tick / 2
        log(_snapshot(tick))
    assert [line.split(": ")[1].split(",")[0] for line in lines] == [
        "60/100 rows",
        "120/100 rows",
        "180/100 rows",
    ]


def test_the_progress_log_says_rows_done_rate_failures_and_cost():
    clock, lines = FakeClock(), []
    log = ProgressLog(lines.append, "chunk 2/3", every=30, clock=clock)
    clock.now = 30
    log(_snapshot(50, failed=3, elapsed=10.0))
    assert lines == [
        "chunk 2/3: 50/100 rows, 50/100 requests (5/s), 3 failed, 0 rate limited, "
        "0 timeouts, 0 retries, cost unknown"
    ]


def test_the_progress_log_ends_with_the_last_snapshot_once():
    clock, lines = FakeClock(), []
    log = ProgressLog(lines.append, "chunk 1/1", every=30, clock=clock)
    log(_snapshot(7))
    log.end()
    log.end()
    assert len(lines) == 1 and lines[0].startswith("chunk 1/1: 7/100 rows")


def test_a_flow_logs_each_chunks_progress_with_rows_done_and_failures(
    prefect, tmp_path, endpoint, cache, caplog
):
    source = tmp_path / "reviews.parquet"
    pl.DataFrame({"text": TEXTS}).write_parquet(source)
    config = EnrichConfig(
        input=str(source),
        output=str(tmp_path / "out.parquet"),
        prompt="{text}",
        base_url=endpoint.base_url,
        cache=str(cache),
        chunk_size=2,
    )
    with caplog.at_level(logging.INFO):
        enrich_table(config)
    said = [record.getMessage() for record in caplog.records]
    progress = [line for line in said if line.startswith("chunk 1/2: ")]
    assert progress and " rows, " in progress[-1] and " failed, " in progress[-1]
