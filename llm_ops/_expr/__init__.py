"""The ``llm`` expression namespace: a model call as a Polars expression.

``import llm_ops`` registers it (``pl.api.register_expr_namespace("llm")``), so any string
expression can ask a model::

    df.with_columns(pl.col("text").llm.complete("Summarize: {}", model="gpt-4o-mini"))

Each expression is a batch function (``map_batches(..., is_elementwise=True)``): Polars hands
it the whole column of an eager frame, or one batch at a time on the streaming engine, and each
batch runs through the same pipeline, client and cache keys as :func:`llm_ops.llm_complete`
(plan, dedupe, cache lookup, dispatch, join back). Batches on one client run one after the
other, so a value repeated in a later batch is answered by the cache (or, with ``cache=False``,
by what the expression remembers of its earlier batches): one request per distinct value.

Every batch's report is added to the expression's :func:`last_report` and recorded in
``llm_runs``: the first batch at once, later ones together at most every ``flush_seconds``
(and when the process exits), since each record is a write to the cache file.

The parts, from the method a user calls to the thread a batch runs on: ``namespace`` (the
methods), ``asks`` (what each asks for, and the shape of its result), ``values`` (``{}`` in
a template), ``batches`` (the batch functions), ``reports`` (:func:`last_report` and
``llm_runs``), ``runtime`` (the shared clients, and the loop and engine each lends its
expressions).
"""

from .asks import Output
from .namespace import ExprOptions, ExtractOptions, LlmNamespace
from .reports import last_report

__all__ = ["ExprOptions", "ExtractOptions", "LlmNamespace", "Output", "last_report"]
