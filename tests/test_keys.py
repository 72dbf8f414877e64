"""Request keys: the documented canonical form, the same from every path."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import enum
import hashlib
import itertools
import json
import uuid

import duckdb
import orjson
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from llm_ops import Retries, Sampling, _key, canonical_json, request_key
from llm_ops._key import normalize_base_url
from llm_ops._media import Documents, Images, Media
from llm_ops._schema import output_schema
from llm_ops._spec import RequestSpec
from llm_ops._template import parse_template

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
    pl.DataFrame({"text": ["x"]}).pipe(
        complete, prompt="{text}", sampling=Sampling(temperature=0.0)
    )
    request = json.loads(_cached(cache)[0][1])
    assert request == {
        "endpoint": normalize_base_url(endpoint.base_url),
        "model": "sim",
        "messages": [{"role": "user", "content": "x"}],
        "temperature": 0.0,
    }


def test_transport_settings_do_not_change_the_key(complete, endpoint):
    df = pl.DataFrame({"text": ["x"]})
    df.pipe(
        complete,
        prompt="{text}",
        concurrency=1,
        retries=Retries(timeout=5, max_attempts=1),
    )
    out = df.pipe(
        complete,
        prompt="{text}",
        concurrency=7,
        retries=Retries(timeout=9, max_attempts=3),
    )
    assert out["completion_status"].to_list() == ["cached"]


def test_output_affecting_parameters_change_the_key(complete, endpoint):
    df = pl.DataFrame({"text": ["x"]})
    df.pipe(complete, prompt="{text}")
    out = df.pipe(complete, prompt="{text}", sampling=Sampling(temperature=0.3))
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


# The canonical form by definition, spelt out here so that no change to llm_ops can move it.
def reference(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def outcome(function, value):
    """What ``function`` returns for ``value``, or the error it raises, to compare two."""
    try:
        return function(value)
    except Exception as exc:
        return type(exc), str(exc)


def reference_key(value):
    return "v1:" + hashlib.sha256(reference(value).encode("utf-8")).hexdigest()


class Color(enum.IntEnum):
    RED = 1


class Size(enum.StrEnum):
    SMALL = "s"


class Text(str):
    pass


class Number(float):
    def __repr__(self):
        return "not json's"


class Tiny(float, enum.Enum):
    VALUE = 1e-7


class Hiding(dict):
    """json writes what ``items()`` gives, orjson what the dict holds."""

    def items(self):
        return [(k, v) for k, v in super().items() if k != "secret"]


class Replaying(list):
    """json writes what iterating gives, orjson what the list holds."""

    def __iter__(self):
        return iter(["replayed"])


def _nested(depth):
    value = "leaf"
    for level in range(depth):
        value = {"level": level, "inner": [value, 0.5]}
    return value


ODD = {
    "1e16": 1e16,
    "1e-7": 1e-7,
    "1e-5": 1e-05,
    "1e-4": 1e-4,
    "1e15": 1e15,
    "0.1": 0.1,
    "-0.0": -0.0,
    "0.0": 0.0,
    "5e-324": 5e-324,
    "max float": 1.7976931348623157e308,
    "nan": float("nan"),
    "infinities": [float("inf"), float("-inf")],
    "floats in a request": {"temperature": 0.7, "top_p": 1e-05, "x": [2.0, 1e-7, 1e22]},
    "2**53+1": 2**53 + 1,
    "2**63": 2**63,
    "2**64-1": 2**64 - 1,
    "2**64": 2**64,
    "-2**63": -(2**63),
    "-2**63-1": -(2**63) - 1,
    "10**30": 10**30,
    "ints in a list": [0, -1, 2**64, True, False, None],
    "emoji": "😀 👩‍👩‍👧 🇫🇷 \U0010ffff",
    "rtl": "שלום مرحبا \u202e override",
    "line separators": "\u2028\u2029",
    "del and nul": "\x7f\u0000",
    "every ascii control": "".join(map(chr, range(0x20))),
    "combining marks": "e\u0301 a\u0308\u0323 \u0915\u094d\u0937",
    "bom and noncharacters": "\ufeff\ufffe\uffff",
    "quotes and backslashes": 'a"b\\c/d \\u001F </script>',
    "nested": {"a": [{"b": [[], {}, [{"c": None}]]}], "d": {"e": {"f": ["g", 1, 2.5]}}},
    "deep orjson nests": _nested(30),
    "deeper than the fast path walks": _nested(100),
    "tuples": (1, ("a", (2.5,)), []),
    "keys across case and scripts": {
        k: k for k in ["b", "B", "a", "A", "é", "e", "É", "😀", "\uffff", "", " ", "10", "9"]
    },
    "int enum": {"seed": Color.RED},
    "str enum": {"stop": [Size.SMALL]},
    "str subclass": {Text("key"): Text("value")},
    "float subclass": {"temperature": Number(0.5)},
    "float enum": {"temperature": Tiny.VALUE},
    "dict subclass": {"params": Hiding(a=1, secret=2)},
    "list subclass": {"stop": Replaying(["a", "b"])},
    "ordered dict": collections.OrderedDict([("b", 1), ("a", 2)]),
    "non-str keys": {1: "a", 2: "b"},
    "float and bool keys": {1.5: "a", True: "b"},
    "lone surrogate": "\ud800 and \udfff",
}


@pytest.mark.parametrize("value", ODD.values(), ids=ODD.keys())
def test_canonical_json_is_json_dumps_for_odd_values(value):
    assert outcome(canonical_json, value) == outcome(reference, value)


@pytest.mark.parametrize("value", ODD.values(), ids=ODD.keys())
def test_request_key_hashes_json_dumps_for_odd_values(value):
    assert outcome(request_key, value) == outcome(reference_key, value)


@dataclasses.dataclass
class Point:
    x: int


def _circular():
    value: list[object] = []
    value.append(value)
    return value


REFUSED = {
    "enum": enum.Enum("Plain", "A").A,
    "uuid": uuid.UUID(int=1),
    "datetime": datetime.datetime(2026, 1, 1),
    "dataclass": Point(1),
    "set": {1},
    "bytes": b"x",
    "orjson fragment": orjson.Fragment(b"1"),
    "mixed key types": {1: "a", "b": 2},
    "circular": _circular(),
}


@pytest.mark.parametrize("value", REFUSED.values(), ids=REFUSED.keys())
def test_what_json_refuses_canonical_json_refuses_with_the_same_error(value):
    assert outcome(canonical_json, value) == outcome(reference, value)
    assert isinstance(outcome(canonical_json, value), tuple)


def _every_code_point():
    return "".join(map(chr, itertools.chain(range(0xD800), range(0xE000, 0x110000))))


def test_orjson_escapes_every_code_point_as_json_does():
    text = _every_code_point()
    assert orjson.dumps(text) == reference(text).encode()


def test_canonical_json_writes_every_code_point_as_json_does_in_keys_and_values():
    text = _every_code_point()
    chunks = {text[i : i + 997]: [text[i : i + 997]] for i in range(0, len(text), 997)}
    assert canonical_json(chunks) == reference(chunks)


def test_the_installed_orjson_passes_the_import_probe():
    assert _key._ORJSON_AGREES


@pytest.mark.parametrize(("request_", "key"), PINNED_KEYS[:4], ids=range(4))
def test_common_requests_are_written_by_orjson(request_, key):
    assert _key._orjson_canonical(request_) == reference(request_).encode()


TRICKY_CHARS = '\x00\x08\x0b\x1f\x7f"\\/\u2028\ufeffé😀\ud800'
texts = st.text() | st.text(st.characters()) | st.text(st.sampled_from(TRICKY_CHARS))
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**65), max_value=2**65)
    | st.floats()
    | texts
)


def _containers(children):
    return st.lists(children) | st.lists(children).map(tuple) | st.dictionaries(texts, children)


def _any_keys(children):
    keys = texts | st.integers() | st.floats() | st.booleans() | st.none()
    return st.lists(children) | st.dictionaries(keys, children)


json_values = st.recursive(scalars, _containers, max_leaves=25)
checks = settings(max_examples=200, deadline=None, database=None)


@checks
@given(json_values)
def test_canonical_json_is_json_dumps_for_any_json_value(value):
    assert outcome(canonical_json, value) == outcome(reference, value)


@checks
@given(json_values)
def test_request_key_hashes_json_dumps_for_any_json_value(value):
    assert outcome(request_key, value) == outcome(reference_key, value)


@checks
@given(st.recursive(scalars, _any_keys, max_leaves=20))
def test_canonical_json_is_json_dumps_whatever_the_dict_keys(value):
    assert outcome(canonical_json, value) == outcome(reference, value)


class Review(BaseModel):
    score: float
    label: str


_PROMPT = parse_template("Summarise: {text}")
_MEDIA_DESCRIPTORS = [
    {"kind": "image", "sha256": "ab" * 32},
    {"kind": "image", "url": "https://example.com/a.png?sig=secret"},
    {"kind": "document", "sha256": "cd" * 32},
]


# The keys the pipeline makes from its options, not from a request written by hand: building
# requests (the sampling parameters, the structured-output format, media parts) must keep
# making these, whichever API dialect sends them. Computed once; must never change.
@pytest.mark.parametrize(
    ("spec", "args", "key"),
    [
        (
            RequestSpec.build(
                endpoint="http://127.0.0.1:8765/v1",
                model="sim",
                prompt=_PROMPT,
                system=parse_template("You are terse.", argument="system"),
                params=Sampling(max_tokens=64, temperature=0.0, seed=7).params,
            ),
            ("You are terse.", "Summarise: the cat"),
            "v1:d4f7f71fac188ed40269df7cc98209629f4b667a39680110f844ce077b63fc18",
        ),
        (
            RequestSpec.build(
                endpoint="vllm-prod", model="m", prompt=_PROMPT, schema=output_schema(Review)
            ),
            (None, "Summarise: the cat"),
            "v1:e67a1f95800b4bda7cb872294ed778033f13d6e30aa56e0aab789d3a945dfa7e",
        ),
        (
            RequestSpec.build(
                endpoint="e",
                model="m",
                prompt=_PROMPT,
                media=Media(Images("photo", detail="low"), Documents("doc")),
            ),
            (None, "Describe", _MEDIA_DESCRIPTORS),
            "v1:293d15c7a78b45cca806ad173d65b4a1e88b21284cbb9182bbf7fca93962b3ef",
        ),
    ],
    ids=["sampling", "structured", "media"],
)
def test_requests_the_pipeline_builds_keep_their_keys(spec, args, key):
    assert spec.key(*args) == key
