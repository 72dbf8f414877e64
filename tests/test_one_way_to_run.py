"""One way to run: every operator takes ``client=`` and every operator is a method of
``Client``; the last report belongs to the thread or task (and the client) that ran the job."""

from __future__ import annotations

import asyncio
import threading

import polars as pl
import pytest
from pydantic import BaseModel

import llm_ops
from llm_ops import (
    Client,
    ConfigError,
    llm_complete,
    llm_complete_async,
    llm_embed,
    llm_filter,
)


@pytest.fixture
def client(endpoint, cache):
    with Client(endpoint=endpoint.base_url, cache=cache) as made:
        yield made


def _texts(rows: int) -> pl.DataFrame:
    return pl.DataFrame({"text": [f"text {i}" for i in range(rows)]})


def test_llm_complete_runs_on_the_client_given(client, endpoint):
    llm_complete(_texts(2), "{text}", model="sim", client=client)
    again = client.complete(_texts(2), "{text}", model="sim")
    assert again["completion_status"].to_list() == ["cached", "cached"]
    assert endpoint.stats()["requests"] == 2


def test_llm_complete_of_a_lazyframe_runs_on_the_client_given(client, endpoint):
    out = llm_complete(_texts(1).lazy(), "{text}", model="sim", client=client)
    assert endpoint.stats()["requests"] == 0
    assert out.collect()["completion_status"].to_list() == ["ok"]
    assert client.last_report().rows == 1


def test_llm_complete_async_runs_on_the_client_given(client):
    out = asyncio.run(llm_complete_async(_texts(1), "{text}", model="sim", client=client))
    assert out["completion_status"].to_list() == ["ok"]


def test_llm_embed_runs_on_the_client_given(client):
    out = llm_embed(_texts(1), "text", model="sim-embed", client=client)
    assert out["embedding_status"].to_list() == ["ok"]


def test_client_options_beside_a_client_are_refused(client, endpoint):
    with pytest.raises(ConfigError, match="either client= or the client's options"):
        llm_complete(_texts(1), "{text}", model="sim", client=client, cache=False)
    assert endpoint.stats()["requests"] == 0


def test_client_filter_keeps_the_rows_answered_yes(client):
    reviews = pl.DataFrame({"text": ["Shipping was slow", "Love the colour", "Never arrived"]})
    late = client.filter(reviews, "Is this review about shipping? {text}", model="sim")
    assert late["text"].to_list() == ["Shipping was slow", "Never arrived"]


def test_client_classify_adds_a_label_column(client):
    reviews = pl.DataFrame({"text": ["Shipping was slow", "Lovely fabric"]})
    topics = client.classify(reviews, "text", ["shipping", "product"], model="sim")
    assert topics["label"].to_list() == ["shipping", "product"]


def test_client_extract_adds_a_struct_column(client):
    class Order(BaseModel):
        item: str
        quantity: int

    orders = client.extract(pl.DataFrame({"text": ["two red scarves"]}), "text", Order, model="sim")
    assert orders["extracted_status"].to_list() == ["ok"]


def test_client_methods_run_on_the_client(client, endpoint):
    reviews = pl.DataFrame({"text": ["Shipping was slow"]})
    llm_filter(reviews, "Late? {text}", model="sim", client=client)
    _, report = client.filter(reviews, "Late? {text}", model="sim", return_report=True)
    assert (report.cache_hits, endpoint.stats()["requests"]) == (1, 1)


def test_two_threads_each_read_their_own_last_report(endpoint):
    both_ran = threading.Barrier(2)
    seen: dict[int, tuple[int, int]] = {}

    def job(rows: int) -> None:
        with Client(endpoint=endpoint.base_url, cache=False) as client:
            llm_complete(_texts(rows), "{text}", model="sim", client=client)
            both_ran.wait(timeout=60)  # each reads after both jobs ran
            seen[rows] = (llm_ops.last_report().rows, client.last_report().rows)

    threads = [threading.Thread(target=job, args=(rows,)) for rows in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {1: (1, 1), 2: (2, 2)}


def test_two_asyncio_tasks_each_read_their_own_last_report(endpoint):
    async def both() -> list[int]:
        both_ran = asyncio.Barrier(2)

        async def job(rows: int) -> int:
            await llm_complete_async(
                _texts(rows), "{text}", model="sim", endpoint=endpoint.base_url, cache=False
            )
            await both_ran.wait()  # each reads after both jobs ran
            return llm_ops.last_report().rows

        return list(await asyncio.gather(job(1), job(2)))

    assert asyncio.run(both()) == [1, 2]


def test_each_client_keeps_the_report_of_its_own_last_job(endpoint):
    with (
        Client(endpoint=endpoint.base_url, cache=False) as one,
        Client(endpoint=endpoint.base_url, cache=False) as two,
    ):
        one.complete(_texts(1), "{text}", model="sim")
        two.complete(_texts(2), "{text}", model="sim")
        assert (one.last_report().rows, two.last_report().rows) == (1, 2)
        assert llm_ops.last_report().rows == 2


def test_expressions_run_on_polars_threads_report_to_the_thread_that_made_them(endpoint):
    seen: list[int | None] = []

    def query() -> None:  # a thread of its own: its context starts with no report
        options = {"model": "sim", "endpoint": endpoint.base_url, "cache": False}
        _texts(3).with_columns(  # two expressions: Polars runs them on its own threads
            pl.col("text").llm.complete("A {}", **options).alias("a"),
            pl.col("text").llm.complete("B {}", **options).alias("b"),
        )
        report = llm_ops.last_report()
        seen.append(None if report is None else report.rows)

    thread = threading.Thread(target=query)
    thread.start()
    thread.join()
    assert seen == [3]


def test_estimate_counts_the_cache_of_the_client_given(client):
    client.complete(_texts(2), "{text}", model="sim")
    plan = llm_ops.estimate(_texts(3), "{text}", model="sim", client=client)
    assert (plan.cache_hits, plan.requests) == (2, 1)
