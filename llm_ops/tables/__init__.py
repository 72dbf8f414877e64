"""Jobs over Parquet inputs of any size, as steps over files that any process can run.

A :class:`Table` is one job over a Parquet path or glob, on a :class:`~llm_ops.Client`::

    from llm_ops import Client
    from llm_ops.tables import Table

    with Client(endpoint=..., cache="output/cache.duckdb") as client:
        table = Table(client, "data/*.parquet", "output/out.parquet",
                      prompt="Summarize: {text}", model="gpt-4o-mini")
        report = table.run()  # or the steps, one by one:

1. :meth:`Table.plan` streams the input in batches, keys every row, dedupes in a DuckDB work
   database, anti-joins the distinct requests against the cache and writes the misses as chunk
   files of at most ``chunk_size`` requests, in a work directory next to the output.
2. :meth:`Table.run_chunk` sends one chunk. It re-checks the cache first, so a rerun after a
   crash sends only what is still missing; answers go to the cache as they arrive, every
   outcome to the chunk's results file.
3. :meth:`Table.write` streams the input again, gives each row its answer and writes the
   output one row group per batch, to a temporary file renamed into place at the end.
4. :meth:`Table.finish` makes the report, records it in ``llm_runs`` and removes the work
   directory.

Each step is a self-contained unit of work over files, so a Prefect task (or a Ray task) can run
it, and run it again. Memory is bounded by the batch size and the chunk size, not by the table.
A cascade (``model=[small, large]``) runs batch by batch through the models instead
(:meth:`Table.run_cascade`), because which rows reach the next model depends on the answers.
"""

from .._outcome import Counters
from .._pipeline.batch import BatchPart
from ._files import input_files, input_folder, media_folders
from ._parameters import TableSettings
from ._plan import TablePlan
from ._send import send_chunk as send_chunk
from ._settings import table_of_settings
from ._table import Table
from ._workers import SharedQuota, WorkerStore
from ._write import Written

__all__ = [
    "BatchPart",
    "Counters",
    "SharedQuota",
    "Table",
    "TablePlan",
    "TableSettings",
    "WorkerStore",
    "Written",
    "input_files",
    "input_folder",
    "media_folders",
    "table_of_settings",
]
