"""Rendered values: one text per value, whatever its time unit, container or entry point.

The simulator's answer repeats the prompt it got, so an answer shows how a row was rendered;
a second run answered from the cache shows that its requests had the same keys.
"""

from __future__ import annotations

import datetime
import decimal

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llm_ops import Client, TemplateError, estimate, llm_embed
from llm_ops.sql import register
from llm_ops.tables import Table
from llm_ops.testing import expected_reply

WHEN = datetime.datetime(2024, 1, 2, 3, 4, 5)
SHOWN = "At 2024-01-02 03:04:05.000000"  # what Polars' default unit (us) always rendered


def _at(unit: str, value: datetime.datetime = WHEN, zone: str | None = None) -> pl.DataFrame:
    return pl.DataFrame({"t": pl.Series([value], dtype=pl.Datetime(unit, zone))})


def _asked(complete, df, prompt="At {t}") -> list[str]:
    """The prompt each row was sent with, read off the simulator's answer."""
    out = complete(df, prompt=prompt)
    assert out["completion_status"].to_list() == ["ok"] * out.height
    return [answer.split(": ", 1)[1] for answer in out["completion"]]


def _statuses(out) -> list[str]:
    frame = pl.from_arrow(out) if isinstance(out, pa.Table) else out
    return frame["completion_status"].cast(pl.String).to_list()


def test_a_datetime_in_polars_default_unit_renders_as_before(complete):
    out = complete(_at("us"), prompt="At {t}")
    assert out["completion"].to_list() == [expected_reply(SHOWN, model="sim")]


def test_the_common_types_render_as_before(complete):
    df = pl.DataFrame({"s": "x", "i": -42, "f": 0.5, "d": datetime.date(2024, 1, 2), "b": True})
    assert _asked(complete, df, prompt="{s} {i} {f} {d} {b}") == ["x -42 0.5 2024-01-02 true"]


@pytest.mark.parametrize("unit", ["ms", "ns"])
def test_the_same_instant_in_another_unit_has_the_same_key(complete, endpoint, unit):
    complete(_at("us"), prompt="At {t}")
    assert _statuses(complete(_at(unit), prompt="At {t}")) == ["cached"]
    assert endpoint.stats()["requests"] == 1


def test_an_arrow_timestamp_ns_table_has_the_key_of_the_polars_frame(complete, endpoint):
    complete(_at("us"), prompt="At {t}")
    table = pa.table({"t": pa.array([WHEN], pa.timestamp("ns"))})
    assert _statuses(complete(table, prompt="At {t}")) == ["cached"]


def test_a_lazyframe_in_ns_has_the_key_of_the_frame_in_us(complete):
    complete(_at("us"), prompt="At {t}")
    assert _statuses(complete(_at("ns").lazy(), prompt="At {t}").collect()) == ["cached"]


def test_a_parquet_table_of_ns_timestamps_has_the_key_of_the_polars_frame(
    complete, endpoint, cache, tmp_path
):
    complete(_at("us"), prompt="At {t}")
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"t": pa.array([WHEN, WHEN], pa.timestamp("ns"))}), source)
    assert pl.read_parquet_schema(source)["t"] == pl.Datetime("ns")
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        plan = Table(client, source, tmp_path / "out.parquet", prompt="At {t}", model="sim").plan()
    assert (plan.rows, plan.distinct, plan.cache_hits) == (2, 1, 1)


def test_the_estimate_of_an_ns_frame_counts_the_answer_cached_for_us(complete, endpoint, cache):
    complete(_at("us"), prompt="At {t}")
    options = {"model": "sim", "endpoint": endpoint.base_url, "cache": cache}
    plan = estimate(_at("ns"), prompt="At {t}", **options)
    assert (plan.distinct_requests, plan.cache_hits) == (1, 1)


def test_an_expression_over_an_ns_datetime_has_the_frame_key(complete, endpoint, cache):
    complete(_at("us"), prompt="At {t}")
    asked = pl.col("t").llm.complete("At {}", model="sim", endpoint=endpoint.base_url, cache=cache)
    out = _at("ns").select(asked)
    assert out["t"].to_list() == [expected_reply(SHOWN, model="sim")]
    assert endpoint.stats()["requests"] == 1


def test_an_ns_value_finer_than_a_microsecond_keeps_its_nanoseconds(complete):
    value = pl.Series([1_704_164_645_000_000_001], dtype=pl.Datetime("ns"))
    assert _asked(complete, value.to_frame("t")) == ["At 2024-01-02 03:04:05.000000001"]


@pytest.mark.parametrize("unit", ["ms", "us", "ns"])
def test_a_zoned_datetime_renders_in_its_zone_with_its_offset_in_every_unit(complete, unit):
    paris = _at(unit, WHEN.replace(tzinfo=datetime.UTC), zone="Europe/Paris")
    assert _asked(complete, paris) == ["At 2024-01-02 04:04:05.000000+01:00"]


def test_a_time_keeps_its_fraction(complete):
    times = [datetime.time(3, 4, 5), datetime.time(3, 4, 5, 500_000)]
    assert _asked(complete, pl.DataFrame({"t": times})) == ["At 03:04:05", "At 03:04:05.500000"]


def test_an_arrow_time_in_ms_has_the_key_of_the_polars_time(complete):
    half = datetime.time(3, 4, 5, 500_000)
    assert _asked(complete, pl.DataFrame({"t": [half]})) == ["At 03:04:05.500000"]
    table = pa.table({"t": pa.array([half], pa.time32("ms"))})
    assert _statuses(complete(table, prompt="At {t}")) == ["cached"]


@pytest.mark.parametrize("unit", ["ms", "us", "ns"])
def test_a_duration_renders_as_iso_8601_in_every_unit(complete, unit):
    took = [datetime.timedelta(hours=1, minutes=2, seconds=3), datetime.timedelta(days=2)]
    df = pl.DataFrame({"t": pl.Series(took, dtype=pl.Duration(unit))})
    assert _asked(complete, df, prompt="Took {t}") == ["Took PT1H2M3S", "Took P2D"]


def test_a_duration_expression_is_answered_not_a_polars_error(endpoint):
    took = pl.DataFrame({"t": [datetime.timedelta(milliseconds=1500)]})
    options = {"model": "sim", "endpoint": endpoint.base_url, "cache": False}
    asked = pl.col("t").llm.complete("Took {}", **options)
    assert took.select(asked)["t"].to_list() == [expected_reply("Took PT1.5S", model="sim")]


def test_decimals_of_any_scale_render_without_trailing_zeros(complete):
    df = pl.DataFrame(
        {
            "a": pl.Series([decimal.Decimal("19.90")], dtype=pl.Decimal(10, 2)),
            "b": pl.Series([decimal.Decimal("19.9000")], dtype=pl.Decimal(12, 4)),
            "c": pl.Series([decimal.Decimal("100")], dtype=pl.Decimal(5, 0)),
        }
    )
    assert _asked(complete, df, prompt="{a} {b} {c}") == ["19.9 19.9 100"]


def test_float32_and_float64_of_the_same_literal_render_alike(complete):
    df = pl.DataFrame({"a": pl.Series([0.1], dtype=pl.Float32), "b": [0.1]})
    assert _asked(complete, df, prompt="{a} {b}") == ["0.1 0.1"]


def test_categorical_and_enum_render_as_their_text(complete):
    df = pl.DataFrame({"s": ["red"]}).with_columns(
        c=pl.col("s").cast(pl.Categorical), e=pl.col("s").cast(pl.Enum(["red"]))
    )
    assert _asked(complete, df, prompt="{s} {c} {e}") == ["red red red"]


NESTED = {
    "list": pl.Series([["a", "b"]]),
    "array": pl.Series([[1, 2]], dtype=pl.Array(pl.Int64, 2)),
    "struct": pl.Series([{"a": 1}]),
    "binary": pl.Series([b"\x00"]),
    "object": pl.Series([object()], dtype=pl.Object),
}


@pytest.mark.parametrize("kind", NESTED)
def test_a_value_that_is_not_text_is_a_template_error_before_any_request(complete, endpoint, kind):
    df = pl.DataFrame({"x": ["a"], "v": NESTED[kind]})
    with pytest.raises(TemplateError, match=r"column 'v' of type .* cannot be rendered"):
        complete(df, prompt="{x} {v}")
    assert endpoint.stats()["requests"] == 0


def test_a_nested_value_in_an_expression_is_a_template_error_before_any_request(endpoint):
    asked = pl.col("v").llm.complete("{}", model="sim", endpoint=endpoint.base_url, cache=False)
    with pytest.raises(TemplateError, match="join its items"):
        NESTED["list"].to_frame("v").select(asked)
    assert endpoint.stats()["requests"] == 0


def test_a_nested_parquet_column_is_a_template_error_when_the_table_is_made(
    endpoint, cache, tmp_path
):
    source = tmp_path / "in.parquet"
    NESTED["struct"].to_frame("v").write_parquet(source)
    with (
        Client(endpoint=endpoint.base_url, cache=cache) as client,
        pytest.raises(TemplateError, match=r"struct\.field"),
    ):
        Table(client, source, tmp_path / "out.parquet", prompt="{v}", model="sim")
    assert endpoint.stats()["requests"] == 0


def test_llm_embed_of_a_nested_column_is_a_template_error_before_any_request(endpoint):
    with pytest.raises(TemplateError, match="llm_embed references column 'v'"):
        llm_embed(
            NESTED["list"].to_frame("v"), column="v", model="sim-embed", endpoint=endpoint.base_url
        )
    assert endpoint.stats()["embedding_requests"] == 0


def test_llm_embed_of_an_ns_datetime_has_the_key_of_the_us_one(endpoint, cache):
    options = {"model": "sim-embed", "endpoint": endpoint.base_url, "cache": cache}
    for unit in ("us", "ns"):
        out = llm_embed(_at(unit), column="t", **options)
    assert out["embedding_status"].cast(pl.String).to_list() == ["cached"]


def test_sql_formatting_a_timestamp_as_documented_has_the_frame_key(complete, endpoint, cache):
    complete(_at("us"), prompt="At {t}")
    with duckdb.connect(str(cache), read_only=True) as con:
        [(frame_key,)] = con.execute("SELECT key FROM llm_cache").fetchall()
    sql = "SELECT llm_request_key('At ' || strftime(t, '%Y-%m-%d %H:%M:%S.%f')) FROM VALUES "
    with duckdb.connect() as con:
        register(con, endpoint=endpoint.base_url, cache=False, model="sim")
        keys = con.sql(sql + "(TIMESTAMP_NS '2024-01-02 03:04:05') v(t)").fetchall()
    assert keys == [(frame_key,)]
