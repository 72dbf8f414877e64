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
``llm_agg(instruction, value, order_by := NULL, model := ..., max_tokens := NULL,
context_tokens := NULL)``
    an aggregate: each group's values folded into one answer by
    :func:`~llm_ops.llm_aggregate`'s tree fold (``SELECT shop, llm_agg('Summarize the
    reviews', text) FROM reviews GROUP BY shop``); NULL when the group's fold failed. The
    values are folded in ``order_by``'s order, then their own (sorted: a parallel scan's
    order never changes the requests, so a rerun is answered by the cache). DuckDB hands the
    function the groups a vector at a time, so each level of the fold is one wave for up to
    2,048 groups.
``llm_agg_result(...)``, same arguments
    ``STRUCT(answer VARCHAR, status VARCHAR, error VARCHAR)``, as ``llm_complete_result``

Failed rows never abort the query unless ``on_error="raise"``; each call of the function (a vector
of rows) with failed rows gives a :class:`~llm_ops.RowsFailedWarning` naming the most common
reasons.

DuckDB calls the functions on threads of its own, where the caller's OpenTelemetry span is not
current: :func:`carry_context` carries it there, so a query's jobs are children of the span
that runs it (``docs/observability.md``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, Unpack

import duckdb
import polars as pl
import pyarrow as pa
from duckdb.func import FunctionNullHandling, PythonUDFType
from duckdb.sqltypes import DOUBLE, INTEGER, VARCHAR

from ._client import Client
from ._config import Sampling
from ._failures import count_reasons, warn_failed
from ._options import ClientOptions, Job, make_job
from ._pipeline.backend import Backend
from ._pipeline.plan import key_rows
from ._pipeline.run import run_frame
from ._report import RunReport
from ._sets.aggregate import llm_aggregate
from ._status import FAILED
from ._telemetry import carried, current_context
from .exceptions import ConfigError, RowsFailedError

if TYPE_CHECKING:
    from opentelemetry.context import Context

__all__ = ["carry_context", "register"]

# prompt, model, system, max_tokens, temperature
_ARGUMENTS: list[Any] = [VARCHAR, VARCHAR, VARCHAR, INTEGER, DOUBLE]
_RESULT = duckdb.struct_type({"answer": VARCHAR, "status": VARCHAR, "error": VARCHAR})
# instruction, values (a group's, in order), model, max_tokens, context_tokens
_AGG_ARGUMENTS: list[Any] = [VARCHAR, duckdb.list_type(VARCHAR), VARCHAR, INTEGER, INTEGER]
_TEXTS = pl.Schema({"prompt": pl.String, "system": pl.String})

# Each registered connection's stack of contexts its functions run in (see carry_context).
_CARRIED: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, list[Context | None]] = (
    weakref.WeakKeyDictionary()
)


def register(
    con: duckdb.DuckDBPyConnection,
    /,
    *,
    model: str | None = None,
    on_error: Literal["null", "raise"] = "null",
    **options: Unpack[ClientOptions],
) -> None:
    """Add ``llm_complete``, ``llm_complete_result``, ``llm_request_key``, ``llm_agg`` and
    ``llm_agg_result`` to ``con``.

    Parameters
    ----------
    con
        Any DuckDB connection.
    model
        Default for the functions' ``model :=`` argument; without one, every call names it.
    on_error
        ``"null"``: a failed row answers NULL (``llm_complete_result`` says why).
        ``"raise"``: a failed row aborts the query, as ``on_error`` does everywhere.
    **options
        What the connection's :class:`~llm_ops.Client` is made with (``endpoint``,
        ``cache``, ``concurrency``, ``retries``, ``rate_limit``; see
        :class:`llm_ops.ClientOptions`). The connection keeps one client, so a query's rate
        limits and what was learned about the endpoint span all its vectors. The key never
        reaches the database. The client is closed with the connection.

    Examples
    --------
    >>> import duckdb
    >>> from llm_ops.sql import register
    >>> from llm_ops.testing import LocalEndpoint
    >>> con = duckdb.connect()
    >>> with LocalEndpoint() as endpoint:
    ...     register(con, endpoint=endpoint.base_url, cache=False)
    ...     con.sql("SELECT llm_complete('Say hi', model := 'sim') AS answer").fetchall()
    [('sim #54ac2d1b: Say hi',)]
    """
    client = Client(**options)
    weakref.finalize(con, client.close)
    parents = _CARRIED.setdefault(con, [])
    suffix = f"{id(con):x}"
    complete, key = f"__llm_ops_complete_{suffix}", f"__llm_ops_key_{suffix}"
    aggregate = f"__llm_ops_agg_{suffix}"
    for name in (complete, key, aggregate):
        with contextlib.suppress(duckdb.InvalidInputException):
            con.remove_function(name)
    con.create_function(
        complete,
        _completer(client, parents, on_error=on_error),
        _ARGUMENTS,
        _RESULT,
        type=PythonUDFType.ARROW,
        null_handling=FunctionNullHandling.SPECIAL,
        side_effects=True,
    )
    con.create_function(
        key,
        _keyer(client),
        _ARGUMENTS,
        VARCHAR,
        type=PythonUDFType.ARROW,
        null_handling=FunctionNullHandling.SPECIAL,
    )
    default_model = "NULL" if model is None else "'" + model.replace("'", "''") + "'"
    signature = (
        f"prompt, model := {default_model}, system := NULL, max_tokens := NULL, temperature := NULL"
    )
    arguments = "prompt, model, system, max_tokens, temperature"
    con.execute(
        f"CREATE OR REPLACE TEMP MACRO llm_complete_result({signature}) AS {complete}({arguments})"
    )
    con.execute(
        f"CREATE OR REPLACE TEMP MACRO llm_complete({signature}) AS "
        f"({complete}({arguments})).answer"
    )
    con.execute(f"CREATE OR REPLACE TEMP MACRO llm_request_key({signature}) AS {key}({arguments})")
    con.create_function(
        aggregate,
        _aggregator(client, parents, on_error=on_error),
        _AGG_ARGUMENTS,
        _RESULT,
        type=PythonUDFType.ARROW,
        null_handling=FunctionNullHandling.SPECIAL,
        side_effects=True,
    )
    folded = (
        f"{aggregate}(instruction, list(value::VARCHAR ORDER BY order_by, value::VARCHAR), "
        "model, max_tokens, context_tokens)"
    )
    agg_signature = (
        f"instruction, value, order_by := NULL::INTEGER, model := {default_model}, "
        "max_tokens := NULL, context_tokens := NULL"
    )
    con.execute(f"CREATE OR REPLACE TEMP MACRO llm_agg_result({agg_signature}) AS {folded}")
    con.execute(f"CREATE OR REPLACE TEMP MACRO llm_agg({agg_signature}) AS ({folded}).answer")


@contextlib.contextmanager
def carry_context(con: duckdb.DuckDBPyConnection, /) -> Iterator[None]:
    """Run the functions of the queries ``con`` runs within the block in the context current
    where the block starts: the span current there is the parent of the queries' jobs.

    DuckDB calls a function on the thread that runs the query for some vectors and on threads
    of its own for others, and OpenTelemetry keeps the current span in Python's context
    variables, which do not follow to DuckDB's threads; DuckDB tells a function nothing of the
    query that calls it. Without this block, a query's jobs on DuckDB's threads start traces
    of their own (with ``SET threads TO 1`` every vector runs on the caller's thread, at the
    cost of DuckDB's parallelism). Nothing is carried when OpenTelemetry is not configured.

    Parameters
    ----------
    con
        A connection given the functions by :func:`register`.

    Raises
    ------
    ConfigError
        ``con`` has no llm-ops functions.

    Examples
    --------
    >>> import duckdb
    >>> from llm_ops.sql import carry_context, register
    >>> from llm_ops.testing import LocalEndpoint
    >>> con = duckdb.connect()
    >>> with LocalEndpoint() as endpoint:
    ...     register(con, endpoint=endpoint.base_url, cache=False, model="sim")
    ...     with carry_context(con):  # in a span: a Prefect task's, a web request's, your own
    ...         con.sql("SELECT llm_complete('Say hi') AS answer").fetchall()
    [('sim #54ac2d1b: Say hi',)]
    """
    parents = _CARRIED.get(con)
    if parents is None:
        raise ConfigError(
            "carry_context(con) carries the caller's context to llm-ops' SQL functions, and "
            "this connection has none: call llm_ops.sql.register(con, ...) first"
        )
    parents.append(current_context())
    try:
        yield
    finally:
        parents.pop()


def _job(
    client: Client, model: str, *, system: bool, max_tokens: int | None, temperature: float | None
) -> Job:
    return make_job(
        prompt="{prompt}",
        model=model,
        endpoint=client.endpoint.identity,
        dialect=client.endpoint.dialect,
        cached=client.cache is not None,
        options={
            "output": "answer",
            "system": "{system}" if system else None,
            "sampling": Sampling(max_tokens=max_tokens, temperature=temperature),
            "progress": False,
        },
    )


def _groups(columns: tuple[pa.Array, ...]) -> Any:
    """The vector's rows grouped by everything that needs its own job."""
    names = ["prompt", "model", "system", "max_tokens", "temperature"]
    frame = (
        pl.DataFrame(
            {name: pl.Series(name, column) for name, column in zip(names, columns, strict=True)}
        )
        .with_row_index("row")
        .with_columns(pl.col("system").is_not_null().alias("has_system"))
    )
    return frame.group_by(["model", "has_system", "max_tokens", "temperature"], maintain_order=True)


def _each_job(client: Client, columns: tuple[pa.Array, ...]) -> Iterator[tuple[Job, Any]]:
    for (model, has_system, max_tokens, temperature), group in _groups(columns):
        if model is None:
            raise ConfigError(
                "llm_complete needs a model: write llm_complete(prompt, "
                "model := 'gpt-4o-mini'), or pass model= to register()"
            )
        job = _job(
            client,
            str(model),
            system=bool(has_system),
            max_tokens=None if max_tokens is None else int(max_tokens),
            temperature=temperature,
        )
        yield job, group


def _completer(
    client: Client, parents: list[Context | None], *, on_error: Literal["null", "raise"]
) -> Callable[..., pa.StructArray]:
    def complete(
        prompt: pa.Array,
        model: pa.Array,
        system: pa.Array,
        max_tokens: pa.Array,
        temperature: pa.Array,
    ) -> pa.StructArray:
        columns = (prompt, model, system, max_tokens, temperature)
        size = len(prompt)
        answers: list[str | None] = [None] * size
        statuses: list[str | None] = [None] * size
        errors: list[str | None] = [None] * size
        for job, group in _each_job(client, columns):
            with carried(parents[-1] if parents else None):
                result, _ = client.run(_answer(client, group.select("prompt", "system"), job))
            for row, answer, status, error in zip(
                group["row"],
                result["answer"],
                result["answer_status"].cast(pl.String),
                result["answer_error"],
                strict=True,
            ):
                answers[row], statuses[row], errors[row] = answer, status, error
        failed = [i for i, status in enumerate(statuses) if status in FAILED]
        if on_error == "raise" and failed:
            raise RowsFailedError(
                failed,
                [errors[i] or "" for i in failed],
                [statuses[i] or "" for i in failed],
                cached=client.cache is not None,
            )
        warn_failed(  # once per call: DuckDB calls the function once per vector of rows
            size,
            len(failed),
            count_reasons((errors[i], 1) for i in failed),
            "the error field of llm_complete_result(...)",
        )
        return _results(answers, statuses, errors)

    return complete


def _keyer(client: Client) -> Callable[..., pa.Array]:
    def key(
        prompt: pa.Array,
        model: pa.Array,
        system: pa.Array,
        max_tokens: pa.Array,
        temperature: pa.Array,
    ) -> pa.Array:
        columns = (prompt, model, system, max_tokens, temperature)
        keys: list[str | None] = [None] * len(prompt)
        for job, group in _each_job(client, columns):
            keyed = key_rows(group.select("prompt", "system"), job.spec)
            for row, value in zip(group["row"], keyed.rows["key"], strict=True):
                keys[row] = value
        return pa.array(keys, pa.string())

    return key


def _aggregator(
    client: Client, parents: list[Context | None], *, on_error: Literal["null", "raise"]
) -> Callable[..., pa.StructArray]:
    def aggregate(
        instruction: pa.Array,
        values: pa.Array,
        model: pa.Array,
        max_tokens: pa.Array,
        context_tokens: pa.Array,
    ) -> pa.StructArray:
        groups = pl.DataFrame(
            {
                "instruction": pl.Series(instruction, dtype=pl.String),
                "values": pl.Series(values, dtype=pl.List(pl.String)),
                "model": pl.Series(model, dtype=pl.String),
                "max_tokens": pl.Series(max_tokens, dtype=pl.Int64),
                "context_tokens": pl.Series(context_tokens, dtype=pl.Int64),
            }
        ).with_row_index("group")
        answers: list[str | None] = [None] * groups.height
        statuses: list[str | None] = [None] * groups.height
        errors: list[str | None] = [None] * groups.height
        settings = ["instruction", "model", "max_tokens", "context_tokens"]
        asked = groups.filter(pl.col("instruction").is_not_null())
        for (text, name, most, context), part in asked.group_by(settings, maintain_order=True):
            if name is None:
                raise ConfigError(
                    "llm_agg needs a model: write llm_agg(instruction, value, "
                    "model := 'gpt-4o-mini'), or pass model= to register()"
                )
            with carried(parents[-1] if parents else None):
                folded = llm_aggregate(
                    part.select("group", "values").explode("values"),
                    "values",
                    str(text),
                    model=str(name),
                    by="group",
                    max_tokens=None if most is None else int(most),
                    context_tokens=None if context is None else int(context),
                    output="answer",
                    client=client,
                    on_error=on_error,
                    progress=False,
                )
            for row, answer, status, error in zip(
                folded["group"],
                folded["answer"],
                folded["answer_status"].cast(pl.String),
                folded["answer_error"],
                strict=True,
            ):
                answers[row], statuses[row], errors[row] = answer, status, error
        return _results(answers, statuses, errors)

    return aggregate


def _results(
    answers: list[str | None], statuses: list[str | None], errors: list[str | None]
) -> pa.StructArray:
    """The ``STRUCT(answer, status, error)`` of each row, as the ``*_result`` functions give."""
    return pa.StructArray.from_arrays(
        [pa.array(values, pa.string()) for values in (answers, statuses, errors)],
        names=["answer", "status", "error"],
    )


async def _answer(client: Client, texts: pl.DataFrame, job: Job) -> tuple[pl.DataFrame, RunReport]:
    backend: Backend = await client.prepare(models=job.endpoint_models)
    return await run_frame(texts, job, backend, record=False)
