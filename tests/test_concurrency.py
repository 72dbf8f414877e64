"""The knee controller against servers modelled in virtual time: what it decides depends on what
the server gives back, never on how busy the machine running the test is."""

from __future__ import annotations

import random
import re
import statistics
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta

import polars as pl
import pytest

from llm_ops import Client, Sampling
from llm_ops._cache import Cache
from llm_ops._concurrency import AT_THE_CAP, CALM, START, Concurrency
from llm_ops.testing import PRESETS


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Server:
    """Continuous batching: at most ``slots`` requests decode at once, the rest queue; a step
    takes ``base + per_sequence * active + per_queued * queued`` seconds; an answer needs as
    many steps as its tokens."""

    slots: int
    base: float
    per_sequence: float
    per_queued: float = 0.0
    tokens: int | None = 16  # None: from 1 to 64 at random
    active: list[list[float]] = field(default_factory=list)  # [epoch, sent at, steps left]
    queue: deque[list[float]] = field(default_factory=deque)

    def run(self, controller: Concurrency, clock: Clock, seconds: float, seed: int = 0) -> None:
        """Keep the controller's limit in flight for ``seconds`` of virtual time."""
        lengths = random.Random(seed)
        end = clock.now + seconds
        while clock.now < end:
            while controller.in_flight < controller.limit:
                tokens = self.tokens or lengths.randint(1, 64)
                self.queue.append([controller.take(), clock.now, tokens, tokens])
            while len(self.active) < self.slots and self.queue:
                self.active.append(self.queue.popleft())
            clock.now += (
                self.base + self.per_sequence * len(self.active) + self.per_queued * len(self.queue)
            )
            for request in self.active:
                request[3] -= 1
            for request in [r for r in self.active if r[3] == 0]:
                self.active.remove(request)
                controller.release()
                controller.observe(int(request[0]), clock.now - request[1], int(request[2]))


GPU = {"slots": 512, "base": 0.005, "per_sequence": 0.00005}
SMALL = {"slots": 8, "base": 0.02, "per_sequence": 0.002}


def settle(server: Server, seconds: float = 120.0, **options: object) -> Concurrency:
    clock = Clock()
    controller = Concurrency(options.pop("cap", 1024), clock=clock, **options)  # type: ignore[arg-type]
    server.run(controller, clock, seconds)
    return controller


def throughput(server: Server, limit: int) -> float:
    """Answers per second the server gives at a fixed ``limit`` in flight."""
    clock = Clock()
    fixed = Concurrency(limit, given=True, clock=clock)
    fixed.observe = lambda *args: None  # type: ignore[method-assign]
    done = 0

    def count(*args: object) -> None:
        nonlocal done
        done += 1

    fixed.release = lambda: (setattr(fixed, "in_flight", fixed.in_flight - 1), count())  # type: ignore[method-assign]
    server.run(fixed, clock, 60.0)
    return done / 60.0


def test_it_rises_on_a_server_with_room():
    controller = settle(Server(**GPU))
    limits = [limit for limit, _ in controller.history]
    assert limits[0] == START and max(limits) >= 512
    assert controller.limit >= 256


def _round_trip(controller: Concurrency, clock: Clock, seconds: float) -> None:
    """The limit sent at once, and every request answered ``seconds`` later: a server with room
    for all of them, as fast with many in flight as with few."""
    sent = [controller.take() for _ in range(controller.limit - controller.in_flight)]
    clock.now += seconds
    for epoch in sent:
        controller.release()
        controller.observe(epoch, seconds, 16)


def test_while_throughput_rises_it_doubles_once_a_round_trip():
    clock = Clock()
    controller = Concurrency(1024, clock=clock)
    limits = []
    for _ in range(5):
        _round_trip(controller, clock, 0.1)
        limits.append(controller.limit)
    # the first round saw the job start and is not read; each one after it doubles the limit
    assert limits == [START, 2 * START, 4 * START, 8 * START, 16 * START]


def test_a_doubling_that_reads_flat_over_its_first_round_is_read_once_more():
    """The requests a doubling lets go open new connections: its first round may read slow."""
    clock = Clock()
    controller = Concurrency(1024, clock=clock)
    for _ in range(2):
        _round_trip(controller, clock, 0.1)
    _round_trip(controller, clock, 0.25)  # twice as many in flight, answered 2.5 times slower
    assert controller.limit == 2 * START
    _round_trip(controller, clock, 0.1)
    assert controller.limit == 4 * START


def test_a_doubling_read_twice_is_kept_only_where_the_answers_came_faster_too():
    """Latency read from the answers back first is short where others wait in a queue."""
    clock = Clock()
    controller = Concurrency(1024, clock=clock)
    for _ in range(2):
        _round_trip(controller, clock, 0.1)
    _round_trip(controller, clock, 0.25)  # flat: read once more
    sent = [controller.take() for _ in range(controller.limit - controller.in_flight)]
    clock.now += 0.25  # the answers come no faster than at START,
    for epoch in sent:
        controller.release()
        controller.observe(epoch, 0.1, 16)  # though each says it took as long as there
    assert controller.limit == START


def test_it_reaches_the_slots_of_a_gpu_like_server_within_a_round_trip_a_doubling():
    """About a second of the server's time: 86 ms at 8 in flight, 290 ms at 256."""
    clock = Clock()
    controller, server = Concurrency(1024, clock=clock), Server(**GPU)
    while controller.limit < 512 and clock.now < 10:
        server.run(controller, clock, 0.01)
    assert clock.now < 1.5, controller.history


def test_it_climbs_no_further_than_one_doubling_past_the_slots_of_a_server_that_queues():
    """The requests let in first answer as fast as before; the climb reads the answers that
    come, not those first latencies."""
    controller = settle(Server(**SMALL))
    assert max(limit for limit, _ in controller.history) == 16, controller.history


def test_answers_of_any_length_do_not_carry_the_climb_past_a_queue():
    """Where long answers are still out when a round ends and short ones came back first."""
    queueing = Server(slots=128, base=0.03, per_sequence=0.0001, tokens=None)
    controller = settle(queueing, seconds=60)
    assert max(limit for limit, _ in controller.history) <= 256, controller.history


def test_it_climbs_no_further_than_one_doubling_past_where_throughput_falls():
    falling = {**GPU, "per_queued": 0.00005}
    controller = settle(Server(**falling), cap=4096)
    assert max(limit for limit, _ in controller.history) == 1024, controller.history


def test_it_settles_near_the_slots_of_a_server_that_queues():
    controller = settle(Server(**SMALL))
    assert 8 <= controller.limit <= 16, controller.history


def test_it_keeps_most_of_the_best_throughput():
    server = Server(**GPU)
    best = max(throughput(Server(**GPU), limit) for limit in (128, 256, 512, 1024))
    controller = settle(server)
    assert throughput(Server(**GPU), controller.limit) >= 0.9 * best


def test_it_stays_below_where_throughput_falls():
    falling = {**GPU, "per_queued": 0.00005}  # a queue slows every step
    controller = settle(Server(**falling))
    assert controller.limit <= 724, controller.history


def test_answers_of_any_length_do_not_fool_it():
    controller = settle(Server(**SMALL, tokens=None))
    assert 8 <= controller.limit <= 16, controller.history


def test_a_cap_given_is_where_it_starts_and_never_passes():
    controller = settle(Server(**GPU), cap=64, given=True)
    assert controller.history[0][0] == 64
    assert max(limit for limit, _ in controller.history) == 64


def test_with_a_cap_above_the_slots_it_comes_down_to_them():
    controller = settle(Server(**SMALL), cap=64, given=True)
    assert controller.limit <= 16, controller.history


def test_latency_that_does_not_grow_keeps_the_cap():
    flat = Server(slots=10_000, base=0.2, per_sequence=0.0, tokens=1)  # 200 ms, no queue
    controller = settle(flat, seconds=30, cap=256, given=True)
    assert [limit for limit, _ in controller.history] == [256]


def test_a_429_halves_it_and_it_does_not_rise_while_calm():
    clock = Clock()
    controller = Concurrency(1024, clock=clock)
    Server(**GPU).run(controller, clock, 30)
    before = controller.limit
    controller.on_overload("429s")
    assert controller.limit == before // 2 and controller.why == "halved: 429s"
    Server(**GPU).run(controller, clock, CALM / 2)
    assert controller.limit <= before // 2


def test_after_the_calm_it_climbs_back_to_the_cap_given():
    clock = Clock()
    controller = Concurrency(16, given=True, clock=clock)
    controller.on_overload("429s")
    Server(**GPU).run(controller, clock, 30)
    assert controller.limit == 16


def _answers(controller: Concurrency, count: int, seconds: float) -> None:
    for _ in range(count):
        controller.observe(controller.take(), seconds, 16)
        controller.release()


def _timeouts(controller: Concurrency, count: int) -> None:
    for _ in range(count):
        controller.take()
        controller.release()
        controller.on_timeout()


def test_requests_that_hang_while_the_others_answer_as_fast_as_ever_keep_the_limit():
    controller = Concurrency(64, given=True, clock=Clock())
    _answers(controller, 64, seconds=0.05)
    for _ in range(10):  # a third of the attempts time out, the answers as fast as ever
        _timeouts(controller, 2)
        _answers(controller, 4, seconds=0.05)
    assert controller.limit == 64


def test_timeouts_while_the_answers_slow_down_halve_it():
    controller = Concurrency(64, given=True, clock=Clock())
    _answers(controller, 64, seconds=0.05)
    _answers(controller, 16, seconds=0.1)
    _timeouts(controller, 16)
    assert controller.limit == 32 and controller.why == "halved: timeouts"


def test_answers_that_slow_down_without_timeouts_keep_it():
    controller = Concurrency(64, given=True, clock=Clock())
    _answers(controller, 64, seconds=0.05)
    _answers(controller, 64, seconds=0.1)
    assert controller.limit == 64


def test_nearly_every_request_timing_out_halves_it_however_its_few_answers_came():
    controller = Concurrency(64, given=True, clock=Clock())
    _answers(controller, 64, seconds=0.05)
    _timeouts(controller, 30)  # of the last 32 requests
    assert controller.limit == 32 and controller.why == "halved: timeouts"


@pytest.mark.parametrize("options", [{}, {"cap": 64, "given": True}])
def test_each_setting_is_recorded_with_the_reason_for_it(options):
    """Not the reason of the decision before: '3 (queueing above 6)' read as a contradiction."""
    for limit, why in settle(Server(**SMALL), **options).history:
        probe = re.match(r"probing (above|below) (\d+); ", why)
        if probe:
            assert (limit > int(probe[2])) == (probe[1] == "above"), (limit, why)
        elif why != "starting":
            assert str(limit) in why, (limit, why)


def test_a_setting_below_the_cap_given_does_not_say_it_is_the_cap():
    controller = settle(Server(slots=2, base=0.02, per_sequence=0.002), cap=4, given=True)
    below = [why for limit, why in controller.history if limit < 4]
    assert below and all(why.startswith("probing below 4; latency x") for why in below), below


def test_it_resumes_where_the_last_job_settled():
    controller = Concurrency(1024)
    controller.resume(300)
    assert controller.limit == 300


def test_the_report_says_where_the_concurrency_ended_and_why(complete):
    rows = pl.DataFrame({"text": [f"row {i}" for i in range(50)]})
    _, report = rows.pipe(complete, prompt="{text}", return_report=True)
    # where it ended depends on how many round trips the machine's load allowed: at START, or
    # doubled once or more (one run on a busy machine ended at 16)
    assert report.concurrency is not None and report.concurrency >= START
    assert report.concurrency_why
    assert f"concurrency        {report.concurrency:>10,}  ({report.concurrency_why})" in str(
        report
    )


def _limit_of_a_new_client(endpoint, cache) -> int:
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        return client.run(client.prepare()).engine.concurrency.limit


def _recorded(complete, cache, concurrency: int, why: str) -> None:
    _, report = pl.DataFrame({"text": ["a"]}).pipe(complete, prompt="{text}", return_report=True)
    later = report.finished_at + timedelta(seconds=1)
    run = {**report.as_dict(), "run_id": "later", "finished_at": later}
    Cache(cache).record_run({**run, "concurrency": concurrency, "concurrency_why": why})


def test_the_next_job_on_the_endpoint_starts_where_the_last_one_settled(complete, endpoint, cache):
    _recorded(complete, cache, 300, "throughput flat above 300, latency x2.0")
    assert _limit_of_a_new_client(endpoint, cache) == 300


def test_a_cap_given_to_the_last_job_is_not_learned(complete, endpoint, cache):
    _recorded(complete, cache, 64, f"{AT_THE_CAP}64")
    assert _limit_of_a_new_client(endpoint, cache) == START


def _decisions(endpoint, rows: int) -> list[int]:
    """The limits a default job against ``endpoint`` went through."""
    texts = pl.DataFrame({"text": [f"review {i}" for i in range(rows)]})
    with Client(endpoint=endpoint.base_url, cache=False) as client:
        out = client.complete(
            texts, prompt="{text}", model="sim", sampling=Sampling(max_tokens=16), progress=False
        )
        assert out["completion_status"].unique().to_list() == ["ok"]
        return [limit for limit, _ in client.run(client.prepare()).engine.concurrency.history]


def test_against_a_gpu_like_server_it_rises_far_past_where_it_starts(endpoint):
    endpoint.configure(**PRESETS["gpu"])
    assert max(_decisions(endpoint, 4_000)) >= 8 * START


def test_against_an_8_slot_server_it_settles_near_the_slots(endpoint):
    endpoint.configure(slots=8, step_base=0.002, step_per_sequence=0.0002)
    decisions = _decisions(endpoint, 1_500)
    # where it held, not its last probe: on a busy machine a job may end mid-probe
    assert statistics.median_low(decisions[len(decisions) // 2 :]) <= 3 * 8
