"""Top-k on the simulator's world: all pairs (the naive plan) against batched quickselect
(random pivots, and pivots from embedding order) and the listwise tournament, on the same
items, seed and judge error, with recall@k and nDCG@k against the latent scores.

Issue 48's target, at N = 1,000, k = 10, judge error 0.05: comparisons at most
3.4·N + 2·k·ln k, at most 2·log2(N) waves, recall@10 at least 0.95 of all pairs'. All pairs at
N = 1,000 is 499,500 calls (about ten minutes on the simulator), so the full run measures it
at N = 500, and quickselect beside it on the same 500 items; ``python benchmarks/setops_topk.py
[--quick]`` prints the table.
"""

from __future__ import annotations

import argparse
import math
import random
import time

import polars as pl

from llm_ops import llm_top_k
from llm_ops.testing import LocalEndpoint

TITLE = "Top-k: all pairs vs batched quickselect vs listwise (judge error 0.05)"
K = 10
ERROR = 0.05
CRITERION = "Which is best?"
WORDS = [
    "soft",
    "fabric",
    "colour",
    "fit",
    "arrived",
    "late",
    "early",
    "great",
    "poor",
    "sturdy",
    "cheap",
    "handle",
    "zipper",
    "stitching",
    "warm",
    "light",
    "heavy",
    "bright",
    "dull",
    "size",
]


def items(n: int, seed: int = 0) -> tuple[pl.DataFrame, list[float]]:
    """``n`` items with latent scores and a few words each (the embeddings' noise)."""
    draw = random.Random(seed)
    scores = [round(draw.random(), 4) for _ in range(n)]
    texts = [
        f"Item {i}: {' '.join(draw.sample(WORDS, 4))} [score={s}]" for i, s in enumerate(scores)
    ]
    return pl.DataFrame({"id": list(range(n)), "text": texts}), scores


def quality(chosen: list[int], scores: list[float], k: int) -> tuple[float, float]:
    """recall@k and nDCG@k (gain: the latent score) of ``chosen``, best first."""
    truth = sorted(range(len(scores)), key=lambda i: -scores[i])[:k]
    recall = len(set(chosen[:k]) & set(truth)) / k
    dcg = sum(scores[item] / math.log2(i + 2) for i, item in enumerate(chosen[:k]))
    ideal = sum(scores[item] / math.log2(i + 2) for i, item in enumerate(truth))
    return recall, dcg / ideal if ideal else 0.0


def run_plan(
    endpoint: LocalEndpoint, df: pl.DataFrame, method: str, embedding: str | None, seed: int
) -> tuple[list[int], int, int, float]:
    endpoint.reset()
    started = time.perf_counter()
    out, report = llm_top_k(
        df,
        "text",
        CRITERION,
        k=K,
        model="sim",
        method=method,  # type: ignore[arg-type]
        embedding_model=embedding,
        seed=seed,
        endpoint=endpoint.base_url,
        cache=False,
        return_report=True,
    )
    wall = time.perf_counter() - started
    judged = endpoint.stats()["judged"]
    return (
        out["id"].to_list(),
        int(judged["comparison"] + judged["ranking"]),
        report.waves or 0,
        wall,
    )


def measure(*, quick: bool) -> tuple[list[str], list[list[object]]]:
    """Each plan on the same items and judge error; the cheaper plans over several seeds (of
    the items, the pivots and the order pairs are shown in): mean calls, wall time, recall
    and nDCG, and the most waves."""
    header = [
        "plan",
        "N",
        "seeds",
        "calls",
        "waves (max)",
        "wall s",
        "recall@10",
        "nDCG@10",
        "target",
    ]
    rows: list[list[object]] = []
    small, large = (120, 400) if quick else (500, 1000)
    seeds = 3 if quick else 5
    with LocalEndpoint(judge_error=ERROR) as endpoint:
        baseline: dict[int, float] = {}
        for n, plans in (
            (small, [("all_pairs", None), ("quickselect", None), ("quickselect", "sim-embed")]),
            (large, [("quickselect", None), ("quickselect", "sim-embed"), ("listwise", None)]),
        ):
            for method, embedding in plans:
                runs = 1 if method == "all_pairs" else seeds
                measured = []
                for seed in range(runs):
                    df, scores = items(n, seed)
                    chosen, calls, waves, wall = run_plan(endpoint, df, method, embedding, seed)
                    measured.append((calls, waves, wall, *quality(chosen, scores, K)))
                calls = sum(m[0] for m in measured) / runs
                waves = max(m[1] for m in measured)
                wall = sum(m[2] for m in measured) / runs
                recall = sum(m[3] for m in measured) / runs
                ndcg = sum(m[4] for m in measured) / runs
                name = method + (" + embedding pivots" if embedding else "")
                if method == "all_pairs":
                    baseline[n] = recall
                    target = "baseline"
                else:
                    reference = baseline.get(n, baseline.get(small, 1.0))
                    holds = {
                        "calls": calls <= 3.4 * n + 2 * K * math.log(K),
                        "waves": waves <= 2 * math.log2(n),
                        "recall": recall >= 0.95 * reference,
                    }
                    failed = [what for what, ok in holds.items() if not ok]
                    target = "yes" if not failed else "no: " + ", ".join(failed)
                    if method == "listwise":
                        target += " (calls are rankings of 20)"
                rows.append(
                    [
                        name,
                        n,
                        runs,
                        round(calls),
                        waves,
                        round(wall, 1),
                        round(recall, 3),
                        round(ndcg, 3),
                        target,
                    ]
                )
    return header, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
    header, rows = measure(quick=parser.parse_args().quick)
    print(TITLE)
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")


if __name__ == "__main__":
    main()
