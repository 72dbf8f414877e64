"""OpenTelemetry: nothing imported where OpenTelemetry is not used."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from llm_ops.testing import LocalEndpoint


def _job_in_a_subprocess(endpoint: LocalEndpoint, cache: str | bool, prelude: str) -> str:
    """Run a job in a fresh interpreter after ``prelude``; its first row's status, and
    whether OpenTelemetry was imported."""
    script = textwrap.dedent(f"""
        import sys
        {prelude}
        import polars as pl
        from llm_ops import llm_complete
        out = pl.DataFrame({{"text": ["a"]}}).pipe(
            llm_complete, prompt="{{text}}", model="sim", endpoint={endpoint.base_url!r},
            cache={cache!r},
        )
        print(out["completion_status"][0], "opentelemetry" in sys.modules)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip()


def test_a_job_runs_where_opentelemetry_is_not_installed(endpoint, cache):
    blocked = "sys.modules['opentelemetry'] = None  # an import of it fails, as if not installed"
    assert _job_in_a_subprocess(endpoint, str(cache), blocked) == "ok True"  # True: the block


def test_a_job_imports_no_opentelemetry_where_the_process_does_not_use_it(endpoint):
    # without a cache: opening one imports portalocker, which imports redis where it is
    # installed, and redis imports OpenTelemetry (that is theirs, not llm-ops's)
    assert _job_in_a_subprocess(endpoint, False, "") == "ok False"
