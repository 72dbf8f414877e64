"""The dispatch engine under faults, rate limits, refusals and crashes (real HTTP, real files)."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import duckdb
import polars as pl
import pytest
from clocks import VirtualTime

from llm_ops import Cache, JobAbortedError, Progress, RateLimit, Retries, RowsFailedWarning
from llm_ops._dialects import parse_duration
from llm_ops._dialects.openai import OPENAI
from llm_ops._engine.answers import retry_after
from llm_ops._limits import NOTHING_HEARD, RateLimiter, SlowStart
from llm_ops._progress import TerminalDisplay, resolve_progress
from llm_ops.testing import expected_reply


def _rows(n, prefix="row"):
    return pl.DataFrame({"text": [f"{prefix} {i}" for i in range(n)]})


def test_faults_and_hangs_leave_every_row_answered_or_failed(complete, endpoint):
    endpoint.configure(fault_rate=0.10, hang_rate=0.05, seed=7)
    out = _rows(3000).pipe(
        complete, prompt="{text}", retries=Retries(timeout=1.0, max_attempts=6), concurrency=64
    )
    assert out.height == 3000
    assert set(out["completion_status"].unique()) <= {"ok", "failed"}
    ok = out.filter(pl.col("completion_status") == "ok")
    assert ok["completion"].to_list() == [expected_reply(t, model="sim") for t in ok["text"]]
    assert out.filter(pl.col("completion_status") == "failed")["completion_error"].null_count() == 0
    assert ok.height >= 2900  # without retries about 2,550; under load a few more time out


def test_a_request_rate_limit_fails_no_row(complete, endpoint):
    endpoint.configure(rpm=1200, rate_window=1.0)
    out = _rows(120).pipe(complete, prompt="{text}", concurrency=32)
    assert out["completion_status"].to_list() == ["ok"] * 120  # the rate: benchmarks/run.py


def _times_let_through(clock: VirtualTime, admissions) -> list[float]:
    """The fake times at which each of ``admissions`` (coroutines) was let through."""

    async def stamped(admission) -> float:
        await admission
        return clock.now

    async def everyone() -> list[float]:
        return list(await asyncio.gather(*(stamped(a) for a in admissions)))

    return clock.run(everyone())


def test_a_slow_start_doubles_what_it_lets_through():
    clock = VirtualTime()
    slow = SlowStart(first=4, doubling=0.05, clock=clock, sleep=clock.sleep)
    times = _times_let_through(clock, [slow.admit() for _ in range(17)])
    # the first (the engine's gate sends it alone) and 4 more at once, then 8 by one
    # doubling, 16 by two
    let_through_by = [sum(t <= moment + 1e-9 for t in times) for moment in (0.0, 0.05, 0.1)]
    assert let_through_by == [1 + 4, 1 + 8, 1 + 16]


def test_the_first_answer_ends_the_slow_start():
    clock = VirtualTime()
    limiter = RateLimiter(rpm=None, tpm=None, clock=clock, sleep=clock.sleep)
    limiter.slow_start = SlowStart(first=1, doubling=10.0, clock=clock, sleep=clock.sleep)

    async def answer_at_one_second() -> None:
        await clock.sleep(1.0)
        limiter.observe(NOTHING_HEARD)  # an answer, whatever it says

    admissions = [limiter.admit(1) for _ in range(3)]
    *times, _ = _times_let_through(clock, [*admissions, answer_at_one_second()])
    # the third would have waited for its turn until 10 s; the answer at 1 s let it go
    assert times == [0.0, 0.0, 1.0]


def test_a_request_rate_lets_a_burst_through_then_one_request_per_its_share_of_a_minute():
    clock = VirtualTime()
    limiter = RateLimiter(rpm=120, tpm=None, burst=1.0, clock=clock, sleep=clock.sleep)
    times = _times_let_through(clock, [limiter.admit(1) for _ in range(5)])
    # a burst of one second's worth (two), then one every half second
    assert times == pytest.approx([0.0, 0.0, 0.5, 1.0, 1.5])


def test_a_limit_given_needs_no_slow_start():
    assert RateLimiter(rpm=600, tpm=None).slow_start is None


def test_retry_after_pauses_every_sender(complete, endpoint):
    endpoint.configure(rpm=60, rate_window=1.0, rate_limit_headers=False)
    out = _rows(4).pipe(complete, prompt="{text}", concurrency=4, retries=Retries(max_attempts=4))
    # Retrying on backoff alone, without waiting out Retry-After, would exhaust four attempts.
    assert out["completion_status"].to_list() == ["ok"] * 4


def test_429s_without_headers_lower_the_concurrency(complete, endpoint):
    endpoint.configure(rpm=600, rate_window=0.5, rate_limit_headers=False, latency=0.02)
    seen: list[Progress] = []

    def watch(progress: Progress) -> None:
        seen.append(progress)
        if progress.rate_limited and endpoint.config.rpm:
            endpoint.configure(latency=0.02)  # the limit lifts, so the job ends soon

    out = _rows(600).pipe(complete, prompt="{text}", concurrency=16, progress=watch)
    assert out["completion_status"].to_list() == ["ok"] * 600
    assert min(p.concurrency for p in seen) < 16  # coming back up: tests/test_concurrency.py


def test_a_request_larger_than_the_token_budget_fails_at_once(complete, endpoint):
    out = pl.DataFrame({"text": ["x" * 2000]}).pipe(
        complete, prompt="{text}", rate_limit=RateLimit(tpm=300)
    )
    assert out["completion_status"].to_list() == ["failed"]
    assert "more than the whole tokens-per-minute budget" in out["completion_error"][0]
    assert endpoint.stats()["requests"] == 0


# The first request is answered slowly, so that others sent beside it would overlap it; the
# others' answers wait until all seven are in flight, so that they overlap however busy the
# machine: at most the seven others at once, and never fewer.
FIRST_ALONE = {"latency": 0.2, "gather": 7}


def test_the_others_wait_until_the_first_request_is_answered(complete, endpoint):
    endpoint.configure(**FIRST_ALONE)  # /models answers at once, the first request slowly
    _rows(8).pipe(complete, prompt="{text}", concurrency=8)
    assert endpoint.stats()["max_in_flight"] == 7  # the first, then the seven others


def test_an_endpoint_without_a_model_list_gets_one_request_first(complete, endpoint):
    endpoint.configure(**FIRST_ALONE, models=())
    _rows(8).pipe(complete, prompt="{text}", concurrency=8)
    assert endpoint.stats()["max_in_flight"] == 7  # the first, then the seven others


def test_insufficient_quota_stops_the_job(complete, endpoint):
    endpoint.configure(insufficient_quota=True)
    with pytest.raises(JobAbortedError, match="out of quota"):
        _rows(50).pipe(complete, prompt="{text}", concurrency=2)
    assert endpoint.stats()["requests"] <= 2


def test_progress_callback_sees_the_job_finish(complete):
    seen: list[Progress] = []
    _rows(20).pipe(complete, prompt="{text}", progress=seen.append)
    assert (seen[-1].rows_done, seen[-1].requests_done) == (20, 20)


def test_the_progress_bar_is_tqdms_with_the_jobs_fields():
    stream = io.StringIO()
    display = TerminalDisplay(stream)
    display(Progress(10, 5, 10, 5, 6, 1, 0, 0, 100, 50, 8, 1.0, cost=0.25))
    display.close()
    last = stream.getvalue().rstrip("\n").rsplit("\r", 1)[-1]
    assert last.startswith("llm-ops:  50%|") and "| 5/10 rows [" in last
    assert (
        "5 req/s · 150 tok/s · 429s 0 · retries 1 · concurrency 8 · ETA 1s · cost $0.2500" in last
    )
    assert stream.getvalue().endswith("\n")


def test_forced_progress_draws_the_bar_on_stderr(complete, capsys):
    _rows(20).pipe(complete, prompt="{text}", progress=True)
    assert "| 20/20 rows [" in capsys.readouterr().err


def test_the_first_rows_failing_alike_are_noted_early(complete):
    seen: list[Progress] = []
    # one answer first: a job whose first answers are all refusals alike stops instead
    texts = ["0", *(f"{i} [[sim:status=400]]" for i in range(1, 40))]
    with pytest.warns(RowsFailedWarning):
        pl.DataFrame({"text": texts}).pipe(
            complete, prompt="{text}", concurrency=1, progress=seen.append
        )
    assert seen[-1].note == "19 of the first 20 rows failed: 'HTTP 400: simulated error N'"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1.5", 1.5), ("soon", None)],
)
def test_parse_reset_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_a_pause_holds_every_sender():
    clock = VirtualTime()
    limiter = RateLimiter(rpm=None, tpm=None, clock=clock, sleep=clock.sleep)
    limiter.pause(0.2)
    times = _times_let_through(clock, [limiter.admit(1) for _ in range(3)])
    # all at its end, spread over up to 50 ms so they do not come back as one herd
    assert all(0.2 <= t <= 0.2 + 0.05 for t in times)


@pytest.mark.parametrize(("remaining", "level"), [("19", 18.0), (None, 0.0), ("-3", 0.0)])
def test_a_learned_limit_starts_with_the_burst_the_server_still_allows(remaining, level):
    limiter = RateLimiter(rpm=None, tpm=None)
    headers = {"x-ratelimit-limit-requests": "1200"}
    if remaining is not None:
        headers["x-ratelimit-remaining-requests"] = remaining
    limiter.observe(OPENAI.heard_limits(headers))
    assert limiter.requests is not None and limiter.requests.level == level


def _answer_headers(endpoint) -> dict[str, str]:
    """The headers of one chat completion, answered or refused."""
    body = {"model": "sim", "messages": [{"role": "user", "content": "hello"}]}
    request = urllib.request.Request(
        f"{endpoint.base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            return {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as refused:
        return {k.lower(): v for k, v in refused.headers.items()}


def test_after_a_429_the_next_request_goes_when_retry_after_says(endpoint):
    endpoint.configure(rpm=60, rate_window=1.0)  # a budget of one request
    answered, refused = _answer_headers(endpoint), _answer_headers(endpoint)
    wait = retry_after(refused)
    assert answered["x-ratelimit-remaining-requests"] == "0" and wait is not None
    clock = VirtualTime()  # what the limiter plans, not what a busy machine takes
    limiter = RateLimiter(rpm=None, tpm=None, clock=clock, sleep=clock.sleep)
    limiter.observe(OPENAI.heard_limits(answered))
    limiter.observe(OPENAI.heard_limits(refused))
    limiter.pause(wait)  # as the dispatcher does for a 429 with Retry-After
    [went] = _times_let_through(clock, [limiter.admit(1)])
    # Up to 50 ms spread the restart of paused senders; not a second request's time more.
    assert wait <= went <= wait + 0.05 + 1e-9


JOB = """
import sys, polars as pl
from llm_ops import Cache, llm_complete
base_url, cache = sys.argv[1], sys.argv[2]
df = pl.DataFrame({"text": [f"row {i} [[sim:latency=0.05]]" for i in range(400)]})
df.pipe(llm_complete, prompt="{text}", model="sim", endpoint=base_url,
        cache=Cache(cache, flush_every=8, flush_seconds=0.2),
        concurrency=16, progress=False)
"""


def _start_job(endpoint, cache):
    return subprocess.Popen(
        [sys.executable, "-c", JOB, endpoint.base_url, str(cache)],
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_answers(endpoint, job, count):
    """Until the endpoint answered ``count`` requests (or the job ended, or a generous minute)."""
    deadline = time.monotonic() + 60
    while endpoint.stats()["answered"] < count and job.poll() is None:
        assert time.monotonic() < deadline, "the job answered too little in a minute"
        time.sleep(0.05)


def test_a_killed_job_rerun_resends_only_what_was_not_flushed(complete, endpoint, cache):
    job = _start_job(endpoint, cache)
    _wait_for_answers(endpoint, job, 80)
    job.send_signal(signal.SIGKILL)
    job.wait()
    df = pl.DataFrame({"text": [f"row {i} [[sim:latency=0.05]]" for i in range(400)]})
    out = df.pipe(complete, prompt="{text}", concurrency=16, cache=Cache(cache, flush_every=8))
    assert set(out["completion_status"].unique()) == {"ok", "cached"}
    assert endpoint.stats()["requests"] <= 400 + 16 + 8


def test_sigint_flushes_and_reports(endpoint, cache):
    job = _start_job(endpoint, cache)
    _wait_for_answers(endpoint, job, 60)
    job.send_signal(signal.SIGINT)
    _, stderr = job.communicate(timeout=30)
    assert job.returncode != 0
    assert "interrupted; answers so far are cached" in stderr
    with duckdb.connect(str(cache), read_only=True) as con:
        cached = con.execute("SELECT count(*) FROM llm_cache").fetchall()[0][0]
        outcome = con.execute("SELECT outcome FROM llm_runs").fetchall()
    assert cached >= 60 - 16
    assert outcome == [("interrupted",)]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_endpoint_stops_the_job_after_one_requests_attempts(complete):
    seen: list[Progress] = []
    with pytest.raises(JobAbortedError, match=r"could not connect to http://127\.0\.0\.1"):
        _rows(500).pipe(
            complete,
            prompt="{text}",
            endpoint=f"http://127.0.0.1:{_free_port()}/v1",
            retries=Retries(max_attempts=3),
            concurrency=64,
            progress=seen.append,
        )
    assert seen[-1].sent == 3


def test_an_endpoint_that_goes_away_stops_the_job_keeping_its_answers(cache):
    from llm_ops import llm_complete, open_cache
    from llm_ops.testing import LocalEndpoint

    endpoint = LocalEndpoint(latency=0.01).start()

    def stop_midway(progress: Progress) -> None:
        if progress.rows_done >= 200:
            endpoint.stop()

    with pytest.raises(JobAbortedError, match="could not connect"):
        _rows(5000).pipe(
            llm_complete,
            prompt="{text}",
            model="sim",
            endpoint=endpoint.base_url,
            cache=cache,
            concurrency=8,
            progress=stop_midway,
        )
    with open_cache(cache) as con:
        assert con.execute("SELECT count(*) FROM llm_cache").fetchall()[0][0] >= 200


def test_an_empty_quota_costs_one_request_however_slowly_the_server_answers(complete, endpoint):
    endpoint.configure(insufficient_quota=True, latency=0.5)  # /models answers at once
    with pytest.raises(JobAbortedError, match="out of quota"):
        _rows(50).pipe(complete, prompt="{text}", concurrency=32)
    assert endpoint.stats()["requests"] == 1


def test_requests_carry_the_key_but_not_the_sdks_telemetry_headers(complete, endpoint):
    _rows(3).pipe(complete, prompt="{text}")
    names = {name.lower() for name in endpoint.stats()["header_names"]}
    assert "authorization" in names and "user-agent" in names
    assert not any(name.startswith("x-stainless") for name in names)


def test_a_cancelled_async_job_keeps_every_answer_it_was_sent(endpoint, cache, caplog):
    from llm_ops import llm_complete_async

    endpoint.configure(hold=1)  # the first answered, then every other held until told
    rows = _rows(200)

    async def cancel_once_in_flight() -> None:
        job = asyncio.create_task(
            llm_complete_async(
                rows,
                prompt="{text}",
                model="sim",
                endpoint=endpoint.base_url,
                cache=cache,
                concurrency=16,
            )
        )
        while (await asyncio.to_thread(endpoint.stats))["held"] < 16:
            await asyncio.sleep(0.02)
        job.cancel()
        await asyncio.sleep(0)  # the job takes the cancel in, then waits for what is held
        await asyncio.to_thread(endpoint.configure)  # which now goes
        with pytest.raises(asyncio.CancelledError):
            await job

    asyncio.run(cancel_once_in_flight())
    sent = endpoint.stats()["requests"]
    with duckdb.connect(str(cache), read_only=True) as con:
        cached = con.sql("SELECT count(*) FROM llm_cache").fetchall()
    assert sent == 1 + 16  # the first, then 16 in flight: no more once cancelled
    assert cached == [(sent,)]  # what was in flight was answered and kept
    assert "destroyed but it is pending" not in caplog.text


def test_a_jupyter_kernel_gets_the_progress_bar_though_its_stderr_is_no_terminal(monkeypatch):
    kernel = SimpleNamespace(config={"IPKernelApp": {}})
    monkeypatch.setitem(sys.modules, "IPython", SimpleNamespace(get_ipython=lambda: kernel))
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert isinstance(resolve_progress(None), TerminalDisplay)


def test_a_pipe_gets_no_progress_bar(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert resolve_progress(None) is None
