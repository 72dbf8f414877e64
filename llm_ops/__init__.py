"""llm-ops: dataframe operators for batch LLM inference.

Every row of a result gets one of these statuses:

>>> import llm_ops
>>> llm_ops.STATUSES
('ok', 'cached', 'similar', 'skipped', 'rejected', 'filtered', 'failed', 'truncated', 'invalid')
"""

from ._cache import CACHE_ENV, default_cache_path, open_cache
from ._embed import llm_embed
from ._escalate import ESCALATE_STATUSES, ConfidenceBelow, confidence_below
from ._estimate import Estimate, estimate
from ._key import canonical_json, request_key
from ._operator import llm_complete, llm_complete_async
from ._pricing import PRICES, Price
from ._progress import Progress
from ._report import LEVERS, STATUSES, ModelUsage, RunReport, Saving
from ._semantic import SemanticCache
from .exceptions import (
    CacheError,
    CacheLockedError,
    ConfigError,
    JobAbortedError,
    JobInterruptedError,
    LlmOpsError,
    MissingApiKeyError,
    RowsFailedError,
    TemplateError,
)

__all__ = [
    "CACHE_ENV",
    "ESCALATE_STATUSES",
    "LEVERS",
    "PRICES",
    "STATUSES",
    "CacheError",
    "CacheLockedError",
    "ConfidenceBelow",
    "ConfigError",
    "Estimate",
    "JobAbortedError",
    "JobInterruptedError",
    "LlmOpsError",
    "MissingApiKeyError",
    "ModelUsage",
    "Price",
    "Progress",
    "RowsFailedError",
    "RunReport",
    "Saving",
    "SemanticCache",
    "TemplateError",
    "canonical_json",
    "confidence_below",
    "default_cache_path",
    "estimate",
    "llm_complete",
    "llm_complete_async",
    "llm_embed",
    "open_cache",
    "request_key",
]

__version__ = "0.1.0"
