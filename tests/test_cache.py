"""The DuckDB cache file: location, migrations, runs table, write-through."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
from sources import syntax_tree

import llm_ops
from llm_ops import Cache, default_cache_path
from llm_ops._cache import MIGRATIONS

DF = pl.DataFrame({"text": ["a", "b"]})


def _query(path, sql):
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_migrations_are_numbered_and_recorded(complete, cache):
    DF.pipe(complete, prompt="{text}")
    assert _query(cache, "SELECT version, name FROM llm_ops_migrations ORDER BY 1") == [
        (1, "create llm_cache"),
        (2, "create llm_runs"),
        (3, "create llm_embeddings"),
        (4, "add cost to llm_runs"),
        (5, "add savings per lever and usage per model to llm_runs"),
        (6, "create llm_semantic_index"),
        (7, "create llm_batches and llm_batch_requests; add mode to llm_runs"),
        (8, "add cached_tokens to llm_cache and llm_runs"),
        (9, "no primary key index on the tables that grow with the answers"),
        (10, "add concurrency to llm_runs"),
        (11, "add reasoning_tokens to llm_cache and llm_runs"),
        (12, "create llm_cache_history"),
        (13, "add reasoning_text to llm_cache and llm_cache_history"),
        (14, "add cache_write_tokens to llm_cache, llm_cache_history and llm_runs"),
    ]


def test_two_writers_of_one_answer_leave_one_row(cache):
    store = Cache(cache)
    store.prepare()
    row = {"key": "v1:k", "model": "m", "endpoint": "e", "request": "{}", "status": "ok"}
    for text in ("first", "second"):
        writer = store.writer()
        writer.answer({**row, "response_text": text})
        writer.close(wait=5.0)
    assert _query(cache, "SELECT response_text FROM llm_cache") == [("first",)]


def test_a_cache_of_version_8_keeps_its_answers_without_a_key_index(complete, cache, tmp_path):
    DF.pipe(complete, prompt="{text}")
    old = tmp_path / "old.duckdb"
    shutil.copy(cache, old)
    with duckdb.connect(str(old)) as con:  # back to version 8: llm_cache with its index
        con.execute("ALTER TABLE llm_cache RENAME TO answers")
        con.execute("ALTER TABLE answers DROP COLUMN reasoning_tokens")  # of version 11
        con.execute("ALTER TABLE answers DROP COLUMN reasoning_text")  # of version 13
        con.execute("ALTER TABLE answers DROP COLUMN cache_write_tokens")  # of version 14
        con.execute(MIGRATIONS[0][2])
        con.execute("ALTER TABLE llm_cache ADD COLUMN cached_tokens INTEGER")
        con.execute("INSERT INTO llm_cache SELECT * FROM answers")
        con.execute("DROP TABLE answers")
        con.execute("ALTER TABLE llm_runs DROP COLUMN concurrency")  # and of version 10
        con.execute("ALTER TABLE llm_runs DROP COLUMN concurrency_why")
        con.execute("ALTER TABLE llm_runs DROP COLUMN reasoning_tokens")  # and of version 11
        con.execute("DROP TABLE llm_cache_history")  # and of version 12
        con.execute("ALTER TABLE llm_runs DROP COLUMN refreshed_for_age")
        con.execute("ALTER TABLE llm_runs DROP COLUMN cache_write_tokens")  # and of version 14
        con.execute("DELETE FROM llm_ops_migrations WHERE version >= 9")
    report = DF.pipe(complete, prompt="{text}", cache=old, return_report=True)[1]
    assert (report.cache_hits, report.requests_sent) == (2, 0)
    kinds = "SELECT constraint_type FROM duckdb_constraints() WHERE table_name = 'llm_cache'"
    assert "PRIMARY KEY" not in {kind for (kind,) in _query(old, kinds)}


def test_every_run_is_recorded(complete, cache):
    DF.pipe(complete, prompt="{text}")
    DF.pipe(complete, prompt="{text}")
    assert _query(cache, "SELECT cache_hits, requests_sent FROM llm_runs ORDER BY started_at") == [
        (0, 2),
        (2, 0),
    ]


def test_a_jobs_end_folds_duckdbs_log_into_the_file(complete, cache):
    # A log left beside the file is replayed by every connection of the next job: skipping
    # the checkpoint saved the end of a job 0.17 s and cost a warm rerun of 5,000 rows as
    # much again (0.19 s -> 0.35 s).
    DF.pipe(complete, prompt="{text}")
    assert not cache.with_name(cache.name + ".wal").exists()


def test_a_new_cache_appears_whole_and_leaves_no_draft(complete, tmp_path):
    # Made beside its place and linked in: a reader polling for the file never opens it
    # before DuckDB has written its header (it was told the file is "not a valid DuckDB
    # database file", and to move it aside).
    DF.pipe(complete, prompt="{text}", cache=tmp_path / "c.duckdb")
    assert not [p for p in tmp_path.iterdir() if ".new-" in p.name]
    assert (tmp_path / "c.duckdb").stat().st_nlink == 1


def test_cache_false_writes_no_file_and_always_sends(complete, cache, endpoint):
    DF.pipe(complete, prompt="{text}", cache=False)
    DF.pipe(complete, prompt="{text}", cache=False)
    assert endpoint.stats()["requests"] == 4
    assert not cache.exists()


def test_env_var_sets_the_location(complete, tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_OPS_CACHE", str(tmp_path / "env.duckdb"))
    DF.pipe(complete, prompt="{text}", cache=None)
    assert (tmp_path / "env.duckdb").exists()


def test_default_location_is_per_user(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_path() == tmp_path / "llm-ops" / "cache.duckdb"


def test_small_flush_batches_store_every_answer(complete, cache):
    df = pl.DataFrame({"text": [str(i) for i in range(20)]})
    df.pipe(complete, prompt="{text}", cache=Cache(cache, flush_every=5), concurrency=2)
    assert _query(cache, "SELECT count(*) FROM llm_cache") == [(20,)]


def _storage_version(path):
    """The version number in a DuckDB file's header (64: readable by every DuckDB 1.x)."""
    return int.from_bytes(path.read_bytes()[12:20], "little")


def test_a_new_cache_is_readable_by_duckdb_1_x(complete, cache):
    DF.pipe(complete, prompt="{text}")
    assert _storage_version(cache) == 64


def test_a_cache_in_a_newer_format_still_works_and_vacuum_converts_it(complete, cache, tmp_path):
    DF.pipe(complete, prompt="{text}")
    newer = tmp_path / "newer.duckdb"
    with duckdb.connect(str(newer)) as con:
        con.execute(f"ATTACH '{cache}' AS old (READ_ONLY); COPY FROM DATABASE old TO newer")
    assert _storage_version(newer) != 64
    assert DF.pipe(complete, prompt="{text}", cache=newer)["completion_status"][0] == "cached"
    Cache(newer).vacuum()
    assert _storage_version(newer) == 64


def _answer(key, tokens):
    return {
        "key": key,
        "model": "m",
        "endpoint": "e",
        "request": "{}",
        "status": "ok",
        "prompt_tokens": tokens,
    }


def test_a_view_of_the_answers_holds_those_still_in_the_journal_and_the_files_win(cache):
    store = Cache(cache)
    store.insert("llm_cache", pa.Table.from_pylist([_answer("a", 1)]))
    writer = store.writer()
    writer.answer(_answer("a", 99))
    writer.answer(_answer("b", 2))
    writer.write()
    with (
        duckdb.connect() as con,
        store.answers_view(con, name="cached", columns=["key", "prompt_tokens"]),
    ):
        assert con.sql("SELECT * FROM cached ORDER BY key").fetchall() == [("a", 1), ("b", 2)]
    writer.close(wait=None)


_CACHE_TABLES = re.compile(
    r"\bllm_(cache|runs|embeddings|semantic_index|batches|batch_requests|ops_migrations)\b"
)
_SQL = re.compile(r"\b(SELECT|FROM|JOIN|INSERT|UPDATE|DELETE|CREATE|ALTER|ATTACH|DROP|COPY)\b")
# Examples for people, in the CLI's help: their own SQL, which the cache runs as theirs.
_SQL_FOR_PEOPLE = {
    ("llm_ops/cli/_sql.py", "(SELECT * FROM cache.llm_cache)"),
    ("llm_ops/cli/_sql.py", '"SELECT count(*) FROM cache.llm_cache"'),
}


def _sql_on_cache_tables(path):
    """The string literals of ``path`` that name a cache table in SQL (an f-string's literal
    parts joined), docstrings aside."""
    tree = syntax_tree(path.read_text())
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, documented) and node.body and isinstance(node.body[0], ast.Expr)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(part.value for part in node.values if isinstance(part, ast.Constant))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = "" if id(node) in docstrings else node.value
        else:
            continue
        if _CACHE_TABLES.search(text) and _SQL.search(text):
            yield text


def test_only_the_cache_package_speaks_sql_to_the_cache_tables():
    root = Path(llm_ops.__file__).parent.parent
    outside = [
        p
        for p in [*root.glob("llm_ops/**/*.py"), *root.glob("flows/*.py")]
        if root / "llm_ops" / "_cache" not in p.parents
    ]
    found = {
        (p.relative_to(root).as_posix(), text) for p in outside for text in _sql_on_cache_tables(p)
    }
    for_people = {
        (name, text)
        for name, text in found
        for where, part in _SQL_FOR_PEOPLE
        if name == where and part in text
    }
    assert outside and found - for_people == set()
