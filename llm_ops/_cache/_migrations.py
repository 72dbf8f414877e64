"""The cache's tables: the numbered migrations that make them (all their DDL), and the columns
of each as the journal's lines and the lookups carry them.

The schema only changes through :data:`MIGRATIONS`; the versions applied are recorded in
``llm_ops_migrations``, and :func:`migrate` applies the rest in one transaction.

The column of why an answer stopped keeps the name it was made with, OpenAI's, though the
dialects are elsewhere (:mod:`llm_ops._dialects`): users query it by that name, and renaming
it would break their SQL. It holds the endpoint's own word, whatever its dialect.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "create llm_cache",
        """
        CREATE TABLE llm_cache (
            key VARCHAR PRIMARY KEY,       -- "v1:" + sha256 of the canonical request JSON
            model VARCHAR NOT NULL,
            endpoint VARCHAR NOT NULL,     -- normalised base URL, never credentials
            request JSON NOT NULL,         -- the canonical request that was hashed
            status VARCHAR NOT NULL,       -- ok | truncated
            response_text VARCHAR,
            response_json JSON,            -- parsed structured output, when one was asked for
            finish_reason VARCHAR,
            prompt_tokens INTEGER,
            completion_tokens INTEGER,
            latency_ms DOUBLE,
            attempts INTEGER,
            created_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
        )
        """,
    ),
    (
        2,
        "create llm_runs",
        """
        CREATE TABLE llm_runs (
            run_id VARCHAR PRIMARY KEY,
            started_at TIMESTAMPTZ NOT NULL,
            finished_at TIMESTAMPTZ NOT NULL,
            model VARCHAR NOT NULL,
            endpoint VARCHAR NOT NULL,
            rows BIGINT NOT NULL,
            distinct_requests BIGINT NOT NULL,
            cache_hits BIGINT NOT NULL,
            requests_sent BIGINT NOT NULL,
            retries BIGINT NOT NULL,
            statuses MAP(VARCHAR, BIGINT) NOT NULL,
            prompt_tokens BIGINT NOT NULL,
            completion_tokens BIGINT NOT NULL,
            wall_seconds DOUBLE NOT NULL,
            outcome VARCHAR NOT NULL,      -- completed | aborted
            error VARCHAR
        )
        """,
    ),
    (
        3,
        "create llm_embeddings",
        """
        CREATE TABLE llm_embeddings (
            key VARCHAR PRIMARY KEY,       -- "v1:" + sha256 of the canonical embedding request
            model VARCHAR NOT NULL,
            endpoint VARCHAR NOT NULL,
            request JSON NOT NULL,         -- {"endpoint", "input", "model", "dimensions"?}
            dimensions INTEGER NOT NULL,
            embedding FLOAT[] NOT NULL,
            prompt_tokens INTEGER,         -- the batch's usage, shared out by input length
            latency_ms DOUBLE,             -- of the batch request that carried this input
            created_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
        )
        """,
    ),
    (
        4,
        "add cost to llm_runs",
        """
        ALTER TABLE llm_runs ADD COLUMN cost DOUBLE;         -- dollars; NULL when unknown
        ALTER TABLE llm_runs ADD COLUMN cost_saved DOUBLE;   -- by cache, dedupe and packing
        ALTER TABLE llm_runs ADD COLUMN budget_stop VARCHAR  -- why a budget stopped sending
        """,
    ),
    (
        5,
        "add savings per lever and usage per model to llm_runs",
        """
        ALTER TABLE llm_runs ADD COLUMN savings          -- lever -> what it saved
            MAP(VARCHAR, STRUCT(requests BIGINT, cost DOUBLE));
        ALTER TABLE llm_runs ADD COLUMN models           -- model -> its share of the job
            MAP(VARCHAR, STRUCT(rows BIGINT, requests BIGINT, prompt_tokens BIGINT,
                                completion_tokens BIGINT, cost DOUBLE))
        """,
    ),
    (
        6,
        "create llm_semantic_index",
        """
        CREATE TABLE llm_semantic_index (
            key VARCHAR PRIMARY KEY,       -- the llm_cache answer that may be reused
            scope VARCHAR NOT NULL,        -- tagged hash of the request minus the user prompt
            embedding_key VARCHAR NOT NULL, -- the llm_embeddings vector of the user prompt
            created_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
        )
        """,
    ),
    (
        7,
        "create llm_batches and llm_batch_requests; add mode to llm_runs",
        """
        CREATE TABLE llm_batches (
            key VARCHAR PRIMARY KEY,       -- job_id:part:state; a row per state a part reached
            job_id VARCHAR NOT NULL,       -- one submission, carried by its batches' metadata
            part INTEGER NOT NULL,         -- which file of the submission
            state VARCHAR NOT NULL,        -- preparing | uploaded | submitted | the provider's
                                           -- statuses (validating ... cancelled) | collected
            endpoint VARCHAR NOT NULL,
            model VARCHAR NOT NULL,
            requests INTEGER NOT NULL,     -- lines in the part's file
            input_file_id VARCHAR,
            batch_id VARCHAR,
            output_file_id VARCHAR,
            error_file_id VARCHAR,
            recorded_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
        );
        CREATE TABLE llm_batch_requests (
            key VARCHAR PRIMARY KEY,       -- job_id:part:request_key
            job_id VARCHAR NOT NULL,
            part INTEGER NOT NULL,
            request_key VARCHAR NOT NULL   -- the llm_cache key, the line's custom_id
        );
        ALTER TABLE llm_runs ADD COLUMN mode VARCHAR  -- live | batch
        """,
    ),
    (
        8,
        "add cached_tokens to llm_cache and llm_runs",
        """
        -- of prompt_tokens, those the server read from its prefix cache (usage.
        -- prompt_tokens_details.cached_tokens), billed at the cached-input price;
        -- NULL for answers and runs recorded before
        ALTER TABLE llm_cache ADD COLUMN cached_tokens INTEGER;
        ALTER TABLE llm_runs ADD COLUMN cached_tokens BIGINT
        """,
    ),
    (
        9,
        "no primary key index on the tables that grow with the answers",
        # DuckDB rewrote each whole index at every checkpoint, which ends every merge: at a
        # million answers a merge of 7,000 took 0.74 s of CPU instead of 0.29, and the index
        # made the file three times larger. One row per key is kept by the merge instead
        # (see KEYS). Columns and their order are those of the tables rebuilt.
        """
        CREATE TABLE llm_cache_9 (
            key VARCHAR NOT NULL,          -- "v1:" + sha256 of the canonical request JSON
            model VARCHAR NOT NULL,
            endpoint VARCHAR NOT NULL,     -- normalised base URL, never credentials
            request JSON NOT NULL,         -- the canonical request that was hashed
            status VARCHAR NOT NULL,       -- ok | truncated
            response_text VARCHAR,
            response_json JSON,            -- parsed structured output, when one was asked for
            finish_reason VARCHAR,
            prompt_tokens INTEGER,
            completion_tokens INTEGER,
            latency_ms DOUBLE,
            attempts INTEGER,
            created_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp,
            cached_tokens INTEGER          -- of prompt_tokens, read from the prefix cache
        );
        INSERT INTO llm_cache_9 SELECT * FROM llm_cache;
        DROP TABLE llm_cache;
        ALTER TABLE llm_cache_9 RENAME TO llm_cache;

        CREATE TABLE llm_embeddings_9 (
            key VARCHAR NOT NULL,          -- "v1:" + sha256 of the canonical embedding request
            model VARCHAR NOT NULL,
            endpoint VARCHAR NOT NULL,
            request JSON NOT NULL,         -- {"endpoint", "input", "model", "dimensions"?}
            dimensions INTEGER NOT NULL,
            embedding FLOAT[] NOT NULL,
            prompt_tokens INTEGER,         -- the batch's usage, shared out by input length
            latency_ms DOUBLE,             -- of the batch request that carried this input
            created_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
        );
        INSERT INTO llm_embeddings_9 SELECT * FROM llm_embeddings;
        DROP TABLE llm_embeddings;
        ALTER TABLE llm_embeddings_9 RENAME TO llm_embeddings;

        CREATE TABLE llm_semantic_index_9 (
            key VARCHAR NOT NULL,          -- the llm_cache answer that may be reused
            scope VARCHAR NOT NULL,        -- tagged hash of the request minus the user prompt
            embedding_key VARCHAR NOT NULL, -- the llm_embeddings vector of the user prompt
            created_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
        );
        INSERT INTO llm_semantic_index_9 SELECT * FROM llm_semantic_index;
        DROP TABLE llm_semantic_index;
        ALTER TABLE llm_semantic_index_9 RENAME TO llm_semantic_index;

        CREATE TABLE llm_batch_requests_9 (
            key VARCHAR NOT NULL,          -- job_id:part:request_key
            job_id VARCHAR NOT NULL,
            part INTEGER NOT NULL,
            request_key VARCHAR NOT NULL   -- the llm_cache key, the line's custom_id
        );
        INSERT INTO llm_batch_requests_9 SELECT * FROM llm_batch_requests;
        DROP TABLE llm_batch_requests;
        ALTER TABLE llm_batch_requests_9 RENAME TO llm_batch_requests
        """,
    ),
    (
        10,
        "add concurrency to llm_runs",
        """
        -- the limit on requests in flight when the job ended, and why (llm_ops._concurrency):
        -- the next job on the endpoint starts from it; NULL for runs recorded before
        ALTER TABLE llm_runs ADD COLUMN concurrency INTEGER;
        ALTER TABLE llm_runs ADD COLUMN concurrency_why VARCHAR
        """,
    ),
    (
        11,
        "add reasoning_tokens to llm_cache and llm_runs",
        """
        -- of completion_tokens, those a reasoning model spent thinking (usage.
        -- completion_tokens_details.reasoning_tokens): billed as output, never seen;
        -- NULL for answers and runs recorded before
        ALTER TABLE llm_cache ADD COLUMN reasoning_tokens INTEGER;
        ALTER TABLE llm_runs ADD COLUMN reasoning_tokens BIGINT
        """,
    ),
    (
        12,
        "create llm_cache_history",
        # llm_cache keeps one row per key, the answer jobs reuse, so every reader of it (a
        # lookup, `llm-ops cache stats`, people's SQL) stays as it was; an answer a newer one
        # to its key replaced (a refresh for age, see Cache.max_age) moves here, never deleted.
        """
        CREATE TABLE llm_cache_history (
            key VARCHAR NOT NULL,
            model VARCHAR NOT NULL,
            endpoint VARCHAR NOT NULL,
            request JSON NOT NULL,
            status VARCHAR NOT NULL,
            response_text VARCHAR,
            response_json JSON,
            finish_reason VARCHAR,
            prompt_tokens INTEGER,
            completion_tokens INTEGER,
            latency_ms DOUBLE,
            attempts INTEGER,
            created_at TIMESTAMPTZ NOT NULL,  -- when the answer came
            cached_tokens INTEGER,
            reasoning_tokens INTEGER,
            replaced_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp  -- when it was replaced
        );
        -- of the requests a job sent, those to which the cache held an answer too old
        ALTER TABLE llm_runs ADD COLUMN refreshed_for_age BIGINT
        """,
    ),
    (
        13,
        "add reasoning_text to llm_cache and llm_cache_history",
        # Kept whenever the endpoint returns it, whether or not the job asked to keep it
        # (keep_reasoning= is not keyed): a later job that asks finds it on a hit.
        """
        -- a reasoning model's thinking, beside its answer (the message's reasoning_content,
        -- or reasoning); NULL when none came, and for answers recorded before
        ALTER TABLE llm_cache ADD COLUMN reasoning_text VARCHAR;
        -- history holds every column llm_cache has (see migration 12)
        ALTER TABLE llm_cache_history ADD COLUMN reasoning_text VARCHAR
        """,
    ),
    (
        14,
        "add cache_write_tokens to llm_cache, llm_cache_history and llm_runs",
        """
        -- of prompt_tokens, those written to a provider's prompt cache (Anthropic reports
        -- them), billed at the cache-write price; NULL for answers and runs recorded before
        ALTER TABLE llm_cache ADD COLUMN cache_write_tokens INTEGER;
        -- history holds every column llm_cache has (see migration 12)
        ALTER TABLE llm_cache_history ADD COLUMN cache_write_tokens INTEGER;
        ALTER TABLE llm_runs ADD COLUMN cache_write_tokens BIGINT
        """,
    ),
)

LATEST_VERSION = MIGRATIONS[-1][0]

# What a lookup returns of each table's answers, as Arrow types.
CACHE_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("model", pa.string()),
        ("endpoint", pa.string()),
        ("request", pa.string()),
        ("status", pa.string()),
        ("response_text", pa.string()),
        ("response_json", pa.string()),
        ("finish_reason", pa.string()),
        ("prompt_tokens", pa.int32()),
        ("completion_tokens", pa.int32()),
        ("latency_ms", pa.float64()),
        ("attempts", pa.int32()),
        ("reasoning_text", pa.string()),
    ]
)
EMBEDDING_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("model", pa.string()),
        ("endpoint", pa.string()),
        ("request", pa.string()),
        ("dimensions", pa.int32()),
        ("embedding", pa.list_(pa.float32())),
        ("prompt_tokens", pa.int32()),
        ("latency_ms", pa.float64()),
    ]
)

# Column types of each table's journal lines, as DuckDB's read_json wants them.
COLUMNS: dict[str, dict[str, str]] = {
    "llm_cache": {
        "key": "VARCHAR",
        "model": "VARCHAR",
        "endpoint": "VARCHAR",
        "request": "VARCHAR",
        "status": "VARCHAR",
        "response_text": "VARCHAR",
        "response_json": "VARCHAR",
        "finish_reason": "VARCHAR",
        "prompt_tokens": "INTEGER",
        "completion_tokens": "INTEGER",
        "latency_ms": "DOUBLE",
        "attempts": "INTEGER",
        "cached_tokens": "INTEGER",
        "reasoning_tokens": "INTEGER",
        "reasoning_text": "VARCHAR",
        "cache_write_tokens": "INTEGER",
        "created_at": "TIMESTAMPTZ",  # when the answer came; lines written before: merge time
        "refresh": "BOOLEAN",  # sent by a job with a max_age: it replaces an older answer
    },
    "llm_embeddings": {
        "key": "VARCHAR",
        "model": "VARCHAR",
        "endpoint": "VARCHAR",
        "request": "VARCHAR",
        "dimensions": "INTEGER",
        "embedding": "FLOAT[]",
        "prompt_tokens": "INTEGER",
        "latency_ms": "DOUBLE",
    },
    "llm_semantic_index": {"key": "VARCHAR", "scope": "VARCHAR", "embedding_key": "VARCHAR"},
    "llm_batches": {
        "key": "VARCHAR",
        "job_id": "VARCHAR",
        "part": "INTEGER",
        "state": "VARCHAR",
        "endpoint": "VARCHAR",
        "model": "VARCHAR",
        "requests": "INTEGER",
        "input_file_id": "VARCHAR",
        "batch_id": "VARCHAR",
        "output_file_id": "VARCHAR",
        "error_file_id": "VARCHAR",
    },
    "llm_batch_requests": {
        "key": "VARCHAR",
        "job_id": "VARCHAR",
        "part": "INTEGER",
        "request_key": "VARCHAR",
    },
    "llm_runs": {
        "run_id": "VARCHAR",
        "started_at": "TIMESTAMPTZ",
        "finished_at": "TIMESTAMPTZ",
        "model": "VARCHAR",
        "endpoint": "VARCHAR",
        "rows": "BIGINT",
        "distinct_requests": "BIGINT",
        "cache_hits": "BIGINT",
        "requests_sent": "BIGINT",
        "retries": "BIGINT",
        "statuses": "MAP(VARCHAR, BIGINT)",
        "prompt_tokens": "BIGINT",
        "completion_tokens": "BIGINT",
        "wall_seconds": "DOUBLE",
        "outcome": "VARCHAR",
        "error": "VARCHAR",
        "cost": "DOUBLE",
        "cost_saved": "DOUBLE",
        "budget_stop": "VARCHAR",
        "savings": "MAP(VARCHAR, STRUCT(requests BIGINT, cost DOUBLE))",
        "models": "MAP(VARCHAR, STRUCT(rows BIGINT, requests BIGINT, prompt_tokens BIGINT, "
        "completion_tokens BIGINT, cost DOUBLE))",
        "mode": "VARCHAR",
        "cached_tokens": "BIGINT",
        "concurrency": "INTEGER",
        "concurrency_why": "VARCHAR",
        "reasoning_tokens": "BIGINT",
        "refreshed_for_age": "BIGINT",
        "cache_write_tokens": "BIGINT",
    },
}
# The columns a journal line must hold (NOT NULL in its table): a line without them is one a
# crash or a full disk cut short, or garbage, and is skipped; merging it would fail the merge.
REQUIRED: dict[str, tuple[str, ...]] = {
    "llm_cache": ("key", "model", "endpoint", "request", "status"),
    "llm_embeddings": ("key", "model", "endpoint", "request", "dimensions", "embedding"),
    "llm_semantic_index": ("key", "scope", "embedding_key"),
    "llm_batches": ("key", "job_id", "part", "state", "endpoint", "model", "requests"),
    "llm_batch_requests": ("key", "job_id", "part", "request_key"),
    "llm_runs": (
        "run_id",
        "started_at",
        "finished_at",
        "model",
        "endpoint",
        "rows",
        "distinct_requests",
        "cache_hits",
        "requests_sent",
        "retries",
        "statuses",
        "prompt_tokens",
        "completion_tokens",
        "wall_seconds",
        "outcome",
    ),
}
# The column that names a row of each table: unique, because rows only ever enter a table
# through an insert of the keys it lacks (see llm_ops._cache._writes.insert_new), whether or
# not an index also says so.
KEYS: dict[str, str] = {table: "key" for table in COLUMNS} | {"llm_runs": "run_id"}
# Columns of a table's journal lines that are not columns of the table: what a merge reads.
JOURNAL_ONLY: dict[str, tuple[str, ...]] = {"llm_cache": ("refresh",)}


def stored(table: str) -> list[str]:
    """The columns of ``table``'s journal lines that a merge inserts."""
    return [name for name in COLUMNS[table] if name not in JOURNAL_ONLY.get(table, ())]


ANSWERS = ("llm_cache", "llm_embeddings")  # the tables whose journal rows are answers
JSON_COLUMNS = {"llm_cache": ("request", "response_json"), "llm_embeddings": ("request",)}


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Apply the migrations not yet recorded; returns the schema version."""
    con.execute(
        "CREATE TABLE IF NOT EXISTS llm_ops_migrations ("
        "version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
        "applied_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp)"
    )
    current = schema_version(con)
    pending = [migration for migration in MIGRATIONS if migration[0] > current]
    if not pending:
        return current
    # One transaction for all of them: a new file is created in one commit, and a failure
    # leaves the file at the version it had, never in between.
    con.execute("BEGIN TRANSACTION")
    try:
        for version, name, sql in pending:
            con.execute(sql)
            con.execute(
                "INSERT INTO llm_ops_migrations (version, name) VALUES (?, ?)", [version, name]
            )
        con.execute("COMMIT")
    except duckdb.Error:
        con.execute("ROLLBACK")
        raise
    return pending[-1][0]


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    # fetchall, not fetchone: DuckDB keeps a partly fetched result open on the connection
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'llm_ops_migrations'"
    ).fetchall()[0][0]
    if not exists:
        return 0
    return int(
        con.execute("SELECT coalesce(max(version), 0) FROM llm_ops_migrations").fetchall()[0][0]
    )
