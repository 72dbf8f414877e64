"""The expressions' shared clients: a bounded cache keyed by a digest, evicted clients closed
only once no expression holds them; and which work runs in place on an expression's thread."""

from __future__ import annotations

import contextvars
import functools
import gc
import socket

import polars as pl

from llm_ops import Endpoint
from llm_ops._cache import Cache
from llm_ops._expr import runtime
from llm_ops._expr.runtime import SHARED_CLIENTS, client_for
from llm_ops._in_place import runs_in_place
from llm_ops._journal import JournalWriter
from llm_ops._pipeline.dispatch import sent_messages
from llm_ops._pipeline.join import raise_failed_rows
from llm_ops._pipeline.plan import plan_frame

SECRET = "sk-test-0123456789abcdef"


class Expression:
    """Stands for an expression holding the shared client it was given."""


def made(endpoint, concurrency):
    return {
        "endpoint": Endpoint(endpoint.base_url, api_key=SECRET),
        "concurrency": concurrency,
        "cache": False,
    }


def test_the_shared_clients_keys_hold_no_api_key(endpoint, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    client_for(None, made(endpoint, 3), user=Expression())
    assert runtime._clients
    assert not any(SECRET in key for key in runtime._clients)


def test_two_api_keys_get_two_shared_clients(endpoint):
    other = {**made(endpoint, 3), "endpoint": Endpoint(endpoint.base_url, api_key="sk-other")}
    assert client_for(None, made(endpoint, 3)) is not client_for(None, other)


def test_the_shared_clients_never_exceed_their_bound(endpoint):
    for concurrency in range(1, 3 * SHARED_CLIENTS):
        client_for(None, made(endpoint, concurrency))
        assert len(runtime._clients) <= SHARED_CLIENTS


def test_an_evicted_client_an_expression_holds_still_answers(endpoint):
    holder = Expression()
    held = client_for(None, made(endpoint, 1), user=holder)
    for concurrency in range(2, SHARED_CLIENTS + 3):
        client_for(None, made(endpoint, concurrency))
    answered = held.complete(pl.DataFrame({"text": ["a"]}), "{text}", model="sim")
    assert answered["completion"].is_not_null().all()


def test_an_evicted_client_is_closed_once_no_expression_holds_it(endpoint):
    holder = Expression()
    held = client_for(None, made(endpoint, 1), user=holder)
    held.complete(pl.DataFrame({"text": ["a"]}), "{text}", model="sim")  # its loop is running
    loop_thread = held._thread
    for concurrency in range(2, SHARED_CLIENTS + 3):
        client_for(None, made(endpoint, concurrency))
    assert loop_thread.is_alive()
    del holder
    gc.collect()
    client_for(None, made(endpoint, SHARED_CLIENTS + 3))  # the next request sweeps
    assert not loop_thread.is_alive()


def in_thread(work, *args):
    """What ``asyncio.to_thread(work, *args)`` hands the loop's executor."""
    return functools.partial(contextvars.copy_context().run, work, *args)


def test_the_pipelines_polars_work_runs_in_place():
    assert runs_in_place(in_thread(plan_frame))


def test_a_media_load_runs_in_place():
    assert runs_in_place(in_thread(functools.partial(sent_messages, [], None, None, False)))


def test_the_caches_methods_run_in_place(tmp_path):
    assert runs_in_place(in_thread(Cache(tmp_path / "c.duckdb").prepare))


def test_the_journals_merges_go_to_a_thread():
    assert not runs_in_place(in_thread(JournalWriter.merge))


def test_host_name_lookups_go_to_a_thread():
    assert not runs_in_place(functools.partial(socket.getaddrinfo, "localhost", 80))


def test_a_function_of_llm_ops_is_not_in_place_by_its_module_alone():
    assert not runs_in_place(in_thread(raise_failed_rows))
