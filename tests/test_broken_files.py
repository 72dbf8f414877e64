"""Files that break under a job: a full disk, a damaged cache file, broken journal lines; and
a reader that still holds the cache file as a job ends."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pytest

from llm_ops import Cache, CacheError, ConfigError
from llm_ops._cache import migrate
from llm_ops._cache._migrations import COLUMNS, REQUIRED

ROWS = pl.DataFrame({"text": [f"row {i}" for i in range(200)]})
# about 4.5 kB a journal line: a few hundred fill what a small disk has left
BIG = pl.DataFrame({"text": [f"row {i} " + "x" * 2000 for i in range(600)]})
BLOCK = 262_144  # DuckDB's block size


def _count(cache: Path) -> int:
    """Answers in the DuckDB file itself, as another tool sees them (the journal not merged)."""
    with duckdb.connect(str(cache), read_only=True) as con:
        return int(con.execute("SELECT count(*) FROM llm_cache").fetchall()[0][0])


def _statuses(out: pl.DataFrame) -> dict[str, int]:
    return dict(out["completion_status"].cast(pl.String).value_counts().rows())


def _journal(cache: Path) -> list[Path]:
    return sorted(cache.with_name(cache.name + ".journal").glob("*.llm_cache.jsonl"))


# -- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MB file system of its own (tmpfs): a new cache takes 2 MB of it, a job the rest."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "--lazy", str(disk)], check=False)


def _free_space(disk: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)


@pytest.fixture
def full(complete, small_disk):
    """A cache on the small disk, and a job that filled the disk."""
    cache = small_disk / "cache.duckdb"
    ROWS.head(1).pipe(complete, prompt="{text}", cache=cache)
    try:
        BIG.pipe(
            complete,
            prompt="{text}",
            cache=Cache(cache, flush_every=64),
        )
    except CacheError as exc:
        return cache, exc
    raise AssertionError("the job did not fill the disk")


def test_a_full_disk_stops_the_job_with_one_clear_error(full):
    cache, error = full
    assert str(error).startswith(f"no space left on the disk of {cache}")
    assert "free some space" in str(error) and "\n" not in str(error)


def test_a_full_disk_leaves_no_half_written_line_in_the_journal(full):
    cache, _ = full
    for file in _journal(cache):
        *lines, last = file.read_bytes().split(b"\n")
        assert last == b""  # the file ends with a whole line, or is empty
        assert all(json.loads(line)["key"] for line in lines)


def test_after_a_full_disk_a_rerun_sends_only_what_is_missing(full, complete, endpoint):
    cache, _ = full
    _free_space(cache.parent)
    Cache(cache).merge_orphans(wait=5)
    kept = _count(cache) - 1
    endpoint.reset()
    again = BIG.pipe(complete, prompt="{text}", cache=cache)
    assert kept > 0
    assert _statuses(again) == {"cached": kept, "ok": BIG.height - kept}
    assert endpoint.stats()["requests"] == BIG.height - kept


def test_a_job_on_a_full_disk_fails_before_sending(complete, small_disk, endpoint):
    cache = small_disk / "cache.duckdb"
    ROWS.head(1).pipe(complete, prompt="{text}", cache=cache)
    with open(small_disk / "filler", "wb") as filler, pytest.raises(OSError):
        while True:
            filler.write(b"x" * 65_536)
    endpoint.reset()
    with pytest.raises(CacheError, match="no space left on the disk"):
        ROWS.pipe(complete, prompt="{text}", cache=cache)
    assert endpoint.stats()["requests"] == 0


# -- a damaged cache file ---------------------------------------------------------------------


def test_a_cache_file_cut_short_is_a_clear_error_before_sending(complete, cache, endpoint):
    ROWS.pipe(complete, prompt="{text}")
    os.truncate(cache, cache.stat().st_size // 2)
    endpoint.reset()
    with pytest.raises(CacheError, match=r"cache\.duckdb cannot be read: it is damaged.*aside"):
        ROWS.pipe(complete, prompt="{text}")
    assert endpoint.stats()["requests"] == 0


def test_garbage_in_the_middle_of_the_cache_file_is_a_clear_error_before_sending(
    complete, cache, endpoint
):
    ROWS.pipe(complete, prompt="{text}")
    with open(cache, "r+b") as file:
        for block in range(12_288, cache.stat().st_size, BLOCK):
            file.seek(block + BLOCK // 2)
            file.write(os.urandom(1_000))
    endpoint.reset()
    with pytest.raises(CacheError, match=r"Corrupt database file.*Move it aside"):
        ROWS.pipe(complete, prompt="{text}")
    assert endpoint.stats()["requests"] == 0


def test_a_damaged_header_is_not_taken_for_a_lock(complete, cache):
    ROWS.head(1).pipe(complete, prompt="{text}")
    with open(cache, "r+b") as file:
        file.seek(4_096)  # DuckDB's two database headers; its checksum error says "block"
        file.write(os.urandom(8_192))
    with pytest.raises(CacheError, match="damaged") as raised:
        ROWS.pipe(complete, prompt="{text}")
    assert "held by another process" not in str(raised.value)


def test_moving_a_damaged_cache_aside_keeps_the_answers_its_journal_holds(
    complete, cache, endpoint, hold
):
    ROWS.head(1).pipe(complete, prompt="{text}")
    reader = hold(cache)
    ROWS.pipe(
        complete, prompt="{text}", cache=Cache(cache, merge_wait=0)
    )  # 199 answers stay in the journal
    reader.release()
    os.truncate(cache, cache.stat().st_size // 2)
    cache.rename(cache.with_name("damaged.duckdb"))
    endpoint.reset()
    ROWS.pipe(complete, prompt="{text}")
    assert endpoint.stats()["requests"] == 1  # the one answer only the damaged file had


# -- broken journal lines ---------------------------------------------------------------------


@pytest.fixture
def journal(complete, cache, hold):
    """199 answers left in the journal by a job that ended while a reader held the file."""
    ROWS.head(1).pipe(complete, prompt="{text}")
    reader = hold(cache)
    ROWS.pipe(complete, prompt="{text}", cache=Cache(cache, merge_wait=0))
    reader.release()
    [file] = _journal(cache)
    return file


def _break_line(file: Path, number: int) -> None:
    lines = file.read_bytes().splitlines(keepends=True)
    lines[number] = b'{"key": "v1:\x00\x07garbage \xff\n'
    file.write_bytes(b"".join(lines))


def test_a_half_written_last_line_is_skipped_with_a_warning(journal, complete, endpoint, caplog):
    with open(journal, "ab") as file:
        file.write(b'{"key": "v1:0123", "model": "si')  # where a crash cut the last write
    endpoint.reset()
    again = ROWS.pipe(complete, prompt="{text}")
    assert again["completion_status"].to_list() == ["cached"] * 200
    assert endpoint.stats()["requests"] == 0
    assert f"skipped 1 unreadable line(s) of the journal file {journal}" in caplog.text


def test_a_garbage_line_in_a_journal_file_costs_only_its_answer(
    journal, complete, endpoint, cache, caplog
):
    _break_line(journal, 100)
    endpoint.reset()
    ROWS.pipe(complete, prompt="{text}")
    assert endpoint.stats()["requests"] == 1
    assert "and kept its 198 other(s)" in caplog.text
    assert _count(cache) == 200  # the 198 merged, and the one sent again


def test_garbage_in_a_json_value_of_a_journal_line_costs_only_its_answer(
    journal, complete, endpoint, cache, caplog
):
    lines = journal.read_bytes().splitlines(keepends=True)
    line = json.loads(lines[100])
    line["request"] = '{"messages": [garbage'
    lines[100] = json.dumps(line).encode() + b"\n"
    journal.write_bytes(b"".join(lines))
    endpoint.reset()
    ROWS.pipe(complete, prompt="{text}")
    assert endpoint.stats()["requests"] == 1
    assert "skipped 1 line(s) of the journal file(s)" in caplog.text
    assert _count(cache) == 200


def test_broken_lines_are_skipped_by_lookups_too_with_one_warning_per_file(
    journal, complete, endpoint, cache, hold, caplog
):
    _break_line(journal, 100)
    reader = hold(cache)  # the journal cannot be merged: lookups read it
    endpoint.reset()
    first = ROWS.pipe(complete, prompt="{text}", cache=Cache(cache, merge_wait=0))
    second = ROWS.pipe(complete, prompt="{text}", cache=Cache(cache, merge_wait=0))
    reader.release()
    assert _statuses(first) == {"cached": 199, "ok": 1}
    assert second["completion_status"].to_list() == ["cached"] * 200
    assert caplog.text.count("unreadable line") == 1


def _answer(key: str) -> dict[str, object]:
    return {"key": key, "model": "m", "endpoint": "e", "request": "{}", "status": "ok"}


def test_a_running_jobs_half_written_last_line_is_not_warned_about(cache, caplog):
    store = Cache(cache)
    store.prepare()
    writer = store.writer()
    writer.answer(_answer("v1:a"))
    writer.write()
    [file] = _journal(cache)
    with open(file, "ab") as appending:
        appending.write(b'{"key": "v1:b", "mod')  # being written right now
    found = store.lookup(pa.table({"key": ["v1:a", "v1:b"]}))
    writer.close(wait=5)
    assert found["key"].to_pylist() == ["v1:a"]
    assert "unreadable" not in caplog.text


def test_a_journal_line_must_hold_every_column_its_table_requires(tmp_path):
    with duckdb.connect(str(tmp_path / "x.duckdb")) as con:
        migrate(con)
        required = con.execute(
            "SELECT table_name, column_name FROM duckdb_columns() "
            "WHERE NOT is_nullable AND column_default IS NULL"  # created_at: the merge's time
        ).fetchall()
    for table, columns in REQUIRED.items():
        assert set(columns) == {c for t, c in required if t == table} & set(COLUMNS[table])


# -- a reader holding the file as the job ends ------------------------------------------------


class _Said(logging.Handler):
    """Sets ``event`` when llm-ops logs a line holding ``words``."""

    def __init__(self, words: str):
        super().__init__()
        self.words, self.event = words, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.words in record.getMessage():
            self.event.set()


def test_the_end_of_a_job_waits_for_a_reader_to_let_go(complete, cache, hold, caplog):
    ROWS.head(1).pipe(complete, prompt="{text}")
    reader = hold(cache)
    said = _Said("waiting up to")
    logging.getLogger("llm_ops").addHandler(said)
    letting_go = threading.Thread(target=lambda: said.event.wait(60) and reader.release())
    letting_go.start()
    try:
        _, report = ROWS.pipe(complete, prompt="{text}", return_report=True)
    finally:
        logging.getLogger("llm_ops").removeHandler(said)
        letting_go.join()
    assert f"waiting up to 30 s for a reader of {cache}" in caplog.text
    assert report.journal_pending == 0
    assert _count(cache) == 200
    assert not _journal(cache)


def test_answers_left_in_the_journal_are_named_in_the_report(complete, cache, hold):
    ROWS.head(1).pipe(complete, prompt="{text}")
    reader = hold(cache)
    _, report = ROWS.pipe(
        complete, prompt="{text}", cache=Cache(cache, merge_wait=0.1), return_report=True
    )
    reader.release()
    assert report.journal_pending == 199
    assert "199 answers wait in the journal" in str(report)
    assert f"llm-ops cache merge --cache {cache}" in str(report)
    assert _count(cache) == 1


def test_merge_wait_is_seconds(cache):
    with pytest.raises(ConfigError, match="merge_wait must be a positive number of seconds"):
        Cache(cache, merge_wait=-1)
