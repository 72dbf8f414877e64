"""Every entry point speaks every dialect: a frame, an expression, SQL, the command line and
the flow, each against the simulator speaking that dialect, live and batch (SQL
functions send live only); Ray's is in tests/test_ray.py."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import polars as pl
import pytest

from flows.enrich import EnrichConfig, enrich_table
from llm_ops import BatchMode, Endpoint, llm_complete
from llm_ops.cli import main
from llm_ops.sql import register
from llm_ops.testing import LocalEndpoint, expected_reply

DIALECTS = ["openai", "gemini", "anthropic"]
TEXTS = ["great fit", "runs small", "great fit"]
ANSWERS = [expected_reply(f"Rate: {text}", model="sim") for text in TEXTS]


@pytest.fixture(scope="module", params=DIALECTS)
def speaking(request: pytest.FixtureRequest) -> Iterator[LocalEndpoint]:
    with LocalEndpoint(dialect=request.param) as server:
        yield server


@pytest.fixture
def sim(speaking: LocalEndpoint) -> LocalEndpoint:
    speaking.configure(dialect=speaking.config.dialect)
    speaking.reset()
    return speaking


@pytest.fixture
def batching(sim: LocalEndpoint) -> LocalEndpoint:
    sim.configure(dialect=sim.config.dialect, batch_seconds=0.2, batch_validation_seconds=0.05)
    return sim


def _endpoint(sim: LocalEndpoint) -> Endpoint:
    return Endpoint(sim.base_url, provider=sim.config.dialect)


@pytest.fixture
def reviews(tmp_path):
    path = tmp_path / "reviews.parquet"
    pl.DataFrame({"id": range(len(TEXTS)), "text": TEXTS}).write_parquet(path)
    return path


def test_a_frame(sim, cache):
    out = pl.DataFrame({"text": TEXTS}).pipe(
        llm_complete, prompt="Rate: {text}", model="sim", endpoint=_endpoint(sim), cache=cache
    )
    assert out["completion"].to_list() == ANSWERS
    assert sim.stats()["requests"] == 2


def test_an_expression(sim, cache):
    rated = pl.col("text").llm.complete(
        "Rate: {}", model="sim", endpoint=_endpoint(sim), cache=cache
    )
    assert pl.DataFrame({"text": TEXTS}).select(rated).to_series().to_list() == ANSWERS


def test_sql(sim, cache):
    connection = duckdb.connect()
    register(connection, endpoint=_endpoint(sim), cache=cache, model="sim")
    rows = connection.sql("SELECT llm_complete('Rate: ' || t) FROM (VALUES ('great fit')) v(t)")
    assert rows.fetchall() == [(ANSWERS[0],)]


def test_the_command_line(sim, cache, reviews, tmp_path):
    job = ["run", str(reviews), "--prompt", "Rate: {text}", "--model", "sim", "--no-progress"]
    where = ["--base-url", sim.base_url, "--provider", sim.config.dialect, "--cache", str(cache)]
    assert main([*job, *where, "--output", str(tmp_path / "out.parquet")]) == 0
    assert pl.read_parquet(tmp_path / "out.parquet")["completion"].to_list() == ANSWERS


def test_the_flow(prefect, sim, cache, reviews, tmp_path):
    config = EnrichConfig(
        input=str(reviews), output=str(tmp_path / "out.parquet"), prompt="Rate: {text}",
        base_url=sim.base_url, provider=sim.config.dialect, cache=str(cache),
    )  # fmt: skip
    enrich_table(config)
    assert pl.read_parquet(config.output)["summary"].to_list() == ANSWERS


def test_a_frame_in_batch_mode(batching, cache):
    out = pl.DataFrame({"text": TEXTS}).pipe(
        llm_complete, prompt="Rate: {text}", model="sim", endpoint=_endpoint(batching),
        cache=cache, batch=BatchMode(poll_seconds=0.05),
    )  # fmt: skip
    assert out["completion"].to_list() == ANSWERS
    assert (batching.stats()["requests"], batching.stats()["batches"]) == (0, 1)


def test_the_command_line_in_batch_mode(batching, cache, reviews, tmp_path):
    job = ["run", str(reviews), "--prompt", "Rate: {text}", "--model", "sim", "--no-progress"]
    where = ["--base-url", batching.base_url, "--provider", batching.config.dialect]
    batch = ["--batch", "--batch-poll-seconds", "0.05", "--cache", str(cache)]
    assert main([*job, *where, *batch, "--output", str(tmp_path / "out.parquet")]) == 0
    assert pl.read_parquet(tmp_path / "out.parquet")["completion"].to_list() == ANSWERS
    assert batching.stats()["batches"] == 1


def test_the_flow_in_batch_mode(prefect, batching, cache, reviews, tmp_path):
    config = EnrichConfig(
        input=str(reviews), output=str(tmp_path / "out.parquet"), prompt="Rate: {text}",
        base_url=batching.base_url, provider=batching.config.dialect, cache=str(cache),
        batch=True, batch_poll_seconds=0.05,
    )  # fmt: skip
    enrich_table(config)
    assert pl.read_parquet(config.output)["summary"].to_list() == ANSWERS
    assert batching.stats()["batches"] == 1


def test_an_expression_in_batch_mode(batching, cache):
    rated = pl.col("text").llm.complete(
        "Rate: {}", model="sim", endpoint=_endpoint(batching), cache=cache,
        batch=BatchMode(poll_seconds=0.05),
    )  # fmt: skip
    assert pl.DataFrame({"text": TEXTS}).select(rated).to_series().to_list() == ANSWERS
    assert batching.stats()["requests"] == 0
