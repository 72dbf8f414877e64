"""CPU per call of ``canonical_json`` and ``request_key``: orjson's fast path against ``json``.

Run: ``python benchmarks/keys.py [--texts N] [--repeats R]``. Prints a markdown table of
microseconds of process CPU per call (best of the repeats), for the requests a job builds from
real review texts: a bare prompt, a system message with sampling parameters, structured output
(a pydantic schema) and an embedding. ``json`` is the canonical form by definition (what keys
were hashed from before orjson); every output is checked to be byte for byte the same.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

import polars as pl
from pydantic import BaseModel

from llm_ops import canonical_json, request_key

ENDPOINT = "https://api.openai.com/v1"
SYSTEM = "You are a careful annotator."


class Review(BaseModel):
    sentiment: str
    score: float
    topics: list[str]


def json_canonical(value: Any) -> str:
    """The canonical form by definition (docs/cache.md, "Keys"): what keys are hashed from."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def chat(prompt: str, *, system: str | None = None, **params: Any) -> dict[str, Any]:
    """A request object of the documented form (docs/cache.md): parameters, endpoint, model,
    messages."""
    messages = [{"role": "user", "content": prompt}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return {**params, "endpoint": ENDPOINT, "model": "gpt-4o-mini", "messages": messages}


def requests(texts: list[str]) -> dict[str, list[dict[str, Any]]]:
    schema = {
        "type": "json_schema",
        "json_schema": {"name": "Review", "schema": Review.model_json_schema(), "strict": True},
    }
    sampling = {"temperature": 0.0, "top_p": 0.9, "max_tokens": 64, "seed": 1}
    return {
        "prompt only": [chat(f"Classify: {t}") for t in texts],
        "system + sampling": [chat(f"Classify: {t}", system=SYSTEM, **sampling) for t in texts],
        "structured output": [
            chat(f"Classify: {t}", temperature=0.2, response_format=schema) for t in texts
        ],
        "embedding": [
            {"endpoint": ENDPOINT, "model": "text-embedding-3-small", "input": t} for t in texts
        ],
    }


def json_key(request: dict[str, Any]) -> str:
    return "v1:" + hashlib.sha256(json_canonical(request).encode()).hexdigest()


def cpu_per_call(function: Callable[[Any], object], values: list[Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for value in values:
            function(value)
        best = min(best, (time.process_time() - started) / len(values))
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--texts", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    frame = pl.read_parquet("data/womens_clothing_reviews.parquet")
    texts = frame["text"].drop_nulls().head(args.texts).to_list()
    print(
        "| request | chars | json µs | canonical_json µs | speed-up | "
        "json key µs | request_key µs | speed-up |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, values in requests(texts).items():
        assert all(canonical_json(v) == json_canonical(v) for v in values), name
        assert all(request_key(v) == json_key(v) for v in values), name
        chars = sum(len(json_canonical(v)) for v in values) // len(values)
        before = cpu_per_call(json_canonical, values, args.repeats)
        after = cpu_per_call(canonical_json, values, args.repeats)
        key_before = cpu_per_call(json_key, values, args.repeats)
        key_after = cpu_per_call(request_key, values, args.repeats)
        print(
            f"| {name} | {chars} | {before:.2f} | {after:.2f} | {before / after:.1f}x | "
            f"{key_before:.2f} | {key_after:.2f} | {key_before / key_after:.1f}x |"
        )


if __name__ == "__main__":
    main()
