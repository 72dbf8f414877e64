"""Journal lines of any length: a paid answer merges whatever its size, a request whose answer
could not be kept is not sent, and a merge that fails says why."""

from __future__ import annotations

import logging
from pathlib import Path

import duckdb
import orjson
import polars as pl

from llm_ops import _journal
from llm_ops._cache import _journal_sql
from llm_ops._cache._journal_sql import DEFAULT_OBJECT_SIZE, longest_line
from llm_ops._journal import JournalWriter
from llm_ops.cli import main

# DuckDB reads a line of up to twice maximum_object_size (16 MiB by default), so a line past
# 32 MiB is what stopped every merge and lookup. JSON spells a control character in 6 bytes,
# and the journal quotes the request JSON once more (7): a 5 MiB prompt is a 35 MiB line.
HUGE = 5 * 2**20
OVER = 33 * 2**20  # a line past DuckDB's limit, written whole by a test


def _count(cache: Path) -> int:
    with duckdb.connect(str(cache), read_only=True) as con:
        return int(con.execute("SELECT count(*) FROM llm_cache").fetchall()[0][0])


def _journal_a_long_line(cache: Path) -> None:
    """What a finished job left in the journal: one answer whose request is OVER bytes long."""
    request = {"model": "sim", "messages": [{"role": "user", "content": "x" * OVER}]}
    line = {"key": "v1:long", "model": "sim", "endpoint": "http://sim", "status": "ok"}
    line |= {"request": orjson.dumps(request).decode(), "response_text": "an answer"}
    journal = cache.with_name(cache.name + ".journal")
    journal.mkdir()
    (journal / "gone-1-abc.000000.llm_cache.jsonl").write_bytes(orjson.dumps(line) + b"\n")


def test_a_prompt_past_duckdbs_json_limit_is_answered_merged_and_then_cached(
    complete, endpoint, cache
):
    huge = pl.DataFrame({"text": ["\x1f" * HUGE]})
    assert huge.pipe(complete, prompt="{text}")["completion_status"].to_list() == ["ok"]
    assert _count(cache) == 1  # in the file itself: the merge read the line
    assert huge.pipe(complete, prompt="{text}")["completion_status"].to_list() == ["cached"]
    assert endpoint.stats()["requests"] == 1


def test_cache_merge_takes_a_line_past_duckdbs_json_limit(cache, capsys):
    _journal_a_long_line(cache)
    assert main(["cache", "merge", "--cache", str(cache)]) == 0
    assert "llm_cache 1" in capsys.readouterr().out
    assert _count(cache) == 1


def test_a_merge_that_fails_for_another_reason_than_a_lock_says_that_reason(
    cache, capsys, monkeypatch
):
    _journal_a_long_line(cache)
    monkeypatch.setattr(_journal_sql, "LINE_MOST", DEFAULT_OBJECT_SIZE)  # the limit it had
    assert main(["cache", "merge", "--cache", str(cache), "--wait", "5"]) == 1
    said = capsys.readouterr().err
    assert '"maximum_object_size" of 16777216 bytes exceeded' in said
    assert "held by another process" not in said
    assert "moving that file out of the journal" in said


def test_the_longest_line_is_measured_across_reads(tmp_path):
    file = tmp_path / "w.000000.llm_cache.jsonl"
    file.write_bytes(b"{}\n" + b"x" * (3 * 2**20) + b"\n{}")
    assert longest_line(file) == 3 * 2**20 + 1


def test_a_line_no_merge_could_read_is_not_written(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(_journal, "LINE_MOST", 1_000)
    writer = JournalWriter(tmp_path, merge=lambda files, wait: None, merge_every=1)
    with caplog.at_level(logging.WARNING, logger="llm_ops"):
        writer.answer({"key": "v1:long", "request": "x" * 1_000})
    writer.close(wait=None)
    assert list(tmp_path.glob("*.jsonl")) == []
    assert "not caching the llm_cache row of key v1:long" in caplog.text


def test_a_request_whose_answer_a_journal_line_could_not_hold_is_not_sent(
    complete, endpoint, monkeypatch
):
    # a line of 2 MiB keeps half for the answer: no room for a request of 1 MiB
    monkeypatch.setattr(_journal, "LINE_MOST", 2 * 2**20)
    rows = pl.DataFrame({"text": ["short", "x" * 2**20]})
    out = rows.pipe(complete, prompt="{text}")
    assert out["completion_status"].to_list() == ["ok", "skipped"]
    assert "max_response_bytes" in out["completion_error"][1]
    assert endpoint.stats()["requests"] == 1


def test_a_request_longer_than_a_lookup_reads_back_is_not_sent(complete, endpoint, monkeypatch):
    monkeypatch.setattr(_journal, "VALUE_MOST", 1_000)
    out = pl.DataFrame({"text": ["x" * 1_000]}).pipe(complete, prompt="{text}")
    assert out["completion_status"].to_list() == ["skipped"]
    assert "a lookup of the cache can read back" in out["completion_error"][0]
    assert endpoint.stats()["requests"] == 0


def test_without_a_cache_no_request_is_refused_for_its_size(complete, monkeypatch):
    monkeypatch.setattr(_journal, "LINE_MOST", 2 * 2**20)
    out = pl.DataFrame({"text": ["x" * 2**20]}).pipe(complete, prompt="{text}", cache=False)
    assert out["completion_status"].to_list() == ["ok"]
