"""Reasoning models: their options, the max_tokens they refuse, and the thinking they bill."""

import json
import re
from datetime import timedelta

import duckdb
import polars as pl
import pytest
from raw_http import RawServer, endpoint, with_length

from flows.enrich import EnrichConfig, open_table
from llm_ops import (
    BatchMode,
    Cache,
    Client,
    ConfigError,
    Endpoint,
    Packing,
    Price,
    Sampling,
    estimate,
    llm_complete,
    options_from_settings,
)
from llm_ops._dialects.openai import thinking
from llm_ops._options import make_job
from llm_ops._pipeline.estimate import REASONING_MODEL
from llm_ops._pipeline.plan import lookup_answers
from llm_ops.cli import main
from llm_ops.polars import llm  # noqa: F401  (the .llm namespace)
from llm_ops.testing import expected_reasoning, expected_reply

DF = pl.DataFrame({"text": ["alpha", "beta"]})


def _ask(complete, **options):
    return DF.pipe(complete, prompt="{text}", model="sim-think", return_report=True, **options)


def test_reasoning_effort_and_max_completion_tokens_are_sent(complete, endpoint):
    sampling = Sampling(reasoning_effort="low", max_completion_tokens=3)
    out, _ = _ask(complete, sampling=sampling)
    assert out["completion"].to_list() == [
        expected_reply(t, model="sim-think", max_tokens=3) for t in DF["text"]
    ]


def test_a_reasoning_effort_that_is_none_of_the_four_is_refused():
    with pytest.raises(ConfigError, match="reasoning_effort must be one of"):
        Sampling(reasoning_effort="extreme")  # type: ignore[arg-type]


def test_max_completion_tokens_must_be_positive():
    with pytest.raises(ConfigError, match="max_completion_tokens"):
        Sampling(max_completion_tokens=0)


def test_the_options_are_part_of_the_cache_key(complete):
    _ask(complete, sampling=Sampling(reasoning_effort="low"))
    report = _ask(complete, sampling=Sampling(reasoning_effort="high"))[1]
    assert report.cache_hits == 0


def test_the_flat_settings_make_a_sampling():
    options = options_from_settings({"reasoning_effort": "high", "max_completion_tokens": 9})
    assert options["sampling"] == Sampling(reasoning_effort="high", max_completion_tokens=9)


def test_max_tokens_refused_is_resent_as_max_completion_tokens(complete):
    out = _ask(complete, sampling=Sampling(max_tokens=2))[0]
    assert out["completion"].to_list() == [
        expected_reply(t, model="sim-think", max_tokens=2) for t in DF["text"]
    ]
    assert out["completion_status"].to_list() == ["truncated"] * 2


def test_the_switch_is_remembered_for_the_rest_of_the_job(complete, endpoint):
    _ask(complete, sampling=Sampling(max_tokens=3), concurrency=1)
    assert endpoint.stats()["by_status"] == {"400": 1, "200": 2}


def test_the_switch_leaves_the_cache_key_as_asked(complete):
    _ask(complete, sampling=Sampling(max_tokens=3))
    report = _ask(complete, sampling=Sampling(max_tokens=3))[1]
    assert (report.cache_hits, report.requests_sent) == (2, 0)


def test_other_models_are_still_sent_max_tokens(complete, endpoint):
    out = DF.pipe(complete, prompt="{text}", sampling=Sampling(max_tokens=3))
    assert out["completion"].to_list() == [
        expected_reply(t, model="sim", max_tokens=3) for t in DF["text"]
    ]


def test_reasoning_tokens_are_summed_in_the_report(complete):
    report = _ask(complete)[1]
    assert report.reasoning_tokens == report.completion_tokens * 3 // 4 > 0


def test_the_report_shows_the_share_of_output_that_was_thinking(complete):
    assert "out reasoning, 75% of out" in str(_ask(complete)[1])


def test_reasoning_tokens_are_kept_per_answer_in_the_cache(complete, cache):
    _ask(complete)
    with duckdb.connect(str(cache), read_only=True) as con:
        rows = con.sql("SELECT reasoning_tokens, completion_tokens FROM llm_cache").fetchall()
    assert [r * 4 == c * 3 for r, c in rows] == [True, True]


def test_reasoning_tokens_are_recorded_in_llm_runs(complete, cache):
    report = _ask(complete)[1]
    with duckdb.connect(str(cache), read_only=True) as con:
        runs = con.sql("SELECT reasoning_tokens FROM llm_runs").fetchall()
    assert runs == [(report.reasoning_tokens,)]


def test_a_model_that_does_not_reason_reports_none(complete):
    report = DF.pipe(complete, prompt="{text}", return_report=True)[1]
    assert report.reasoning_tokens == 0
    assert "reasoning" not in str(report)


def test_the_thinking_is_never_mixed_into_the_answer(complete):
    out = _ask(complete)[0]
    assert out["completion"].to_list() == [expected_reply(t, model="sim-think") for t in DF["text"]]


def test_an_estimate_is_bounded_by_max_completion_tokens(endpoint):
    sampling = Sampling(max_completion_tokens=50)
    plan = estimate(DF, prompt="{text}", model="sim-think", cache=False, sampling=sampling)
    assert plan.output_tokens_max == 100


def test_a_pack_refused_for_max_tokens_is_resent_too(complete):
    packing = Packing(rows_per_request=2)
    out = _ask(complete, sampling=Sampling(max_tokens=50), packing=packing)[0]
    assert out["completion_status"].to_list() == ["ok", "ok"]


def test_the_command_line_flags_reach_the_job(tmp_path, endpoint, cache, capsys):
    DF.write_parquet(table := tmp_path / "rows.parquet")
    flags = ["--max-completion-tokens", "50", "--reasoning-effort", "low"]
    job = [str(table), "--prompt", "{text}", "--model", "sim-think", "--cache", str(cache)]
    assert main(["estimate", *job, "--base-url", endpoint.base_url, *flags]) == 0
    assert re.search(r"output tokens \(max\) +100\n", capsys.readouterr().out)


KEEP = {"keep_reasoning": True}
THOUGHTS = [expected_reasoning(t, model="sim-think") for t in DF["text"]]


def test_keep_reasoning_adds_the_thinking_beside_the_answer(complete):
    out = _ask(complete, **KEEP)[0]
    assert out["completion_reasoning"].to_list() == THOUGHTS
    assert out["completion"].to_list() == [expected_reply(t, model="sim-think") for t in DF["text"]]


def test_without_keep_reasoning_there_is_no_reasoning_column(complete):
    assert "completion_reasoning" not in _ask(complete)[0].columns


def test_keep_reasoning_is_neither_sent_nor_keyed():
    asked = {"prompt": "{text}", "model": "m", "endpoint": "e", "cached": False}
    kept = make_job(**asked, options={"keep_reasoning": True})
    assert kept.columns.reasoning and kept.spec == make_job(**asked, options={}).spec


def test_the_thinking_comes_back_from_the_cache(complete):
    _ask(complete)  # not asked to keep it: the cache stores it all the same
    out, report = _ask(complete, **KEEP)
    assert (report.cache_hits, report.requests_sent) == (2, 0)
    assert out["completion_reasoning"].to_list() == THOUGHTS


def test_the_thinking_is_stored_in_llm_cache(complete, cache):
    _ask(complete)
    with duckdb.connect(str(cache), read_only=True) as con:
        rows = con.sql("SELECT reasoning_text FROM llm_cache ORDER BY reasoning_text").fetchall()
    assert rows == [(t,) for t in sorted(THOUGHTS)]


def test_an_answer_refreshed_for_age_keeps_its_thinking_in_history(complete, cache):
    _ask(complete)
    with duckdb.connect(str(cache)) as con:
        con.execute("UPDATE llm_cache SET created_at = created_at - INTERVAL 2 DAY")
    _ask(complete, cache=Cache(cache, max_age=timedelta(days=1)))
    with duckdb.connect(str(cache), read_only=True) as con:
        rows = con.sql("SELECT reasoning_text FROM llm_cache_history ORDER BY 1").fetchall()
    assert rows == [(t,) for t in sorted(THOUGHTS)]


def test_an_expression_with_status_keeps_the_thinking_as_a_field(endpoint, cache):
    asked = pl.col("text").llm.complete(
        "{}", model="sim-think", with_status=True, endpoint=endpoint.base_url, cache=cache,
        **KEEP,
    )  # fmt: skip
    assert DF.select(asked)["text"].struct.field("reasoning").to_list() == THOUGHTS


def test_a_model_that_does_not_reason_gets_null_thinking(complete):
    out = DF.pipe(complete, prompt="{text}", **KEEP)
    assert out["completion_reasoning"].to_list() == [None, None]


def test_a_server_that_names_it_reasoning_is_read_too():
    assert thinking({"content": "4", "reasoning": "2 + 2"}) == "2 + 2"


def test_thinking_that_is_not_text_is_none():
    assert thinking({"content": "4", "reasoning_content": {"steps": 2}}) is None


def test_keep_reasoning_must_be_a_bool(complete):
    with pytest.raises(ConfigError, match="keep_reasoning must be True or False"):
        DF.pipe(complete, prompt="{text}", keep_reasoning="yes")


def test_keep_reasoning_in_sampling_says_where_it_is_now():
    with pytest.raises(
        ConfigError, match=r"llm_complete\(\.\.\., output=\.\.\., keep_reasoning=True\)"
    ):
        Sampling(keep_reasoning=True)


def test_the_flat_setting_keeps_reasoning():
    assert options_from_settings({"keep_reasoning": True}) == KEEP


def test_a_table_job_keeps_the_thinking(tmp_path, endpoint, cache):
    DF.write_parquet(source := tmp_path / "in.parquet")
    config = EnrichConfig(
        input=str(source),
        output=str(output := tmp_path / "out.parquet"),
        prompt="{text}",
        model=["sim-think"],
        base_url=endpoint.base_url,
        cache=str(cache),
        keep_reasoning=True,
    )
    open_table(config).run()
    assert pl.read_parquet(output)["summary_reasoning"].to_list() == THOUGHTS


def test_the_command_line_keeps_reasoning(tmp_path, endpoint, cache):
    DF.write_parquet(table := tmp_path / "rows.parquet")
    job = [str(table), "--prompt", "{text}", "--model", "sim-think", "--cache", str(cache)]
    out = ["--output", str(output := tmp_path / "out.parquet"), "--no-progress"]
    assert main(["run", *job, "--base-url", endpoint.base_url, "--keep-reasoning", *out]) == 0
    assert pl.read_parquet(output)["completion_reasoning"].to_list() == THOUGHTS


PRICED = Price(input_per_million=1.0, output_per_million=10.0)


def test_the_report_prices_the_thinking_at_the_output_price(complete):
    report = _ask(complete, pricing=PRICED)[1]
    assert report.reasoning_cost == pytest.approx(report.reasoning_tokens * 10.0 / 1e6)
    assert 0 < report.reasoning_cost < report.cost


def test_the_report_text_shows_the_thinkings_share_of_the_cost(complete):
    report = _ask(complete, pricing=PRICED)[1]
    share = round(100 * report.reasoning_cost / report.cost)
    assert re.search(rf"reasoning cost +\$0\.\d{{4}}  \({share}% of cost, ", str(report))


def test_a_model_that_does_not_reason_costs_no_thinking(complete):
    report = DF.pipe(complete, prompt="{text}", pricing=PRICED, return_report=True)[1]
    assert report.reasoning_cost == 0
    assert "reasoning cost" not in str(report)


def _estimate(endpoint, model="sim-think", **sampling):
    return estimate(
        DF,
        prompt="{text}",
        model=model,
        endpoint=endpoint.base_url,
        cache=False,
        sampling=Sampling(**sampling),
        pricing=PRICED,
    )


def test_an_estimate_bounds_the_thinking_by_max_completion_tokens(endpoint):
    plan = _estimate(endpoint, max_tokens=10, max_completion_tokens=50)
    assert (plan.reasoning, plan.output_tokens_high) == (True, 100)


def test_without_max_completion_tokens_the_thinking_is_a_multiple_of_the_answers(endpoint):
    plan = _estimate(endpoint, max_tokens=10)
    assert (plan.output_tokens_max, plan.output_tokens_high) == (20, 20 * 5)
    assert plan.cost_high == pytest.approx(plan.cost_min + 100 * 10.0 / 1e6)


def test_an_estimate_of_a_reasoning_model_shows_the_range(endpoint):
    text = str(_estimate(endpoint, max_tokens=10))
    assert re.search(r"output tokens \(max\) +20\n  with thinking +100 ", text)
    assert re.search(r"cost with thinking +\$0\.\d{4} to \$0\.0010\n", text)


def test_unbounded_thinking_says_how_to_bound_it(endpoint):
    assert "set max_completion_tokens" in str(_estimate(endpoint))


@pytest.mark.parametrize("model", ["o3-mini", "gpt-5", "openai/o4-mini", "deepseek-reasoner"])
def test_a_reasoning_model_is_known_by_its_name(model):
    assert REASONING_MODEL.search(model)


@pytest.mark.parametrize("model", ["gpt-4o-mini", "llama-3.1-8b", "sim"])
def test_other_names_are_not_taken_for_one(model):
    assert not REASONING_MODEL.search(model)


def test_reasoning_effort_makes_any_model_a_reasoning_one(endpoint):
    plan = _estimate(endpoint, model="sim", max_tokens=10, reasoning_effort="low")
    assert (plan.reasoning, plan.output_tokens_high) == (True, 100)


def test_a_model_that_does_not_reason_has_one_bound(endpoint):
    plan = _estimate(endpoint, model="sim", max_tokens=10)
    assert (plan.reasoning, plan.output_tokens_high, plan.cost_high) == (
        False,
        plan.output_tokens_max,
        plan.cost_max,
    )
    assert "thinking" not in str(plan)


@pytest.fixture
def in_batches(endpoint):
    """The simulator's batches end fast, and are polled every 0.05 s."""
    endpoint.configure(batch_seconds=0.2, batch_validation_seconds=0.05)
    return {"batch": BatchMode(poll_seconds=0.05), "sampling": Sampling(max_tokens=2)}


def test_a_batch_line_refused_for_max_tokens_is_resent_with_max_completion_tokens(
    complete, endpoint, in_batches
):
    out = _ask(complete, **in_batches)[0]
    assert out["completion"].to_list() == [
        expected_reply(t, model="sim-think", max_tokens=2) for t in DF["text"]
    ]
    assert out["completion_status"].to_list() == ["truncated"] * 2
    assert endpoint.stats()["batches"] == 2


def test_the_batch_switch_is_remembered_for_later_lines(endpoint, cache, in_batches):
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        client.complete(DF, prompt="{text}", model="sim-think", **in_batches)
        later = client.complete(DF, prompt="again {text}", model="sim-think", **in_batches)
    assert later["completion_status"].to_list() == ["truncated"] * 2
    assert endpoint.stats()["batches"] == 3  # two for the first job, one for the later


def test_a_batch_line_resent_keeps_its_key_as_asked(complete, in_batches):
    _ask(complete, **in_batches)
    report = _ask(complete, sampling=in_batches["sampling"])[1]
    assert (report.cache_hits, report.requests_sent) == (2, 0)


def test_a_batch_report_counts_a_resent_line_once(complete, in_batches):
    assert _ask(complete, **in_batches)[1].requests_sent == 2


def test_a_hit_that_does_not_keep_the_thinking_does_not_read_it(cache):
    thinking = "t" * 5_000_000  # a tester's was 50 MB: a job not keeping it loaded it all
    message = {"role": "assistant", "content": "fine", "reasoning_content": thinking}
    body = json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})
    with RawServer(respond=endpoint(lambda request: with_length(body.encode()))) as server:
        ep = Endpoint(server.base_url, max_response_bytes=10**8)
        DF.head(1).pipe(llm_complete, prompt="{text}", model="m", endpoint=ep, cache=cache)
    with duckdb.connect(str(cache), read_only=True) as con:
        keys = con.sql("SELECT key FROM llm_cache").pl()
    hit = lookup_answers(Cache(cache), keys)
    assert hit["reasoning"].to_list() == [None] and hit.estimated_size() < 100_000
    assert lookup_answers(Cache(cache), keys, reasoning=True)["reasoning"][0] == thinking
