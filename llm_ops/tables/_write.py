"""Writing a table job's output: the input again, batch by batch, each row given its answer
from the cache and the chunks' results files, one row group per batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from .._cache import Cache
from .._failures import add_reasons, failure_reasons
from .._options import Job
from .._pipeline.join import join_back, status_counts
from .._pipeline.plan import key_rows, lookup_answers
from .._pipeline.savings import Tally
from .._status import RESULTS
from ._accounting import count_tallies
from ._files import OutputFile, no_rows, read_batches
from ._plan import read_outcomes


@dataclass
class Written:
    """What :meth:`Table.write` wrote: rows per status, and the requests and tokens behind
    them for the report's savings.

    Attributes
    ----------
    statuses
        Rows written per status (:data:`llm_ops.STATUSES`); statuses no row has are left out.
    tallies
        Requests and tokens as if every row were sent (``every_row``), each distinct request
        once (``each_distinct``), and those the cache (``cache``) and the semantic cache
        (``similar``) answered, for :meth:`Table.finish`.
    errors
        Failed rows written per reason, most common first (see
        :attr:`llm_ops.RunReport.errors`).

    See the example of :meth:`Table.plan`.
    """

    statuses: dict[str, int]
    tallies: dict[str, Tally]
    errors: dict[str, int] = field(default_factory=dict)


def write_output(
    job: Job, cache: Cache, files: list[Path], output: Path, work_dir: Path, *, rows_per_read: int
) -> Written:
    """:meth:`Table.write`: each batch of ``files`` joined back to its answers (those of the
    chunks' results files first), written to ``output``."""
    fresh = read_outcomes(work_dir)
    counts: dict[str, int] = {}
    errors: dict[str, int] = {}
    with OutputFile(output) as out:
        for batch in read_batches(files, rows_per_read):
            keyed = key_rows(batch, job.spec)
            wanted = keyed.distinct.select("key")
            cached = lookup_answers(cache, wanted, reasoning=job.columns.reasoning)
            results = _batch_results(cached, wanted.join(fresh, on="key"))
            added = join_back(
                keyed.groups, results, job.columns, job.spec.schema, row_group=keyed.row_group
            )
            for status, n in status_counts(added, job.columns).items():
                counts[status] = counts.get(status, 0) + n
            errors = add_reasons(
                errors, failure_reasons(added, job.columns.status, job.columns.error)
            )
            out.append(batch, added)
    if out.empty:
        raise no_rows(files)
    out.publish()
    similar = fresh.filter(pl.col("status") == "similar").select(
        "key", "prompt_tokens", "completion_tokens"
    )
    return Written(statuses=counts, tallies=count_tallies(work_dir, cache, similar), errors=errors)


def _batch_results(cached: pl.DataFrame, fresh: pl.DataFrame) -> pl.DataFrame:
    """Answers from the cache, with this run's statuses (ok, failed, ...) taking precedence,
    and this run's answers where the cache has none under the key (similar, invalid). A
    column the results files do not keep (a reasoning model's thinking) comes from the cache
    alone: every answer that has one is cached."""
    merged = cached.join(fresh, on="key", how="full", coalesce=True, suffix="_run")
    run_first = ("status", "error")
    return merged.select(
        "key",
        *(
            pl.col(name)
            if f"{name}_run" not in merged.columns
            else pl.coalesce(f"{name}_run", name).alias(name)
            if name in run_first
            else pl.coalesce(name, f"{name}_run").alias(name)
            for name in RESULTS
            if name != "key"
        ),
    ).cast(RESULTS)
