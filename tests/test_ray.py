"""Tables on a real local Ray cluster (two worker processes) against the simulator."""

from __future__ import annotations

import threading
import time

import polars as pl
import pytest

from llm_ops import Client, JobAbortedError, RateLimit, open_cache
from llm_ops.testing import expected_reply

ray = pytest.importorskip("ray")

TEXTS = [f"review {i % 60}" for i in range(240)]


@pytest.fixture(scope="module")
def cluster():
    from llm_ops.ray import connect

    connect("local", workers=2)
    yield
    ray.shutdown()


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "in.parquet"
    pl.DataFrame({"id": range(len(TEXTS)), "text": TEXTS}).write_parquet(path)
    return path


def _table(client, source, tmp_path, **options):
    from llm_ops.tables import Table

    options = {"chunk_size": 10, **options}
    return Table(client, source, tmp_path / "out.parquet", prompt="{text}", model="sim", **options)


def _wait_until(condition, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.01)


def test_chunks_run_on_two_workers_and_every_row_is_answered_in_order(
    cluster, endpoint, cache, source, tmp_path
):
    from llm_ops.ray import run_on_ray

    ends = []
    with Client(endpoint=endpoint.base_url, cache=cache, concurrency=8) as client:
        report = run_on_ray(
            _table(client, source, tmp_path),
            workers=2,
            on_chunk=lambda done, total, counters: ends.append(done),
        )
    out = pl.read_parquet(tmp_path / "out.parquet")
    assert out["id"].to_list() == list(range(len(TEXTS)))
    assert out["completion"].to_list() == [expected_reply(t, model="sim") for t in TEXTS]
    assert endpoint.stats()["requests"] == endpoint.stats()["distinct_prompts"] == 60
    assert (report.requests_sent, ends[-1]) == (60, 6)
    with open_cache(cache) as con:
        assert con.execute("SELECT count(*) FROM llm_cache").fetchall() == [(60,)]
    assert not (tmp_path / "out.parquet.work").exists()


def test_two_workers_under_one_shared_rate_limit_answer_every_row(
    cluster, endpoint, cache, source, tmp_path
):
    from llm_ops.ray import run_on_ray

    # The endpoint allows 600 a minute and answers a burst beyond one second's worth with
    # 429s; the client asks for a little less, leased from the cluster's one quota. How few
    # 429s that leaves depends on how the machine schedules the workers (none on a quiet
    # one, one in three loaded runs): benchmarks/ray_scale.py measures it; here, every row.
    endpoint.configure(rpm=600, rate_window=1.0, rate_limit_headers=False, latency=0.01)
    with Client(
        endpoint=endpoint.base_url, rate_limit=RateLimit(rpm=570), cache=cache, concurrency=8
    ) as client:
        report = run_on_ray(_table(client, source, tmp_path, chunk_size=30), workers=2)
    assert report.statuses["ok"] == len(TEXTS)


def test_a_failed_run_reruns_without_sending_anything_answered_again(
    cluster, endpoint, cache, source, tmp_path
):
    from llm_ops.ray import run_on_ray

    # A worker's chunk is refused midway; the other worker's, refused too or stopped by the
    # driver, keeps what it had in flight: the count does not depend on which comes first.
    endpoint.configure(quota_requests=25)
    with (
        Client(endpoint=endpoint.base_url, cache=cache, concurrency=4) as client,
        pytest.raises(JobAbortedError, match="out of quota"),
    ):
        run_on_ray(_table(client, source, tmp_path), workers=2)
    answered = endpoint.stats()["answered"]
    endpoint.configure()
    with Client(endpoint=endpoint.base_url, cache=cache, concurrency=4) as client:
        report = run_on_ray(_table(client, source, tmp_path), workers=2)
    assert report.statuses["ok"] + report.statuses["cached"] == len(TEXTS)
    assert endpoint.stats()["answered"] == 60  # the first run's answers were kept
    assert answered == 25


def test_chunks_stopped_after_another_failed_keep_the_answers_they_had_in_flight(
    cluster, endpoint, cache, tmp_path
):
    from llm_ops.ray import run_on_ray

    source = tmp_path / "two.parquet"
    pl.DataFrame({"text": ["[[sim:latency=1]] slow", "fast"]}).write_parquet(source)

    # The fast chunk ends first; failing then stops the other chunk as a chunk's failure
    # would, while its request is at the endpoint, which answers (and bills) it a second later.
    def fail_while_the_slow_one_is_in_flight(done, total, counters):
        _wait_until(lambda: endpoint.stats()["requests"] == 2)
        raise RuntimeError("a chunk failed")

    with (
        Client(endpoint=endpoint.base_url, cache=cache) as client,
        pytest.raises(RuntimeError, match="a chunk failed"),
    ):
        table = _table(client, source, tmp_path, chunk_size=1)
        run_on_ray(table, workers=2, on_chunk=fail_while_the_slow_one_is_in_flight)
    with open_cache(cache) as con:
        assert con.execute("SELECT count(*) FROM llm_cache").fetchall() == [(2,)]


def test_the_driver_hears_a_chunks_progress_while_it_runs(cluster, endpoint, cache, tmp_path):
    from llm_ops.ray import send_chunks

    source = tmp_path / "four.parquet"
    pl.DataFrame({"text": [f"row {i}" for i in range(4)]}).write_parquet(source)
    # Two rows are answered and the others held until the driver hears a snapshot: the chunk
    # cannot end before. Should none come, the timer lets them go (and the test fails) instead
    # of the test hanging; it is long because Ray starts a process for each of the run's two
    # actors, which took over 30 s on a busy machine.
    endpoint.configure(hold=2)
    heard, gave_up = [], threading.Event()

    def on_progress(number, chunks, progress, last):
        heard.append((number, chunks, progress.rows_done, progress.rows, last))
        endpoint.configure()

    def give_up():
        gave_up.set()
        endpoint.configure()

    safety_net = threading.Timer(180, give_up)
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        table = _table(client, source, tmp_path)
        safety_net.start()
        try:
            send_chunks(table, table.plan().chunks, on_progress=on_progress, progress_every=0.2)
        finally:
            safety_net.cancel()
    assert not gave_up.is_set(), "no snapshot was heard while the chunk ran"
    number, chunks, rows_done, rows, last = heard[0]
    assert (number, chunks, rows, last) == (1, 1, 4, False)
    assert rows_done < rows
    assert heard[-1] == (1, 1, 4, 4, True)
    assert [last for *_, last in heard].count(True) == 1


def test_a_chunk_failing_while_its_progress_is_heard_fails_the_run_with_its_error(
    cluster, endpoint, cache, source, tmp_path
):
    from llm_ops.ray import send_chunks

    endpoint.configure(quota_requests=25, latency=0.05)  # refused midway
    heard = []
    with (
        Client(endpoint=endpoint.base_url, cache=cache, concurrency=4) as client,
        pytest.raises(JobAbortedError, match="out of quota"),
    ):
        table = _table(client, source, tmp_path)
        send_chunks(
            table,
            table.plan().chunks,
            workers=2,
            on_progress=lambda number, chunks, progress, last: heard.append((number, last)),
            progress_every=0.2,
        )
    # Chunks 1 and 2 run first, and the third starts only when one of them has ended with its
    # 10 requests answered: that one's progress was told to its end.
    assert {1, 2} & {number for number, last in heard if last}


def test_the_flow_logs_each_chunk_running_on_ray(cluster, endpoint, cache, source, tmp_path):
    from flows.enrich import ChunkLogs
    from llm_ops.ray import send_chunks

    lines = []
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        table = _table(client, source, tmp_path, chunk_size=30)
        chunks = table.plan().chunks
        send_chunks(table, chunks, on_progress=ChunkLogs(lines.append, every=0.0))
    # every chunk's lines, its last saying all its rows are done (each chunk has 120 rows)
    for number in (1, 2):
        said = [line for line in lines if line.startswith(f"chunk {number}/2 on Ray: ")]
        assert said[-1].startswith(f"chunk {number}/2 on Ray: 120/120 rows, 30/30 requests")


def test_the_flow_runs_its_chunks_on_ray(prefect, cluster, endpoint, cache, source, tmp_path):
    from flows.enrich import EnrichConfig, enrich_table

    config = EnrichConfig(
        input=str(source),
        output=str(tmp_path / "flow.parquet"),
        prompt="{text}",
        base_url=endpoint.base_url,
        cache=str(cache),
        chunk_size=10,
        ray_address="local",
        ray_workers=2,
    )
    result = enrich_table(config)
    assert result["requests_sent"] == 60
    out = pl.read_parquet(tmp_path / "flow.parquet")
    assert out["summary"].to_list() == [expected_reply(t, model="sim") for t in TEXTS]


def test_the_command_line_sends_on_ray(cluster, endpoint, cache, source, tmp_path):
    from llm_ops.cli import main

    assert (
        main(
            [
                "run",
                str(source),
                "--prompt",
                "{text}",
                "--model",
                "sim",
                "--base-url",
                endpoint.base_url,
                "--cache",
                str(cache),
                "--output",
                str(tmp_path / "o.parquet"),
                "--chunk-size",
                "10",
                "--ray",
                "local",
                "--ray-workers",
                "2",
                "--no-progress",
            ]
        )
        == 0
    )
    assert pl.read_parquet(tmp_path / "o.parquet")["completion_status"].to_list() == ["ok"] * len(
        TEXTS
    )
    assert endpoint.stats()["requests"] == 60


def test_image_bytes_travel_to_the_workers_in_the_chunk_files(cluster, endpoint, cache, tmp_path):
    from llm_ops.ray import run_on_ray
    from llm_ops.tables import Table
    from tests.media_files import image

    photos = [image("PNG", color=n) for n in range(6)]
    pl.DataFrame({"photo": photos * 2}).write_parquet(tmp_path / "in.parquet")
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        table = Table(
            client,
            tmp_path / "in.parquet",
            tmp_path / "out.parquet",
            prompt="What is this?",
            model="sim",
            images="photo",
            chunk_size=2,
        )
        run_on_ray(table, workers=2)
    out = pl.read_parquet(tmp_path / "out.parquet")
    expected = [expected_reply("What is this?", model="sim", media=[p]) for p in photos]
    assert out["completion"].to_list() == expected * 2
    assert endpoint.stats()["requests"] == 6


@pytest.mark.parametrize("dialect", ["gemini", "anthropic"])
def test_workers_speak_the_drivers_dialect(cluster, cache, source, tmp_path, dialect):
    from llm_ops import Endpoint
    from llm_ops.ray import run_on_ray
    from llm_ops.testing import LocalEndpoint

    with (
        LocalEndpoint(dialect=dialect) as sim,
        Client(endpoint=Endpoint(sim.base_url, provider=dialect), cache=cache) as client,
    ):
        run_on_ray(_table(client, source, tmp_path), workers=2)
        assert sim.stats()["requests"] == 60
    out = pl.read_parquet(tmp_path / "out.parquet")
    assert out["completion"].to_list() == [expected_reply(t, model="sim") for t in TEXTS]
