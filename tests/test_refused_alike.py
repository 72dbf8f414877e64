"""A job whose first answers all refuse it the same way stops once, with the endpoint's reason,
instead of sending (and retrying) every row: over real sockets, to raw servers and the
simulator."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import polars as pl
import pytest

from llm_ops import Endpoint, JobAbortedError, llm_complete
from llm_ops._dialects.openai import OPENAI
from llm_ops._engine.answers import rejection_hint
from llm_ops._engine.dispatcher import REFUSED_ALIKE_TO_STOP
from tests.media_files import image
from tests.raw_http import RawServer, addresses, completion, endpoint, with_length

NO_MMPROJ = json.dumps(  # llama.cpp's answer to an image, served without --mmproj
    {
        "error": {
            "code": 500,
            "message": "image input is not supported - hint: if this is unexpected, you may "
            "need to provide the mmproj",
            "type": "server_error",
        }
    }
).encode()


def photos(rows: int) -> pl.DataFrame:
    return pl.DataFrame(
        {"sku": [f"s{i}" for i in range(rows)], "photo": [image(color=i) for i in range(rows)]}
    )


def _retryable(status: int, body: bytes) -> bool:
    return OPENAI.read_error(status, body).retryable


def test_a_5xx_saying_the_input_is_not_supported_is_not_retried():
    assert not _retryable(500, NO_MMPROJ)
    assert _retryable(500, b'{"error": {"message": "out of memory"}}')
    assert _retryable(429, b'{"error": {"message": "not supported"}}')


def _label(frame: pl.DataFrame, server: RawServer, cache: Path) -> pl.DataFrame:
    """Each photo sent with its prompt, one request at a time, to ``server``."""
    return frame.pipe(
        llm_complete,
        prompt="Label {sku}?",
        images="photo",
        model="m",
        endpoint=server.base_url,
        cache=cache,
        concurrency=1,
    )


def test_images_sent_to_a_text_only_llama_cpp_stop_the_job_with_its_reason(cache):
    refuse = endpoint(lambda request: with_length(NO_MMPROJ, "500 Internal Server Error"))
    with (
        RawServer(respond=refuse) as server,
        pytest.raises(JobAbortedError, match=r"not supported.*llama-server --mmproj") as stopped,
    ):
        _label(photos(200), server, cache)
    assert server.posts == REFUSED_ALIKE_TO_STOP  # one each, none retried
    assert f"refused the first {REFUSED_ALIKE_TO_STOP} requests alike" in str(stopped.value)


def test_an_answer_first_lets_every_refused_row_be_refused(complete, endpoint):
    texts = ["0", *(f"{i} [[sim:status=400]]" for i in range(1, 21))]  # "0" is sent first
    with pytest.warns(UserWarning, match="20 of 21 rows failed"):
        out = pl.DataFrame({"text": texts}).pipe(complete, prompt="{text}", concurrency=1)
    assert sorted(out["completion_status"].cast(pl.String)) == ["ok"] + ["rejected"] * 20


def test_refusals_for_different_reasons_do_not_stop_the_job(complete):
    texts = [f"{i} [[sim:status={400 if i % 2 else 422}]]" for i in range(20)]
    with pytest.warns(UserWarning, match="20 of 20 rows failed"):
        out = pl.DataFrame({"text": texts}).pipe(complete, prompt="{text}", concurrency=1)
    assert set(out["completion_status"].cast(pl.String)) == {"rejected"}


def test_an_azure_url_without_openai_v1_says_what_to_use(monkeypatch, cache):
    not_found = b'{"error": {"code": "404", "message": "Resource not found"}}'
    host = "myres.openai.azure.com"
    with RawServer(respond=endpoint(lambda r: with_length(not_found, "404 Not Found"))) as server:
        monkeypatch.setattr(socket, "getaddrinfo", addresses(host, "127.0.0.1"))
        stop = pytest.raises(JobAbortedError, match=r"Resource not found; Azure OpenAI serves")
        with stop as stopped:
            pl.DataFrame({"text": [f"row {i}" for i in range(50)]}).pipe(
                llm_complete,
                prompt="{text}",
                model="gpt-4o-mini",
                endpoint=Endpoint(f"http://{host}:{server.port}/", api_key="k"),
                cache=cache,
                concurrency=1,
            )
    assert f"http://{host}:{server.port}/openai/v1/" in str(stopped.value)


def test_fewer_refusals_alike_than_stop_a_job_leave_it_running(cache):
    answers = iter([with_length(NO_MMPROJ, "500 Internal Server Error")] * 3)
    with RawServer(
        respond=endpoint(lambda r: next(answers, with_length(completion("ok"))))
    ) as server:
        out = _label(photos(5), server, cache)
    assert sorted(out["completion_status"].cast(pl.String)) == ["ok"] * 2 + ["rejected"] * 3


def test_rows_an_earlier_model_of_a_cascade_refuses_go_on_to_the_next(complete):
    texts = [f"{i} [[sim:fail_for=sim-small]]" for i in range(20)]
    out = pl.DataFrame({"text": texts}).pipe(
        complete, prompt="{text}", model=["sim-small", "sim"], concurrency=1
    )
    assert set(out["completion_status"].cast(pl.String)) == {"ok"}
    assert set(out["completion_model"]) == {"sim"}


def test_only_a_model_that_takes_no_images_is_told_to_take_images_elsewhere():
    assert "--mmproj" in rejection_hint("HTTP 400: image input is not supported")
    assert "--mmproj" not in rejection_hint("HTTP 400: Invalid image URL")
