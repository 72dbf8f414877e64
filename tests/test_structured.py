"""Structured output: typed struct columns, invalid answers kept raw, optional repair."""

from __future__ import annotations

import polars as pl
import pytest
from pydantic import BaseModel

from llm_ops import Client, ConfigError, Retries, llm_extract
from llm_ops.polars import llm  # noqa: F401  (the .llm namespace)


class Aspect(BaseModel):
    name: str
    score: float


class Review(BaseModel):
    sentiment: str
    stars: int
    recommended: bool
    aspects: list[Aspect]
    note: str | None = None


def test_answers_become_a_typed_struct_column(complete):
    out = pl.DataFrame({"text": ["soft warm coat"]}).pipe(complete, prompt="{text}", schema=Review)
    assert out.schema["completion"] == pl.Struct(
        {
            "sentiment": pl.String,
            "stars": pl.Int64,
            "recommended": pl.Boolean,
            "aspects": pl.List(pl.Struct({"name": pl.String, "score": pl.Float64})),
            "note": pl.String,
        }
    )
    assert out["completion"][0]["sentiment"] == "soft warm coat"
    assert out.columns[-1] == "completion_raw"


def test_a_json_schema_dict_works_too(complete):
    schema = {
        "type": "object",
        "properties": {"label": {"enum": ["pos", "neg"]}},
        "required": ["label"],
    }
    out = pl.DataFrame({"text": ["x"]}).pipe(complete, prompt="{text}", schema=schema)
    assert out["completion"].struct.field("label")[0] in ("pos", "neg")


@pytest.mark.parametrize("broken", ["json", "schema"])
def test_invalid_answers_keep_their_raw_text_and_no_defaults(complete, broken):
    out = pl.DataFrame({"text": [f"[[sim:invalid={broken}]]"]}).pipe(
        complete, prompt="{text}", schema=Review
    )
    assert out["completion_status"].to_list() == ["invalid"]
    assert out["completion"][0] is None
    assert out["completion_raw"][0] in ("Sure! Here is the JSON you asked for.", "{}")
    assert out["completion_error"][0].startswith("the answer does not match the schema")


def test_invalid_answers_are_not_cached(complete, endpoint):
    df = pl.DataFrame({"text": ["[[sim:invalid=schema]]"]})
    df.pipe(complete, prompt="{text}", schema=Review)
    df.pipe(complete, prompt="{text}", schema=Review)
    assert endpoint.stats()["requests"] == 2


def test_repair_resends_once_with_the_error(complete, endpoint):
    out, report = pl.DataFrame({"text": ["[[sim:invalid=schema]] wool"]}).pipe(
        complete, prompt="{text}", schema=Review, repair=True, return_report=True
    )
    assert out["completion_status"].to_list() == ["ok"]
    assert (report.requests_sent, report.retries) == (2, 1)


def test_cached_structured_answers_come_back_typed(complete):
    df = pl.DataFrame({"text": ["linen shirt"]})
    first = df.pipe(complete, prompt="{text}", schema=Review)
    again = df.pipe(complete, prompt="{text}", schema=Review)
    assert again["completion_status"].to_list() == ["cached"]
    assert again["completion"].to_list() == first["completion"].to_list()


def test_schemas_that_cannot_become_columns_are_refused(complete):
    with pytest.raises(ConfigError, match="several types"):
        pl.DataFrame({"text": ["x"]}).pipe(
            complete,
            prompt="{text}",
            schema={
                "type": "object",
                "properties": {"v": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
            },
        )


def test_repair_is_said_per_call_on_one_client(endpoint):
    df = pl.DataFrame({"text": ["[[sim:invalid=schema]] wool"]})
    with Client(endpoint=endpoint.base_url, cache=False) as client:
        repaired = client.complete(df, "{text}", model="sim", schema=Review, repair=True)
        left = client.complete(df, "{text}", model="sim", schema=Review)
    assert (repaired["completion_status"].to_list(), left["completion_status"].to_list()) == (
        ["ok"],
        ["invalid"],
    )


def test_an_extraction_takes_repair(endpoint):
    df = pl.DataFrame({"text": ["[[sim:invalid=schema]] wool"]})
    out = df.pipe(
        llm_extract, "text", Review, model="sim", endpoint=endpoint.base_url, cache=False,
        repair=True, prompt="{text}",
    )  # fmt: skip
    assert out["extracted_status"].to_list() == ["ok"]


def test_an_expression_takes_repair(endpoint):
    asked = pl.col("text").llm.complete(
        "{}", model="sim", schema=Review, repair=True, with_status=True,
        endpoint=endpoint.base_url, cache=False,
    )  # fmt: skip
    out = pl.DataFrame({"text": ["[[sim:invalid=schema]] wool"]}).select(asked)
    assert out["text"].struct.field("status").to_list() == ["ok"]


def test_repair_without_a_schema_is_a_config_error_before_sending(complete, endpoint):
    with pytest.raises(ConfigError, match="repair asks again for an answer that does not match"):
        pl.DataFrame({"text": ["x"]}).pipe(complete, prompt="{text}", repair=True)
    assert endpoint.stats()["requests"] == 0


def test_repair_in_retries_says_where_it_is_now():
    with pytest.raises(ConfigError, match=r"llm_complete\(\.\.\., schema=\.\.\., repair=True\)"):
        Retries(repair=True)
