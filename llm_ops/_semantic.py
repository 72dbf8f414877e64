"""The semantic cache's settings (``semantic_cache=``) and its search: the most similar indexed
answer of each miss, scored with numpy matrix products a block at a time (about 30 times
faster than ``array_cosine_similarity`` over a cross join here, with memory bounded by the
block sizes). How a job uses it is in ``_similar``."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._key import build_request, canonical_json, messages_for
from .exceptions import ConfigError

MISS_BLOCK = 2_048  # score blocks of at most MISS_BLOCK x CANDIDATE_BLOCK floats (128 MB)
CANDIDATE_BLOCK = 16_384


@dataclass(frozen=True)
class SemanticCache:
    """Settings of the semantic cache, an opt-in second cache tier (``semantic_cache=``).

    Parameters
    ----------
    model
        Embedding model, on the same endpoint as the completions.
    threshold
        Cosine similarity from which a cached answer is reused (0 < threshold <= 1). High
        values (0.95 and up) reuse answers to near-identical prompts only.
    dimensions
        Ask the embedding endpoint for vectors of this size.
    inputs_per_request
        Texts per embedding request.

    Examples
    --------
    >>> SemanticCache("text-embedding-3-small", threshold=0.97)  # doctest: +ELLIPSIS
    SemanticCache(model='text-embedding-3-small', threshold=0.97, dimensions=None, ...)
    """

    model: str
    threshold: float = 0.95
    dimensions: int | None = None
    inputs_per_request: int = 256

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError(
                f"SemanticCache needs an embedding model name such as "
                f"'text-embedding-3-small', got {self.model!r}"
            )
        threshold = self.threshold
        if (
            isinstance(threshold, bool)
            or not isinstance(threshold, int | float)
            or not (0 < threshold <= 1)
        ):
            raise ConfigError(
                f"SemanticCache threshold is a cosine similarity in (0, 1], "
                f"e.g. 0.95, got {threshold!r}"
            )
        for name in ("dimensions", "inputs_per_request"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigError(f"SemanticCache {name} must be a positive integer, got {value!r}")

    @property
    def params(self) -> dict[str, Any]:
        return {"dimensions": self.dimensions} if self.dimensions is not None else {}


def scope_of(
    *, endpoint: str, model: str, params: Mapping[str, Any], system: str | None, template: str
) -> str:
    """A tagged hash of a request with its user prompt replaced by the prompt's *template*:
    answers may only be reused between requests of one scope, which differ only in the column
    values rendered into the prompt."""
    request = build_request(
        endpoint=endpoint, model=model, messages=messages_for(system, template), params=params
    )
    return "scope-v1:" + hashlib.sha256(canonical_json(request).encode()).hexdigest()


def normalised(vectors: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1.0, norms)
