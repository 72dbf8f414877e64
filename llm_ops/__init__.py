"""llm-ops: dataframe operators for batch LLM inference.

Every row of a result gets one of these statuses:

>>> import llm_ops
>>> llm_ops.STATUSES
('ok', 'cached', 'similar', 'skipped', 'rejected', 'filtered', 'failed', 'truncated', 'invalid')
"""

from importlib import metadata as _metadata

from ._cache import CACHE_ENV, Cache, default_cache_path, open_cache, parse_duration
from ._client import Client
from ._config import (
    BatchMode,
    Budget,
    Cascade,
    ConfidenceBelow,
    Endpoint,
    Packing,
    RateLimit,
    Retries,
    Sampling,
    SemanticCache,
    confidence_below,
)
from ._expr import ExprOptions, ExtractOptions, LlmNamespace, last_report
from ._expr.frames import llm_classify, llm_extract, llm_filter
from ._key import canonical_json, request_key
from ._media import Documents, Images
from ._operator import estimate, llm_complete, llm_complete_async, llm_embed
from ._options import (
    SETTINGS,
    AskOptions,
    CallOptions,
    ClientOptions,
    EmbedOptions,
    Options,
    RequestOptions,
    options_from_settings,
)
from ._parameters import SettingsModel, parse_settings, settings_parser, with_settings
from ._pipeline.batch import BatchPart
from ._pipeline.estimate import Estimate
from ._pricing import PRICES, Price, parse_pricing
from ._progress import Progress
from ._report import LEVERS, ModelUsage, RunReport, Saving
from ._sets import SetEstimate, SetOptions, estimate_set
from ._sets.aggregate import llm_aggregate
from ._sets.join import llm_join
from ._sets.resolve import llm_resolve
from ._sets.top_k import llm_top_k
from ._status import ESCALATE as ESCALATE_STATUSES
from ._status import STATUS_DTYPE, STATUSES, Status
from ._wire import AsyncTransport, HttpAnswer, HttpRequest
from .exceptions import (
    CacheError,
    CacheLockedError,
    ConfigError,
    JobAbortedError,
    JobInterruptedError,
    LlmOpsError,
    LlmOpsWarning,
    MissingApiKeyError,
    RowsFailedError,
    RowsFailedWarning,
    TemplateError,
)

__all__ = [
    "CACHE_ENV",
    "ESCALATE_STATUSES",
    "LEVERS",
    "PRICES",
    "SETTINGS",
    "STATUSES",
    "STATUS_DTYPE",
    "AskOptions",
    "AsyncTransport",
    "BatchMode",
    "BatchPart",
    "Budget",
    "Cache",
    "CacheError",
    "CacheLockedError",
    "CallOptions",
    "Cascade",
    "Client",
    "ClientOptions",
    "ConfidenceBelow",
    "ConfigError",
    "Documents",
    "EmbedOptions",
    "Endpoint",
    "Estimate",
    "ExprOptions",
    "ExtractOptions",
    "HttpAnswer",
    "HttpRequest",
    "Images",
    "JobAbortedError",
    "JobInterruptedError",
    "LlmNamespace",
    "LlmOpsError",
    "LlmOpsWarning",
    "MissingApiKeyError",
    "ModelUsage",
    "Options",
    "Packing",
    "Price",
    "Progress",
    "RateLimit",
    "RequestOptions",
    "Retries",
    "RowsFailedError",
    "RowsFailedWarning",
    "RunReport",
    "Sampling",
    "Saving",
    "SemanticCache",
    "SetEstimate",
    "SetOptions",
    "SettingsModel",
    "Status",
    "TemplateError",
    "canonical_json",
    "confidence_below",
    "default_cache_path",
    "estimate",
    "estimate_set",
    "last_report",
    "llm_aggregate",
    "llm_classify",
    "llm_complete",
    "llm_complete_async",
    "llm_embed",
    "llm_extract",
    "llm_filter",
    "llm_join",
    "llm_resolve",
    "llm_top_k",
    "open_cache",
    "options_from_settings",
    "parse_duration",
    "parse_pricing",
    "parse_settings",
    "request_key",
    "settings_parser",
    "with_settings",
]

try:
    __version__ = _metadata.version("llm-ops")  # pyproject.toml is the one place it is written
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
