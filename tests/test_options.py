"""Options that belong together are one typed object, which checks its own fields; the command
line and the flow spell the fields flat and build the same objects."""

from __future__ import annotations

import argparse
import inspect

import polars as pl
import pytest

from flows.enrich import EnrichConfig
from llm_ops import (
    SETTINGS,
    BatchMode,
    Budget,
    Cascade,
    ConfigError,
    Endpoint,
    Options,
    Packing,
    RateLimit,
    Retries,
    Sampling,
    llm_complete,
    options_from_settings,
)
from llm_ops._options import setting_type
from llm_ops.cli._job_arguments import add_job_arguments, job_options

DF = pl.DataFrame({"text": ["a"]})


def test_llm_complete_takes_at_most_23_keyword_options():
    keywords = [
        p.name
        for p in inspect.signature(llm_complete).parameters.values()
        # client= is no option of the job but where it runs: it stands for the client's options
        if p.kind is p.KEYWORD_ONLY and p.name != "client"
    ]
    # 20 until repair, keep_reasoning and send_order left the objects they did not belong in
    assert len(keywords) + len(Options.__optional_keys__) <= 23


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("temperature", r"Sampling\(temperature=...\) as sampling="),
        ("base_url", r"Endpoint\(base_url=...\) as endpoint="),
        ("max_cost", r"Budget\(max_cost=...\) as budget="),
        ("escalate", r"Cascade\(escalate=...\) as model="),
    ],
)
def test_a_former_option_says_where_it_went(complete, old, new):
    with pytest.raises(ConfigError, match=new):
        DF.pipe(complete, prompt="{text}", **{old: 1})


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("output_column", "output="),  # the flow's and the CLI's spelling
        ("max_concurency", "concurrency="),
        ("temprature", r"Sampling\(temperature=...\) as sampling="),
    ],
)
def test_an_unknown_option_says_what_to_type(complete, given, meant):
    with pytest.raises(ConfigError, match=rf"did you mean {meant} instead of {given}="):
        DF.pipe(complete, prompt="{text}", **{given: 1})


@pytest.mark.parametrize(
    ("old", "new"),
    [("batch_max_requests", "requests_per_batch"), ("batch_max_bytes", "bytes_per_batch")],
)
def test_a_renamed_setting_names_the_new_one(complete, old, new):
    with pytest.raises(ConfigError, match=rf"{old} is {new} now \(BatchMode\({new}=...\)"):
        DF.pipe(complete, prompt="{text}", **{old: 1})


@pytest.mark.parametrize(
    ("old", "new"), [("max_requests", "requests_per_batch"), ("max_bytes", "bytes_per_batch")]
)
def test_batch_modes_former_fields_name_the_new_ones(old, new):
    with pytest.raises(ConfigError, match=rf"BatchMode's {old} is {new} now: BatchMode\({new}=7\)"):
        BatchMode(**{old: 7})


def test_mode_batch_says_what_it_is_now(complete):
    with pytest.raises(ConfigError, match=r"batch=True \(or batch=BatchMode"):
        DF.pipe(complete, prompt="{text}", mode="batch")


@pytest.mark.parametrize(
    "make",
    [
        lambda: Sampling(temperature=3),
        lambda: Retries(timeout=0),
        lambda: RateLimit(rpm=-1),
        lambda: Packing(rows_per_request=0),
        lambda: Budget(max_cost=-1),
        lambda: BatchMode(on_expired="later"),  # type: ignore[arg-type]
        lambda: Cascade(["a", "a"]),
        lambda: Endpoint(headers={"Content-Length": "1"}),
    ],
)
def test_each_object_checks_its_fields_when_made(make):
    with pytest.raises(ConfigError):
        make()


def test_an_object_given_where_another_belongs_is_refused(complete):
    with pytest.raises(ConfigError, match=r"sampling takes a Sampling"):
        DF.pipe(complete, prompt="{text}", sampling=Budget(max_cost=1))  # type: ignore[arg-type]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_every_setting_is_a_field_of_its_object(setting):
    assert setting_type(setting) is not None  # a KeyError where the object has no such field


def test_settings_make_the_objects():
    options = options_from_settings(
        {"model": ["a", "b"], "escalate": "x > 1", "temperature": 0.5, "batch": True,
         "batch_poll_seconds": 1, "base_url": "http://127.0.0.1:9/v1", "endpoint_name": "e"}
    )  # fmt: skip
    assert options == {
        "model": Cascade(["a", "b"], escalate="x > 1"),
        "sampling": Sampling(temperature=0.5),
        "batch": BatchMode(poll_seconds=1),
        "endpoint": Endpoint("http://127.0.0.1:9/v1", name="e"),
    }


def test_batch_settings_without_batch_mode_are_refused():
    with pytest.raises(ConfigError, match="batch_poll_seconds applies only in batch mode"):
        options_from_settings({"batch_poll_seconds": 1})


def test_media_settings_without_their_column_name_the_settings_given():
    with pytest.raises(ConfigError, match="documents_as, max_pages apply only with documents"):
        options_from_settings({"documents_as": "pages", "max_pages": 3})


def test_the_command_line_and_the_flow_build_the_same_objects():
    parser = argparse.ArgumentParser()
    add_job_arguments(parser, output="the file")
    flags = ["in.parquet", "--output", "out.parquet", "--prompt", "{text}", "--model", "m"]
    flags += ["--temperature", "0.5", "--max-cost", "2", "--batch", "--batch-poll-seconds", "1"]
    flags += ["--rpm", "60", "--timeout", "5", "--endpoint-name", "e", "--pricing", "free"]
    from_cli = options_from_settings(job_options(parser.parse_args(flags)))
    from_flow = options_from_settings(
        EnrichConfig(temperature=0.5, max_cost=2, batch=True, batch_poll_seconds=1, rpm=60,
                     timeout=5, endpoint_name="e", pricing=["free"]).settings()
    )  # fmt: skip
    groups = ("sampling", "budget", "batch", "rate_limit", "retries", "endpoint", "pricing")
    assert {g: from_cli[g] for g in groups} == {g: from_flow[g] for g in groups}


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("endpoint", 8000, "endpoint takes a URL"),
        ("cache", 123, "cache takes a file path"),
        ("batch", "yes", "batch takes True, False or a BatchMode"),
    ],
)
def test_an_option_of_the_wrong_kind_says_what_it_takes(complete, option, value, said):
    with pytest.raises(ConfigError, match=said):
        DF.pipe(complete, prompt="{text}", **{option: value})
