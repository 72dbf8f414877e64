"""Send order on a real llama.cpp server: the same job in input order and in prefix order.

    python benchmarks/llama_send_order.py [--rows N] [--parallel 4] [--reps 3]

Needs ``../shared/llama/llama-server`` and its tiny model (or ``LLAMA_SERVER`` /
``LLAMA_MODEL``); prints a markdown table. llama.cpp keeps each slot's last prompt in its KV
cache and gives a request the slot sharing the longest prefix (``cache_prompt``), so prompt
tokens it did not have to compute are the ones reused. Figures are the server's own: the
prompt tokens it evaluated (``/metrics`` ``llamacpp:prompt_tokens_total``) against the prompt
tokens the answers were billed (``usage``), and what it reported as cached
(``usage.prompt_tokens_details.cached_tokens``), with the wall time of the call.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from llm_ops import Endpoint, Sampling

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import SEND_ORDER_LAYOUTS, send_order_frame  # noqa: E402

from llm_ops import llm_complete  # noqa: E402

LLAMA = HERE.parent.parent / "shared" / "llama"
MAX_REVIEW_CHARS = 400  # with the instruction, a prompt fits one slot of a 2,048 context / 4


@contextmanager
def llama_server(parallel: int) -> Iterator[str]:
    """A llama-server on a free loopback port; yields its root URL."""
    binary = Path(os.environ.get("LLAMA_SERVER") or LLAMA / "llama-server")
    model = Path(os.environ.get("LLAMA_MODEL") or LLAMA / "tiny-llama.gguf")
    if not binary.exists() or not model.exists():
        raise SystemExit(f"llama.cpp not found ({binary}); set LLAMA_SERVER and LLAMA_MODEL")
    command = [
        str(binary), "-m", str(model), "--alias", "tiny", "--host", "127.0.0.1", "--port", "0",
        "--ctx-size", str(512 * parallel), "--parallel", str(parallel), "--threads", "1",
        "--metrics",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            if found:
                root = found.group(1)
                break
        else:
            raise SystemExit("llama-server exited before listening")
        # keep reading its log: a full pipe would stop the server mid-job
        threading.Thread(target=process.stdout.read, daemon=True).start()
        for _ in range(200):
            try:
                urllib.request.urlopen(root + "/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.05)
        yield root
    finally:
        process.terminate()
        process.wait(timeout=10)


def evaluated_prompt_tokens(root: str) -> float:
    text = urllib.request.urlopen(root + "/metrics", timeout=5).read().decode()
    found = re.search(r"^llamacpp:prompt_tokens_total (\S+)", text, re.MULTILINE)
    return float(found.group(1)) if found else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    frame = send_order_frame(args.rows).with_columns(pl.col("text").str.slice(0, MAX_REVIEW_CHARS))
    print(
        f"{frame.height} reviews, llama.cpp with --parallel {args.parallel} and concurrency "
        f"{args.parallel}, max_tokens 4, cache=False; median of {args.reps}.\n"
    )
    print(
        "| layout | send order | billed prompt tokens | evaluated prompt tokens | reused | "
        "reported cached | wall s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for layout, template in SEND_ORDER_LAYOUTS.items():
        figures: dict[str, list[tuple[float, float, float, float]]] = {}
        for rep in range(args.reps):
            for order in ("input", "prefix") if rep % 2 == 0 else ("prefix", "input"):
                # a fresh server per run: its prompt cache would otherwise carry the last run's
                with llama_server(args.parallel) as root:
                    started = time.perf_counter()
                    _, report = llm_complete(
                        frame,
                        prompt=template,
                        model="tiny",
                        endpoint=Endpoint(root + "/v1", api_key="x"),
                        sampling=Sampling(max_tokens=4),
                        cache=False,
                        concurrency=args.parallel,
                        send_order=order,
                        progress=False,
                        return_report=True,
                    )
                    wall = time.perf_counter() - started
                    evaluated = evaluated_prompt_tokens(root)
                figures.setdefault(order, []).append(
                    (report.prompt_tokens, evaluated, report.cached_tokens, wall)
                )
        for order, runs in figures.items():
            billed, evaluated, cached, wall = (
                statistics.median(run[i] for run in runs) for i in range(4)
            )
            print(
                f"| {layout} | {order} | {billed:,.0f} | {evaluated:,.0f} | "
                f"{1 - evaluated / billed:.0%} | {cached:,.0f} | {wall:.2f} |"
            )


if __name__ == "__main__":
    main()
