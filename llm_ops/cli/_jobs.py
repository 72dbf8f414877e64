"""``llm-ops run`` and ``llm-ops estimate``: a job on Parquet or CSV files, run or planned."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from .._client import Client
from .._failures import TOP_REASONS, shown
from .._options import options_from_settings, split_options
from .._status import ANSWERED
from ..exceptions import ConfigError, RowsFailedWarning
from ..tables import Table, input_files, media_folders
from ._job_arguments import add_job_arguments, job_options
from ._parser import DEFAULT_KEY_ENV, Commands, command, output_format


def add_commands(commands: Commands) -> None:
    run_parser = command(
        commands,
        "run",
        run,
        summary="run a prompt over every row of a file",
        description="Run a prompt over every row of a Parquet or CSV "
        "file and write the rows with their answers.",
    )
    add_job_arguments(
        run_parser, output="file to write the rows with their answers to, .parquet or .csv"
    )
    run_parser.add_argument(
        "--on-error",
        choices=("null", "raise"),
        default="null",
        help="null: failed rows get an empty answer, and the command exits 0 unless every "
        "row sent failed; raise: it exits with status 1 when any row failed (the output is "
        "written either way; default: null)",
    )
    run_parser.add_argument("--no-progress", action="store_true", help="no progress line")
    run_parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="send the chunks on a Ray cluster: 'local' (started here), 'auto' or "
        "'ray://host:10001' (pip install 'llm-ops[ray]')",
    )
    run_parser.add_argument(
        "--ray-workers",
        type=int,
        metavar="N",
        help="with --ray: chunks sent at once (a local cluster's CPUs)",
    )

    add_job_arguments(
        command(
            commands,
            "estimate",
            estimate,
            summary="count what a job would send, without sending anything",
            description="Plan a job without sending anything: rows, distinct requests, cache "
            "hits, requests and tokens to send.",
        )
    )


def run(args: argparse.Namespace) -> int:
    out = Path(args.output)
    csv = output_format(out) == "csv"
    # (the table checks this too, but sees CSV inputs only as their Parquet copies)
    if any(f.resolve() == out.resolve() for f in input_files(args.input)):
        raise ConfigError(f"output {args.output!r} is also an input; write somewhere else")
    # The job writes Parquet, converted to CSV at the end; next to the CSV, so that a rerun
    # after a crash finds the job's work directory.
    written = out.with_name(out.name + ".parquet") if csv else out
    options = job_options(args)
    options["progress"] = False if args.no_progress else None
    with _table(args, written, options) as table:
        if csv:
            _check_csv_columns(table)
        with warnings.catch_warnings():  # the reasons are printed below, as the CLI's own
            warnings.simplefilter("ignore", RowsFailedWarning)
            if args.ray:
                from ..ray import run_on_ray

                report = run_on_ray(table, address=args.ray, workers=args.ray_workers)
            else:
                report = table.run()
        status, error = table.job.columns.status, table.job.columns.error
    if csv:
        _parquet_to_csv(written, out)
    print(report)
    print(f"wrote {out}")
    if report.failed_rows:
        print(
            f"{report.failed_rows:,} row(s) failed; see the {status} and {error} columns. A "
            "rerun sends only those. Most common reasons:",
            *(f"  {n:>8,}  {shown(why)}" for why, n in list(report.errors.items())[:TOP_REASONS]),
            sep="\n",
            file=sys.stderr,
        )
        if not any(n for why, n in report.statuses.items() if why in ANSWERED):
            print("llm-ops: no row got an answer (exit status 1)", file=sys.stderr)
            return 1
        return 1 if args.on_error == "raise" else 0
    return 0


def estimate(args: argparse.Namespace) -> int:
    options = job_options(args)
    # Nothing is sent, so no key is needed; the endpoint still names the cache keys.
    options["api_key"] = options.get("api_key") or os.environ.get(DEFAULT_KEY_ENV) or "unused"
    with (
        tempfile.TemporaryDirectory(prefix="llm-ops-estimate-") as scratch,
        _table(args, Path(scratch) / "unused.parquet", options) as table,
    ):
        print(table.estimate())
    return 0


@contextlib.contextmanager
def _table(args: argparse.Namespace, out: Path, options: dict[str, Any]) -> Iterator[Table]:
    model = args.model if len(args.model) > 1 else args.model[0]
    options = {**options, "media_folders": media_folders(args.input, options)}
    grouped = options_from_settings({**options, "model": model})
    model = grouped.pop("model")
    made, call = split_options(grouped)
    files = input_files(args.input)
    with tempfile.TemporaryDirectory(prefix="llm-ops-csv-") as scratch, Client(**made) as client:
        converted = _csv_as_parquet(files, Path(scratch))
        source = args.input if converted == files else str(Path(scratch) / "input-*.parquet")
        yield Table(
            client,
            source,
            out,
            prompt=args.prompt,
            model=model,
            rows_per_read=args.rows_per_read,
            chunk_size=args.chunk_size,
            **call,
        )


def _csv_as_parquet(files: list[Path], work: Path) -> list[Path]:
    """CSV inputs are converted once, streaming, so every job runs on Parquet."""
    if all(f.suffix.lower() != ".csv" for f in files):
        return files
    converted = []
    for number, file in enumerate(files):
        target = work / f"input-{number:05d}.parquet"
        pl.scan_csv(file).sink_parquet(target)
        converted.append(target)
    return converted


def _check_csv_columns(table: Table) -> None:
    """CSV cannot hold nested values: refuse before anything is paid for, not at the end."""
    schema = pl.scan_parquet(table.files).collect_schema()
    nested = [name for name, dtype in schema.items() if dtype.is_nested()]
    if nested:
        raise ConfigError(
            f"CSV cannot hold the nested column(s) {', '.join(nested)}; write a .parquet "
            "file instead"
        )


def _parquet_to_csv(parquet: Path, out: Path) -> None:
    partial = out.with_name(out.name + ".partial")
    pl.scan_parquet(parquet).sink_csv(partial)
    partial.replace(out)
    parquet.unlink()
