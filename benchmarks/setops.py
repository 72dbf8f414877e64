"""Operators over sets of rows, side by side with their naive plans, against a known truth.

    python benchmarks/setops.py [--quick] [--only topk,join] [--out benchmarks/SETOPS.md]

Each operator runs in a simulator world (``docs/simulator.md``, "A world with known truth"):
texts carry latent facts (``[score=0.83]``, ``[entity=17]``), the simulator's judge answers
comparisons, predicates, rankings and folds from them with a set error rate, and ``sim-embed``
puts texts of one entity near each other. So every plan's quality is measured against the truth,
and its calls, waves (rounds of judgments sent together) and wall time side by side with the
naive plan's on the same data, seed and error rate:

- **aggregate**: the tree fold, every group's level in one wave, against folding group by group;
- **top-k**: batched quickselect and listwise windows, against comparing all pairs;
- **join**: the cascade and the classification rewrite, against the nested loop;
- **resolve**: blocking, pairwise checks and a cautious union-find, against judging all pairs.

Each section is a module beside this one (``setops_<operator>.py``) with ``TITLE`` and
``measure(quick=...)``; ``--quick`` runs each at a size that takes seconds, the default at the
issue's target sizes (minutes). The tables are printed and, with ``--out``, written to a file.
"""

from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path

SECTIONS = ("setops_aggregate", "setops_topk", "setops_join", "setops_resolve")


def markdown(header: list[str], rows: list[list[object]]) -> str:
    """A markdown table: numbers right-aligned, floats to three significant places."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return str(value)

    align = [
        "---:" if rows and isinstance(rows[0][i], int | float) else "---"
        for i in range(len(header))
    ]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a run of a few minutes")
    parser.add_argument(
        "--only", default="", help="comma-separated sections: aggregate, topk, join, resolve"
    )
    parser.add_argument("--out", type=Path, help="also write the tables to this markdown file")
    arguments = parser.parse_args()
    wanted = {name.strip() for name in arguments.only.split(",") if name.strip()}
    report = ["# Set operators against their naive plans", ""]
    for name in SECTIONS:
        if wanted and name.removeprefix("setops_") not in wanted:
            continue
        section = importlib.import_module(name)
        started = time.perf_counter()
        header, rows = section.measure(quick=arguments.quick)
        text = f"## {section.TITLE}\n\n{markdown(header, rows)}\n\n"
        kind = "quick" if arguments.quick else "full"
        text += f"({kind} run, {time.perf_counter() - started:.0f} s)\n"
        print(text, flush=True)
        report.append(text)
    if arguments.out is not None:
        arguments.out.write_text("\n".join(report))


if __name__ == "__main__":
    main()
