"""The semantic cache's search (its settings, ``semantic_cache=``, are
:class:`~llm_ops.SemanticCache` in :mod:`llm_ops._config`): the most similar indexed
answer of each miss, scored with numpy matrix products a block at a time (about 30 times
faster than ``array_cosine_similarity`` over a cross join here, with memory bounded by the
block sizes). How a job uses it is in ``_similar``."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._key import build_request, canonical_json, messages_for

MISS_BLOCK = 2_048  # score blocks of at most MISS_BLOCK x CANDIDATE_BLOCK floats (128 MB)
CANDIDATE_BLOCK = 16_384


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
