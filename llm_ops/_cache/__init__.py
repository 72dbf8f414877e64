"""The cache database: a DuckDB file holding ``llm_cache``, ``llm_runs`` and friends, with its
journal folder beside it; :class:`Cache` is its one face, and all SQL on its tables lives in
this package.

Location: the ``cache=`` argument, else the ``LLM_OPS_CACHE`` environment variable, else
``$XDG_CACHE_HOME/llm-ops/cache.duckdb`` (``~/.cache/llm-ops/cache.duckdb``).
"""

from ._connection import CACHE_ENV, DUCKDB_CONFIG, default_cache_path, resolve_cache_path
from ._migrations import LATEST_VERSION, MIGRATIONS, migrate
from ._store import FLUSH_EVERY, MERGE_WAIT, Cache, cache_of, open_cache, parse_duration
from ._writes import Merged

__all__ = [
    "CACHE_ENV",
    "DUCKDB_CONFIG",
    "FLUSH_EVERY",
    "LATEST_VERSION",
    "MERGE_WAIT",
    "MIGRATIONS",
    "Cache",
    "Merged",
    "cache_of",
    "default_cache_path",
    "migrate",
    "open_cache",
    "parse_duration",
    "resolve_cache_path",
]
