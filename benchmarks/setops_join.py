"""llm_join's plans side by side on the simulator's world: the nested loop, the embedding
cascade and the classification rewrite, on the same data, seed and judge error.

The world: reviews (left) and products (right), each carrying its product's latent
``[entity=k]``; a review is about exactly one product (drawn with replacement, so some products
have several reviews and some none): n_left true pairs. The judge errs on 5% of its
judgments. Quality is measured against the latent truth, not the judge. The cascade runs on
the simulator's default embeddings (``embed_noise`` 0.3) and on noisier ones (1.0), where
the embedding ranks the matches less cleanly and the band between the thresholds grows.

Run alone: ``python benchmarks/setops_join.py [--quick]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import polars as pl

from llm_ops import llm_join
from llm_ops.testing import LocalEndpoint

TITLE = "join: nested loop vs embedding cascade vs classification (llm_join)"

JUDGE_ERROR = 0.05
PREDICATE = "Is the review {review} about the product {product}?"
WORDS = [
    "sturdy",
    "warm",
    "cheap",
    "bright",
    "heavy",
    "soft",
    "loud",
    "quiet",
    "tiny",
    "huge",
    "red",
    "blue",
    "green",
    "old",
    "new",
    "fast",
    "slow",
    "smooth",
    "rough",
    "light",
    "dark",
    "sharp",
    "dull",
    "clean",
]


def world(n_left: int, n_right: int, seed: int) -> tuple[pl.DataFrame, pl.DataFrame, set[Any]]:
    """Reviews and products with their true pairs, as (review id, product id)."""
    draw = random.Random(seed)
    products = pl.DataFrame(
        {
            "product_id": list(range(n_right)),
            "product": [
                f"{' '.join(draw.sample(WORDS, 2))} product [entity={k}]" for k in range(n_right)
            ],
        }
    )
    about = [draw.randrange(n_right) for _ in range(n_left)]
    reviews = pl.DataFrame(
        {
            "review_id": list(range(n_left)),
            "review": [f"review, {' '.join(draw.sample(WORDS, 3))} [entity={k}]" for k in about],
        }
    )
    return reviews, products, set(enumerate(about))


def run(
    endpoint: LocalEndpoint,
    n_left: int,
    n_right: int,
    seed: int,
    *,
    embed_noise: float = 0.3,
    **arguments: Any,
) -> dict[str, Any]:
    """One join: its calls, waves, wall time and quality against the truth."""
    reviews, products, truth = world(n_left, n_right, seed)
    endpoint.configure(judge_error=JUDGE_ERROR, seed=seed, embed_noise=embed_noise)
    endpoint.reset()
    started = time.perf_counter()
    joined, report = llm_join(
        reviews,
        products,
        PREDICATE,
        model="sim",
        seed=seed,
        endpoint=endpoint.base_url,
        cache=False,
        return_report=True,
        **arguments,
    )
    wall = time.perf_counter() - started
    found = set(zip(joined["review_id"].to_list(), joined["product_id"].to_list(), strict=True))
    hits = len(found & truth)
    recall, precision = hits / len(truth), hits / max(len(found), 1)
    f1 = 2 * recall * precision / max(recall + precision, 1e-12)
    return {
        "plan": report.plan,
        "calls": report.requests_sent,
        "waves": report.waves,
        "wall": wall,
        "recall": recall,
        "precision": precision,
        "f1": f1,
    }


def _row(name: str, size: str, r: dict[str, Any], target: str) -> list[object]:
    return [
        name,
        size,
        f"{r['calls']:,}",
        r["waves"],
        f"{r['wall']:.1f}",
        f"{r['recall']:.3f}",
        f"{r['precision']:.3f}",
        f"{r['f1']:.3f}",
        target,
    ]


def measure(*, quick: bool) -> tuple[list[str], list[list[object]]]:
    """The table: the nested loop and the cascade on n x n, the classification rewrite and
    the nested loop on n x few; the targets are the issue's (for 500 x 500 and 500 x 100)."""
    n, few, seeds = (120, 30, 3) if quick else (500, 100, 20)
    header = ["plan", "size", "calls", "waves", "wall s", "recall", "precision", "F1", "target"]
    rows: list[list[object]] = []
    with LocalEndpoint() as endpoint:
        nested = run(endpoint, n, n, 0, plan="nested")
        rows.append(_row("nested", f"{n}x{n}", nested, "baseline"))
        for embed_noise in (0.3, 1.0):
            cascades = [
                run(
                    endpoint,
                    n,
                    n,
                    seed,
                    embed_noise=embed_noise,
                    plan="cascade",
                    embedding_model="sim-embed",
                )
                for seed in range(seeds)
            ]
            good = [
                c
                for c in cascades
                if c["recall"] >= 0.9
                and c["precision"] >= 0.9
                and c["calls"] * 50 <= nested["calls"]
            ]
            first = cascades[0]
            noted = "" if embed_noise == 0.3 else f", embed_noise {embed_noise}"
            rows.append(
                _row(
                    f"cascade, seed 0{noted}",
                    f"{n}x{n}",
                    first,
                    f"{nested['calls'] / first['calls']:.0f}x fewer calls",
                )
            )
            summary = {
                "calls": max(c["calls"] for c in cascades),
                "waves": max(c["waves"] for c in cascades),
                "wall": statistics.mean(c["wall"] for c in cascades),
                "recall": min(c["recall"] for c in cascades),
                "precision": min(c["precision"] for c in cascades),
                "f1": min(c["f1"] for c in cascades),
            }
            needed = seeds - seeds // 20
            verdict = "yes" if len(good) >= needed else "no"
            if quick:  # the sample alone is more than 1/50 of a small nested loop
                verdict = "n/a below 500x500"
            rows.append(
                _row(
                    f"cascade, worst of {seeds} seeds{noted}",
                    f"{n}x{n}",
                    summary,
                    f"{len(good)}/{seeds} seeds >= 0.9 and 50x: {verdict}",
                )
            )
        nested_few = run(endpoint, n, few, 0, plan="nested")
        rows.append(_row("nested", f"{n}x{few}", nested_few, "baseline"))
        classify = run(endpoint, n, few, 0, plan="classify")
        ratio = nested_few["calls"] / max(classify["calls"], 1)
        rows.append(
            _row(
                "classify",
                f"{n}x{few}",
                classify,
                f"{ratio:.0f}x fewer calls: {'yes' if ratio >= 15 else 'no'}",
            )
        )
    return header, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=TITLE)
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    quick = parser.parse_args().quick
    header, rows = measure(quick=quick)
    print(f"## {TITLE}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")


if __name__ == "__main__":
    main()
