"""DuckDB SQL functions: ``llm_complete``, ``llm_complete_result`` and ``llm_request_key``.

:func:`register` adds them to a DuckDB connection (any connection, including one to the cache
database itself)::

    SELECT id, llm_complete('Summarize: ' || text, model := 'gpt-4o-mini') AS summary
    FROM 'data/womens_clothing_reviews.parquet'

DuckDB hands the functions whole vectors of rows (2,048 at a time). Within each vector the
requests are deduplicated, served from the cache and sent concurrently by the same engine as
:func:`llm_ops.llm_complete`, and keyed identically, so Python and SQL share one cache.

``llm_complete(prompt, model := ..., system := NULL, max_tokens := NULL, temperature := NULL)``
    the answer, or NULL when the row failed (or the prompt is NULL)
``llm_complete_result(...)``, same arguments
    ``STRUCT(answer VARCHAR, status VARCHAR, error VARCHAR)``: the answer with its status
    (:data:`llm_ops.STATUSES`) and error message, for finding out why a row is NULL
``llm_request_key(...)``, same arguments
    the cache key of the request, to ``JOIN llm_cache USING (key)`` yourself

Failed rows never abort the query unless ``strict=True``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
from duckdb.func import FunctionNullHandling, PythonUDFType
from duckdb.sqltypes import DOUBLE, INTEGER, VARCHAR

from ._frame import run_frame
from ._job import CachePath, Job, make_job
from ._plan import key_rows
from ._report import FAILED_STATUSES
from ._run import run_sync
from .exceptions import ConfigError, RowsFailedError

__all__ = ["register"]

# prompt, model, system, max_tokens, temperature
_ARGUMENTS: list[Any] = [VARCHAR, VARCHAR, VARCHAR, INTEGER, DOUBLE]
_RESULT = duckdb.struct_type({"answer": VARCHAR, "status": VARCHAR, "error": VARCHAR})


@dataclass(frozen=True)
class _Settings:
    base_url: str | None
    api_key: str | None
    cache: CachePath
    concurrency: int
    max_attempts: int
    timeout: float
    rpm: float | None
    tpm: float | None
    strict: bool


def register(
    con: duckdb.DuckDBPyConnection,
    /,
    *,
    model: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    cache: CachePath = None,
    concurrency: int = 32,
    max_attempts: int = 5,
    timeout: float = 60.0,
    rpm: float | None = None,
    tpm: float | None = None,
    strict: bool = False,
) -> None:
    """Add ``llm_complete``, ``llm_complete_result`` and ``llm_request_key`` to ``con``.

    Parameters
    ----------
    con
        Any DuckDB connection.
    model
        Default for the functions' ``model :=`` argument; without one, every call names it.
    base_url, api_key, cache, concurrency, max_attempts, timeout, rpm, tpm
        As for :func:`llm_ops.llm_complete`; the key never reaches the database.
    strict
        Abort the query when a row fails, instead of answering NULL.

    Examples
    --------
    >>> import duckdb
    >>> from llm_ops.sql import register
    >>> from llm_ops.testing import LocalEndpoint
    >>> con = duckdb.connect()
    >>> with LocalEndpoint() as endpoint:
    ...     register(con, base_url=endpoint.base_url, cache=False)
    ...     con.sql("SELECT llm_complete('Say hi', model := 'sim') AS answer").fetchall()
    [('sim #54ac2d1b: Say hi',)]
    """
    settings = _Settings(base_url=base_url, api_key=api_key, cache=cache,
                         concurrency=concurrency, max_attempts=max_attempts, timeout=timeout,
                         rpm=rpm, tpm=tpm, strict=strict)
    _job(settings, model or "check", system=False, max_tokens=None, temperature=None)
    suffix = f"{id(con):x}"
    complete, key = f"__llm_ops_complete_{suffix}", f"__llm_ops_key_{suffix}"
    for name in (complete, key):
        with contextlib.suppress(duckdb.InvalidInputException):
            con.remove_function(name)
    con.create_function(complete, _completer(settings), _ARGUMENTS, _RESULT,
                        type=PythonUDFType.ARROW, null_handling=FunctionNullHandling.SPECIAL,
                        side_effects=True)
    con.create_function(key, _keyer(settings), _ARGUMENTS, VARCHAR, type=PythonUDFType.ARROW,
                        null_handling=FunctionNullHandling.SPECIAL)
    default_model = "NULL" if model is None else "'" + model.replace("'", "''") + "'"
    signature = (f"prompt, model := {default_model}, system := NULL, max_tokens := NULL, "
                 "temperature := NULL")
    arguments = "prompt, model, system, max_tokens, temperature"
    con.execute(f"CREATE OR REPLACE TEMP MACRO llm_complete_result({signature}) AS "
                f"{complete}({arguments})")
    con.execute(f"CREATE OR REPLACE TEMP MACRO llm_complete({signature}) AS "
                f"({complete}({arguments})).answer")
    con.execute(f"CREATE OR REPLACE TEMP MACRO llm_request_key({signature}) AS "
                f"{key}({arguments})")


def _job(settings: _Settings, model: str, *, system: bool, max_tokens: int | None,
         temperature: float | None) -> Job:
    schema = pl.Schema({"prompt": pl.String, "system": pl.String})
    return make_job(
        schema, prompt="{prompt}", model=model, output="answer",
        system="{system}" if system else None, base_url=settings.base_url,
        api_key=settings.api_key, cache=settings.cache, concurrency=settings.concurrency,
        max_tokens=max_tokens, temperature=temperature, max_attempts=settings.max_attempts,
        timeout=settings.timeout, rpm=settings.rpm, tpm=settings.tpm,
    )


def _groups(columns: tuple[pa.Array, ...]) -> Any:
    """The vector's rows grouped by everything that needs its own job."""
    names = ["prompt", "model", "system", "max_tokens", "temperature"]
    frame = pl.DataFrame(
        {name: pl.Series(name, column) for name, column in zip(names, columns, strict=True)}
    ).with_row_index("row").with_columns(pl.col("system").is_not_null().alias("has_system"))
    return frame.group_by(["model", "has_system", "max_tokens", "temperature"],
                          maintain_order=True)


def _each_job(settings: _Settings, columns: tuple[pa.Array, ...]) -> Iterator[tuple[Job, Any]]:
    for (model, has_system, max_tokens, temperature), group in _groups(columns):
        if model is None:
            raise ConfigError("llm_complete needs a model: write llm_complete(prompt, "
                              "model := 'gpt-4o-mini'), or pass model= to register()")
        job = _job(settings, str(model), system=bool(has_system),
                   max_tokens=None if max_tokens is None else int(max_tokens),
                   temperature=temperature)
        yield job, group


def _completer(settings: _Settings) -> Callable[..., pa.StructArray]:
    def complete(prompt: pa.Array, model: pa.Array, system: pa.Array, max_tokens: pa.Array,
                 temperature: pa.Array) -> pa.StructArray:
        columns = (prompt, model, system, max_tokens, temperature)
        size = len(prompt)
        answers: list[str | None] = [None] * size
        statuses: list[str | None] = [None] * size
        errors: list[str | None] = [None] * size
        for job, group in _each_job(settings, columns):
            result, _ = run_sync(run_frame(group.select("prompt", "system"), job, record=False))
            for row, answer, status, error in zip(
                group["row"], result["answer"], result["answer_status"].cast(pl.String),
                result["answer_error"], strict=True,
            ):
                answers[row], statuses[row], errors[row] = answer, status, error
        if settings.strict:
            failed = [i for i, status in enumerate(statuses) if status in FAILED_STATUSES]
            if failed:
                raise RowsFailedError(failed, [errors[i] or "" for i in failed],
                                      [statuses[i] or "" for i in failed])
        return pa.StructArray.from_arrays(
            [pa.array(answers, pa.string()), pa.array(statuses, pa.string()),
             pa.array(errors, pa.string())],
            names=["answer", "status", "error"],
        )

    return complete


def _keyer(settings: _Settings) -> Callable[..., pa.Array]:
    def key(prompt: pa.Array, model: pa.Array, system: pa.Array, max_tokens: pa.Array,
            temperature: pa.Array) -> pa.Array:
        columns = (prompt, model, system, max_tokens, temperature)
        keys: list[str | None] = [None] * len(prompt)
        for job, group in _each_job(settings, columns):
            keyed = key_rows(group.select("prompt", "system"), job)
            for row, value in zip(group["row"], keyed.rows["key"], strict=True):
                keys[row] = value
        return pa.array(keys, pa.string())

    return key
