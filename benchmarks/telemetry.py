"""Client CPU per request with OpenTelemetry off, imported, sampled out and sampled in.

Run: ``python benchmarks/telemetry.py [--requests N] [--repeats R]``. Prints a markdown table
of the client's CPU (all its threads) per request, the median of the repeats, for a job of N
distinct prompts against the local simulator (in its own process), with the cache off:

- ``off``: OpenTelemetry not imported (what a process that does not use it pays);
- ``imported``: imported, no tracer provider (its no-op tracer);
- ``none sampled``: the SDK's provider with a sampler that keeps nothing;
- ``all sampled``: every span kept and handed to an exporter that drops it (the SDK's
  processing, not a network's);
- ``all sampled + metrics``: that, and the SDK's meter provider reading the metrics.

Each run is a fresh worker process (``--worker MODE URL N``), as a job's process would be; the
modes alternate within each repeat.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

MODES = ("off", "imported", "none sampled", "all sampled", "all sampled + metrics")


def _configure(mode: str) -> None:
    """Set up OpenTelemetry as ``mode`` says, before llm-ops is imported."""
    if mode == "off":
        return
    from opentelemetry import trace

    if mode == "imported":
        return
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


def worker(mode: str, url: str, requests: int) -> None:
    """One measured job; prints the client's CPU microseconds per request."""
    _configure(mode)
    import polars as pl

    from llm_ops import Client

    frame = pl.DataFrame({"text": [f"review {i} ({mode})" for i in range(requests)]})
    with Client(endpoint=url, cache=False) as client:
        client.complete(frame.head(20), prompt="warm up {text}", model="sim")  # connections
        cpu = time.process_time()
        client.complete(frame, prompt="{text}", model="sim")
        cpu = time.process_time() - cpu
    print(f"RESULT {1e6 * cpu / requests:.1f}")


def _measure(mode: str, url: str, requests: int) -> float:
    done = subprocess.run(
        [sys.executable, __file__, "--worker", mode, url, str(requests)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return float(line.split()[1])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="distinct prompts a job")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each mode")
    parser.add_argument("--worker", nargs=3, metavar=("MODE", "URL", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        mode, url, requests = args.worker
        worker(mode, url, int(requests))
        return
    from llm_ops.testing import LocalEndpoint

    runs: dict[str, list[float]] = {mode: [] for mode in MODES}
    with LocalEndpoint() as endpoint:
        for _ in range(args.repeats):
            for mode in MODES:
                runs[mode].append(_measure(mode, endpoint.base_url, args.requests))
    off = statistics.median(runs["off"])
    print(f"{args.requests} distinct requests, cache off, median of {args.repeats} runs\n")
    print("| OpenTelemetry | client CPU µs/request | vs off |")
    print("| --- | ---: | ---: |")
    for mode in MODES:
        median = statistics.median(runs[mode])
        print(f"| {mode} | {median:.0f} | {median / off:.2f}x |")


if __name__ == "__main__":
    main()
