"""The ``llm`` expression namespace for type-checked code.

``import llm_ops`` registers ``pl.col(...).llm`` with Polars at run time, which type checkers
(mypy, pyright) cannot see: they report ``"Expr" has no attribute "llm"``. :func:`llm` is the
same namespace, typed, with the same methods and signatures::

    from llm_ops.polars import llm

    df.with_columns(llm(pl.col("text")).complete("Summarize: {}", model="gpt-4o-mini"))

Examples
--------
>>> import polars as pl
>>> from llm_ops.polars import llm
>>> from llm_ops.testing import LocalEndpoint
>>> df = pl.DataFrame({"text": ["Lovely dress"]})
>>> with LocalEndpoint() as endpoint:
...     out = df.select(llm(pl.col("text")).complete("Summarize: {}", model="sim",
...                                                  endpoint=endpoint.base_url, cache=False))
>>> out.item()
'sim #a9d110f4: Summarize: Lovely dress'
"""

from __future__ import annotations

import polars as pl

from ._expr import ExprOptions, LlmNamespace, Output, last_report

__all__ = ["ExprOptions", "LlmNamespace", "Output", "last_report", "llm"]


def llm(expr: pl.Expr) -> LlmNamespace:
    """``expr.llm``, typed: ``llm(pl.col("text")).classify([...], model=...)``."""
    if not isinstance(expr, pl.Expr):
        raise TypeError(f"llm() takes a Polars expression such as pl.col('text'), got {expr!r}")
    return LlmNamespace(expr)
