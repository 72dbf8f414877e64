"""The waves of a set operator: every judgment of one round sent together, as one job.

A set operator (aggregate, top-k, join, resolve) decides what to ask from the answers it
already has, so it asks in rounds. Each round is one :class:`Waves.ask`: a frame of rendered
prompts sent through the operator's :class:`~llm_ops.Client` like any ``llm_complete`` call,
so every judgment is keyed, deduped and cached (a rerun sends nothing), counted against the
operator's budget, sent as one provider batch under ``batch=``, and failed judgments come back
with a status and an error, never as answers. The operator's report adds up its waves.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

import polars as pl

from .._client import Client, given_client
from .._config import Budget, Sampling
from .._failures import warn_columns
from .._options import (
    AskOptions,
    CallOptions,
    ClientOptions,
    Columns,
    ModelOption,
    SchemaOption,
    check_embedding,
    split_options,
)
from .._pipeline.backend import Backend
from .._pipeline.embed import embed_frame
from .._pipeline.join import raise_failed_rows
from .._pipeline.run import run_frame
from .._pricing import approx_tokens, cost_or_none, price_for
from .._report import RunReport, dollars, remember_latest, sum_reports
from .._spec import EmbeddingSpec
from .._status import FAILED
from ..exceptions import ConfigError

T = TypeVar("T")


class InPlace(Protocol):
    """Where an ``llm`` expression's jobs run (``llm_ops._expr.runtime.Runtime``): on a loop
    driven by the thread Polars called, the pipeline's Polars work in place, since a Polars
    pool worker waiting for the client's loop could wait for itself."""

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T: ...

    async def backend(self) -> Backend: ...


PROMPT = "prompt"
"""The column of a wave's frame holding each judgment's rendered prompt."""

INPUTS_PER_REQUEST = 256
"""Texts per embedding request, as :func:`llm_ops.llm_embed` sends them by default."""


class SetOptions(ClientOptions, AskOptions, total=False):
    """The keyword options of the set operators (``llm_aggregate``, ``llm_top_k``,
    ``llm_join``, ``llm_resolve``): those of :func:`~llm_ops.llm_complete` but ``output`` and
    ``schema``, which each operator sets for its judgments."""


@dataclass(frozen=True)
class Answers:
    """One wave's answers, in the order of its prompts: each one's value (the parsed JSON
    object with a schema, else the text; ``None`` when it failed), status and error."""

    values: list[Any]
    statuses: list[str]
    errors: list[str | None]

    def ok(self, i: int) -> bool:
        """Whether judgment ``i`` has an answer to act on."""
        return self.values[i] is not None and self.statuses[i] not in FAILED

    def __len__(self) -> int:
        return len(self.values)


class Waves:
    """A set operator's judgments, sent a round at a time on one client, and its report.

    Parameters
    ----------
    operator
        The operator's name, for the report and messages (``"llm_top_k"``).
    model
        The judgments' model.
    client
        The client to run on; ``None``: one made from ``options`` and closed by :meth:`close`.
    options
        The operator's keyword options (:class:`SetOptions`).
    in_place
        Run each wave there (an ``llm`` expression's runtime) rather than on the client's
        loop.
    """

    def __init__(
        self,
        operator: str,
        *,
        model: ModelOption,
        client: Client | None,
        options: Mapping[str, Any],
        in_place: InPlace | None = None,
    ) -> None:
        for name in ("output", "schema"):
            if name in options:
                raise ConfigError(f"{operator} takes no {name}=: it sets its judgments' own")
        made, call = split_options(options)
        self.operator = operator
        self.model = model
        self.client = Client(**made) if client is None else given_client(client, made)
        self._own = client is None
        self._in_place = in_place
        self._call = call
        self._budget: Budget | None = call.get("budget")
        self._reports: list[RunReport] = []
        self._started = datetime.now(UTC)
        self._clock = time.perf_counter()
        self.waves = 0
        self.plan: str | None = None
        self.plan_why: str | None = None

    def ask(
        self,
        prompts: Sequence[str],
        *,
        schema: SchemaOption = None,
        max_tokens: int | None = None,
    ) -> Answers:
        """Send ``prompts`` as one wave (asking for JSON matching ``schema``, when given) and
        wait for every answer. Once the budget is spent, nothing is sent: every judgment is
        ``skipped``, with the budget's reason."""
        if not prompts:
            return Answers([], [], [])
        budget = self._remaining_budget()
        if budget is None:
            why = f"not sent: the budget is spent ({self._budget_stop()})"
            return Answers([None] * len(prompts), ["skipped"] * len(prompts), [why] * len(prompts))
        call = cast(dict[str, Any], dict(self._call))
        call.update(output="answer", on_error="null", progress=False)
        call.pop("budget", None)
        if budget != Budget():
            call["budget"] = budget
        if schema is not None:
            call["schema"] = schema
        if max_tokens is not None:
            sampling: Sampling = call.get("sampling") or Sampling()
            call["sampling"] = replace(sampling, max_tokens=max_tokens)
        frame = pl.DataFrame({PROMPT: list(prompts)}, schema={PROMPT: pl.String})
        answered, report = self._run(frame, cast(CallOptions, call))
        self._reports.append(report)
        self.waves += 1
        values = answered["answer"].to_list()
        statuses = answered["answer_status"].cast(pl.String).to_list()
        errors = answered["answer_error"].to_list()
        return Answers(
            [None if s in FAILED else v for v, s in zip(values, statuses, strict=True)],
            statuses,
            errors,
        )

    def _run(self, frame: pl.DataFrame, call: CallOptions) -> tuple[pl.DataFrame, RunReport]:
        """One wave's job over ``frame``: on the client's loop, or in place."""
        template = "{" + PROMPT + "}"
        if self._in_place is None:
            return self.client.run(self.client._complete(frame, template, self.model, call))
        job = self.client._job(template, self.model, call, columns=frame.schema)
        runtime = self._in_place

        async def on_loop() -> tuple[pl.DataFrame, RunReport]:
            return await run_frame(frame, job, await runtime.backend())

        columns, report = runtime.run(on_loop())
        return frame.hstack(columns.get_columns()), report

    def embed(self, frame: pl.DataFrame, column: str, *, model: str) -> pl.DataFrame:
        """``frame`` with the embedding of ``column`` added (``vector``, ``vector_status``,
        ``vector_error``), cached as any embedding: on the client's loop, or in place."""
        if self._in_place is None:
            embedded: pl.DataFrame = self.client.embed(
                frame, column, model=model, output="vector", progress=False
            )
            return embedded
        columns = check_embedding(
            frame.schema,
            column=column,
            model=model,
            output="vector",
            dimensions=None,
            inputs_per_request=INPUTS_PER_REQUEST,
            on_error="null",
        )
        spec = EmbeddingSpec(self.client.endpoint.identity, model, None)
        runtime = self._in_place

        async def on_loop() -> pl.DataFrame:
            return await embed_frame(
                frame,
                column,
                spec,
                await runtime.backend(),
                columns=columns,
                inputs_per_request=INPUTS_PER_REQUEST,
                on_error="null",
                progress=None,
            )

        return frame.hstack(runtime.run(on_loop()).get_columns())

    def _spent(self) -> dict[str, float]:
        """What the waves so far spent, in each of a budget's measures."""
        return {
            "max_requests": sum(r.requests_sent for r in self._reports),
            "max_tokens_total": sum(r.prompt_tokens + r.completion_tokens for r in self._reports),
            "max_cost": sum(r.cost or 0.0 for r in self._reports),
        }

    def _remaining_budget(self) -> Budget | None:
        """What is left of the operator's budget for the next wave: ``Budget()`` when there
        is none, ``None`` when it is spent."""
        if self._budget is None:
            return Budget()
        if self._budget_stop() is not None:
            return None
        spent = self._spent()
        left: dict[str, Any] = {}
        for measure, amount in spent.items():
            limit = getattr(self._budget, measure)
            if limit is not None:
                left[measure] = limit - amount if measure == "max_cost" else int(limit - amount)
        return Budget(**left)

    def _budget_stop(self) -> str | None:
        """Why the budget stops the operator (a wave's own stop, or one spent to the last
        unit between waves); ``None`` while some is left."""
        stop = next((r.budget_stop for r in self._reports if r.budget_stop), None)
        if stop is not None or self._budget is None:
            return stop
        for measure, amount in self._spent().items():
            limit = getattr(self._budget, measure)
            if limit is not None and amount >= limit:
                return f"{measure}={limit} reached"
        return None

    def report(self) -> RunReport:
        """The operator's report so far: its waves added up, with its plan."""
        model = self.model if isinstance(self.model, str) else str(self.model)
        wall = time.perf_counter() - self._clock
        if self._reports:
            summed = sum_reports(
                self._reports, started_at=self._started, wall_seconds=wall, model=model
            )
        else:
            summed = RunReport(
                run_id="",
                started_at=self._started,
                finished_at=datetime.now(UTC),
                model=model,
                endpoint=self.client.endpoint.identity,
                rows=0,
                distinct_requests=0,
                cache_hits=0,
                requests_sent=0,
                retries=0,
                wall_seconds=wall,
                cache=None if self.client.cache is None else str(self.client.cache.path),
            )
        return replace(
            summed,
            operator=self.operator,
            plan=self.plan,
            plan_why=self.plan_why,
            waves=self.waves,
            budget_stop=summed.budget_stop or self._budget_stop(),
        )

    def finish(self, added: pl.DataFrame, columns: Columns) -> RunReport:
        """The operator's end: its report becomes :func:`llm_ops.last_report` (and the
        client's), and its rows that failed (``added``: the columns it adds, ``columns``
        naming them) raise one :class:`~llm_ops.RowsFailedError` under ``on_error="raise"``,
        else warn once."""
        report = self.report()
        remember_latest(lambda: report, None if self._own else self.client)
        where = f"the {columns.error!r} column"
        if self._call.get("on_error") == "raise":
            failed = added[columns.status].cast(pl.String).is_in(list(FAILED))
            if failed.any():
                raise_failed_rows(added, columns, cached=self.client.cache is not None)
        else:
            warn_columns(added, columns.status, columns.error, where)
        return report

    def close(self) -> None:
        if self._own:
            self.client.close()

    def __enter__(self) -> Waves:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


@dataclass(frozen=True)
class SetEstimate:
    """A set operator's plan, calls and price, computed before it runs, without a request.

    The calls are the plan's expected count on a cold cache (a rerun's are cache hits, $0);
    tokens are estimated as for :func:`llm_ops.estimate` (four characters a token, four a
    message) from the prompts the plan would render; the costs are ``None`` when the model
    has no price.
    """

    operator: str
    plan: str
    plan_why: str
    calls: int
    waves: int
    input_tokens: int
    output_tokens: int
    cost: float | None
    batch_cost: float | None

    def __str__(self) -> str:
        return (
            f"{self.operator}: plan {self.plan} ({self.plan_why}) · {self.calls:,} calls in "
            f"{self.waves:,} waves · tokens in / out {self.input_tokens:,} / "
            f"{self.output_tokens:,} · cost {dollars(self.cost)} (batch {dollars(self.batch_cost)})"
        )


def priced(
    operator: str,
    *,
    plan: str,
    plan_why: str,
    calls: int,
    waves: int,
    prompt_chars: float,
    output_tokens: float,
    model: ModelOption,
    options: Mapping[str, Any],
) -> SetEstimate:
    """A :class:`SetEstimate` of ``calls`` judgments of ``prompt_chars`` characters (on
    average, with the ``system`` option's) answered with ``output_tokens`` each."""
    system = options.get("system")
    chars = prompt_chars + (len(system) if system else 0)
    input_tokens = round(calls * approx_tokens(round(chars), 2 if system else 1))
    output = round(calls * output_tokens)
    first = model if isinstance(model, str) else None
    price = None if first is None else price_for(first, options.get("pricing"))
    spent = {"requests": calls, "input_tokens": input_tokens, "output_tokens": output}
    cost = cost_or_none(price, **spent)
    batch_cost = cost_or_none(None if price is None else price.for_batch(), **spent)
    return SetEstimate(
        operator, plan, plan_why, calls, waves, input_tokens, output, cost, batch_cost
    )
