"""A table job's Parquet files: the input a path or glob names, read in batches of rows, and
the output, written one row group per batch."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from .._frames import from_arrow
from ..exceptions import ConfigError


def input_files(pattern: str | os.PathLike[str]) -> list[Path]:
    """The Parquet files named by a path or a glob, sorted; :class:`ConfigError` if none.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> import polars as pl
    >>> from llm_ops.tables import input_files
    >>> work = tempfile.TemporaryDirectory()
    >>> for part in (1, 0):
    ...     pl.DataFrame({"text": ["a"]}).write_parquet(Path(work.name, f"part-{part}.parquet"))
    >>> [path.name for path in input_files(Path(work.name, "part-*.parquet"))]
    ['part-0.parquet', 'part-1.parquet']
    >>> input_files(Path(work.name, "missing-*.parquet"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    llm_ops.exceptions.ConfigError: no input file matches '...missing-*.parquet'; check the ...
    >>> work.cleanup()
    """
    text = os.fspath(pattern)
    files = sorted(Path(p) for p in glob.glob(text)) if glob.has_magic(text) else [Path(text)]
    files = [f for f in files if f.is_file()]
    if not files:
        raise ConfigError(
            f"no input file matches {text!r}; check the path (globs like "
            "'data/*.parquet' are allowed)"
        )
    return files


def input_folder(pattern: str | os.PathLike[str]) -> Path:
    """The folder of a table job's input: a file's own folder, or the folder a glob starts
    in (``data`` for ``data/*.parquet`` and ``data/**/part-*.parquet``), resolved.

    Examples
    --------
    >>> from llm_ops.tables import input_folder
    >>> input_folder("/srv/tables/*/part-*.parquet").as_posix()
    '/srv/tables'
    """
    parts = Path(pattern).parts
    first_glob = next((n for n, part in enumerate(parts) if glob.has_magic(part)), None)
    if first_glob is None:  # a file: its folder
        return Path(pattern).resolve().parent
    return Path(*parts[:first_glob]).resolve() if first_glob else Path.cwd()


def media_folders(pattern: str | os.PathLike[str], settings: Mapping[str, Any]) -> Any:
    """The ``media_folders`` setting of a job on files (the CLI's, the flow's): as given, or
    with images or documents, the input's folder (:func:`input_folder`): a table names the
    files it sends, and by default only those beside it may be read."""
    if settings.get("media_folders") is not None:
        return settings["media_folders"]
    if settings.get("images") is None and settings.get("documents") is None:
        return None
    return [str(input_folder(pattern))]


def read_batches(files: list[Path], rows_per_read: int) -> Iterator[pl.DataFrame]:
    """The input as Polars frames of at most ``rows_per_read`` rows, in file and row order."""
    for file in files:
        # One batch at a time: a dataset scanner would read ahead many batches.
        for batch in pq.ParquetFile(file).iter_batches(batch_size=rows_per_read):
            if batch.num_rows:
                yield from_arrow(pa.Table.from_batches([batch]))


def no_rows(files: list[Path]) -> ConfigError:
    """The error of an input that has files but no rows: there is no output to write."""
    return ConfigError(f"the input {', '.join(map(str, files))} has no rows")


class OutputFile:
    """The output, written one row group per batch to a ``.partial`` file next to it, which
    :meth:`publish` renames into place once every batch is written: a job that fails or stops
    midway leaves no half-written output."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        self._writer: pq.ParquetWriter | None = None

    @property
    def empty(self) -> bool:
        return self._writer is None

    def append(self, batch: pl.DataFrame, added: pl.DataFrame) -> None:
        """Write ``batch``'s rows with the ``added`` columns beside them, as one row group."""
        table = batch.hstack(added.get_columns()).to_arrow()
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.partial, table.schema)
        self._writer.write_table(table)

    def publish(self) -> None:
        self.partial.replace(self.path)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> OutputFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
