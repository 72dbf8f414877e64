"""Resolve: the blocked plan against every pair judged, on the simulator's world.

Rows are company names written several ways, each carrying its true entity as a latent fact
(``[entity=17]``): the simulator's judge answers pair checks from those facts, wrong with
probability ``judge_error``, and ``sim-embed`` puts one entity's names near each other. Quality
is read against that truth: pairwise precision, recall and F1 (a pair of rows is predicted
when they share an output entity), and the output entities holding rows of two or more true
entities ("mixed").

Judging all pairs of 5,000 rows is 12,497,500 calls, too many to run: the naive plan is
measured at a smaller size side by side with the blocked one, and the blocked plan alone at
the issue's size (5,000 rows of 1,000 entities, judge error 0.02).

Run: ``python -m benchmarks.setops_resolve [--quick]``.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter

import polars as pl

from llm_ops import llm_resolve
from llm_ops.testing import LocalEndpoint

TITLE = "Resolve: blocking + corroborated union-find vs all pairs"
JUDGE_ERROR = 0.02
SEED = 7
MAX_SHARE = 0.02
MIN_F1 = 0.95

_STEMS = [
    "acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka", "tyrell",
    "cyberdyne", "soylent", "oscorp", "gringotts", "vandelay", "pied", "piper", "aperture",
    "black", "mesa", "massive", "dynamic", "virtucon", "monarch", "sterling", "cooper",
    "dunder", "mifflin", "prestige", "worldwide", "north", "central", "pacific", "atlantic",
]  # fmt: skip
_SUFFIXES = ["Inc.", "Inc", "Incorporated", "Corp.", "Corporation", "LLC", "Ltd", "Co.", "Group"]


def companies(rows: int, entities: int, *, seed: int) -> pl.DataFrame:
    """``rows`` names of ``entities`` companies (each at least once), written several ways,
    with the true entity as a fact and as a column."""
    draws = random.Random(seed)
    names = [
        " ".join(draws.sample(_STEMS, 2)).title() + f" {draws.randrange(100, 999)}"
        for _ in range(entities)
    ]
    truth = list(range(entities)) + [draws.randrange(entities) for _ in range(rows - entities)]
    draws.shuffle(truth)
    texts = []
    for entity in truth:
        name = names[entity]
        if draws.random() < 0.5:
            name = name.upper() if draws.random() < 0.5 else name.lower()
        texts.append(f"{name} {draws.choice(_SUFFIXES)} [entity={entity}]")
    return pl.DataFrame({"name": texts, "truth": truth})


def _pairs(sizes: Counter[object]) -> int:
    return sum(n * (n - 1) // 2 for n in sizes.values())


def quality(truth: list[int], predicted: list[int | None]) -> tuple[float, float, float, int]:
    """Pairwise precision, recall and F1 against the truth, and the mixed output entities."""
    together = _pairs(Counter(zip(truth, predicted, strict=True)))
    said, true = _pairs(Counter(predicted)), _pairs(Counter(truth))
    precision = together / said if said else 1.0
    recall = together / true if true else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    entities_of: dict[object, set[int]] = {}
    for t, p in zip(truth, predicted, strict=True):
        entities_of.setdefault(p, set()).add(t)
    mixed = sum(1 for found in entities_of.values() if len(found) > 1)
    return precision, recall, f1, mixed


def _run(endpoint: LocalEndpoint, frame: pl.DataFrame, plan: str, *, target: bool) -> list[object]:
    endpoint.reset()
    started = time.perf_counter()
    resolved, report = llm_resolve(
        frame,
        "name",
        model="sim",
        embedding_model="sim-embed",
        plan=plan,  # type: ignore[arg-type]
        seed=SEED,
        endpoint=endpoint.base_url,
        cache=False,
        concurrency=64,
        return_report=True,
    )
    wall = time.perf_counter() - started
    rows = frame.height
    all_pairs = rows * (rows - 1) // 2
    calls = report.requests_sent
    precision, recall, f1, mixed = quality(frame["truth"].to_list(), resolved["entity"].to_list())
    share = calls / all_pairs
    holds = share <= MAX_SHARE and f1 >= MIN_F1 and mixed == 0
    return [
        report.plan,
        f"{rows} rows / {frame['truth'].n_unique()} entities",
        calls,
        f"{share:.2%}",
        report.waves,
        round(wall, 1),
        round(precision, 3),
        round(recall, 3),
        round(f1, 3),
        mixed,
        ("yes" if holds else "no") if target else "n/a (the target is at 5,000 rows)",
    ]


def measure(*, quick: bool) -> tuple[list[str], list[list[object]]]:
    """The naive and blocked plans side by side at a small size, and the blocked plan alone
    at the issue's size (a smaller one with ``quick``)."""
    header = [
        "plan",
        "size",
        "calls",
        "of all pairs",
        "waves",
        "wall s",
        "precision",
        "recall",
        "F1",
        "mixed",
        "target holds",
    ]
    small = companies(120 if quick else 300, 24 if quick else 60, seed=SEED)
    large = companies(1000 if quick else 5000, 200 if quick else 1000, seed=SEED)
    with LocalEndpoint(judge_error=JUDGE_ERROR, seed=SEED) as endpoint:
        rows = [
            _run(endpoint, small, "all_pairs", target=False),
            _run(endpoint, small, "blocking", target=False),
            _run(endpoint, large, "blocking", target=True),
        ]
    return header, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=TITLE)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, well under a minute")
    header, rows = measure(quick=parser.parse_args().quick)
    table = [header, *[[str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[k]) for row in table) for k in range(len(header))]
    for k, row in enumerate(table):
        print(" | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if k == 0:
            print("-+-".join("-" * width for width in widths))


if __name__ == "__main__":
    main()
