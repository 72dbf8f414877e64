"""A table job's plan, and the work directory it leaves for the later steps.

The work directory sits next to the output (``out.parquet.work/``) and holds ``plan.duckdb``
(the distinct ``requests`` and the ``misses`` the cache lacks), the chunk files of the misses
(``chunk-00000.parquet``, ...), each chunk's results file once it is sent
(``chunk-00000.results.parquet``), and ``answers/``, where cluster workers leave answers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from .._cache import DUCKDB_CONFIG, Cache
from .._media import attach_bytes
from .._options import Job
from .._pipeline.plan import key_rows
from ._files import read_batches

CHUNK_GLOB = "chunk-*.parquet"
RESULTS_GLOB = "chunk-*.results.parquet"
# What a chunk's results file keeps: the outcome of every request, and the answers the cache
# does not hold under the request's own key (failures' raw text, answers of similar requests).
OUTCOME_SCHEMA = {
    "key": pl.String,
    "status": pl.String,
    "error": pl.String,
    "text": pl.String,
    "json": pl.String,
    "prompt_tokens": pl.Int64,
    "completion_tokens": pl.Int64,
    "similar_to": pl.String,
    "similarity": pl.Float64,
}


@dataclass
class TablePlan:
    """What :meth:`Table.plan` found: counts and the chunk files to send.

    Attributes
    ----------
    rows
        Rows of the input.
    distinct
        Distinct requests among them (a row whose columns are null makes none).
    cache_hits
        Distinct requests the cache answers already.
    skipped
        Rows not sent: a column the prompt reads is null.
    chunks
        The chunk files of the requests to send, for :meth:`Table.run_chunk`.
    refreshed
        Of the requests to send, those the cache holds an answer to older than its
        ``max_age`` (see :class:`~llm_ops.Cache`).
    misses
        Distinct requests to send: ``distinct - cache_hits``.

    Examples
    --------
    >>> from llm_ops.tables import TablePlan
    >>> TablePlan(rows=1_000, distinct=120, cache_hits=100).misses
    20
    """

    rows: int
    distinct: int
    cache_hits: int
    skipped: int = 0
    chunks: list[str] = field(default_factory=list)
    refreshed: int = 0

    @property
    def misses(self) -> int:
        return self.distinct - self.cache_hits


def plan_table(
    job: Job,
    cache: Cache,
    files: list[Path],
    work_dir: Path,
    *,
    answers_dir: Path,
    rows_per_read: int,
    chunk_size: int,
) -> TablePlan:
    """Key and dedupe ``files`` in the work database, anti-join the cache and write the
    misses as chunk files of at most ``chunk_size`` requests, in the job's send order."""
    cache.prepare()
    # answers a crashed run's workers left are cache hits, not requests to send again
    cache.adopt(answers_dir, wait=2.0)
    work_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*work_dir.glob(CHUNK_GLOB), work_dir / "plan.duckdb"]:
        stale.unlink(missing_ok=True)
    with open_plan_db(work_dir) as con:
        # Counted up batch by batch, so the table never holds more than the distinct
        # requests.
        # first: the request's rank by its first row, for send_order="input"
        # media: the descriptors of a request's images and PDFs (llm_ops._media), and the
        # bytes of those a Binary column holds: a chunk file stands alone
        extra: list[str] | None = None
        rows = seen = 0
        for batch in read_batches(files, rows_per_read):
            rows += batch.height
            found = key_rows(batch, job.spec).distinct
            if job.spec.media:
                found = attach_bytes(found, batch, job.spec.media)
            if extra is None:  # the first batch says which media columns hold bytes
                extra = [c for c in found.columns if c.startswith("media")]
                _create_requests(con, extra)
            found = found.with_row_index("first", seen)
            seen += found.height
            con.register("batch_requests", found.to_arrow())
            con.execute(
                f"INSERT INTO requests SELECT key, system, prompt, rows, first{_listed(extra)} "
                "FROM batch_requests ON CONFLICT (key) DO UPDATE "
                "SET rows = requests.rows + excluded.rows"
            )
            con.unregister("batch_requests")
        if extra is None:
            extra = ["media"] if job.spec.media else []
            _create_requests(con, extra)
        media = _listed(extra)
        # Chunks are runs of the send order (llm_ops._order): byte-wise, as Polars sorts.
        prefix = job.send_order == "prefix"
        order = "r.system NULLS FIRST, r.prompt, r.key" if prefix else "r.first"
        with cache.answers_view(con, name="cached", columns=["key"]):
            con.execute(
                "CREATE TABLE misses AS SELECT r.* FROM requests r "
                f"ANTI JOIN cached c ON r.key = c.key ORDER BY {order}"
            )
        distinct, keyed_rows = con.execute(
            "SELECT count(*), coalesce(sum(rows), 0) FROM requests"
        ).fetchall()[0]
        reader = con.sql(f"SELECT key, system, prompt, rows{media} FROM misses").to_arrow_reader(
            chunk_size
        )
        chunks = []
        for number, chunk in enumerate(reader):
            path = work_dir / f"chunk-{number:05d}.parquet"
            pq.write_table(pa.Table.from_batches([chunk]), path)
            chunks.append(str(path))
        misses = int(con.execute("SELECT count(*) FROM misses").fetchall()[0][0])
        refreshed = 0
        if cache.max_age is not None and misses:
            with cache.answers_view(con, name="stale", columns=["key"], any_age=True):
                refreshed = int(
                    con.execute(
                        "SELECT count(*) FROM misses SEMI JOIN stale USING (key)"
                    ).fetchall()[0][0]
                )
    return TablePlan(
        rows=rows,
        distinct=int(distinct),
        cache_hits=int(distinct) - misses,
        skipped=rows - int(keyed_rows),
        chunks=chunks,
        refreshed=refreshed,
    )


def _create_requests(con: duckdb.DuckDBPyConnection, extra: list[str]) -> None:
    """The work database's ``requests`` table, with the ``extra`` media columns: descriptors
    (``media``) and the bytes of a Binary column's values (``media_bytes_<n>``)."""
    typed = "".join(f", {c} {'VARCHAR' if c == 'media' else 'BLOB'}" for c in extra)
    con.execute(
        "CREATE TABLE requests (key VARCHAR PRIMARY KEY, system VARCHAR, prompt VARCHAR, "
        f"rows BIGINT, first BIGINT{typed})"
    )


def _listed(columns: list[str]) -> str:
    return "".join(f", {column}" for column in columns)


def open_plan_db(work_dir: Path) -> duckdb.DuckDBPyConnection:
    """The work database of :func:`plan_table`: its ``requests`` and ``misses`` tables."""
    return duckdb.connect(str(work_dir / "plan.duckdb"), config=DUCKDB_CONFIG)


def chunk_sizes(chunks: list[str]) -> list[tuple[int, int]]:
    """The requests of each chunk file, and the rows they answer."""
    sizes = []
    for chunk in chunks:
        rows = pl.read_parquet(chunk, columns=["rows"])["rows"]  # a request's rows
        sizes.append((rows.len(), int(rows.sum())))
    return sizes


def results_path(chunk: str | os.PathLike[str]) -> Path:
    """The results file of a chunk file, next to it."""
    return Path(chunk).with_suffix(".results.parquet")


def read_outcomes(work_dir: Path) -> pl.DataFrame:
    """Every results file of the work directory, in one frame of :data:`OUTCOME_SCHEMA`."""
    files = sorted(work_dir.glob(RESULTS_GLOB))
    return pl.read_parquet(files) if files else pl.DataFrame(schema=OUTCOME_SCHEMA)
