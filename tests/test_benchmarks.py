"""The benchmark scripts run end to end at a tiny size and print their tables.

The two longest (every scenario of ``run.py``, and ``knee.py``) are marked ``benchmark`` and
left out of the default run, which must stay under 6 minutes on 2 cores: ``pytest -m
benchmark`` runs them. The default run keeps one cheap scenario of ``run.py``, so that the
harness every scenario shares is exercised on each change.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
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


def _quick_benchmark(out: Path, *only: str) -> subprocess.CompletedProcess[str]:
    scenarios = ["--only", ",".join(only)] if only else []
    command = ["--quick", "--scale", "0.02", "--reps", "1", "--out", str(out), *scenarios]
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "run.py"), *command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_quick_benchmark_prints_a_scenario_and_writes_the_results(tmp_path: Path) -> None:
    done = _quick_benchmark(tmp_path / "r.md", "duplicates")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "## 3. duplicates\n" in done.stdout  # numbered as in a full run
    assert (tmp_path / "r.md").read_text().startswith("# llm-ops benchmark results")


@pytest.mark.benchmark
def test_quick_benchmark_runs_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    done = _quick_benchmark(out)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in SCENARIOS:
        section = re.search(
            rf"^## \d+\. {re.escape(name)}\n\n.*?\n\n\| ", done.stdout, re.MULTILINE | re.DOTALL
        )
        assert section, f"no {name!r} section with a table in:\n{done.stdout}"
    assert "Most rows lost by llm_ops in any repetition: 0." in done.stdout
    written = out.read_text()
    assert written.startswith("# llm-ops benchmark results")
    assert all(name in written for name in SCENARIOS)


def test_levers_benchmark_prints_its_three_tables() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "levers.py"), "--rows", "400"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for title in ("Semantic cache", "Cascade", "Similarity search"):
        assert f"### {title}" in done.stdout
    assert "| llm_ops, cascade [sim-small, sim] |" in done.stdout


def test_batch_benchmark_prints_live_and_batch_side_by_side() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "batch.py"),
            "--rows",
            "200",
            "--batch-seconds",
            "0.5",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| llm_ops, batch | 200 | 200 | 1 |" in done.stdout
    assert "| 200 | 0.50x |" in done.stdout


def test_streaming_benchmark_sends_each_distinct_prompt_once_at_every_size() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "streaming.py"), "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| `.llm.complete` | 20,000 | 500 | 500 | 1.00 | 20,000 | 0 |" in done.stdout
    assert "| `.llm.complete` | 100,000 | 500 | 500 | 1.00 | 100,000 | 0 |" in done.stdout


@pytest.mark.benchmark
def test_knee_benchmark_prints_every_side_against_the_best_fixed_concurrency(
    tmp_path: Path,
) -> None:
    out = tmp_path / "knee.md"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "knee.py"),
            "--only",
            "gpu",
            "--seconds",
            "0.5",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for side in ("concurrency unset (default)", "concurrency=1024", "plain loop, Semaphore(20)"):
        assert side in done.stdout
    assert "the default reached" in done.stdout
    assert out.read_text().startswith("# The knee")


def test_media_benchmark_rerun_sends_nothing_and_the_cache_holds_no_image_bytes() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "media.py"),
            "--rows",
            "30",
            "--binary-rows",
            "0",
            "--pdf-rows",
            "0",
            "--hostile-rows",
            "0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        cells[0]: cells
        for line in done.stdout.splitlines()
        if line.startswith("| ") and (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    header = rows["side"]
    assert len(header) == 14
    assert all(len(cells) == len(header) for cells in rows.values())
    column = {name: header.index(name) for name in header}
    rerun = rows["llm_ops rerun, paths, same cache"]
    assert rerun[column["requests sent"]] == "0"
    assert rerun[column["media parts received"]] == "0"
    for side in ("llm_ops, paths, fresh cache", "llm_ops rerun, paths, same cache"):
        assert rows[side][column["correct rows"]] == "30"
        assert rows[side][column["image bytes in cache"]] == "no"
    # 30 images are 6 MB; the cache file (DuckDB's blocks, mostly empty) stays near 2.5 MB
    assert float(rows["llm_ops, paths, fresh cache"][column["cache file MB"]]) < 4
    assert "**ratio llm_ops / baseline, paths**" in rows


def test_media_benchmark_sends_pdf_pages_and_rejects_the_hostile_pdf() -> None:
    command = [sys.executable, str(REPO / "benchmarks" / "media.py"), "--rows", "0"]
    command += ["--binary-rows", "0", "--pdf-rows", "2", "--hostile-rows", "1"]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        cells[0]: cells
        for line in done.stdout.splitlines()
        if line.startswith("| ") and (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    column = {name: rows["side"].index(name) for name in rows["side"]}
    pages, hostile = rows["pages"], rows["pages, hostile"]
    assert (pages[column["rows ok"]], pages[column["page images received"]]) == ("2", "16")
    assert (hostile[column["rows rejected"]], hostile[column["requests sent"]]) == ("1", "0")


def test_set_operators_benchmark_prints_a_section_beside_its_naive_plan() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "setops.py"), "--quick", "--only", "resolve"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| all_pairs |" in done.stdout and "| blocking |" in done.stdout


def test_telemetry_benchmark_prints_each_modes_cpu_per_request() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "telemetry.py"),
            "--requests",
            "20",
            "--repeats",
            "1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for mode in ("off", "imported", "none sampled", "all sampled", "all sampled + metrics"):
        assert f"\n| {mode} | " in done.stdout
