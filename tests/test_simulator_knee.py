"""The simulator's continuous-batching model: slots, a queue, decode steps and the presets.

Nothing here asserts a duration or a rate: requests are held in the server (answers far longer
than the test) while the stats are read, so every count is what the model must give, however
busy the machine is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import polars as pl
import pytest

from llm_ops import Sampling, llm_complete
from llm_ops.testing import PRESETS, LocalEndpoint, SimulatorConfig, expected_reply

Stats = dict[str, Any]
NEVER_DONE = 1_000_000  # tokens: an answer that outlasts any test
BATCHING = {"step_base": 0.001, "slots": 4}


def _body(n: int, **fields: Any) -> dict[str, Any]:
    return {"model": "sim", "messages": [{"role": "user", "content": f"row {n}"}], **fields}


def _wait(endpoint: LocalEndpoint, until: Callable[[Stats], bool]) -> Stats:
    """The stats once ``until`` holds (or after 30 s, for the assertion to show them)."""
    deadline = time.monotonic() + 30
    while not until(stats := endpoint.stats()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return stats


def _hold(endpoint: LocalEndpoint, count: int, steps: int = 2) -> Stats:
    """Post ``count`` requests at once and read the stats once all are in the server and
    ``steps`` more decode steps have run (so every admission that could happen has); then hang
    up and wait until the server has let them all go, so nothing is left for the next test."""

    def settled() -> Stats:
        arrived = _wait(endpoint, lambda s: s["active"] + s["queued"] == count)
        return _wait(endpoint, lambda s: s["decode_steps"] >= arrived["decode_steps"] + steps)

    async def run() -> Stats:
        url = endpoint.base_url + "/chat/completions"
        async with aiohttp.ClientSession() as session:
            posts = [asyncio.create_task(session.post(url, json=_body(n))) for n in range(count)]
            stats = await asyncio.to_thread(settled)
            for post in posts:
                post.cancel()
            await asyncio.gather(*posts, return_exceptions=True)
        await asyncio.to_thread(_wait, endpoint, lambda s: s["active"] + s["queued"] == 0)
        return stats

    return asyncio.run(run())


def _post(endpoint: LocalEndpoint, body: dict[str, Any]) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(endpoint.base_url + "/chat/completions", json=body) as response,
        ):
            answer: dict[str, Any] = await response.json()
            return answer

    return asyncio.run(run())


def test_no_more_requests_decode_at_once_than_the_slots(endpoint):
    endpoint.configure(**BATCHING, answer_tokens=NEVER_DONE)
    stats = _hold(endpoint, 12)
    assert (stats["active"], stats["max_active"]) == (4, 4)


def test_requests_beyond_the_slots_wait_in_the_queue(endpoint):
    endpoint.configure(**BATCHING, answer_tokens=NEVER_DONE)
    stats = _hold(endpoint, 12)
    assert stats["queued"] == 8


def test_a_request_whose_client_hangs_up_leaves_the_queue_and_the_batch(endpoint):
    endpoint.configure(**BATCHING, answer_tokens=NEVER_DONE)
    _hold(endpoint, 12)
    stats = endpoint.stats()
    assert (stats["cancelled"], stats["active"], stats["queued"]) == (12, 0, 0)


def test_without_batching_a_slot_is_held_for_the_latency(endpoint):
    endpoint.configure(slots=2, latency=3600)
    stats = _hold(endpoint, 6, steps=0)
    assert (stats["max_active"], stats["queued"]) == (2, 4)


def test_an_answer_takes_one_step_per_token(endpoint):
    endpoint.configure(**BATCHING, answer_tokens=7)
    _post(endpoint, _body(1))
    assert endpoint.stats()["decode_steps"] == 7


def test_completion_tokens_are_max_tokens(endpoint):
    endpoint.configure(**BATCHING)
    _, report = pl.DataFrame({"text": ["a b c d e f g h", "i j"]}).pipe(
        llm_complete,
        prompt="{text}",
        model="sim",
        endpoint=endpoint.base_url,
        sampling=Sampling(max_tokens=5),
        cache=False,
        return_report=True,
    )
    assert report.completion_tokens == 2 * 5


def test_without_max_tokens_an_answer_has_the_configured_tokens(endpoint):
    endpoint.configure(**BATCHING, answer_tokens=9)
    assert _post(endpoint, _body(1))["usage"]["completion_tokens"] == 9


def test_a_prompt_sets_its_own_answer_length_up_to_max_tokens(endpoint):
    endpoint.configure(**BATCHING)
    prompt = {"role": "user", "content": "long [[sim:answer_tokens=40]]"}
    lengths = [
        _post(endpoint, {"model": "sim", "messages": [prompt], **cap})["usage"]["completion_tokens"]
        for cap in ({}, {"max_tokens": 10})
    ]
    assert lengths == [40, 10]


def test_batched_answers_keep_the_simulators_text(endpoint):
    endpoint.configure(**BATCHING)
    answer = _post(endpoint, _body(3))
    assert answer["choices"][0]["message"]["content"] == expected_reply("row 3", model="sim")


def test_an_error_answer_does_not_decode(endpoint):
    endpoint.configure(**BATCHING)
    body = {"model": "sim", "messages": [{"role": "user", "content": "x [[sim:status=400]]"}]}
    assert "error" in _post(endpoint, body)
    assert endpoint.stats()["decode_steps"] == 0


def test_the_stats_time_every_answer_in_the_queue_and_decoding(endpoint):
    endpoint.configure(**BATCHING, answer_tokens=2)
    for n in range(3):
        _post(endpoint, _body(n))
    stats = endpoint.stats()
    timed = ("answer_seconds", "queue_seconds", "decode_seconds")
    assert [stats[name]["count"] for name in timed] == [3, 3, 3]


def test_without_batching_completion_tokens_count_the_words(endpoint):
    answer = _post(endpoint, _body(1, max_tokens=50))
    assert answer["usage"]["completion_tokens"] == len(expected_reply("row 1", model="sim").split())


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_starts_and_answers(name):
    with LocalEndpoint(**PRESETS[name]) as endpoint:
        answer = _post(endpoint, _body(1, max_tokens=2))
        assert answer["usage"]["completion_tokens"] == 2
        assert endpoint.stats()["config"]["slots"] == PRESETS[name]["slots"]


def test_the_gpu_preset_rises_to_about_a_thousand_answers_a_second_near_its_slots():
    gpu = SimulatorConfig(**PRESETS["gpu"])
    curve = [gpu.modelled_throughput(n) or 0 for n in (8, 32, 128, 512)]
    assert curve == sorted(curve) and 900 < curve[-1] < 1100


def test_the_llama_preset_is_flat_beyond_its_eight_slots():
    llama = SimulatorConfig(**PRESETS["llama.cpp"])
    assert llama.modelled_throughput(32) == llama.modelled_throughput(512)


def test_the_past_knee_preset_falls_beyond_its_slots():
    knee = SimulatorConfig(**PRESETS["gpu-past-knee"])
    peak, beyond = knee.modelled_throughput(512) or 0, knee.modelled_throughput(1024) or 0
    assert 0.80 < beyond / peak < 0.85


def test_the_presets_cannot_be_changed_by_accident():
    with pytest.raises(TypeError):
        PRESETS["gpu"]["slots"] = 1  # type: ignore[index]


def test_held_answers_go_once_the_hold_is_lifted(endpoint):
    endpoint.configure(hold=1)

    async def run() -> list[int]:
        url = endpoint.base_url + "/chat/completions"
        async with aiohttp.ClientSession() as session:

            async def status(n: int) -> int:
                async with session.post(url, json=_body(n)) as response:
                    return response.status

            posts = [asyncio.create_task(status(n)) for n in range(3)]
            held = await asyncio.to_thread(_wait, endpoint, lambda s: s["held"] == 2)
            assert (held["answered"], held["held"]) == (1, 2)
            await asyncio.to_thread(endpoint.configure)
            return list(await asyncio.gather(*posts))

    assert asyncio.run(run()) == [200] * 3
    assert endpoint.stats()["held"] == 0
