"""llm_aggregate: a tree fold per group, each level one wave for every group.

    python benchmarks/setops_aggregate.py [--quick]

On the simulator's world (``context_tokens=512``, as a llama.cpp slot of ``--ctx-size 2048
--parallel 4``; every request takes ``latency`` seconds), groups of 5-500 short reviews, each
about one of its group's 2-6 latent entities (``[entity=k]``), are folded:

- ``one group at a time``: ``llm_aggregate`` called per group, as a ``group_by().agg()`` of
  the ``.llm.aggregate`` expression does (and LOTUS #61 reports): the wall time adds up the
  groups' depths. Run on the first groups only (its wall time grows with their number).
- ``all groups in waves``: ``llm_aggregate(..., by=...)``: one wave per level for all groups.

Quality: the share of groups whose answer names every distinct fact of the group (the
simulator's aggregation names the facts it was given, leaving one out with probability
``judge_error``). Calls bound: each group's calls at most ``ceil(n / (b - 1)) + depth``, with
``b`` the group's values per request (the room ``plan_why`` reports over its longest value's
weight, four characters a token, 1.5 times over, as the guide says) and ``depth`` its levels
(a group's own run, from the cache). Wall: at most 1.5 times the deepest group's depth times
the latency, judged where round trips make the wall time (:data:`SLOW`: seconds of latency,
a hosted model's context, a warm client). A last row folds groups on a real llama.cpp
(512-token slots, read from its ``/props``) when ``../shared/llama`` is there, counting
context errors.
"""

from __future__ import annotations

import math
import random
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from llm_ops import Client, estimate_set, llm_aggregate, llm_complete  # noqa: E402
from llm_ops.testing import LocalEndpoint, distinct_facts  # noqa: E402

TITLE = "Aggregate: tree fold per group, each level one wave for all groups"
LATENCY = 0.2
SLOW, QUICK_SLOW = 10.0, 2.0
"""The latency of the row that judges the wall-time target: one at which round trips, not
the client's CPU, make the wall time (an LLM's answer takes seconds). Its endpoint holds a
hosted model's context (no ``/props``: 8,192 tokens), so each wave's requests fit in the
requests a client may have in flight (4,096), and its client is warm: a client's first job
sends one request alone before the rest (the gate that stops a job with a bad key after one
request), a round trip once per client, not per wave. With 512-token slots the first wave
holds 18,000 requests: the 0.2 s row is bound by the client's CPU to send them (the 0.0 s
row), and at a latency of seconds it would be bound by the 4,096 in flight, not the depth."""
JUDGE_ERROR = 0.01
CONTEXT = 512
SEED = 0
INSTRUCTION = "Summarize the reviews"
WARM = pl.DataFrame({"text": ["a first request, alone"]})
WORDS = ["parcel", "late", "torn", "box", "coat", "fits", "well", "soft", "warm", "colour"]


def groups_frame(groups: int, most: int, seed: int = SEED) -> pl.DataFrame:
    """``groups`` groups of 5 to ``most`` reviews, each about one of its group's 2-6 entities."""
    draw = random.Random(seed)
    rows = []
    for g in range(groups):
        entities = draw.sample(range(10_000), draw.randint(2, 6))
        for i in range(draw.randint(5, most)):
            entity = entities[i % len(entities)]  # every entity of the group is reviewed
            words = " ".join(draw.choices(WORDS, k=draw.randint(3, 8)))
            rows.append((g, f"{words} [entity={entity}]"))
    return pl.DataFrame(rows, schema=["group", "text"], orient="row")


def named_all(out: pl.DataFrame, df: pl.DataFrame) -> float:
    """The share of groups whose answer names every distinct fact of its values."""
    truth = df.group_by("group").agg(pl.col("text").str.join(" ")).rows()
    wanted = {g: set(distinct_facts(text)) for g, text in truth}
    answers = dict(zip(out["group"], out["aggregate"], strict=True))
    right = sum(1 for g, facts in wanted.items() if facts <= set(distinct_facts(answers[g] or "")))
    return right / len(wanted)


def values_per_request(texts: list[str], room_tokens: float) -> int:
    """How many of a group's values a request holds at least: the room over the longest's
    weight (as llm_aggregate estimates: (chars + 8) / 4 tokens, 1.5 times over)."""
    heaviest = max(1.5 * (len(text) + 8) / 4 for text in texts)
    return max(2, math.floor(room_tokens / heaviest))


def measure(*, quick: bool) -> tuple[list[str], list[list[object]]]:
    groups, most, naive_groups = (60, 120, 10) if quick else (1000, 500, 20)
    df = groups_frame(groups, most)
    header = ["plan", "groups", "values", "calls", "waves", "wall s", "names all facts", "target"]
    rows: list[list[object]] = []
    for latency, context in (
        (LATENCY, CONTEXT),
        (0.0, CONTEXT),
        (slow := QUICK_SLOW if quick else SLOW, None),
    ):
        with (
            LocalEndpoint(latency=latency, judge_error=JUDGE_ERROR, context_tokens=context) as sim,
            tempfile.TemporaryDirectory() as tmp,
        ):
            cache = Path(tmp) / "cache.duckdb"
            if latency == LATENCY:
                rows.append(_one_at_a_time(sim.base_url, df, naive_groups, cache))
            with Client(endpoint=sim.base_url, cache=cache, concurrency=4096) as client:
                if latency == slow:  # past the gate of the client's first request
                    llm_complete(WARM, prompt="{text}", model="sim", client=client, progress=False)
                estimate = estimate_set(
                    llm_aggregate, df, column="text", instruction=INSTRUCTION, by="group",
                    model="sim", client=client,
                )  # fmt: skip
                started = time.perf_counter()
                out, report = llm_aggregate(
                    df, "text", INSTRUCTION, by="group", model="sim", client=client,
                    return_report=True, progress=False,
                )  # fmt: skip
                wall = time.perf_counter() - started
        room = float((report.plan_why or "").split(", ")[1].split(" tokens")[0].replace(",", ""))
        depth = report.waves  # the deepest group's, as every level is one wave
        bound = sum(
            math.ceil(len(texts) / (values_per_request(texts, room) - 1)) + depth
            for texts in df.group_by("group").agg("text")["text"].to_list()
        )
        holds = report.requests_sent <= bound
        if latency == slow:
            fast = wall <= 1.5 * depth * latency
            timing = f"wall {wall:.2f} {'<=' if fast else '>'} 1.5 x {depth} x {latency}s"
        elif latency:
            timing = "wall: bound by the client's CPU to send (the 0.0s row), see the next row"
        else:
            timing = f"the client's work alone: {wall / report.requests_sent * 1e3:.2f} ms a call"
        target = (
            f"calls {report.requests_sent:,} {'<=' if holds else '>'} {bound:,} (the sum of "
            f"ceil(n/(b-1)) + depth); {timing}; "
            f"estimated {estimate.calls:,} calls in {estimate.waves} waves "
            f"({estimate.calls / report.requests_sent - 1:+.0%} calls)"
        )
        rows.append(
            [f"all groups in waves, latency {latency}s, {context or 8192}-token context", groups,
             df.height, report.requests_sent, report.waves, round(wall, 2),
             round(named_all(out, df), 3), target]
        )  # fmt: skip
    rows.append(_on_llama(quick))
    return header, rows


def _one_at_a_time(base_url: str, df: pl.DataFrame, groups: int, cache: Path) -> list[object]:
    """The first ``groups`` groups folded one after another (on a cache of their own); each
    group's calls checked against its own bound (its depth: its own run's waves)."""
    first = df.filter(pl.col("group") < groups)
    started, calls, waves, outs, holds = time.perf_counter(), 0, 0, [], True
    with Client(endpoint=base_url, cache=cache.with_name("one.duckdb"), concurrency=4096) as one:
        for _, group in first.group_by("group", maintain_order=True):
            out, report = llm_aggregate(
                group, "text", INSTRUCTION, by="group", model="sim", client=one,
                return_report=True, progress=False,
            )  # fmt: skip
            room = float(
                (report.plan_why or "").split(", ")[1].split(" tokens")[0].replace(",", "")
            )
            texts = group["text"].to_list()
            b = values_per_request(texts, room)
            holds &= report.requests_sent <= math.ceil(len(texts) / (b - 1)) + report.waves
            calls, waves = calls + report.requests_sent, waves + report.waves
            outs.append(out)
    wall = time.perf_counter() - started
    return [
        "one group at a time", groups, first.height, calls, waves, round(wall, 2),
        round(named_all(pl.concat(outs), first), 3),
        f"each group's calls <= ceil(n/(b-1)) + its depth: {'holds' if holds else 'FAILS'}",
    ]  # fmt: skip


def _on_llama(quick: bool) -> list[object]:
    """Groups folded on a real llama.cpp of 512-token slots; its context errors counted."""
    try:
        from llama_send_order import llama_server
    except SystemExit:
        return ["llama.cpp 512-token slots", 0, 0, 0, 0, 0, "-", "skipped: no llama.cpp"]
    groups = 3 if quick else 10
    df = groups_frame(groups, 500, seed=SEED + 1)
    try:
        with llama_server(4) as root, tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            out, report = llm_aggregate(
                df, "text", INSTRUCTION, by="group", model="tiny", endpoint=f"{root}/v1",
                cache=Path(tmp) / "cache.duckdb", max_tokens=32, concurrency=4,
                return_report=True, progress=False,
            )  # fmt: skip
            wall = time.perf_counter() - started
    except SystemExit as missing:
        return ["llama.cpp 512-token slots", 0, 0, 0, 0, 0, "-", f"skipped: {missing}"]
    errors = out["aggregate_error"].drop_nulls()
    overflows = int(errors.str.contains("context").sum())
    return [
        "llama.cpp 512-token slots", groups, df.height, report.requests_sent, report.waves,
        round(wall, 2), "-", f"{overflows} context errors (slot from /props)",
    ]  # fmt: skip


if __name__ == "__main__":
    head, table = measure(quick="--quick" in sys.argv)
    print(f"## {TITLE}\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in table:
        print("| " + " | ".join(str(cell) for cell in row) + " |")
