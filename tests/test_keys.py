"""Request keys: the documented canonical form, the same from every path."""

from __future__ import annotations

import json

import duckdb
import polars as pl
import pytest

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


# Keys live in users' caches: a key that changes loses every answer stored under it. These
# were computed once and must never change; a failure here means the canonical form moved.
PINNED_KEYS = [
    (
        {
            "endpoint": "https://api.openai.com/v1",
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "Summarise: the cat sat on the mat."}],
        },
        "v1:5b90141056b141287b51850f235485ecbf50407b7420963f40b449d308962702",
    ),
    (
        {
            "endpoint": "http://127.0.0.1:8765/v1",
            "model": "sim",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Classify: great product"},
            ],
            "max_tokens": 64,
            "temperature": 0.0,
            "top_p": 0.9,
            "seed": 42,
            "stop": ["\n\n", "END"],
        },
        "v1:0a6543a791c05cf300a1c9652dfe51b94f149b10e0a7b45eddfe1105f0a4b1b2",
    ),
    (
        {
            "endpoint": "vllm-prod",
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "Review",
                    "schema": {
                        "type": "object",
                        "properties": {
                            "score": {"type": "number", "minimum": 0.5, "maximum": 1e16},
                            "label": {"type": "string", "enum": ["bon", "très bon", "日本"]},
                        },
                        "required": ["score", "label"],
                    },
                },
            },
        },
        "v1:4393aa6c5c31004e03978826d9297ce6da3ec94d1bc29a476884655f3da02592",
    ),
    (
        {
            "endpoint": "http://127.0.0.1:8765/v1",
            "model": "emb",
            "input": "hello",
            "dimensions": 256,
        },
        "v1:193d992c281de72b0453df130083bf1d07836dd50b3869e8cc991b22b46187bb",
    ),
    (
        {
            "endpoint": "e",
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": 'é 日本 😀 שלום \u2028 \x7f \x00 \x1f e\u0301 \t\n"\\',
                }
            ],
            "temperature": 1e-07,
            "top_p": 5e-324,
            "seed": 2**64,
            "x": [10**30, -(2**63) - 1, 1.7976931348623157e308, -0.0, 1e-05],
            "Z": {"b": 1, "B": 2, "é": 3, "e": 4, "😀": 5, "": 6},
        },
        "v1:e66d7c3514aad0228123f7fcfa59fe29ce462f417c0788e6508add7598611c0c",
    ),
]


@pytest.mark.parametrize(("request_", "key"), PINNED_KEYS, ids=range(len(PINNED_KEYS)))
def test_known_requests_keep_their_keys(request_, key):
    assert request_key(request_) == key


def test_odd_values_have_their_pinned_canonical_json():
    assert canonical_json(PINNED_KEYS[-1][0]) == (
        '{"Z":{"":6,"B":2,"b":1,"e":4,"é":3,"😀":5},"endpoint":"e","messages":[{"content":'
        '"é 日本 😀 שלום \u2028 \x7f \\u0000 \\u001f e\u0301 \\t\\n\\"\\\\","role":"user"}],'
        '"model":"m","seed":18446744073709551616,"temperature":1e-07,"top_p":5e-324,"x":['
        "1000000000000000000000000000000,-9223372036854775809,1.7976931348623157e+308,-0.0,"
        "1e-05]}"
    )
