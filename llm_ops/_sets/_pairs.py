"""Embeddings and nearest neighbours for the operators that block pairs (join, resolve).

Comparing every pair of N rows with a model costs N²/2 calls; embeddings make that a matrix
product, done here in numpy (one matrix a side, unit rows), so a model is asked only about the
pairs near enough to matter.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import polars as pl

from .._status import FAILED
from ..exceptions import RowsFailedWarning
from ._waves import Waves


def unit_vectors(
    waves: Waves, texts: Sequence[str], *, model: str
) -> tuple[np.ndarray, list[str | None]]:
    """The embedding of each text on ``waves``' client (cached as any embedding), as rows of
    unit length, and each one's error (``None``: embedded). A text that failed is a row of
    zeros: near nothing, so it is never blocked with another by similarity alone."""
    frame = pl.DataFrame({"text": list(texts)}, schema={"text": pl.String})
    with warnings.catch_warnings():
        # the operator answers for these rows (asked, or given a status of their own): a
        # warning naming this frame's ``vector_error`` column would point at no column it adds
        warnings.simplefilter("ignore", RowsFailedWarning)
        embedded = waves.embed(frame, "text", model=model)
    failed = embedded["vector_status"].cast(pl.String).is_in(list(FAILED)).to_list()
    errors = embedded["vector_error"].to_list()
    vectors = [
        v if v is not None and not bad else None
        for v, bad in zip(embedded["vector"].to_list(), failed, strict=True)
    ]
    width = next((len(v) for v in vectors if v is not None), 1)
    matrix = np.zeros((len(vectors), width), dtype=np.float32)
    for i, vector in enumerate(vectors):
        if vector is not None:
            matrix[i] = vector
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    np.divide(matrix, norms, out=matrix, where=norms > 0)
    return matrix, [error if bad else None for error, bad in zip(errors, failed, strict=True)]


def cosine(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Every left row's cosine similarity to every right row (both of unit rows)."""
    return np.asarray(left @ right.T, dtype=np.float32)


def nearest(similarity: np.ndarray, m: int) -> np.ndarray:
    """Each row's ``m`` most similar columns, most similar first (fewer columns: all)."""
    m = min(m, similarity.shape[1])
    if m == 0:
        return np.zeros((similarity.shape[0], 0), dtype=np.int64)
    top = np.argpartition(-similarity, m - 1, axis=1)[:, :m]
    order = np.argsort(-np.take_along_axis(similarity, top, axis=1), axis=1, kind="stable")
    return np.take_along_axis(top, order, axis=1)
