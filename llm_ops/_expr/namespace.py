"""The ``llm`` namespace's methods: ``pl.col("text").llm.complete(...)`` and friends, each an
expression made of a batch function (see :mod:`llm_ops._expr.batches`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

import polars as pl

from .._client import Client
from .._options import (
    AskOptions,
    ClientOptions,
    Columns,
    EmbedOptions,
    ModelOption,
    RequestOptions,
    SchemaOption,
    split_options,
)
from .._sets import SetOptions, Waves
from .._sets.aggregate import _aggregate
from .._sets.resolve import Plan, check_arguments, resolve_values
from .._sets.top_k import Method, ranks_of
from .._status import STATUS_DTYPE
from ..exceptions import ConfigError, TemplateError
from .asks import Output, classification, extraction, text, verdict
from .batches import completion, embedding
from .runtime import client_for, runtime_of


class ExprOptions(ClientOptions, RequestOptions, total=False):
    """The keyword options of the ``llm`` expressions and of ``llm_filter``, ``llm_classify``
    and ``llm_extract``: every option of :func:`~llm_ops.llm_complete` but ``output`` (an
    expression's name is its output; see :class:`llm_ops.Options`)."""


class ExtractOptions(ClientOptions, AskOptions, total=False):
    """The keyword options of ``.llm.extract`` and ``llm_extract``: those of
    :class:`ExprOptions` but ``schema``, a parameter of their own."""


@pl.api.register_expr_namespace("llm")
class LlmNamespace:
    """Model calls on a column: ``pl.col("text").llm.complete(...)`` and friends.

    Every method takes the keyword options of :func:`llm_ops.llm_complete` (see
    :class:`llm_ops.ExprOptions`), and ``client=`` to run on a :class:`~llm_ops.Client` of
    your own; without it, the expressions with the same client options (``endpoint``,
    ``cache``, ``concurrency``, ...) share one client for the life of the process.

    The result keeps the expression's name, as Polars expressions do: name it with
    ``.alias(...)``. Each method returns the answer, null where a row failed or was skipped
    (:func:`llm_ops.last_report` counts them), or, with ``with_status=True``, a struct of
    ``answer``, ``status`` (:data:`llm_ops.STATUSES`) and ``error`` (plus ``raw``,
    ``similar_to``, ``similarity``, ``model`` and ``reasoning`` where ``llm_complete`` adds
    those columns: ``reasoning`` with ``keep_reasoning=True``).

    Use the plain form where a null answer is all you need to know (a filter, a summary
    column); use ``with_status=True`` where each row must say why it has no answer (a job whose
    failures you look at or retry). In a type-checked module, write
    ``llm(pl.col("text")).complete(...)`` with :func:`llm_ops.polars.llm`: type checkers
    do not see namespaces registered at run time.
    """

    def __init__(self, expr: pl.Expr) -> None:
        self._expr = expr

    def complete(
        self,
        prompt: str | None = None,
        *,
        model: ModelOption,
        with_status: bool = False,
        client: Client | None = None,
        **options: Unpack[ExprOptions],
    ) -> pl.Expr:
        """Ask the model about every value; the answer text (or struct, with ``schema=``).

        Identical prompts are sent once, answers already cached are reused, and a value
        repeated in a later batch of a streaming query is answered by the cache: one request
        per distinct prompt. A row sent here and by :func:`~llm_ops.llm_complete` with the
        same rendered prompt and parameters has the same cache key.

        Parameters
        ----------
        prompt
            A template in which ``{}`` stands for the value, e.g. ``"Summarize: {}"``
            (``{{`` and ``}}`` are literal braces); ``None``: the value is the prompt, as
            with ``pl.format(...)``. On a struct expression (``pl.struct("title", "text")``)
            the template names the fields instead: ``"{title}: {text}"``. A null value (or
            field) is not sent: the row is ``skipped``.
        model
            Model name, or a list of names for a cascade (see :func:`~llm_ops.llm_complete`;
            an ``escalate=`` rule reads the answer as ``pl.col("answer")``).
        with_status
            ``False``: the answer, null where the row failed or was skipped.
            ``True``: a struct ``{answer, status, error, ...}``, so nothing is hidden.
        client
            A :class:`~llm_ops.Client` to run on, instead of the shared one for these options.
        **options
            As for :func:`~llm_ops.llm_complete`, the keys of :class:`~llm_ops.ExprOptions`.

        Returns
        -------
        Expr
            ``String`` (a struct of the schema's fields with ``schema=``), or the struct form.

        Examples
        --------
        >>> import polars as pl
        >>> import llm_ops
        >>> from llm_ops.testing import LocalEndpoint
        >>> df = pl.DataFrame({"text": ["Lovely dress", None, "Lovely dress"]})
        >>> with LocalEndpoint() as endpoint:
        ...     out = df.with_columns(
        ...         pl.col("text")
        ...         .llm.complete("Summarize: {}", model="sim", endpoint=endpoint.base_url,
        ...                       cache=False)
        ...         .alias("summary"))
        >>> out
        shape: (3, 2)
        ┌──────────────┬─────────────────────────────────┐
        │ text         ┆ summary                         │
        │ ---          ┆ ---                             │
        │ str          ┆ str                             │
        ╞══════════════╪═════════════════════════════════╡
        │ Lovely dress ┆ sim #a9d110f4: Summarize: Love… │
        │ null         ┆ null                            │
        │ Lovely dress ┆ sim #a9d110f4: Summarize: Love… │
        └──────────────┴─────────────────────────────────┘

        The struct form says why a row has no answer:

        >>> with LocalEndpoint() as endpoint:
        ...     out = df.select(
        ...         pl.col("text").llm.complete("Summarize: {}", model="sim", with_status=True,
        ...                                     endpoint=endpoint.base_url, cache=False)
        ...     ).unnest("text")
        >>> out.select("status", "error")
        shape: (3, 2)
        ┌─────────┬─────────────────────────────────┐
        │ status  ┆ error                           │
        │ ---     ┆ ---                             │
        │ enum    ┆ str                             │
        ╞═════════╪═════════════════════════════════╡
        │ ok      ┆ null                            │
        │ skipped ┆ column 'text' is null; row not… │
        │ ok      ┆ null                            │
        └─────────┴─────────────────────────────────┘
        """
        ask = text()
        expr, _ = completion(
            self._expr, ask, prompt, "complete", model, _shape(with_status), client, options
        )
        return expr

    def classify(
        self,
        labels: Sequence[str],
        prompt: str | None = None,
        *,
        model: ModelOption,
        with_status: bool = False,
        client: Client | None = None,
        **options: Unpack[ExprOptions],
    ) -> pl.Expr:
        """Classify every value as one of ``labels``; an ``Enum`` column of them.

        The request's JSON schema allows only these labels (servers that follow schemas, such
        as OpenAI, vLLM and llama.cpp, cannot answer anything else); an answer that is not
        one of them is ``invalid``: null, never coerced to a label.

        Parameters
        ----------
        labels
            The label names, each once.
        prompt
            A template with ``{}`` for the value (or field names, on a struct); by default
            ``"Classify the text as exactly one of these labels: <labels>.\\n\\nText: {}"``.
        model, with_status, client, **options
            As for :meth:`complete`.

        Examples
        --------
        >>> import polars as pl
        >>> import llm_ops
        >>> from llm_ops.testing import LocalEndpoint
        >>> df = pl.DataFrame({"text": ["Shipping was slow", "Lovely fabric", "Runs small"]})
        >>> with LocalEndpoint() as endpoint:
        ...     out = df.with_columns(
        ...         pl.col("text").llm.classify(["shipping", "product"], model="sim",
        ...                                     endpoint=endpoint.base_url, cache=False)
        ...         .alias("topic"))
        >>> out
        shape: (3, 2)
        ┌───────────────────┬──────────┐
        │ text              ┆ topic    │
        │ ---               ┆ ---      │
        │ str               ┆ enum     │
        ╞═══════════════════╪══════════╡
        │ Shipping was slow ┆ shipping │
        │ Lovely fabric     ┆ product  │
        │ Runs small        ┆ product  │
        └───────────────────┴──────────┘
        """
        ask = classification(labels)
        expr, _ = completion(
            self._expr, ask, prompt, "classify", model, _shape(with_status), client, options
        )
        return expr

    def extract(
        self,
        schema: SchemaOption,
        prompt: str | None = None,
        *,
        model: ModelOption,
        with_status: bool = False,
        client: Client | None = None,
        **options: Unpack[ExtractOptions],
    ) -> pl.Expr:
        """Extract the fields of ``schema`` from every value; a ``Struct`` column of them.

        Answers are asked for by the schema and validated as with ``llm_complete(schema=)``;
        one that does not match is ``invalid`` (null here; its raw text in the struct form's
        ``raw``), unless ``repair=True`` asks again and the second answer matches.

        Parameters
        ----------
        schema
            A pydantic model class or a JSON schema dict of an object (positional, or
            ``schema=``).
        prompt
            A template with ``{}`` for the value (or field names, on a struct); by default
            ``"Extract the fields of the JSON schema from the text.\\n\\nText: {}"``.
        model, with_status, client, **options
            As for :meth:`complete`.

        Examples
        --------
        >>> import polars as pl
        >>> from pydantic import BaseModel
        >>> import llm_ops
        >>> from llm_ops.testing import LocalEndpoint
        >>> class Item(BaseModel):
        ...     product: str
        ...     quantity: int
        >>> df = pl.DataFrame({"text": ["two red scarves", "a blue hat"]})
        >>> with LocalEndpoint() as endpoint:
        ...     out = df.select(
        ...         pl.col("text").llm.extract(Item, model="sim", endpoint=endpoint.base_url,
        ...                                    cache=False).struct.unnest())
        >>> out
        shape: (2, 2)
        ┌────────────────────┬──────────┐
        │ product            ┆ quantity │
        │ ---                ┆ ---      │
        │ str                ┆ i64      │
        ╞════════════════════╪══════════╡
        │ Extract the fields ┆ 32       │
        │ Extract the fields ┆ 95       │
        └────────────────────┴──────────┘
        """
        ask = extraction(schema)
        expr, _ = completion(
            self._expr, ask, prompt, "extract", model, _shape(with_status), client, options
        )
        return expr

    def filter(
        self,
        prompt: str,
        *,
        model: ModelOption,
        with_status: bool = False,
        client: Client | None = None,
        **options: Unpack[ExprOptions],
    ) -> pl.Expr:
        """Ask a yes/no question of every value; a ``Boolean`` column, for ``df.filter(...)``.

        The answer is asked for as JSON ``{"answer": true|false}``. A row that failed is null,
        which ``df.filter`` drops (:func:`llm_ops.last_report` counts them).

        Polars evaluates every predicate of a ``filter`` on every row, and joins consecutive
        ``filter`` calls into one: ``lf.filter(cheap).filter(pl.col("text").llm.filter(...))``
        asks about the rows ``cheap`` drops too. To ask only about the rows left, filter in
        two steps with the answer as a column in between, as :func:`llm_ops.llm_filter`
        does: ``lf.filter(cheap).with_columns(keep=...llm.filter(...)).filter("keep")``.

        Parameters
        ----------
        prompt
            The question, a template with ``{}`` for the value (or field names, on a struct):
            ``"Is this review about shipping? {}"``.
        model, with_status, client, **options
            As for :meth:`complete`.

        Examples
        --------
        >>> import polars as pl
        >>> import llm_ops
        >>> from llm_ops.testing import LocalEndpoint
        >>> df = pl.DataFrame({"text": ["Shipping was slow", "Love the colour", "Never arrived"]})
        >>> with LocalEndpoint() as endpoint:
        ...     out = df.filter(pl.col("text").llm.filter(
        ...         "Is this review about shipping? {}", model="sim",
        ...         endpoint=endpoint.base_url, cache=False))
        >>> out
        shape: (2, 1)
        ┌───────────────────┐
        │ text              │
        │ ---               │
        │ str               │
        ╞═══════════════════╡
        │ Shipping was slow │
        │ Never arrived     │
        └───────────────────┘
        """
        if not isinstance(prompt, str):
            raise TemplateError(
                "filter needs the question, e.g. .llm.filter('Is this about shipping? {}', ...)"
            )
        ask = verdict()
        expr, _ = completion(
            self._expr, ask, prompt, "filter", model, _shape(with_status), client, options
        )
        return expr

    def aggregate(
        self,
        instruction: str,
        *,
        model: ModelOption,
        schema: SchemaOption = None,
        context_tokens: int | None = None,
        max_tokens: int | None = None,
        with_status: bool = False,
        client: Client | None = None,
        **options: Unpack[SetOptions],
    ) -> pl.Expr:
        """Fold the values into one answer: an aggregation, for ``group_by().agg()``,
        ``.over()`` or ``select``, by :func:`~llm_ops.llm_aggregate`'s tree fold.

        Polars calls the expression once per group, so groups are folded one after another,
        each level of each a wave of its own: for many groups, ``llm_aggregate(df, ...,
        by=...)`` sends each level of every group in one wave. The values are folded in the
        order they come in (``pl.col("text").sort_by("date").llm.aggregate(...)`` sets one);
        nulls are left out.

        Parameters
        ----------
        instruction
            What to make of the values, e.g. ``"Summarize the reviews"``.
        model, schema, context_tokens, max_tokens
            As for :func:`~llm_ops.llm_aggregate`.
        with_status, client
            As for :meth:`complete`.
        **options
            As for :func:`~llm_ops.llm_aggregate`, the keys of :class:`~llm_ops.SetOptions`.

        Returns
        -------
        Expr
            One ``String`` per group (a struct with ``schema=``), null where its fold failed;
            or, ``with_status=True``, a struct of ``answer``, ``status`` and ``error``.

        Examples
        --------
        >>> import polars as pl
        >>> import llm_ops
        >>> from llm_ops.testing import LocalEndpoint
        >>> df = pl.DataFrame({"shop": ["a", "b", "a"],
        ...                    "text": ["Slow [entity=1]", "Great [entity=2]", "Late [entity=3]"]})
        >>> with LocalEndpoint() as endpoint:
        ...     out = df.group_by("shop", maintain_order=True).agg(
        ...         pl.col("text").llm.aggregate("Summarize the reviews", model="sim",
        ...                                      endpoint=endpoint.base_url, cache=False))
        >>> out["text"].to_list()
        ['sim #0a789136: [entity=1] [entity=3]', 'sim #75d1a01b: [entity=2]']
        """
        shape = _shape(with_status)
        made, call = split_options(options)
        shared = client_for(client, made, user=self)
        answer_type: Any = pl.String if schema is None else None
        dtype = (
            pl.Struct({"answer": pl.String, "status": STATUS_DTYPE, "error": pl.String})
            if shape == "struct" and schema is None
            else answer_type
        )

        def fold(values: pl.Series) -> Any:
            # The fold's Polars work runs on the thread Polars called, as every expression's
            # does (see llm_ops._expr.runtime): one group at a time per client.
            runtime = runtime_of(shared)
            with runtime.lock:
                folded = _aggregate(
                    pl.DataFrame({"value": values}),
                    "value",
                    instruction,
                    model=model,
                    by=None,
                    order_by=None,
                    schema=schema,
                    context_tokens=context_tokens,
                    max_tokens=max_tokens,
                    output="answer",
                    return_report=False,
                    client=shared,
                    options=call,
                    in_place=runtime,
                ).row(0, named=True)
            if shape == "answer":
                return folded["answer"]
            return {
                "answer": folded["answer"],
                "status": folded["answer_status"],
                "error": folded["answer_error"],
            }

        return self._expr.map_batches(fold, return_dtype=dtype, returns_scalar=True)

    def embed(
        self,
        *,
        model: str,
        dimensions: int | None = None,
        inputs_per_request: int = 256,
        with_status: bool = False,
        client: Client | None = None,
        **options: Unpack[EmbedOptions],
    ) -> pl.Expr:
        """Embed every value; a ``List(Float32)`` column, ``Array(Float32, dimensions)`` with
        ``dimensions``.

        Distinct texts are embedded once, ``inputs_per_request`` to a request, and cached in
        ``llm_embeddings`` with the same keys as :func:`~llm_ops.llm_embed`.

        Parameters
        ----------
        model
            Embedding model name.
        dimensions
            Ask the endpoint for vectors of this size (part of the cache key); the result is
            then a fixed-size ``Array``.
        inputs_per_request
            Inputs per request.
        with_status, client
            As for :meth:`complete`.
        **options
            As for :func:`~llm_ops.llm_embed`, the keys of :class:`~llm_ops.EmbedOptions`.

        Examples
        --------
        >>> import polars as pl
        >>> import llm_ops
        >>> from llm_ops.testing import LocalEndpoint
        >>> df = pl.DataFrame({"text": ["red dress", None]})
        >>> with LocalEndpoint() as endpoint:
        ...     out = df.with_columns(
        ...         pl.col("text").llm.embed(model="sim-embed", dimensions=4,
        ...                                  endpoint=endpoint.base_url, cache=False)
        ...         .alias("vector"))
        >>> out
        shape: (2, 2)
        ┌───────────┬─────────────────────────────────┐
        │ text      ┆ vector                          │
        │ ---       ┆ ---                             │
        │ str       ┆ array[f32, 4]                   │
        ╞═══════════╪═════════════════════════════════╡
        │ red dress ┆ [0.288675, -0.866025, … -0.288… │
        │ null      ┆ null                            │
        └───────────┴─────────────────────────────────┘
        """
        return embedding(
            self._expr, model, dimensions, inputs_per_request, _shape(with_status), client, options
        )

    def top_k(
        self,
        criterion: str,
        *,
        k: int,
        model: ModelOption,
        method: Method = "auto",
        window: int = 20,
        seed: int = 0,
        client: Client | None = None,
        **options: Unpack[SetOptions],
    ) -> pl.Expr:
        """The ``k`` best values by ``criterion``, best first, as one list: an aggregation,
        for ``select`` or ``group_by().agg()``.

        The values are judged as text (and returned as text) by
        :func:`~llm_ops.llm_top_k`, whose plans, guarantees and statuses apply (a value
        whose rank rests on failed judgments is still listed; ``on_error="raise"`` raises
        instead). Null values are never listed.

        Inside ``group_by().agg()`` Polars calls the expression once per group, so the groups
        are judged one after another; ``llm_top_k(df, ..., by=...)`` judges every group in
        the same waves, which is faster on many groups.

        Parameters
        ----------
        criterion, k, model, method, window, seed, client
            As for :func:`~llm_ops.llm_top_k` (pivots from embeddings need
            ``llm_top_k(embedding_model=...)``).
        **options
            As for :func:`~llm_ops.llm_top_k`.

        Examples
        --------
        >>> import polars as pl
        >>> import llm_ops
        >>> from llm_ops.testing import LocalEndpoint
        >>> df = pl.DataFrame({"shop": ["a", "a", "a", "b", "b"],
        ...                    "text": ["ok [score=0.5]", "top [score=0.9]", "bad [score=0.1]",
        ...                             "fine [score=0.6]", "best [score=0.8]"]})
        >>> with LocalEndpoint() as endpoint:
        ...     out = df.group_by("shop", maintain_order=True).agg(
        ...         pl.col("text").llm.top_k("the most helpful", k=2, model="sim",
        ...                                  endpoint=endpoint.base_url, cache=False))
        >>> for shop, best in out.rows():
        ...     print(shop, best)
        a ['top [score=0.9]', 'ok [score=0.5]']
        b ['best [score=0.8]', 'fine [score=0.6]']
        """

        ranks = _ranker(criterion, k, model, method, window, seed, client, options)

        def best(values: pl.Series) -> pl.Series:
            ranks_of_values = ranks(values)
            text = values.cast(pl.String).to_list()
            ranked = sorted((r, i) for i, r in enumerate(ranks_of_values) if r is not None)
            return pl.Series([[text[i] for _, i in ranked]], dtype=pl.List(pl.String))

        return self._expr.map_batches(best, return_dtype=pl.List(pl.String), returns_scalar=True)

    def rank(
        self,
        criterion: str,
        *,
        model: ModelOption,
        method: Method = "auto",
        seed: int = 0,
        client: Client | None = None,
        **options: Unpack[SetOptions],
    ) -> pl.Expr:
        """Each value's rank by ``criterion`` (1 is best; null for a null value): a
        ``UInt32`` column, for ``with_columns`` and ``.over(...)``.

        Every value is ranked, by :func:`~llm_ops.llm_top_k` with ``k`` the column's length:
        that compares every pair once (``n(n-1)/2`` comparisons, one wave); for the few best
        of a long column, use :meth:`top_k` or ``llm_top_k``. With ``.over(...)`` Polars
        calls the expression once per group, so the groups are judged one after another.

        Parameters
        ----------
        criterion, model, method, seed, client
            As for :func:`~llm_ops.llm_top_k`.
        **options
            As for :func:`~llm_ops.llm_top_k`.

        Examples
        --------
        >>> import polars as pl
        >>> import llm_ops
        >>> from llm_ops.testing import LocalEndpoint
        >>> df = pl.DataFrame({"shop": ["a", "a", "b", "b"],
        ...                    "text": ["ok [score=0.5]", "top [score=0.9]",
        ...                             "best [score=0.8]", "bad [score=0.2]"]})
        >>> with LocalEndpoint() as endpoint:
        ...     out = df.with_columns(
        ...         pl.col("text").llm.rank("the most helpful", model="sim",
        ...                                 endpoint=endpoint.base_url, cache=False)
        ...         .over("shop").alias("rank"))
        >>> out
        shape: (4, 3)
        ┌──────┬──────────────────┬──────┐
        │ shop ┆ text             ┆ rank │
        │ ---  ┆ ---              ┆ ---  │
        │ str  ┆ str              ┆ u32  │
        ╞══════╪══════════════════╪══════╡
        │ a    ┆ ok [score=0.5]   ┆ 2    │
        │ a    ┆ top [score=0.9]  ┆ 1    │
        │ b    ┆ best [score=0.8] ┆ 1    │
        │ b    ┆ bad [score=0.2]  ┆ 2    │
        └──────┴──────────────────┴──────┘
        """

        ranks = _ranker(criterion, None, model, method, 20, seed, client, options)

        def ranked(values: pl.Series) -> pl.Series:
            return pl.Series(values.name, ranks(values), dtype=pl.UInt32)

        return self._expr.map_batches(ranked, return_dtype=pl.UInt32)

    def resolve(
        self,
        *,
        model: ModelOption,
        embedding_model: str,
        target_recall: float = 0.95,
        neighbours: int = 10,
        sample: int = 100,
        plan: Plan = "auto",
        seed: int = 0,
        client: Client | None = None,
        **options: Unpack[SetOptions],
    ) -> pl.Expr:
        """An entity id per value: values that mean the same real-world thing share it; an
        ``Int64`` column, resolved as :func:`llm_ops.llm_resolve` resolves a column.

        The id is the smallest position, counted from 0, of the entity's values among the
        values the expression is given: the whole column, or one group's under
        ``.over(...)`` (ids then count within each group) or in ``group_by().agg(...)``. A
        null value stays null; a value that could not be resolved is its own entity (the
        frame function's ``<output>_status`` column says why).

        Polars calls the expression once per group under ``.over`` and ``group_by``, so
        each group is resolved in waves of its own, one group at a time, and never matched
        against another group's values.

        Parameters
        ----------
        model, embedding_model, target_recall, neighbours, sample, plan, seed
            As for :func:`~llm_ops.llm_resolve`.
        client
            A :class:`~llm_ops.Client` to run on, instead of the shared one for these options.
        **options
            As for :func:`~llm_ops.llm_resolve`.

        Examples
        --------
        >>> import polars as pl
        >>> import llm_ops
        >>> from llm_ops.testing import LocalEndpoint
        >>> df = pl.DataFrame({"country": ["fr", "fr", "fr", "de", "de"], "name": [
        ...     "Total [entity=1]", "TotalEnergies [entity=1]", "Danone [entity=2]",
        ...     "Siemens [entity=3]", "Siemens AG [entity=3]"]})
        >>> with LocalEndpoint() as endpoint:
        ...     out = df.with_columns(pl.col("name").llm.resolve(
        ...         model="sim", embedding_model="sim-embed", endpoint=endpoint.base_url,
        ...         cache=False).over("country").alias("entity"))
        >>> out
        shape: (5, 3)
        ┌─────────┬──────────────────────────┬────────┐
        │ country ┆ name                     ┆ entity │
        │ ---     ┆ ---                      ┆ ---    │
        │ str     ┆ str                      ┆ i64    │
        ╞═════════╪══════════════════════════╪════════╡
        │ fr      ┆ Total [entity=1]         ┆ 0      │
        │ fr      ┆ TotalEnergies [entity=1] ┆ 0      │
        │ fr      ┆ Danone [entity=2]        ┆ 2      │
        │ de      ┆ Siemens [entity=3]       ┆ 0      │
        │ de      ┆ Siemens AG [entity=3]    ┆ 0      │
        └─────────┴──────────────────────────┴────────┘
        """
        value = "value"
        check_arguments(
            value,
            {value: pl.String},
            target_recall=target_recall,
            neighbours=neighbours,
            sample=sample,
            plan=plan,
            seed=seed,
        )
        made, call = split_options(options)
        shared = client_for(client, made)
        columns = Columns("entity")

        def resolved(values: pl.Series) -> pl.Series:
            # on the thread Polars called, as the other expressions send: from the client's
            # own loop, the pipeline's Polars work would wait for the Polars threads that this
            # expression's groups hold under .over (a deadlock)
            runtime = runtime_of(shared)
            waves = Waves("resolve", model=model, client=shared, options=call, in_place=runtime)
            with runtime.lock, waves:
                added, _ = resolve_values(
                    values,
                    waves,
                    embedding_model=embedding_model,
                    target_recall=target_recall,
                    neighbours=neighbours,
                    sample=sample,
                    plan=plan,
                    seed=seed,
                    columns=columns,
                )
            return added.get_column(columns.output).alias(values.name)

        return self._expr.map_batches(resolved, return_dtype=pl.Int64)


def _ranker(
    criterion: str,
    k: int | None,
    model: ModelOption,
    method: str,
    window: int,
    seed: int,
    client: Client | None,
    options: Mapping[str, Any],
) -> Callable[[pl.Series], list[int | None]]:
    """The ranks of a batch's values, as ``llm_top_k`` ranks them, on the shared client for
    ``options`` (or ``client``), its waves driven by the thread Polars calls it on."""
    made, call = split_options(options)
    shared = client_for(client, made)

    def ranks(values: pl.Series) -> list[int | None]:
        runtime = runtime_of(shared)
        with runtime.lock:
            return ranks_of(
                values,
                criterion,
                k=k,
                model=model,
                method=method,
                window=window,
                seed=seed,
                client=shared,
                options=call,
                in_place=runtime,
            )

    return ranks


def _shape(with_status: bool) -> Output:
    """What an expression gives: the answer alone, or the struct that also says why."""
    if not isinstance(with_status, bool):
        raise ConfigError(f"with_status must be True or False, got {with_status!r}")
    return "struct" if with_status else "answer"


def _name_options() -> None:
    """Name the options in the methods' docstrings (``help()``), from the option types
    themselves: a renamed or new option is listed as it is spelled, never as it was. (The
    rendered reference links to the types, which list them too.)"""
    for method, options in (
        (LlmNamespace.complete, ExprOptions),
        (LlmNamespace.embed, EmbedOptions),
    ):
        said = f"the keys of :class:`~llm_ops.{options.__name__}`."
        names = ", ".join(f"``{name}``" for name in options.__annotations__)
        if method.__doc__ is not None:  # python -OO drops docstrings
            method.__doc__ = method.__doc__.replace(said, f"{said[:-1]}: {names}.")


_name_options()
