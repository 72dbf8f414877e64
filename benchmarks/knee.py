"""The knee: a job with ``concurrency`` unset against the best fixed concurrency, on servers
whose throughput stops rising (or falls) past some number of requests in flight.

    python benchmarks/knee.py              # about 30 s a side, writes benchmarks/KNEE.md
    python benchmarks/knee.py --quick      # a few seconds a side, prints only
    python benchmarks/knee.py --only gpu,llama.cpp
    python benchmarks/knee.py --curves     # the presets' curves under a raw client, and the
                                           # simulator's CPU per request

Servers: the simulator's presets (``llm_ops.testing.PRESETS``: ``gpu``, ``llama.cpp``,
``gpu-past-knee``), each in its own process, and a real llama.cpp (``llama-server --parallel 8``
with the tiny model of ``../shared/llama``, or ``LLAMA_SERVER`` / ``LLAMA_MODEL``; skipped with
a note when absent). On each, one side after another, each in a fresh process: ``llm_complete``
with ``concurrency`` unset (whatever the library does by default), with a fixed concurrency of
8, 32, 128 and 512 (and 1,024 on the GPU presets), and the plain loop at the seed's
``Semaphore(20)`` (``benchmarks/baseline.py``). Every side sends distinct prompts (review texts,
at most 400 characters) with ``max_tokens`` 16 and ``cache=False``, so all of them are sent.

Row counts: the default's run lasts about 30 s at the best fixed concurrency's rate (the
preset's modelled rate; on real llama.cpp, the rate of a short pilot at concurrency 8, its
slots). A fixed side or the loop whose modelled rate is lower sends fewer rows, as many as
last about as long, so a slow side does not take minutes (its rate is a steady state all the
same). Latency is per answered request, measured at the server from its arrival to its
answer, queueing included: the simulator's own stats, and for llama.cpp a stopwatch proxy in
front of it (``--proxy``, its own process). Retries are requests the server received beyond
one a row; timeouts are requests whose client hung up before the answer.

``llm_ops/`` is copied aside at the start and every worker and simulator imports the copy, as
``benchmarks/run.py`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import polars as pl
from baseline import complete_all
from run import (
    DATA,
    endpoint_cpu_seconds,
    fingerprint,
    fmt,
    hammer,
    llm_ops_snapshot,
    load_average,
    machine,
    machine_busy_seconds,
    source_state,
    table,
    versions,
)

from llm_ops import Endpoint, Sampling, llm_complete
from llm_ops.testing import PRESETS, LocalEndpoint, SimulatorConfig

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
KNEE = HERE / "KNEE.md"
LLAMA = REPO.parent / "shared" / "llama"
RESULT_PREFIX = "RESULT "
Result = dict[str, Any]

SIDE_SECONDS = 30.0  # the issue: long enough for a ramp-up to pay for itself, not forever
QUICK_SIDE_SECONDS = 3.0
CURVE_SECONDS = 10.0
FIXED = (8, 32, 128, 512)
GPU_FIXED = (*FIXED, 1024)
CURVES = {"gpu": GPU_FIXED, "gpu-past-knee": GPU_FIXED, "llama.cpp": (1, 4, 8, 16, 32)}
SEED_CONCURRENCY = 20  # the seed's plain loop: asyncio.Semaphore(20)
MAX_TOKENS = 16
MIN_ROWS = 40
MAX_PROMPT_CHARS = 400  # with the chat template, a prompt fits a 512-token llama.cpp slot
PARALLEL = 8
PILOT_ROWS, QUICK_PILOT_ROWS = 300, 80
SERVERS = ("gpu", "llama.cpp", "gpu-past-knee", "real llama.cpp")


def frame(rows: int) -> pl.DataFrame:
    """``rows`` distinct review texts, the same for every side: each cut to its first
    characters, then numbered (cut after, long reviews sampled twice would be one prompt)."""
    reviews = pl.read_parquet(DATA, columns=["text"])["text"].drop_nulls()
    sample = reviews.sample(rows, with_replacement=True, seed=0).str.slice(0, MAX_PROMPT_CHARS)
    numbered = pl.DataFrame({"review": sample}).with_row_index("row")
    return numbered.select(pl.format("{} (row {})", "review", "row").alias("text"))


# --------------------------------------------------------------------------------------------
# The worker: one side in a fresh process


def run_worker(params: dict[str, Any]) -> Result:
    side, rows = params["side"], params["rows"]
    data = frame(rows)
    result: Result = {"side": side, "rows": rows}
    seen: dict[str, Any] = {"max_concurrency": 0}

    def progress(snapshot: Any) -> None:
        seen["last"] = snapshot
        seen["max_concurrency"] = max(seen["max_concurrency"], snapshot.concurrency)

    busy = machine_busy_seconds()
    wall, cpu = time.perf_counter(), time.process_time()
    if side == "llm_ops":
        fixed = {"concurrency": params["concurrency"]} if params.get("concurrency") else {}
        _, report = llm_complete(
            data,
            prompt="{text}",
            model=params["model"],
            endpoint=Endpoint(params["base_url"], api_key="x"),
            sampling=Sampling(max_tokens=MAX_TOKENS),
            cache=False,
            progress=progress,
            return_report=True,
            **fixed,
        )
        result["failed_rows"] = report.failed_rows
        result["ok_rows"] = rows - report.failed_rows
        result["statuses"] = {k: v for k, v in report.statuses.items() if v}
        last = seen.get("last")
        result["concurrency_last"] = getattr(last, "concurrency", None)
        result["concurrency_max"] = seen["max_concurrency"] or None
        result["client_timeouts"] = getattr(last, "timeouts", None)
    elif side == "loop":
        answers, errors = asyncio.run(
            complete_all(
                data["text"].to_list(),
                base_url=params["base_url"],
                concurrency=params["concurrency"],
                model=params["model"],
                max_tokens=MAX_TOKENS,
            )
        )
        result["failed_rows"] = sum(error is not None for error in errors)
        result["ok_rows"] = sum(answer is not None for answer in answers)
    elif side == "raw":
        bodies = [
            json.dumps(
                {
                    "model": params["model"],
                    "messages": [{"role": "user", "content": text}],
                    "max_tokens": MAX_TOKENS,
                }
            ).encode()
            for text in data["text"]
        ]
        wall, cpu = time.perf_counter(), time.process_time()
        result["ok_rows"] = asyncio.run(hammer(params["base_url"], bodies, params["concurrency"]))
        result["failed_rows"] = rows - result["ok_rows"]
    else:
        raise SystemExit(f"unknown side {side!r}")
    result["wall"] = time.perf_counter() - wall
    result["cpu"] = time.process_time() - cpu
    result["machine_busy"] = machine_busy_seconds() - busy
    return result


def spawn(params: dict[str, Any]) -> Result:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(params)]
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=REPO, timeout=3600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"worker {params} exited {done.returncode}:\n{done.stderr[-4000:]}")
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result: Result = json.loads(line.removeprefix(RESULT_PREFIX))
            return result
    raise RuntimeError(f"worker {params} printed no result:\n{done.stdout[-2000:]}")


# --------------------------------------------------------------------------------------------
# The stopwatch proxy: per-request latency at a server that does not report it


def nearest_rank(values: Sequence[float], share: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(share * len(ordered))) - 1]


async def stopwatch(upstream: str) -> None:
    """Forward every request to ``upstream`` and time each chat completion from its arrival to
    its answer; ``/_sim/stats`` and ``/_sim/reset`` as on the simulator. A client that hangs up
    cancels the request upstream too (the connection closes), as it would without the proxy."""
    import aiohttp
    from aiohttp import web

    seconds: list[float] = []
    counts = {"requests": 0, "cancelled": 0, "in_flight": 0, "max_in_flight": 0}
    statuses: dict[str, int] = {}
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
    )

    async def forward(request: web.Request) -> web.StreamResponse:
        chat = request.path.endswith("/chat/completions")
        started = time.perf_counter()
        if chat:
            counts["requests"] += 1
            counts["in_flight"] += 1
            counts["max_in_flight"] = max(counts["max_in_flight"], counts["in_flight"])
        try:
            body = await request.read()
            headers = {
                name: request.headers[name]
                for name in ("Content-Type", "Authorization")
                if name in request.headers
            }
            async with session.request(
                request.method, upstream + request.path_qs, data=body, headers=headers
            ) as answer:
                payload = await answer.read()
                status = answer.status
                kind = answer.headers.get("Content-Type", "application/json")
        except asyncio.CancelledError:
            counts["cancelled"] += chat
            raise
        finally:
            counts["in_flight"] -= chat
        if chat:
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            if status == 200:
                seconds.append(time.perf_counter() - started)
        return web.Response(body=payload, status=status, headers={"Content-Type": kind})

    async def stats(request: web.Request) -> web.Response:
        summary = {"count": len(seconds)} | {
            name: nearest_rank(seconds, share) for name, share in (("p50", 0.5), ("p95", 0.95))
        }
        return web.json_response(
            {**counts, "by_status": statuses, "answer_seconds": summary}, dumps=json.dumps
        )

    async def reset(request: web.Request) -> web.Response:
        seconds.clear()
        statuses.clear()
        counts.update(requests=0, cancelled=0, max_in_flight=counts["in_flight"])
        return await stats(request)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/_sim/stats", stats)
    app.router.add_post("/_sim/reset", reset)
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"listening on http://127.0.0.1:{port}/v1", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await session.close()
        await runner.cleanup()


# --------------------------------------------------------------------------------------------
# Servers


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far."""
    with open(f"/proc/{pid}/stat") as stat:
        parts = stat.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def get_json(url: str) -> dict[str, Any]:
    request = urllib.request.Request(url)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as answer:
        found: dict[str, Any] = json.load(answer)
    return found


class Target(Protocol):
    """A server one side runs against: where it is, what it saw, the CPU it spent."""

    base_url: str

    def stats(self) -> dict[str, Any]: ...

    def cpu_seconds(self) -> float: ...


@dataclass
class Simulated:
    endpoint: LocalEndpoint

    @property
    def base_url(self) -> str:
        return self.endpoint.base_url

    def stats(self) -> dict[str, Any]:
        return self.endpoint.stats()

    def cpu_seconds(self) -> float:
        return endpoint_cpu_seconds(self.endpoint)


@dataclass
class Proxied:
    base_url: str
    pids: tuple[int, ...]

    def stats(self) -> dict[str, Any]:
        return get_json(self.base_url.removesuffix("/v1") + "/_sim/stats")

    def cpu_seconds(self) -> float:
        return sum(process_cpu_seconds(pid) for pid in self.pids)


def llama_paths() -> tuple[Path, Path]:
    binary = Path(os.environ.get("LLAMA_SERVER") or LLAMA / "llama-server")
    model = Path(os.environ.get("LLAMA_MODEL") or binary.with_name("tiny-llama.gguf"))
    return binary, model


def read_line(process: subprocess.Popen[str], pattern: str, timeout: float = 60) -> str:
    """The first match of ``pattern`` in the process's output, then its output is drained (a
    full pipe would stop it mid-run)."""
    assert process.stdout is not None
    found: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            match = re.search(pattern, line)
            if match:
                found.append(match.group(1))
                break

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if not found:
        process.kill()
        raise RuntimeError(f"{process.args!r} did not say {pattern!r}")
    threading.Thread(target=process.stdout.read, daemon=True).start()
    return found[0]


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def real_llama() -> Iterator[Proxied]:
    """A fresh ``llama-server --parallel 8`` behind the stopwatch proxy: no side inherits the
    last one's slots, KV cache or cancelled tasks."""
    binary, model = llama_paths()
    command = [
        str(binary), "-m", str(model), "--alias", "tiny", "--host", "127.0.0.1", "--port", "0",
        "--ctx-size", str(512 * PARALLEL), "--parallel", str(PARALLEL), "--threads", "1",
    ]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proxy: subprocess.Popen[str] | None = None
    try:
        root = read_line(server, r"listening on (http://127\.0\.0\.1:\d+)")
        for _ in range(200):
            try:
                get_json(root + "/health")
                break
            except OSError:
                time.sleep(0.05)
        proxy = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--proxy", root],
            stdout=subprocess.PIPE,
            text=True,
        )
        base_url = read_line(proxy, r"listening on (\S+)")
        yield Proxied(base_url, (server.pid, proxy.pid))
    finally:
        if proxy is not None:
            stop(proxy)
        stop(server)


# --------------------------------------------------------------------------------------------
# Running the sides of one server


@dataclass
class Side:
    label: str
    kind: str  # "llm_ops", "loop" or "raw"
    concurrency: int | None  # None: llm_complete's default
    rows: int
    modelled: float | None = None  # req/s of the preset's model at this concurrency


def measure(target: Target, side: Side, model: str) -> Result:
    """One side in a fresh worker, with what the server saw meanwhile."""
    before = target.cpu_seconds()
    result = spawn(
        {
            "side": side.kind,
            "rows": side.rows,
            "model": model,
            "base_url": target.base_url,
            "concurrency": side.concurrency,
        }
    )
    server_cpu = target.cpu_seconds() - before
    stats = target.stats()
    wall = max(result["wall"], 1e-9)
    latency = stats.get("answer_seconds", {})
    result |= {
        "label": side.label,
        "concurrency": side.concurrency,
        "modelled": side.modelled,
        "rate": result["ok_rows"] / wall,
        "p50": latency.get("p50", math.nan),
        "p95": latency.get("p95", math.nan),
        "retries": max(0, stats["requests"] - side.rows),
        "timeouts": stats.get("cancelled", 0),
        "max_in_flight": stats.get("max_in_flight"),
        "max_active": stats.get("max_active"),
        "server_cpu": server_cpu,
        "server_ms_per_request": 1000 * server_cpu / max(1, stats["requests"]),
        "other_load": max(0.0, result["machine_busy"] - result["cpu"] - server_cpu) / wall,
    }
    return result


def sides_for(fixed: Sequence[int], rows: int, config: SimulatorConfig | None) -> list[Side]:
    """The default, the fixed concurrencies and the seed's loop; a side the model says is
    slower than the best sends as many rows as last as long as the default's run."""

    def sized(concurrency: int) -> tuple[int, float | None]:
        if config is None:
            return rows, None
        modelled = config.modelled_throughput(concurrency) or 0.0
        best = max(config.modelled_throughput(c) or 0.0 for c in fixed)
        return min(rows, max(MIN_ROWS, round(rows * modelled / best))), modelled

    sides = [Side("llm_complete, concurrency unset (default)", "llm_ops", None, rows)]
    for concurrency in fixed:
        count, modelled = sized(concurrency)
        sides.append(
            Side(
                f"llm_complete, concurrency={concurrency}", "llm_ops", concurrency, count, modelled
            )
        )
    count, modelled = sized(SEED_CONCURRENCY)
    sides.append(
        Side(
            f"plain loop, Semaphore({SEED_CONCURRENCY})", "loop", SEED_CONCURRENCY, count, modelled
        )
    )
    return sides


def ratio_text(value: float, reference: float) -> str:
    if math.isnan(value) or math.isnan(reference) or reference <= 0:
        return "n/a"
    return f"{value / reference:.2f}"


@dataclass
class Outcome:
    """A server's section: its table and the default's figures against the goals."""

    title: str
    text: str


def report(title: str, intro: str, results: list[Result], slots: int | None) -> Outcome:
    fixed = [r for r in results if r["side"] == "llm_ops" and r["concurrency"]]
    best = max(fixed, key=lambda r: r["rate"])
    reference = min(
        (r for r in fixed if r["rate"] >= 0.9 * best["rate"]), key=lambda r: r["concurrency"]
    )
    headers = [
        "side",
        "rows",
        "wall s",
        "req/s",
        "model req/s",
        "p50 s",
        "p95 s",
        "retries",
        "timeouts",
        "failed rows",
        "server max in flight",
        "llm-ops concurrency (last / max)",
        "client CPU s",
        "others' load (cores)",
        "req/s / best fixed",
        f"p95 / p95 at {reference['concurrency']}",
    ]
    body = []
    for r in results:
        concurrency = (
            f"{r['concurrency_last']} / {r['concurrency_max']}"
            if r.get("concurrency_last") is not None
            else ""
        )
        body.append(
            [
                r["label"] + (" **(best)**" if r is best else ""),
                fmt(r["rows"]),
                fmt(r["wall"], 1),
                fmt(r["rate"], 1),
                fmt(r["modelled"], 1) if r["modelled"] is not None else "",
                fmt(r["p50"], 2),
                fmt(r["p95"], 2),
                fmt(r["retries"]),
                fmt(r["timeouts"]),
                fmt(r["failed_rows"]),
                fmt(r["max_in_flight"]) if r["max_in_flight"] is not None else "n/a",
                concurrency,
                fmt(r["cpu"], 1),
                fmt(r["other_load"], 2),
                ratio_text(r["rate"], best["rate"]),
                ratio_text(r["p95"], reference["p95"]),
            ]
        )
    default = results[0]
    share = default["rate"] / best["rate"]
    p95_ratio = default["p95"] / reference["p95"] if reference["p95"] > 0 else math.nan
    goals = [
        f"the default reached **{share:.2f}** of the best fixed concurrency's req/s "
        f"(concurrency {best['concurrency']}; goal ≥ 0.90: {'met' if share >= 0.9 else 'missed'})",
        f"its p95 latency is **{p95_ratio:.2f}x** that of concurrency {reference['concurrency']}, "
        "the smallest fixed concurrency reaching 0.9 of the best"
        + (
            f" (goal ≤ 3 on this {slots}-slot server: {'met' if p95_ratio <= 3 else 'missed'})"
            if slots is not None and slots <= PARALLEL
            else ""
        ),
        f"{default['retries']} retries, {default['timeouts']} timeouts and "
        f"{default['failed_rows']} failed rows",
    ]
    loads = [r["other_load"] for r in results if not math.isnan(r["other_load"])]
    text = (
        f"{intro}\n\n{table(headers, body)}\n\nWith `concurrency` unset, "
        + "; ".join(goals)
        + ".\n\n"
        + (
            f"Other processes used a median {statistics.median(loads):.2f} and at most "
            f"{max(loads):.2f} cores while these sides ran ({os.cpu_count()} cores in all)."
            if loads
            else ""
        )
    )
    return Outcome(title, text)


def seconds_text(value: float) -> str:
    return f"{value * 1000:g} ms" if value >= 1e-3 else f"{value * 1e6:g} µs"


def describe(config: SimulatorConfig, fixed: Sequence[int]) -> str:
    queued = (
        f" + {seconds_text(config.step_per_queued)} per queued request"
        if config.step_per_queued
        else ""
    )
    curve = ", ".join(f"{c} → {config.modelled_throughput(c) or 0:,.0f}" for c in fixed)
    loop = config.modelled_throughput(SEED_CONCURRENCY) or 0
    return (
        f"{config.slots} slots, decode steps of {seconds_text(config.step_base or 0)} + "
        f"{seconds_text(config.step_per_sequence)} per active request{queued}, "
        f"{MAX_TOKENS}-token answers. Modelled req/s by requests in flight: {curve} (and "
        f"{SEED_CONCURRENCY}, the plain loop's → {loop:,.0f})."
    )


def run_preset(name: str, side_seconds: float) -> Outcome:
    config = SimulatorConfig(**PRESETS[name])
    fixed = GPU_FIXED if (config.slots or 0) > PARALLEL else FIXED
    best = max(config.modelled_throughput(c) or 0.0 for c in fixed)
    rows = max(MIN_ROWS, round(side_seconds * best))
    results = []
    with LocalEndpoint(**PRESETS[name]) as endpoint:
        target = Simulated(endpoint)
        for side in sides_for(fixed, rows, config):
            endpoint.reset()
            results.append(measure(target, side, "sim"))
            print(f"  {name}: {side.label}: {results[-1]['rate']:.1f} req/s", file=sys.stderr)
    intro = (
        f"`LocalEndpoint(**PRESETS[{name!r}])`: {describe(config, fixed)} The default's run: "
        f"{rows:,} rows, about {side_seconds:g} s at the best modelled rate."
    )
    return report(f"{name} (simulator preset)", intro, results, config.slots)


def run_real_llama(side_seconds: float, quick: bool) -> Outcome:
    title = f"real llama.cpp (--parallel {PARALLEL})"
    binary, model = llama_paths()
    if not (binary.is_file() and os.access(binary, os.X_OK) and model.is_file()):
        return Outcome(title, f"Skipped: llama.cpp not found ({binary}, {model}).")
    pilot_rows = QUICK_PILOT_ROWS if quick else PILOT_ROWS
    with real_llama() as target:
        pilot = measure(target, Side("pilot", "llm_ops", PARALLEL, pilot_rows), "tiny")
    rows = max(MIN_ROWS, round(side_seconds * pilot["rate"]))
    results = []
    for side in sides_for(FIXED, rows, None):
        with real_llama() as target:
            results.append(measure(target, side, "tiny"))
        print(f"  llama.cpp: {side.label}: {results[-1]['rate']:.1f} req/s", file=sys.stderr)
    intro = (
        f"`llama-server --parallel {PARALLEL} --ctx-size {512 * PARALLEL} --threads 1` with "
        "`../shared/llama/tiny-llama.gguf` (4M parameters, random weights: answers of up to 16 "
        "tokens, about half stopping early), a fresh server per side, behind the stopwatch "
        "proxy. One thread: the server shares 2 cores with the client and the proxy. Rows per "
        f"side: {rows:,}, about {side_seconds:g} s at the rate of a pilot of {pilot_rows} rows "
        f"at concurrency {PARALLEL} ({pilot['rate']:.1f} req/s)."
    )
    return report(title, intro, results, PARALLEL)


# --------------------------------------------------------------------------------------------
# The presets' curves under a raw client


def run_curves(seconds: float) -> str:
    headers = [
        "preset",
        "in flight",
        "requests",
        "req/s",
        "model req/s",
        "measured / model",
        "p50 s",
        "p95 s",
        "max active",
        "simulator CPU ms/request",
        "client CPU ms/request",
    ]
    body = []
    for name in PRESETS:
        config = SimulatorConfig(**PRESETS[name])
        with LocalEndpoint(**PRESETS[name]) as endpoint:
            target = Simulated(endpoint)
            for concurrency in CURVES[name]:
                modelled = config.modelled_throughput(concurrency) or 0.0
                rows = max(2 * concurrency, round(seconds * modelled))
                endpoint.reset()
                r = measure(target, Side("raw", "raw", concurrency, rows, modelled), "sim")
                body.append(
                    [
                        name,
                        fmt(concurrency),
                        fmt(rows),
                        fmt(r["rate"]),
                        fmt(modelled),
                        ratio_text(r["rate"], modelled),
                        fmt(r["p50"], 2),
                        fmt(r["p95"], 2),
                        fmt(r["max_active"]),
                        fmt(r["server_ms_per_request"], 2),
                        fmt(1000 * r["cpu"] / rows, 2),
                    ]
                )
                print(f"  {name} at {concurrency}: {r['rate']:.0f} req/s", file=sys.stderr)
    return (
        "## The presets' curves\n\n"
        "A lean client (raw aiohttp, pre-encoded bodies, `run.py`'s `hammer`) keeps each number "
        f"of requests in flight for about {seconds:g} s (at least two rounds) against each "
        "preset; the model's rate is `SimulatorConfig.modelled_throughput`. A short run "
        "includes the first round's ramp and the last one's drain, so it lands a little under "
        "the model at high concurrency.\n\n" + table(headers, body) + "\n"
    )


# --------------------------------------------------------------------------------------------
# Main


def header(args: argparse.Namespace, seconds: float, source: str, load: str, side: float) -> str:
    return (
        "# The knee: concurrency unset against the best fixed concurrency\n\n"
        "Generated by `python benchmarks/knee.py"
        + (" --quick" if args.quick else "")
        + (f" --only {args.only}" if args.only else "")
        + (f" --seconds {args.seconds:g}" if args.seconds else "")
        + "`; regenerated by each run. Issue 35's acceptance: with `concurrency` unset, ≥ 0.9 "
        "of the best fixed concurrency's req/s on every server, and on the 8-slot servers a "
        "p95 latency ≤ 3x that of the smallest fixed concurrency already reaching 0.9 of the "
        "best, with no row failed or retried for a timeout.\n\n"
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M UTC}\n"
        f"- machine: {machine()}\n"
        f"- Python {sys.version.split()[0]}; {versions()}\n"
        f"- source: {source}\n"
        f"- about {side:g} s per side; total run time {seconds / 60:.1f} min\n"
        f"- load average (1, 5, 15 min) at the start: {load}; at the end: {load_average()} "
        "(the client, the server and anything else share the cores)\n"
        "- every side ran in a fresh process, one after another against the same server; "
        f"distinct prompts, `max_tokens={MAX_TOKENS}`, `cache=False`; req/s = rows answered / "
        "wall time of the call; latency per answered request at the server (arrival to answer, "
        "queueing included); retries = requests received beyond one a row; timeouts = requests "
        "whose client hung up before the answer; the plain loop = `benchmarks/baseline.py` "
        "(AsyncOpenAI + Semaphore + gather, the SDK's 2 retries)\n"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="a few seconds a side, prints only")
    parser.add_argument(
        "--only", default=None, help=f"comma-separated servers, of: {', '.join(SERVERS)}"
    )
    parser.add_argument(
        "--seconds", type=float, default=None, help="seconds a side (default 30, --quick 3)"
    )
    parser.add_argument("--curves", action="store_true", help="the presets' curves, raw client")
    parser.add_argument("--out", default=None, help="results file (default: benchmarks/KNEE.md)")
    parser.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    parser.add_argument("--proxy", metavar="UPSTREAM", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(RESULT_PREFIX + json.dumps(run_worker(json.loads(args.worker))), flush=True)
        return 0
    if args.proxy:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(stopwatch(args.proxy))
        return 0
    names = [n.strip() for n in (args.only or ",".join(SERVERS)).split(",") if n.strip()]
    unknown = [n for n in names if n not in SERVERS]
    if unknown:
        raise SystemExit(f"unknown server(s) {unknown}; choose from {', '.join(SERVERS)}")
    side_seconds = args.seconds or (QUICK_SIDE_SECONDS if args.quick else SIDE_SECONDS)
    source, load, started = source_state(), load_average(), time.perf_counter()
    sections = []
    with (
        tempfile.TemporaryDirectory(prefix="llm-ops-knee-") as folder,
        llm_ops_snapshot(Path(folder)) as snapshot,
    ):
        source += f"; llm_ops sources {snapshot}, copied aside and imported by every process"
        if args.curves:
            curve_seconds = QUICK_SIDE_SECONDS if args.quick else CURVE_SECONDS
            text = run_curves(args.seconds or curve_seconds)
            print(text, flush=True)
            return 0
        for name in names:
            clock = time.perf_counter()
            if name == "real llama.cpp":
                outcome = run_real_llama(side_seconds, args.quick)
            else:
                outcome = run_preset(name, side_seconds)
            section = f"## {outcome.title}\n\n{outcome.text.strip()}\n"
            sections.append(section)
            print(section, flush=True)
            print(f"({name}: {time.perf_counter() - clock:.0f} s)\n", file=sys.stderr)
    seconds = time.perf_counter() - started
    if fingerprint(REPO / "llm_ops") != snapshot:
        source += " (the work tree's llm_ops changed during the run: these figures are the copy's)"
    document = header(args, seconds, source, load, side_seconds) + "\n" + "\n".join(sections)
    print(f"total run time {seconds:.0f} s", flush=True)
    if args.out or not args.quick:
        out = Path(args.out) if args.out else KNEE
        out.write_text(document)
        print(f"written to {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
