"""Model cascades: rows go to the first model; failed or flagged rows go on to the next."""

from __future__ import annotations

import duckdb
import polars as pl
import pytest
from pydantic import BaseModel

from llm_ops import Budget, Cascade, ConfigError, Price, confidence_below

MODELS = ["sim-small", "sim"]
PRICING = {"sim-small": Price(0.05, 0.20), "sim": Price(2.50, 10.00)}
UNSURE = "[[sim:unsure_for=sim-small]]"


class Label(BaseModel):
    label: str
    confidence: float


LOW_CONFIDENCE = pl.col("completion").struct.field("confidence") < 0.5


def _ask(complete, *texts, **options):
    options = {"model": MODELS, "pricing": PRICING, **options}
    return pl.DataFrame({"text": list(texts)}).pipe(complete, prompt="{text}", **options)


def test_only_flagged_rows_go_to_the_next_model(complete, endpoint):
    out = _ask(
        complete,
        "easy",
        f"hard {UNSURE}",
        "plain",
        schema=Label,
        model=Cascade(MODELS, escalate=LOW_CONFIDENCE),
    )
    assert out["completion_model"].to_list() == ["sim-small", "sim", "sim-small"]
    assert endpoint.stats()["by_model"] == {"sim-small": 3, "sim": 1}


def test_the_next_model_answer_replaces_the_flagged_one(complete):
    out = _ask(
        complete, f"hard {UNSURE}", schema=Label, model=Cascade(MODELS, escalate=LOW_CONFIDENCE)
    )
    assert out["completion"].struct.field("confidence").to_list() == [0.9]
    assert out["completion_status"].to_list() == ["ok"]


def test_failed_rows_go_on_without_a_rule(complete):
    out = _ask(complete, "ok", "refused [[sim:fail_for=sim-small]]")
    assert out["completion_model"].to_list() == ["sim-small", "sim"]
    assert out["completion_status"].to_list() == ["ok", "ok"]


def test_a_rule_over_text_answers(complete):
    out = _ask(
        complete,
        "ok",
        f"hmm {UNSURE}",
        model=Cascade(MODELS, escalate=pl.col("completion").str.starts_with("unsure:")),
    )
    assert out["completion_model"].to_list() == ["sim-small", "sim"]


def test_a_row_failing_everywhere_keeps_the_last_models_error(complete):
    out = _ask(complete, "no [[sim:status=400]]")
    assert out["completion_status"].to_list() == ["rejected"]
    assert out["completion_model"].to_list() == ["sim"]


def test_skipped_rows_have_no_model(complete):
    out = _ask(complete, None, "ok")
    assert out["completion_model"].to_list() == [None, "sim-small"]


def test_a_rerun_is_answered_by_the_cache(complete, endpoint):
    _ask(
        complete,
        "easy",
        f"hard {UNSURE}",
        schema=Label,
        model=Cascade(MODELS, escalate=LOW_CONFIDENCE),
    )
    endpoint.reset()
    out = _ask(
        complete,
        "easy",
        f"hard {UNSURE}",
        schema=Label,
        model=Cascade(MODELS, escalate=LOW_CONFIDENCE),
    )
    assert out["completion_model"].to_list() == ["sim-small", "sim"]
    assert endpoint.stats()["requests"] == 0


def test_report_shows_rows_and_cost_per_model(complete):
    _, report = _ask(
        complete,
        "a",
        "b",
        f"c {UNSURE}",
        schema=Label,
        model=Cascade(MODELS, escalate=LOW_CONFIDENCE),
        return_report=True,
    )
    assert {m: u.rows for m, u in report.models.items()} == {"sim-small": 2, "sim": 1}
    assert report.models["sim-small"].requests == 3
    assert report.cost == pytest.approx(report.models["sim-small"].cost + report.models["sim"].cost)


def test_cascade_saving_is_the_big_models_price_less_the_small_models_cost(complete):
    _, report = _ask(
        complete,
        "a",
        "b",
        f"c {UNSURE}",
        schema=Label,
        model=Cascade(MODELS, escalate=LOW_CONFIDENCE),
        return_report=True,
    )
    saving = report.savings["cascade"]
    assert saving.requests == 2
    assert 0 < saving.cost < report.cost_saved + report.cost


def test_runs_table_records_the_models(complete, cache):
    _ask(complete, "a", f"b {UNSURE}", schema=Label, model=Cascade(MODELS, escalate=LOW_CONFIDENCE))
    with duckdb.connect(str(cache), read_only=True) as con:
        rows = con.sql(
            "SELECT model, models['sim'].rows, savings['cascade'].requests FROM llm_runs"
        ).fetchall()
    assert rows == [("sim-small > sim", 1, 1)]


def test_a_budget_spans_the_models(complete):
    out = _ask(
        complete,
        "a",
        f"b {UNSURE}",
        schema=Label,
        model=Cascade(MODELS, escalate=LOW_CONFIDENCE),
        budget=Budget(max_requests=2),
    )
    assert out["completion_status"].to_list() == ["ok", "skipped"]
    assert "max_requests" in out["completion_error"][1]


def test_escalate_needs_a_cascade():
    with pytest.raises(ConfigError, match="two models or more"):
        Cascade(["sim"], escalate=pl.col("completion").is_null())


@pytest.mark.parametrize("rule", [pl.col("nope") > 1, pl.col("completion").str.len_chars()])
def test_escalate_is_checked_before_sending(complete, endpoint, rule):
    with pytest.raises(ConfigError, match="escalate"):
        _ask(complete, "a", model=Cascade(MODELS, escalate=rule))
    assert endpoint.stats()["requests"] == 0


def test_a_model_is_named_once(complete):
    with pytest.raises(ConfigError, match="each model once"):
        _ask(complete, "a", model=["sim", "sim"])


def test_confidence_below_reads_the_confidence_field(complete):
    out = _ask(
        complete,
        "a",
        f"b {UNSURE}",
        schema=Label,
        model=Cascade(MODELS, escalate=confidence_below(0.5)),
    )
    assert out["completion_model"].to_list() == ["sim-small", "sim"]


def test_confidence_below_needs_a_numeric_field(complete):
    with pytest.raises(ConfigError, match="number field 'certainty'"):
        _ask(
            complete,
            "a",
            schema=Label,
            model=Cascade(MODELS, escalate=confidence_below(0.5, field="certainty")),
        )


def test_escalate_sql_must_parse(complete):
    with pytest.raises(ConfigError, match="not a SQL expression"):
        _ask(complete, "a", model=Cascade(MODELS, escalate="completion LIKE"))


def test_confidence_below_takes_a_number():
    with pytest.raises(ConfigError, match="takes a number"):
        confidence_below("high")


@pytest.mark.parametrize("model", [[], ["sim", 3]])
def test_a_cascade_names_its_models(complete, model):
    with pytest.raises(ConfigError, match="or a cascade such as"):
        _ask(complete, "a", model=model)
