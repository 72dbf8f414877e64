"""Request keys: the documented canonical form, the same from every path."""

from __future__ import annotations

import json

import duckdb
import polars as pl

from llm_ops import canonical_json, request_key
from llm_ops._key import normalize_base_url

TRICKY = [
    "plain",
    "é 日本 😀",
    'quote " backslash \\ slash /',
    "\x00\x01\x0b\x1f\x7f",
    "tab\tnewline\n",
    "\u2028",
    "\\u001F literal",
]


def _cached(cache):
    with duckdb.connect(str(cache), read_only=True) as con:
        return con.execute("SELECT key, request FROM llm_cache").fetchall()


def test_canonical_json_is_sorted_compact_utf8():
    assert canonical_json({"b": 1, "a": ["é", {"d": None, "c": 0.5}]}) == (
        '{"a":["é",{"c":0.5,"d":null}],"b":1}'
    )


def test_key_is_v1_sha256_of_the_canonical_request():
    assert request_key({"model": "m"}) == (
        "v1:" + __import__("hashlib").sha256(b'{"model":"m"}').hexdigest()
    )


def test_vectorised_keys_match_the_reference_for_tricky_text(complete, cache):
    pl.DataFrame({"text": TRICKY}).pipe(complete, prompt="{text}", system="S {text}")
    for key, request in _cached(cache):
        assert key == request_key(json.loads(request))
    assert len(_cached(cache)) == len(TRICKY)


def test_request_holds_endpoint_model_messages_and_set_parameters(complete, cache, endpoint):
    pl.DataFrame({"text": ["x"]}).pipe(complete, prompt="{text}", temperature=0.0)
    request = json.loads(_cached(cache)[0][1])
    assert request == {
        "endpoint": normalize_base_url(endpoint.base_url),
        "model": "sim",
        "messages": [{"role": "user", "content": "x"}],
        "temperature": 0.0,
    }


def test_transport_settings_do_not_change_the_key(complete, endpoint):
    df = pl.DataFrame({"text": ["x"]})
    df.pipe(complete, prompt="{text}", concurrency=1, timeout=5, max_attempts=1)
    out = df.pipe(complete, prompt="{text}", concurrency=7, timeout=9, max_attempts=3)
    assert out["completion_status"].to_list() == ["cached"]


def test_output_affecting_parameters_change_the_key(complete, endpoint):
    df = pl.DataFrame({"text": ["x"]})
    df.pipe(complete, prompt="{text}")
    out = df.pipe(complete, prompt="{text}", temperature=0.3)
    assert out["completion_status"].to_list() == ["ok"]


def test_base_url_normalisation():
    assert normalize_base_url("HTTPS://user:pw@API.Example.com:443/v1/") == (
        "https://api.example.com/v1"
    )
    assert normalize_base_url("http://127.0.0.1:8765/v1") == "http://127.0.0.1:8765/v1"
