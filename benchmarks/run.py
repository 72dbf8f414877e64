"""Benchmarks: ``llm_complete`` against the hand-written ``AsyncOpenAI`` loop, on one machine.

    python benchmarks/run.py            # full sizes, writes benchmarks/RESULTS.md
    python benchmarks/run.py --quick    # smaller sizes, one repetition, prints only
    python benchmarks/run.py --profile  # scenario 1 for llm_ops under cProfile -> PROFILE.txt

The local simulator (``llm_ops.testing.LocalEndpoint``) runs in its own process. Every measured
side (llm_ops or the baseline of ``benchmarks/baseline.py``) runs in a fresh worker process,
``run.py --worker SCENARIO SIDE JSON``, which prints one ``RESULT {...}`` line: wall time,
client CPU time (all threads of the worker), peak RSS and the rows' outcomes, checked against
``expected_reply``. The sides alternate, the order flipping every repetition, and tables show
medians over the repetitions. Workloads are seeded samples of real review texts.

``llm_ops/`` is copied aside at the start and every worker and the endpoint import the copy
(through ``PYTHONPATH``), so a run that takes minutes measures one version of the code even
while the work tree changes; the header says so when it did.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import hashlib
import importlib.metadata
import io
import json
import math
import os
import platform
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import polars as pl
from baseline import baseline_complete

from llm_ops import Endpoint, Price, Retries, llm_complete
from llm_ops.testing import BASE_PATHS, LocalEndpoint, expected_reply

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = REPO / "data" / "womens_clothing_reviews.parquet"
RESULTS = HERE / "RESULTS.md"
PROFILE = HERE / "PROFILE.txt"
MODEL = "sim"
RESULT_PREFIX = "RESULT "
SCENARIOS = (
    "overhead",
    "latency-bound",
    "duplicates",
    "rerun",
    "rate limited",
    "faults",
    "memory",
    "send order",
    "sporadic hangs",
    "dialects",
    "telemetry",
)
Result = dict[str, Any]


# --------------------------------------------------------------------------------------------
# Sizes


@dataclass(frozen=True)
class Sizes:
    """Workload sizes of one run; ``--scale`` multiplies the row counts and seconds of work."""

    reps: int
    overhead_rows: int
    ceiling_requests: int
    latency_work_seconds: float  # ideal seconds of work at C / latency
    duplicate_rows: int
    rerun_rows: int
    cached_distinct: int
    cached_rows: int
    rate_work_seconds: float
    fault_rows: int
    memory_small: int
    memory_large: int
    memory_distinct: int
    send_order_rows: int
    hang_rows: int

    def scaled(self, scale: float) -> Sizes:
        changes: dict[str, Any] = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if spec.name == "reps":
                continue
            if isinstance(value, float):
                changes[spec.name] = max(0.05, value * scale)
            else:
                changes[spec.name] = max(20, round(value * scale))
        return replace(self, **changes)


FULL = Sizes(
    reps=3,
    overhead_rows=20_000,
    ceiling_requests=10_000,
    latency_work_seconds=5.0,
    duplicate_rows=4_000,
    rerun_rows=5_000,
    cached_distinct=10_000,
    cached_rows=1_000_000,
    rate_work_seconds=10.0,
    fault_rows=3_000,
    memory_small=100_000,
    memory_large=1_000_000,
    memory_distinct=10_000,
    send_order_rows=10_000,
    hang_rows=2_000,
)
QUICK = Sizes(
    reps=1,
    overhead_rows=3_000,
    ceiling_requests=3_000,
    latency_work_seconds=2.0,
    duplicate_rows=1_000,
    rerun_rows=1_000,
    cached_distinct=3_000,
    cached_rows=100_000,
    rate_work_seconds=4.0,
    fault_rows=1_000,
    memory_small=100_000,
    memory_large=300_000,
    memory_distinct=3_000,
    send_order_rows=3_000,
    hang_rows=1_000,
)

CONCURRENCY = 64
LATENCY = 0.2
LATENCY_CONCURRENCIES = (64, 256, 1024)
DUPLICATE_LATENCY = 0.05
RATE_RPM = 1200
RATE_WINDOW = 1.0
RATE_LATENCY = 0.1
FAULTS = {"fault_rate": 0.10, "hang_rate": 0.05, "seed": 1, "latency": 0.05}
FAULT_TIMEOUT = 2.0
HANGS = {  # 2.5% each of 500, 503, dropped connections and malformed bodies; 5% hang
    "fault_rate": 0.10,
    "fault_kinds": ("500", "503", "drop", "truncated_json"),
    "hang_rate": 0.05,
    "seed": 1,
    "latency": 0.05,
}
HANG_TIMEOUT = 10.0
TRACING_MODES = ("off", "none sampled", "all sampled", "all sampled + metrics")
"""The telemetry scenario's sides: OpenTelemetry not imported; the SDK's tracer provider with
a sampler that keeps nothing; every span kept (by an exporter that drops them: the SDK's
processing, not a network's); and that with the SDK's meter provider too."""
SLOW_SCENARIO_REPS = (
    2  # faults, memory, sporadic hangs: at most this many repetitions (keeps full < 15 min)
)


# --------------------------------------------------------------------------------------------
# Workloads


def distinct_texts(count: int, seed: int) -> pl.Series:
    """``count`` review texts sampled with replacement, each made distinct by its number."""
    reviews = pl.read_parquet(DATA, columns=["text"])["text"].drop_nulls()
    sample = reviews.sample(count, with_replacement=True, seed=seed)
    numbered = pl.DataFrame({"review": sample}).with_row_index("row")
    return numbered.select(pl.format("{} (row {})", "review", "row").alias("text"))["text"]


def workload(rows: int, distinct: int | None = None, seed: int = 0) -> pl.DataFrame:
    """A ``text`` column of ``rows`` rows over ``distinct`` prompts (each as often), shuffled.

    The distinct prompts depend only on ``distinct`` and ``seed``, so a big table can be made of
    the prompts an earlier, smaller job put in the cache.
    """
    count = distinct or rows
    texts = distinct_texts(count, seed)
    if count == rows:
        return pl.DataFrame({"text": texts})
    order = (pl.int_range(0, rows, eager=True) % count).shuffle(seed=seed)
    return pl.DataFrame({"text": texts.gather(order)})


# --------------------------------------------------------------------------------------------
# The worker: one measured side in a fresh process


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        resident = int(statm.read().split()[1])
    return resident * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def machine_busy_seconds() -> float:
    """CPU seconds all cores of the machine have spent busy since boot (from /proc/stat)."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return math.nan
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    busy = sum(ticks[:8]) - idle  # guest time is already counted in user
    return busy / os.sysconf("SC_CLK_TCK")


class ThreadsProfiler:
    """cProfile of the calling thread and, apart, of every thread started while it is on.

    ``asyncio.to_thread`` work (planning, cache writes) runs in pool threads, which a plain
    ``cProfile.Profile`` would not see. Times are wall times per thread (a CPU-time timer
    costs a system call per event here and distorts more): the event loop's idle time shows
    as ``select.epoll.poll``, a pool thread's as ``SimpleQueue.get``. DuckDB's C++ threads
    are not seen.
    """

    def __init__(self) -> None:
        self.main = cProfile.Profile()
        self.others: list[cProfile.Profile] = []

    def _start_in_thread(self, frame: FrameType, event: str, arg: object) -> None:
        profiler = cProfile.Profile()
        self.others.append(profiler)
        profiler.enable()

    def __enter__(self) -> ThreadsProfiler:
        threading.setprofile(self._start_in_thread)
        self.main.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        self.main.disable()
        threading.setprofile(None)

    def text(self, top: int) -> str:
        out = io.StringIO()
        main = pstats.Stats(self.main, stream=out)
        for order in ("cumulative", "tottime"):
            out.write(
                f"\n===== calling thread (it waits on the client's loop): top {top} by {order} "
                "=====\n"
            )
            main.sort_stats(order).print_stats(top)
        if self.others:
            pool = pstats.Stats(self.others[0], stream=out)
            for profiler in self.others[1:]:
                pool.add(profiler)
            out.write(
                f"\n===== the {len(self.others)} other Python threads (the client's event loop, "
                "llm-ops-client, where requests are sent, and asyncio.to_thread: planning, cache "
                f"writes, join back), merged: top {top} by tottime =====\n"
            )
            pool.sort_stats("tottime").print_stats(top)
        text = out.getvalue()
        package = Path(sys.modules["llm_ops"].__file__ or "").parent
        for prefix in (
            sysconfig.get_paths()["purelib"],
            sysconfig.get_paths()["stdlib"],
            str(package.parent),
            str(REPO),
        ):
            text = text.replace(prefix + os.sep, "")
        return text


def check_rows(
    texts: pl.Series, answers: pl.Series, marked_failed: pl.Series, rows_out: int
) -> dict[str, int]:
    """Rows answered correctly, explicitly failed, and lost (wrong, missing or unexplained)."""
    unique = texts.unique()
    expected = pl.DataFrame(
        {"text": unique, "expected": [expected_reply(t, model=MODEL) for t in unique]}
    )
    joined = pl.DataFrame({"text": texts, "answer": answers, "failed": marked_failed}).join(
        expected, on="text", how="left", maintain_order="left"
    )
    correct = int((joined["answer"] == joined["expected"]).fill_null(False).sum())
    failed = int((joined["failed"] & joined["answer"].is_null()).sum())
    lost = texts.len() - correct - failed + abs(rows_out - texts.len())
    return {"correct": correct, "failed_rows": failed, "lost": lost}


async def hammer(base_url: str, bodies: Sequence[bytes], concurrency: int) -> int:
    """Raw aiohttp load: ``concurrency`` loops posting pre-encoded bodies; returns 200s."""
    import aiohttp

    url = base_url.rstrip("/") + "/chat/completions"
    headers = {"Content-Type": "application/json", "Authorization": "Bearer x"}
    work = iter(bodies)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def loop() -> int:
            ok = 0
            for body in work:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    ok += response.status == 200
            return ok

        counts = await asyncio.gather(*(loop() for _ in range(concurrency)))
    return sum(counts)


def configure_tracing(mode: str) -> None:
    """Set OpenTelemetry's global providers as ``mode`` (one of :data:`TRACING_MODES`) says;
    llm-ops emits through them from its next job on."""
    if mode == "off":
        return
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ALWAYS_OFF if mode == "none sampled" else ALWAYS_ON)
    provider.add_span_processor(SimpleSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)
    if mode.endswith("metrics"):
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


def run_worker(scenario: str, side: str, params: dict[str, Any]) -> Result:
    if scenario == "send order":
        return send_order_worker(side, params)
    configure_tracing(params.get("tracing", "off"))
    frame = workload(params["rows"], params.get("distinct"), params.get("seed", 0))
    texts = frame["text"]
    result: Result = {
        "scenario": scenario,
        "side": side,
        "rows": frame.height,
        "distinct": texts.n_unique(),
        "llm_ops": str(Path(sys.modules["llm_ops"].__file__ or "").parent),
        "opentelemetry": "opentelemetry" in sys.modules,
    }
    bodies = (
        [
            json.dumps({"model": MODEL, "messages": [{"role": "user", "content": t}]}).encode()
            for t in texts
        ]
        if side == "ceiling"
        else []
    )
    gc.collect()
    result["rss_before_mb"] = rss_mb()
    profiler = ThreadsProfiler() if params.get("profile") else None
    busy = machine_busy_seconds()
    wall, cpu = time.perf_counter(), time.process_time()
    with profiler or contextlib.nullcontext():
        if side == "llm_ops":
            out, report = llm_complete(
                frame,
                prompt="{text}",
                model=MODEL,
                endpoint=Endpoint(params["base_url"], provider=params.get("provider")),
                retries=Retries(timeout=params.get("timeout") or 60.0),
                cache=params.get("cache") or False,
                concurrency=params["concurrency"],
                progress=False,
                return_report=True,
            )
        elif side == "baseline":
            out = baseline_complete(
                frame,
                base_url=params["base_url"],
                concurrency=params["concurrency"],
                timeout=params.get("timeout"),
            )
        elif side == "ceiling":
            ok = asyncio.run(hammer(params["base_url"], bodies, params["concurrency"]))
        else:
            raise SystemExit(f"unknown side {side!r}")
    result["wall"] = time.perf_counter() - wall
    result["cpu"] = time.process_time() - cpu
    result["machine_busy"] = machine_busy_seconds() - busy
    result["peak_rss_mb"] = peak_rss_mb()
    if profiler is not None:
        result["profile"] = profiler.text(25)
    if side == "ceiling":
        result["ok"] = ok
        return result
    if side == "llm_ops":
        status = out["completion_status"].cast(pl.String)
        result["report"] = {
            "requests_sent": report.requests_sent,
            "retries": report.retries,
            "cache_hits": report.cache_hits,
            "distinct_requests": report.distinct_requests,
            "statuses": {k: v for k, v in report.statuses.items() if v},
            "concurrency": report.concurrency,
            "concurrency_why": report.concurrency_why,
        }
        marked_failed = status.is_in(["failed", "rejected"])
        result["ok_rows"] = int(status.is_in(["ok", "cached"]).sum())
    else:
        marked_failed = out["completion_error"].is_not_null()
        result["ok_rows"] = int(out["completion"].is_not_null().sum())
    result |= check_rows(texts, out["completion"], marked_failed, out.height)
    return result


# --------------------------------------------------------------------------------------------
# Send order: one templated job, in input order and in prefix order

SEND_ORDER_INSTRUCTION = (
    "You are a retail analyst for a women's clothing store. Read the customer review below and "
    "answer in one short sentence: what the customer liked or disliked, and whether a note on "
    "size, fit or quality would help other shoppers. Be factual and do not invent details. If "
    "the review is mixed, name the main complaint first. Answer in plain English, without "
    "quoting the review."
)
SEND_ORDER_FIELDS = "Department: {department}. Class: {class_name}. Rating: {rating} of 5."
SEND_ORDER_LAYOUTS = {  # the same words, the row's columns after or before the instruction
    "instruction first": f"{SEND_ORDER_INSTRUCTION}\n{SEND_ORDER_FIELDS}\nReview: {{text}}",
    "columns first": f"{SEND_ORDER_FIELDS}\n{SEND_ORDER_INSTRUCTION}\nReview: {{text}}",
}
SEND_ORDER_CONFIG = {  # a server with a prefix cache far smaller than the job
    "latency": 0.05,
    "prefix_cache_tokens": 16_384,
    "prefill_seconds_per_1k_tokens": 0.25,
}
SEND_ORDER_PRICE = Price(0.15, 0.60, cached_input_per_million=0.075)
SEND_ORDER_SIDES = {"input": "input order", "prefix": "prefix order"}


def send_order_frame(rows: int, seed: int = 0) -> pl.DataFrame:
    """``rows`` reviews (a seeded sample) with the columns the send-order templates read."""
    reviews = pl.read_parquet(DATA, columns=["department", "class_name", "rating", "text"])
    reviews = reviews.drop_nulls()
    return reviews.sample(rows, with_replacement=rows > reviews.height, seed=seed)


def send_order_worker(side: str, params: dict[str, Any]) -> Result:
    """One side of the send-order scenario: ``llm_complete`` with ``send_order=side``."""
    frame = send_order_frame(params["rows"])
    template = SEND_ORDER_LAYOUTS[params["layout"]]
    busy = machine_busy_seconds()
    wall, cpu = time.perf_counter(), time.process_time()
    out = llm_complete(
        frame,
        prompt=template,
        model=MODEL,
        endpoint=params["base_url"],
        cache=False,
        concurrency=CONCURRENCY,
        send_order="prefix" if side == "prefix" else "input",
        progress=False,
    )
    result: Result = {
        "scenario": "send order",
        "side": side,
        "rows": frame.height,
        "llm_ops": str(Path(sys.modules["llm_ops"].__file__ or "").parent),
        "wall": time.perf_counter() - wall,
        "cpu": time.process_time() - cpu,
        "machine_busy": machine_busy_seconds() - busy,
    }
    expected = [
        expected_reply(template.format(**row), model=MODEL) for row in frame.iter_rows(named=True)
    ]
    result["correct"] = int((out["completion"] == pl.Series(expected)).fill_null(False).sum())
    return result


# --------------------------------------------------------------------------------------------
# The orchestrator


def endpoint_cpu_seconds(endpoint: LocalEndpoint) -> float:
    """User + system CPU of the endpoint's process so far."""
    process = getattr(endpoint, "_process", None)
    if process is None:
        return math.nan
    with open(f"/proc/{process.pid}/stat") as stat:
        parts = stat.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


class Bench:
    """Runs workers against one endpoint, reconfigured and reset before every run."""

    def __init__(self, endpoint: LocalEndpoint, reps: int, scratch: Path):
        self.endpoint = endpoint
        self.reps = reps
        self.scratch = scratch
        self._files = 0
        self.results: dict[str, list[Result]] = {}

    def cache_file(self, name: str) -> str:
        self._files += 1
        return str(self.scratch / f"{name}-{self._files}.duckdb")

    def run(
        self, scenario: str, side: str, params: dict[str, Any], config: dict[str, Any]
    ) -> Result:
        self.endpoint.configure(**config)
        self.endpoint.reset()
        cpu = endpoint_cpu_seconds(self.endpoint)
        result = spawn(scenario, side, {"base_url": self.endpoint.base_url, **params})
        if not Path(result["llm_ops"]).is_relative_to(self.scratch):
            raise RuntimeError(f"the worker imported {result['llm_ops']}, not the snapshot")
        result["endpoint_cpu"] = endpoint_cpu_seconds(self.endpoint) - cpu
        stats = self.endpoint.stats()
        stats.pop("config", None)
        result["endpoint"] = stats
        derived = derive(result)
        self.results.setdefault(scenario, []).append(derived)
        return derived

    def disturbance(self, scenario: str) -> str:
        """One line on how busy other processes kept the machine during a scenario's runs."""
        loads = [
            r["other_load"]
            for r in self.results.get(scenario, [])
            if not math.isnan(r["other_load"])
        ]
        if not loads:
            return ""
        return (
            f"Other processes used a median {statistics.median(loads):.2f} and at most "
            f"{max(loads):.2f} cores while this scenario's sides were measured "
            f"({os.cpu_count()} cores in all)."
        )

    def later(
        self,
        scenario: str,
        side: str,
        params: dict[str, Any],
        config: dict[str, Any],
        *,
        fresh_cache: bool = False,
    ) -> Callable[[], Result]:
        """A run to make later; ``fresh_cache`` gives each run a new cache file."""

        def run() -> Result:
            extra = {"cache": self.cache_file(scenario.replace(" ", "-"))} if fresh_cache else {}
            return self.run(scenario, side, {**params, **extra}, config)

        return run

    def alternate(
        self, runs: Sequence[tuple[str, Callable[[], Result]]], reps: int | None = None
    ) -> dict[str, list[Result]]:
        """Every run ``reps`` times, in alternation, the order reversed every other repetition."""
        results: dict[str, list[Result]] = {label: [] for label, _ in runs}
        for rep in range(reps or self.reps):
            for label, run in runs if rep % 2 == 0 else list(reversed(runs)):
                results[label].append(run())
        return results


def spawn(scenario: str, side: str, params: dict[str, Any]) -> Result:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        scenario,
        side,
        json.dumps(params),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=REPO, timeout=3600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"worker {scenario}/{side} exited {done.returncode}:\n{done.stderr[-4000:]}"
        )
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result: Result = json.loads(line.removeprefix(RESULT_PREFIX))
            return result
    raise RuntimeError(f"worker {scenario}/{side} printed no result:\n{done.stdout[-2000:]}")


def derive(result: Result) -> Result:
    """Per-run figures computed from the raw measurements."""
    wall = max(result["wall"], 1e-9)
    sent = result["endpoint"]["requests"]
    result["rows_per_s"] = result["rows"] / wall
    result["cpu_ms_per_request"] = 1000 * result["cpu"] / sent if sent else math.nan
    result["cpu_us_per_row"] = 1e6 * result["cpu"] / result["rows"]
    result["endpoint_ms_per_request"] = 1000 * result["endpoint_cpu"] / sent if sent else math.nan
    result["endpoint_busy"] = result["endpoint_cpu"] / wall
    result["sent"] = sent
    result["http_429"] = result["endpoint"]["by_status"].get("429", 0)
    # Cores' worth of CPU used by other processes while this side was measured (a disturbance).
    others = result["machine_busy"] - result["cpu"] - result["endpoint_cpu"]
    result["other_load"] = max(0.0, others) / wall
    return result


def median(results: Sequence[Result], key: str | Callable[[Result], float]) -> float:
    values = [key(r) if callable(key) else r[key] for r in results]
    values = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return statistics.median(values) if values else math.nan


# --------------------------------------------------------------------------------------------
# Formatting


def fmt(value: float, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.0f}%"


def ratio(a: float, b: float) -> str:
    if math.isnan(a) or math.isnan(b) or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass
class Section:
    title: str
    body: str

    def markdown(self) -> str:
        return f"## {self.title}\n\n{self.body.strip()}\n"


# --------------------------------------------------------------------------------------------
# Scenarios


def scenario_overhead(bench: Bench, sizes: Sizes) -> Section:
    rows = sizes.overhead_rows
    params = {"rows": rows, "concurrency": CONCURRENCY}
    ceiling = [
        bench.run(
            "overhead", "ceiling", {"rows": sizes.ceiling_requests, "concurrency": CONCURRENCY}, {}
        )
        for _ in range(bench.reps)
    ]
    runs = bench.alternate(
        [
            ("llm_ops", bench.later("overhead", "llm_ops", params, {}, fresh_cache=True)),
            ("llm_ops_nocache", bench.later("overhead", "llm_ops", params, {})),
            ("baseline", bench.later("overhead", "baseline", params, {})),
        ]
    )
    headers = [
        "side",
        "rows",
        "wall s",
        "rows/s",
        "client CPU ms/request",
        "peak RSS MB",
        "endpoint CPU ms/request",
        "endpoint busy",
        "correct rows",
    ]
    labels = {
        "llm_ops": "llm_ops (fresh cache file)",
        "llm_ops_nocache": "llm_ops (cache=False)",
        "baseline": "baseline (AsyncOpenAI loop)",
    }
    body = []
    for key, label in labels.items():
        r = runs[key]
        body.append(
            [
                label,
                fmt(median(r, "rows")),
                fmt(median(r, "wall"), 2),
                fmt(median(r, "rows_per_s")),
                fmt(median(r, "cpu_ms_per_request"), 2),
                fmt(median(r, "peak_rss_mb")),
                fmt(median(r, "endpoint_ms_per_request"), 2),
                pct(median(r, "endpoint_busy")),
                fmt(median(r, "correct")),
            ]
        )
    for key in ("llm_ops", "llm_ops_nocache"):
        a, b = runs[key], runs["baseline"]
        body.append(
            [
                f"**ratio {labels[key]} / baseline**",
                "",
                ratio(median(a, "wall"), median(b, "wall")),
                ratio(median(a, "rows_per_s"), median(b, "rows_per_s")),
                ratio(median(a, "cpu_ms_per_request"), median(b, "cpu_ms_per_request")),
                ratio(median(a, "peak_rss_mb"), median(b, "peak_rss_mb")),
                "",
                "",
                "",
            ]
        )
    ceiling_ms = median(ceiling, "endpoint_ms_per_request")
    worst = max(median(r, "endpoint_ms_per_request") for r in runs.values())
    fastest = max(median(r, "rows_per_s") for r in runs.values())
    ceiling_table = table(
        [
            "load",
            "requests",
            "req/s",
            "load client CPU ms/request",
            "endpoint CPU ms/request",
            "endpoint busy",
            "endpoint ceiling (1 core) ≈ req/s",
        ],
        [
            [
                "raw aiohttp, pre-encoded bodies, body read not parsed",
                fmt(median(ceiling, "rows")),
                fmt(median(ceiling, "rows_per_s")),
                fmt(median(ceiling, "cpu_ms_per_request"), 2),
                fmt(ceiling_ms, 2),
                pct(median(ceiling, "endpoint_busy")),
                fmt(1000 / ceiling_ms if ceiling_ms else math.nan),
            ]
        ],
    )
    text = (
        f"Zero-latency endpoint, {rows:,} distinct rows, concurrency {CONCURRENCY}. Client CPU "
        "is user+system time of the worker process (all its threads, DuckDB's included) during "
        "the call, divided by the requests the endpoint received.\n\n"
        f"{table(headers, body)}\n\n"
        "The endpoint alone, driven by a lean raw-aiohttp client (same machine, own process); "
        "its ceiling is 1 / its CPU per request, so the sides above are not bounded by it while "
        "its busy share stays well under 100%:\n\n"
        f"{ceiling_table}\n\n"
        f"With the costliest client above the endpoint spent {fmt(worst, 2)} ms of CPU per "
        f"request, a ceiling of about {fmt(1000 / worst if worst else math.nan)} req/s; the "
        f"fastest side reached {fmt(fastest)} rows/s."
    )
    return Section("1. overhead", text)


def scenario_latency(bench: Bench, sizes: Sizes) -> Section:
    headers = [
        "concurrency",
        "side",
        "rows",
        "wall s",
        "rows/s",
        "% of C/latency",
        "share of the raw-aiohttp ceiling",
        "client CPU ms/request",
        "endpoint max in flight",
    ]
    body = []
    config = {"latency": LATENCY}
    for concurrency in LATENCY_CONCURRENCIES:
        ideal = concurrency / LATENCY
        params = {
            "rows": max(20, round(ideal * sizes.latency_work_seconds)),
            "concurrency": concurrency,
        }
        runs = bench.alternate(
            [
                (
                    "llm_ops",
                    bench.later("latency-bound", "llm_ops", params, config, fresh_cache=True),
                ),
                ("baseline", bench.later("latency-bound", "baseline", params, config)),
                ("raw aiohttp ceiling", bench.later("latency-bound", "ceiling", params, config)),
            ]
        )
        ceiling = median(runs["raw aiohttp ceiling"], "rows_per_s")
        for side, r in runs.items():
            body.append(
                [
                    str(concurrency),
                    side,
                    fmt(median(r, "rows")),
                    fmt(median(r, "wall"), 2),
                    fmt(median(r, "rows_per_s")),
                    pct(median(r, "rows_per_s") / ideal),
                    f"{median(r, 'rows_per_s') / ceiling:.2f}",
                    fmt(median(r, "cpu_ms_per_request"), 2),
                    fmt(median(r, lambda x: x["endpoint"]["max_in_flight"])),
                ]
            )
        a, b = runs["llm_ops"], runs["baseline"]
        body.append(
            [
                str(concurrency),
                "**ratio llm_ops / baseline**",
                "",
                ratio(median(a, "wall"), median(b, "wall")),
                ratio(median(a, "rows_per_s"), median(b, "rows_per_s")),
                "",
                "",
                ratio(median(a, "cpu_ms_per_request"), median(b, "cpu_ms_per_request")),
                "",
            ]
        )
    text = (
        f"Endpoint latency {LATENCY * 1000:.0f} ms, distinct rows, about "
        f"{sizes.latency_work_seconds:g} s of ideal work at C / latency "
        f"({', '.join(f'{c / LATENCY:,.0f}' for c in LATENCY_CONCURRENCIES)} rows/s). "
        "llm_ops writes a fresh cache file. The raw-aiohttp ceiling is a lean client on the "
        "most used async HTTP library (pre-encoded bodies, one aiohttp session, the body read "
        "but not parsed) against the same server in the same run: on this machine the "
        "endpoint shares the CPU, so it, not C / latency, is the limit such a client reaches; "
        "the goal is a share of at least 0.95. llm_ops posts through aiohttp too, plus its "
        "work per request (keys, the limiter, the journal, reading the answer).\n\n"
        f"{table(headers, body)}"
    )
    return Section("2. latency-bound", text)


def scenario_duplicates(bench: Bench, sizes: Sizes) -> Section:
    rows = sizes.duplicate_rows
    params = {"rows": rows, "distinct": max(1, rows // 2), "concurrency": CONCURRENCY}
    config = {"latency": DUPLICATE_LATENCY}
    runs = bench.alternate(
        [
            ("llm_ops", bench.later("duplicates", "llm_ops", params, config, fresh_cache=True)),
            ("baseline", bench.later("duplicates", "baseline", params, config)),
        ]
    )
    headers = [
        "side",
        "rows",
        "distinct prompts",
        "requests received",
        "requests per distinct",
        "requests per row",
        "most sends of one prompt",
        "wall s",
        "rows/s",
        "correct rows",
    ]
    body = []
    for side, r in runs.items():
        body.append(
            [
                side,
                fmt(median(r, "rows")),
                fmt(median(r, "distinct")),
                fmt(median(r, "sent")),
                fmt(median(r, lambda x: x["sent"] / x["distinct"]), 2),
                fmt(median(r, lambda x: x["sent"] / x["rows"]), 2),
                fmt(median(r, lambda x: x["endpoint"]["max_prompt_repeats"])),
                fmt(median(r, "wall"), 2),
                fmt(median(r, "rows_per_s")),
                fmt(median(r, "correct")),
            ]
        )
    a, b = runs["llm_ops"], runs["baseline"]
    body.append(
        [
            "**ratio llm_ops / baseline**",
            "",
            "",
            ratio(median(a, "sent"), median(b, "sent")),
            "",
            "",
            "",
            ratio(median(a, "wall"), median(b, "wall")),
            ratio(median(a, "rows_per_s"), median(b, "rows_per_s")),
            "",
        ]
    )
    text = (
        f"{rows:,} rows over {rows // 2:,} distinct prompts (each twice, shuffled), endpoint "
        f"latency {DUPLICATE_LATENCY * 1000:.0f} ms, concurrency {CONCURRENCY}. Requests are "
        "counted by the endpoint.\n\n"
        f"{table(headers, body)}"
    )
    return Section("3. duplicates", text)


def scenario_rerun(bench: Bench, sizes: Sizes) -> Section:
    rows = sizes.rerun_rows
    cache = bench.cache_file("rerun")
    params = {"rows": rows, "concurrency": CONCURRENCY, "cache": cache}
    cold = bench.run("rerun", "llm_ops", params, {})
    runs = bench.alternate(
        [
            ("warm", bench.later("rerun", "llm_ops", params, {})),
            ("baseline", bench.later("rerun", "baseline", params, {})),
        ]
    )
    big_cache = bench.cache_file("cached-table")
    fill = bench.run(
        "rerun",
        "llm_ops",
        {"rows": sizes.cached_distinct, "concurrency": CONCURRENCY, "cache": big_cache},
        {},
    )
    big = [
        bench.run(
            "rerun",
            "llm_ops",
            {
                "rows": sizes.cached_rows,
                "distinct": sizes.cached_distinct,
                "concurrency": CONCURRENCY,
                "cache": big_cache,
            },
            {},
        )
        for _ in range(bench.reps)
    ]
    headers = [
        "run",
        "side",
        "rows",
        "distinct",
        "requests received",
        "wall s",
        "rows/s",
        "client CPU s",
        "peak RSS MB",
        "correct rows",
    ]

    def line(run: str, side: str, r: Sequence[Result]) -> list[str]:
        return [
            run,
            side,
            fmt(median(r, "rows")),
            fmt(median(r, "distinct")),
            fmt(median(r, "sent")),
            fmt(median(r, "wall"), 2),
            fmt(median(r, "rows_per_s")),
            fmt(median(r, "cpu"), 2),
            fmt(median(r, "peak_rss_mb")),
            fmt(median(r, "correct")),
        ]

    warm, base = runs["warm"], runs["baseline"]
    body = [
        line("first run, empty cache (once)", "llm_ops", [cold]),
        line("same job again, warm cache", "llm_ops", warm),
        line("same job again (no cache)", "baseline", base),
        [
            "**ratio warm llm_ops / baseline**",
            "",
            "",
            "",
            "",
            ratio(median(warm, "wall"), median(base, "wall")),
            ratio(median(warm, "rows_per_s"), median(base, "rows_per_s")),
            ratio(median(warm, "cpu"), median(base, "cpu")),
            ratio(median(warm, "peak_rss_mb"), median(base, "peak_rss_mb")),
            "",
        ],
        line("cache fill: the distinct prompts (once)", "llm_ops", [fill]),
        line("fully cached table", "llm_ops", big),
    ]
    statuses = big[0].get("report", {}).get("statuses", {})
    text = (
        f"Zero-latency endpoint, concurrency {CONCURRENCY}. The job: {rows:,} distinct rows. "
        f"Then a table of {sizes.cached_rows:,} rows made of {sizes.cached_distinct:,} distinct "
        "prompts, after one llm_complete over those prompts filled its cache; end to end = the "
        "whole llm_complete call (render, key, dedupe, cache lookup, join back, run record). "
        f"Statuses of the cached table: {json.dumps(statuses)}.\n\n"
        f"{table(headers, body)}"
    )
    return Section("4. rerun", text)


def scenario_rate_limited(bench: Bench, sizes: Sizes) -> Section:
    rate = RATE_RPM / 60
    burst = max(1.0, RATE_RPM * RATE_WINDOW / 60)
    rows = max(20, round(rate * sizes.rate_work_seconds))
    ideal_wall = max(0.0, rows - burst) / rate + RATE_LATENCY
    config = {"rpm": RATE_RPM, "rate_window": RATE_WINDOW, "latency": RATE_LATENCY}
    params = {"rows": rows, "concurrency": CONCURRENCY}
    runs = bench.alternate(
        [
            ("llm_ops", bench.later("rate limited", "llm_ops", params, config, fresh_cache=True)),
            ("baseline", bench.later("rate limited", "baseline", params, config)),
        ]
    )
    headers = [
        "side",
        "rows",
        "answered rows",
        "failed rows",
        "429s received",
        "requests received",
        "wall s",
        "goodput rows/s",
        "sustained % of limit",
    ]

    def sustained(x: Result) -> float:
        """Rows answered beyond the burst, per second of wall time past the first latency."""
        answered, wall = float(x["correct"]), float(x["wall"])
        return max(0.0, answered - burst) / max(wall - RATE_LATENCY, 1e-9) / rate

    body = []
    for side, r in runs.items():
        body.append(
            [
                side,
                fmt(median(r, "rows")),
                fmt(median(r, "correct")),
                fmt(median(r, "failed_rows")),
                fmt(median(r, "http_429")),
                fmt(median(r, "sent")),
                fmt(median(r, "wall"), 2),
                fmt(median(r, lambda x: x["correct"] / x["wall"]), 1),
                pct(median(r, sustained)),
            ]
        )
    a, b = runs["llm_ops"], runs["baseline"]
    body.append(
        [
            "**ratio llm_ops / baseline**",
            "",
            ratio(median(a, "correct"), median(b, "correct")),
            "",
            ratio(median(a, "http_429"), median(b, "http_429")),
            ratio(median(a, "sent"), median(b, "sent")),
            ratio(median(a, "wall"), median(b, "wall")),
            "",
            "",
        ]
    )
    text = (
        f"Endpoint limit {RATE_RPM} requests/min ({rate:g}/s) with a {RATE_WINDOW:g} s burst "
        f"({burst:g} requests), latency {RATE_LATENCY * 1000:.0f} ms; x-ratelimit headers on, "
        f"429s carry Retry-After. {rows} distinct rows, concurrency {CONCURRENCY}; llm_ops is "
        "given no rpm= (it learns the limit from the headers); the baseline uses the SDK's "
        "default 2 retries. Sustained % of limit = (answered rows - the burst) / (wall time - "
        "latency) / limit: the share of the limit turned into answers once the burst is spent "
        f"(the ideal job takes {ideal_wall:.2f} s). A side that gives up early has a short wall "
        "time and failed rows.\n\n"
        f"{table(headers, body)}"
    )
    return Section("5. rate limited", text)


def scenario_faults(bench: Bench, sizes: Sizes) -> Section:
    rows = sizes.fault_rows
    params = {"rows": rows, "concurrency": CONCURRENCY, "timeout": FAULT_TIMEOUT}
    runs = bench.alternate(
        [
            ("llm_ops", bench.later("faults", "llm_ops", params, FAULTS, fresh_cache=True)),
            ("baseline", bench.later("faults", "baseline", params, FAULTS)),
        ],
        reps=min(bench.reps, SLOW_SCENARIO_REPS),
    )
    headers = [
        "side",
        "rows",
        "answered correctly",
        "failed (explicitly)",
        "lost",
        "requests received",
        "hangs hit",
        "other faults hit",
        "wall s",
        "rows/s",
    ]
    body = []
    for side, r in runs.items():
        body.append(
            [
                side,
                fmt(median(r, "rows")),
                fmt(median(r, "correct")),
                fmt(median(r, "failed_rows")),
                fmt(median(r, "lost")),
                fmt(median(r, "sent")),
                fmt(median(r, lambda x: x["endpoint"]["faults"].get("hang", 0))),
                fmt(
                    median(
                        r,
                        lambda x: sum(v for k, v in x["endpoint"]["faults"].items() if k != "hang"),
                    )
                ),
                fmt(median(r, "wall"), 2),
                fmt(median(r, "rows_per_s")),
            ]
        )
    a, b = runs["llm_ops"], runs["baseline"]
    body.append(
        [
            "**ratio llm_ops / baseline**",
            "",
            ratio(median(a, "correct"), median(b, "correct")),
            "",
            "",
            ratio(median(a, "sent"), median(b, "sent")),
            "",
            "",
            ratio(median(a, "wall"), median(b, "wall")),
            ratio(median(a, "rows_per_s"), median(b, "rows_per_s")),
        ]
    )
    worst_lost = max(int(x["lost"]) for x in a)
    text = (
        f"{FAULTS['fault_rate']:.0%} of attempts get a fault (500, 503, 429 without headers, "
        f"connection dropped mid-body, truncated JSON, HTML page; drawn per attempt) and "
        f"{FAULTS['hang_rate']:.0%} hang forever; latency {FAULTS['latency'] * 1000:.0f} ms, "
        f"{rows:,} distinct rows, concurrency {CONCURRENCY}, timeout {FAULT_TIMEOUT:g} s per "
        "attempt on both sides; llm_ops with its default 5 attempts, the baseline with the "
        "SDK's 2 retries. Correct = the answer is expected_reply(own prompt); lost = anything "
        "else that is not an explicit failure (missing, wrong answer, empty answer marked ok). "
        f"Median of {len(a)} repetition(s). Most rows lost by llm_ops in any repetition: "
        f"{worst_lost}.\n\n"
        f"{table(headers, body)}"
    )
    return Section("6. faults", text)


def scenario_memory(bench: Bench, sizes: Sizes) -> Section:
    distinct = sizes.memory_distinct
    runs = bench.alternate(
        [
            (
                str(rows),
                bench.later(
                    "memory",
                    "llm_ops",
                    {"rows": rows, "distinct": distinct, "concurrency": CONCURRENCY},
                    {},
                ),
            )
            for rows in (sizes.memory_small, sizes.memory_large)
        ],
        reps=min(bench.reps, SLOW_SCENARIO_REPS),
    )
    headers = [
        "rows",
        "distinct",
        "requests received",
        "RSS before the call MB",
        "peak RSS MB",
        "peak - before MB",
        "wall s",
        "rows/s",
    ]
    body = []
    for r in runs.values():
        body.append(
            [
                fmt(median(r, "rows")),
                fmt(median(r, "distinct")),
                fmt(median(r, "sent")),
                fmt(median(r, "rss_before_mb")),
                fmt(median(r, "peak_rss_mb")),
                fmt(median(r, lambda x: x["peak_rss_mb"] - x["rss_before_mb"])),
                fmt(median(r, "wall"), 2),
                fmt(median(r, "rows_per_s")),
            ]
        )
    small, large = runs[str(sizes.memory_small)], runs[str(sizes.memory_large)]
    growth = ratio(
        median(large, lambda x: x["peak_rss_mb"] - x["rss_before_mb"]),
        median(small, lambda x: x["peak_rss_mb"] - x["rss_before_mb"]),
    )
    body.append(
        [
            f"**ratio {sizes.memory_large:,} / {sizes.memory_small:,}**",
            "",
            "",
            ratio(median(large, "rss_before_mb"), median(small, "rss_before_mb")),
            ratio(median(large, "peak_rss_mb"), median(small, "peak_rss_mb")),
            growth,
            "",
            "",
        ]
    )
    text = (
        "llm_complete on an in-memory Polars frame, cache=False, zero-latency endpoint, "
        f"concurrency {CONCURRENCY}; rows are {distinct:,} distinct prompts repeated (so the "
        "request count stays fixed and the row count is what grows). RSS before = the worker "
        "after imports and building the input frame; peak = ru_maxrss of the worker. llm_ops "
        f"only (the baseline would send every row). Median of {len(small)} repetition(s). A "
        "Parquet-in/Parquet-out flow version of this scenario will come later.\n\n"
        f"{table(headers, body)}"
    )
    return Section("7. memory", text)


def scenario_send_order(bench: Bench, sizes: Sizes) -> Section:
    rows = sizes.send_order_rows

    def tokens(kind: str) -> Callable[[Result], float]:
        return lambda r: float(r["endpoint"][kind])

    def cost(r: Result) -> float:
        counted = r["endpoint"]
        return SEND_ORDER_PRICE.cost(
            requests=counted["requests"],
            input_tokens=counted["prompt_tokens"],
            output_tokens=counted["completion_tokens"],
            cached_input_tokens=counted["cached_tokens"],
        )

    def share(r: Result) -> float:
        return r["endpoint"]["cached_tokens"] / max(1, r["endpoint"]["prompt_tokens"])

    headers = [
        "layout",
        "side",
        "rows",
        "requests",
        "prompt tokens",
        "cached tokens",
        "% cached",
        "cost $",
        "wall s",
        "correct rows",
    ]
    body = []
    for layout in SEND_ORDER_LAYOUTS:
        params = {"rows": rows, "layout": layout}
        runs = bench.alternate(
            [
                (side, bench.later("send order", side, params, SEND_ORDER_CONFIG))
                for side in SEND_ORDER_SIDES
            ]
        )
        for side, label in SEND_ORDER_SIDES.items():
            r = runs[side]
            body.append(
                [
                    layout,
                    label,
                    fmt(median(r, "rows")),
                    fmt(median(r, "sent")),
                    fmt(median(r, tokens("prompt_tokens"))),
                    fmt(median(r, tokens("cached_tokens"))),
                    pct(median(r, share)),
                    fmt(median(r, cost), 4),
                    fmt(median(r, "wall"), 2),
                    fmt(median(r, "correct")),
                ]
            )
        a, b = runs["prefix"], runs["input"]
        body.append(
            [
                layout,
                "**ratio prefix / input**",
                "",
                ratio(median(a, "sent"), median(b, "sent")),
                ratio(median(a, tokens("prompt_tokens")), median(b, tokens("prompt_tokens"))),
                ratio(median(a, tokens("cached_tokens")), median(b, tokens("cached_tokens"))),
                "",
                ratio(median(a, cost), median(b, cost)),
                ratio(median(a, "wall"), median(b, "wall")),
                "",
            ]
        )
    price = SEND_ORDER_PRICE
    config = SEND_ORDER_CONFIG
    text = (
        f"{rows:,} reviews, one templated prompt each: a {len(SEND_ORDER_INSTRUCTION)}-character "
        f"instruction, then (or, in the columns-first layout, before it) "
        f'"{SEND_ORDER_FIELDS}", then "Review: {{text}}". llm_complete, cache=False, '
        f"concurrency {CONCURRENCY}, send_order='input' (the order of first rows) or 'prefix' (the "
        f"default). The endpoint models a prefix cache of {config['prefix_cache_tokens']:,} "
        "tokens (LRU over 16-token blocks, a request's blocks entering once it is answered), "
        f"far smaller than the job; latency {config['latency'] * 1000:.0f} ms plus "
        f"{config['prefill_seconds_per_1k_tokens']:g} s per 1,000 uncached prompt tokens. Tokens "
        f"are counted by the endpoint; cost at ${price.input_per_million:g} input, "
        f"${price.cached_input_per_million:g} cached input and ${price.output_per_million:g} "
        f"output per million tokens. Median of {bench.reps} repetition(s).\n\n"
        f"{table(headers, body)}"
    )
    return Section("8. send order", text)


def scenario_sporadic_hangs(bench: Bench, sizes: Sizes) -> Section:
    """A healthy endpoint on which a few requests in a hundred hang: a timeout there is no sign
    of load, and must not slow the requests that are answered."""
    rows = sizes.hang_rows
    params = {"rows": rows, "concurrency": CONCURRENCY, "timeout": HANG_TIMEOUT}
    runs = bench.alternate(
        [
            ("llm_ops", bench.later("sporadic hangs", "llm_ops", params, HANGS, fresh_cache=True)),
            ("baseline", bench.later("sporadic hangs", "baseline", params, HANGS)),
        ],
        reps=min(bench.reps, SLOW_SCENARIO_REPS),
    )
    headers = [
        "side",
        "rows",
        "answered correctly",
        "failed (explicitly)",
        "lost",
        "requests received",
        "hangs hit",
        "wall s",
        "concurrency at the end",
    ]
    body = []
    for side, r in runs.items():
        last = r[-1].get("report", {})
        body.append(
            [
                side,
                fmt(median(r, "rows")),
                fmt(median(r, "correct")),
                fmt(median(r, "failed_rows")),
                fmt(median(r, "lost")),
                fmt(median(r, "sent")),
                fmt(median(r, lambda x: x["endpoint"]["faults"].get("hang", 0))),
                fmt(median(r, "wall"), 2),
                f"{last['concurrency']} ({last['concurrency_why']})"
                if last.get("concurrency")
                else str(CONCURRENCY),
            ]
        )
    a, b = runs["llm_ops"], runs["baseline"]
    body.append(
        [
            "**ratio llm_ops / baseline**",
            "",
            ratio(median(a, "correct"), median(b, "correct")),
            "",
            "",
            ratio(median(a, "sent"), median(b, "sent")),
            "",
            ratio(median(a, "wall"), median(b, "wall")),
            "",
        ]
    )
    walls = ", ".join(f"{x['wall']:.1f}" for x in a)
    text = (
        "Attempts get 2.5% each of 500, 503, a connection dropped mid-body and a truncated JSON "
        f"body, and {HANGS['hang_rate']:.0%} hang forever (drawn per attempt, seeded); latency "
        f"{HANGS['latency'] * 1000:.0f} ms, {rows:,} distinct rows, concurrency {CONCURRENCY}, "
        f"timeout {HANG_TIMEOUT:g} s per attempt on both sides; llm_ops with its default "
        "attempts (a malformed answer is tried twice), the baseline with the SDK's 2 retries. "
        "A request that hangs while the others are answered at their usual latency is no sign "
        "of load: llm_ops retries it and keeps the concurrency. Correct = the answer is "
        "expected_reply(own prompt); lost = anything else that is not an explicit failure. "
        f"Median of {len(a)} repetition(s); llm_ops' wall times: {walls} s.\n\n"
        f"{table(headers, body)}"
    )
    return Section("9. sporadic hangs", text)


def scenario_dialects(bench: Bench, sizes: Sizes) -> Section:
    """The overhead scenario's job in each dialect llm-ops ships, on the simulator speaking it:
    the client's CPU per request beside the OpenAI dialect's (issue 49: at most 1.5x)."""
    rows = sizes.overhead_rows
    root = bench.endpoint.base_url.removesuffix(BASE_PATHS["openai"])
    runs = bench.alternate(
        [
            (
                dialect,
                bench.later(
                    "dialects",
                    "llm_ops",
                    {
                        "rows": rows,
                        "concurrency": CONCURRENCY,
                        "provider": dialect,
                        "base_url": root + BASE_PATHS[dialect],
                    },
                    {},
                    fresh_cache=True,
                ),
            )
            for dialect in BASE_PATHS
        ]
    )
    headers = ["dialect", "rows", "wall s", "client CPU ms/request", "vs openai", "correct rows"]
    openai = median(runs["openai"], "cpu_ms_per_request")
    body = [
        [
            dialect,
            fmt(median(r, "rows")),
            fmt(median(r, "wall"), 2),
            fmt(median(r, "cpu_ms_per_request"), 2),
            ratio(median(r, "cpu_ms_per_request"), openai),
            fmt(median(r, "correct")),
        ]
        for dialect, r in runs.items()
    ]
    text = (
        f"Zero-latency endpoint, {rows:,} distinct rows, concurrency {CONCURRENCY}, a fresh "
        "cache file; the same simulator answers every dialect at its own paths. Client CPU as "
        "in scenario 1.\n\n" + table(headers, body)
    )
    return Section("10. dialects", text)


def scenario_telemetry(bench: Bench, sizes: Sizes) -> Section:
    """The overhead scenario's job (cache off) with OpenTelemetry off and with tracing on,
    every span sampled or none: the client's CPU per request beside off (issue 50)."""
    rows = sizes.overhead_rows
    params = {"rows": rows, "concurrency": CONCURRENCY}
    runs = bench.alternate(
        [
            (mode, bench.later("telemetry", "llm_ops", {**params, "tracing": mode}, {}))
            for mode in TRACING_MODES
        ]
    )
    off = median(runs["off"], "cpu_ms_per_request")
    headers = [
        "OpenTelemetry",
        "imported",
        "rows",
        "wall s",
        "client CPU ms/request",
        "vs off",
        "correct rows",
    ]
    body = [
        [
            mode,
            "yes" if all(r["opentelemetry"] for r in results) else "no",
            fmt(median(results, "rows")),
            fmt(median(results, "wall"), 2),
            fmt(median(results, "cpu_ms_per_request"), 3),
            ratio(median(results, "cpu_ms_per_request"), off),
            fmt(median(results, "correct")),
        ]
        for mode, results in runs.items()
    ]
    text = (
        f"Zero-latency endpoint, {rows:,} distinct rows, concurrency {CONCURRENCY}, cache off; "
        "each side sets OpenTelemetry's global providers in its worker before the job: none "
        "(`off`, OpenTelemetry not imported), the SDK's tracer provider with a sampler keeping "
        "no span (`none sampled`) or every span, handed to an exporter that drops them (`all "
        "sampled`), and that with the SDK's meter provider (`+ metrics`). Client CPU as in "
        "scenario 1.\n\n" + table(headers, body)
    )
    return Section("11. telemetry", text)


RUNNERS: dict[str, Callable[[Bench, Sizes], Section]] = {
    "overhead": scenario_overhead,
    "latency-bound": scenario_latency,
    "duplicates": scenario_duplicates,
    "rerun": scenario_rerun,
    "rate limited": scenario_rate_limited,
    "faults": scenario_faults,
    "memory": scenario_memory,
    "send order": scenario_send_order,
    "sporadic hangs": scenario_sporadic_hangs,
    "dialects": scenario_dialects,
    "telemetry": scenario_telemetry,
}


# --------------------------------------------------------------------------------------------
# Header, profile, main


def versions() -> str:
    names = ("llm-ops", "openai", "polars", "duckdb", "aiohttp", "httpx2", "pyarrow")
    found = []
    for name in names:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def machine() -> str:
    memory = "?"
    with contextlib.suppress(OSError), open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 2**20:.1f} GiB RAM"
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores ({model}), {memory}, {platform.system()} {platform.release()}"


def source_state() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "llm_ops"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" + uncommitted changes in llm_ops/" if dirty else "")


def fingerprint(package: Path) -> str:
    """A digest of the package's Python sources, to tell whether they changed."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


@contextlib.contextmanager
def llm_ops_snapshot(scratch: Path) -> Iterator[str]:
    """Copy ``llm_ops/`` aside and make every child process (workers, endpoint) import the copy.

    A run takes minutes; the work tree may change meanwhile. Yields the copy's fingerprint.
    """
    copy = scratch / "src" / "llm_ops"
    shutil.copytree(REPO / "llm_ops", copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(copy.parent), before]))
    try:
        yield fingerprint(copy)
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def header(args: argparse.Namespace, sizes: Sizes, seconds: float, source: str, load: str) -> str:
    mode = "quick" if args.quick else "full"
    return (
        "# llm-ops benchmark results\n\n"
        "Generated by `python benchmarks/run.py"
        + (" --quick" if args.quick else "")
        + (f" --scale {args.scale:g}" if args.scale != 1 else "")
        + "`; regenerated by each run.\n\n"
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M UTC}\n"
        f"- machine: {machine()}\n"
        f"- Python {platform.python_version()}; {versions()}\n"
        f"- source: {source}\n"
        f"- mode: {mode}, scale {args.scale:g}, {sizes.reps} repetition(s) per side "
        f"({min(sizes.reps, SLOW_SCENARIO_REPS)} for faults, memory and sporadic hangs; medians "
        f"shown), total run time {seconds / 60:.1f} min\n"
        f"- load average (1, 5, 15 min) at the start: {load}; at the end: {load_average()} "
        "(other work on the machine disturbs the figures)\n"
        "- every measured side ran in a fresh process; the endpoint is the local simulator "
        "(`llm_ops.testing.LocalEndpoint`) in its own process on 127.0.0.1; baseline = "
        "`benchmarks/baseline.py` (AsyncOpenAI + Semaphore + gather, SDK defaults)\n"
    )


def run_profile(args: argparse.Namespace, sizes: Sizes) -> None:
    rows = sizes.overhead_rows
    source = source_state()
    with bench_setup() as (endpoint, scratch, snapshot):
        bench = Bench(endpoint, 1, scratch)
        result = bench.run(
            "overhead",
            "llm_ops",
            {
                "rows": rows,
                "concurrency": CONCURRENCY,
                "cache": bench.cache_file("profile"),
                "profile": True,
            },
            {},
        )
    text = (
        f"llm-ops client CPU profile: scenario 1 (overhead), llm_ops side under cProfile\n"
        f"date {datetime.now(UTC):%Y-%m-%d %H:%M UTC}; {machine()}; Python "
        f"{platform.python_version()}; {versions()}; source {source} (llm_ops sources "
        f"{snapshot})\n"
        f"{rows:,} distinct rows, zero-latency endpoint, concurrency {CONCURRENCY}, fresh "
        f"cache file. Under the profiler: wall {result['wall']:.2f} s, client CPU "
        f"{result['cpu_ms_per_request']:.2f} ms/request (profiling adds overhead; see "
        "RESULTS.md for unprofiled figures).\n"
        "Covers the calling thread and, apart, the client's event-loop thread and the "
        "asyncio.to_thread pool threads (planning, cache writes); DuckDB's own C++ threads "
        "are not visible to cProfile. Times are wall seconds per thread: the loop's idle time "
        "is select.epoll.poll, a pool thread's "
        "SimpleQueue.get.\n" + result["profile"]
    )
    out = Path(args.out) if args.out else PROFILE
    out.write_text(text)
    print(text)
    print(f"written to {out}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one repetition")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every size by this")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per side")
    parser.add_argument(
        "--out",
        default=None,
        help="results file (default: benchmarks/RESULTS.md; --quick writes none)",
    )
    parser.add_argument(
        "--only", default=None, help=f"comma-separated scenarios to run, of: {', '.join(SCENARIOS)}"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile scenario 1 for llm_ops; writes benchmarks/PROFILE.txt",
    )
    parser.add_argument(
        "--worker", nargs=3, metavar=("SCENARIO", "SIDE", "JSON"), help=argparse.SUPPRESS
    )
    return parser.parse_args(argv)


def selected(only: str | None) -> list[str]:
    if not only:
        return list(SCENARIOS)
    names = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in names if name not in RUNNERS]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)}")
    return names


@contextlib.contextmanager
def bench_setup() -> Iterator[tuple[LocalEndpoint, Path, str]]:
    """A scratch folder, a snapshot of llm_ops in it, and the endpoint (importing the copy)."""
    with tempfile.TemporaryDirectory(prefix="llm-ops-bench-") as folder:
        scratch = Path(folder)
        with llm_ops_snapshot(scratch) as snapshot, LocalEndpoint() as endpoint:
            yield endpoint, scratch, snapshot


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        scenario, side, params = args.worker
        result = run_worker(scenario, side, json.loads(params))
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0
    sizes = (QUICK if args.quick else FULL).scaled(args.scale)
    if args.reps is not None:
        sizes = replace(sizes, reps=max(1, args.reps))
    if args.profile:
        run_profile(args, sizes)
        return 0
    names = selected(args.only)
    source, load = source_state(), load_average()
    started = time.perf_counter()
    sections = []
    with bench_setup() as (endpoint, scratch, snapshot):
        source += f"; llm_ops sources {snapshot}, copied aside at the start and imported by every "
        source += "worker and the endpoint"
        if fingerprint(REPO / "llm_ops") != snapshot:
            raise SystemExit("llm_ops changed while it was being copied; run again")
        bench = Bench(endpoint, sizes.reps, scratch)
        for name in names:
            clock = time.perf_counter()
            section = RUNNERS[name](bench, sizes)
            section.body += "\n\n" + bench.disturbance(name)
            sections.append(section)
            print(section.markdown(), flush=True)
            print(f"({name}: {time.perf_counter() - clock:.0f} s)\n", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - started
    if fingerprint(REPO / "llm_ops") != snapshot:
        source += " (the work tree's llm_ops changed during the run: these figures are the copy's)"
    document = (
        header(args, sizes, seconds, source, load)
        + "\n"
        + "\n".join(section.markdown() for section in sections)
    )
    print(f"total run time {seconds:.0f} s", flush=True)
    if args.out or not args.quick:
        out = Path(args.out) if args.out else RESULTS
        out.write_text(document)
        print(f"written to {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
