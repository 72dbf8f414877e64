"""The Anthropic dialect (issue 49): its translation of the canonical request and its reading
of answers (pure functions), then jobs over HTTP against the simulator speaking Anthropic's
Messages API strictly."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import duckdb
import polars as pl
import pytest

from llm_ops import (
    PRICES,
    ConfigError,
    Endpoint,
    JobAbortedError,
    Price,
    Sampling,
    estimate,
    llm_complete,
    llm_embed,
    request_key,
)
from llm_ops._dialects import OPENAI
from llm_ops._dialects.anthropic import ANTHROPIC, DEFAULT_MAX_TOKENS, AnthropicDialect
from llm_ops._endpoint import dialect_for
from llm_ops._options import make_job
from llm_ops.testing import LocalEndpoint, expected_reasoning, expected_reply, media_tag
from tests.media_files import image, pdf

KEY = "sk-ant-sim-key"
PROMPTS = pl.DataFrame({"text": ["alpha", "beta", "gamma"]})
SCHEMA = {"title": "Word", "type": "object", "properties": {"word": {"type": "string"}}}


def _canonical(**params):
    return {
        "model": "claude-x",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
        ],
        **params,
    }


# -- the dialect's translation ----------------------------------------------------------------


def test_the_host_and_the_name_pick_the_dialect():
    assert dialect_for(None, "https://api.anthropic.com") is ANTHROPIC
    assert dialect_for("anthropic") is ANTHROPIC


def test_the_key_goes_as_x_api_key_with_the_version():
    headers = ANTHROPIC.headers("k")
    assert (headers["x-api-key"], headers["anthropic-version"]) == ("k", "2023-06-01")
    assert "authorization" not in {name.lower() for name in headers}


def test_system_goes_to_the_top_marked_for_the_prompt_cache_and_max_tokens_is_always_sent():
    body = ANTHROPIC.completion_body(_canonical())
    mark = {"type": "ephemeral"}
    assert body["system"] == [{"type": "text", "text": "be brief", "cache_control": mark}]
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["max_tokens"] == DEFAULT_MAX_TOKENS


def test_an_unmarked_dialect_marks_nothing():
    body = ANTHROPIC.unmarked().completion_body(_canonical())
    assert body["system"] == [{"type": "text", "text": "be brief"}]


def test_sampling_is_translated_and_seed_is_not_sent():
    body = ANTHROPIC.completion_body(
        _canonical(max_tokens=9, temperature=0.5, top_p=0.9, stop="END", seed=3)
    )
    assert (body["max_tokens"], body["temperature"], body["top_p"]) == (9, 0.5, 0.9)
    assert body["stop_sequences"] == ["END"] and "seed" not in body


def test_structured_output_is_output_config_format():
    asked = {"type": "json_schema", "json_schema": {"name": "Word", "schema": SCHEMA}}
    body = ANTHROPIC.completion_body(_canonical(response_format=asked))
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}
    assert "response_format" not in body


def test_reasoning_effort_turns_thinking_on_beside_the_answers_room():
    body = ANTHROPIC.completion_body(_canonical(reasoning_effort="low", max_tokens=100))
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert body["max_tokens"] == 2148


def test_max_completion_tokens_holds_the_thinking_too():
    body = ANTHROPIC.completion_body(
        _canonical(reasoning_effort="high", max_completion_tokens=5000)
    )
    assert (body["max_tokens"], body["thinking"]["budget_tokens"]) == (5000, 4999)


PDF_URL = "data:application/pdf;base64,Q"


def test_images_and_pdfs_become_blocks():
    content = [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "file", "file": {"filename": "c.pdf", "file_data": PDF_URL}},
    ]
    request = {"model": "m", "messages": [{"role": "user", "content": content}]}
    blocks = ANTHROPIC.completion_body(request)["messages"][0]["content"]
    assert blocks[1]["source"] == {"type": "base64", "media_type": "image/png", "data": "AAAA"}
    assert blocks[2]["source"] == {"type": "url", "url": "https://example.com/a.png"}
    assert blocks[3] == {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": "Q"},
        "title": "c.pdf",
    }


# -- the dialect's reading --------------------------------------------------------------------


def _answer(stop_reason="end_turn", **usage):
    content = [
        {"type": "thinking", "thinking": "hmm " * 10, "signature": "s"},
        {"type": "text", "text": "Hel"},
        {"type": "text", "text": "lo"},
    ]
    counts = {"input_tokens": 10, "output_tokens": 20, **usage}
    body = {"type": "message", "content": content, "stop_reason": stop_reason, "usage": counts}
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("stop_reason", "stop"),
    [
        ("end_turn", "done"),
        ("stop_sequence", "done"),
        ("max_tokens", "length"),
        ("refusal", "filtered"),
        ("pause_turn", "unfinished"),
        (None, "unfinished"),
    ],
)
def test_stop_reasons_map_onto_the_neutral_stops(stop_reason, stop):
    assert ANTHROPIC.read_completion(_answer(stop_reason)).stop == stop


def test_text_blocks_are_joined_and_thinking_kept_apart():
    reply = ANTHROPIC.read_completion(_answer())
    assert (reply.text, reply.reasoning) == ("Hello", ("hmm " * 10).strip() + " ")


def test_the_prompt_counts_cache_reads_and_writes_and_cached_is_the_reads():
    reply = ANTHROPIC.read_completion(
        _answer(cache_read_input_tokens=100, cache_creation_input_tokens=50)
    )
    assert reply.usage == (160, 20, 100, 10)


def test_rate_limit_headers_reset_at_an_rfc3339_time():
    dialect = AnthropicDialect(clock=lambda: 1_700_000_000.0)
    heard = dialect.heard_limits(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2023-11-14T22:13:30Z",
        }
    )
    assert heard.requests is not None
    assert (heard.requests.per_minute, heard.requests.spent, heard.requests.reset) == (
        50.0,
        True,
        10.0,
    )


@pytest.mark.parametrize(
    ("status", "kind", "read"),
    [
        (401, "authentication_error", "credentials"),
        (403, "permission_error", "credentials"),
        (429, "rate_limit_error", "rate_limited"),
        (529, "overloaded_error", "rate_limited"),
        (500, "api_error", "retryable"),
        (400, "invalid_request_error", "rejected"),
    ],
)
def test_error_types_are_read(status, kind, read):
    body = json.dumps({"type": "error", "error": {"type": kind, "message": "m"}}).encode()
    assert ANTHROPIC.read_error(status, body).kind == read


# -- jobs over HTTP, against the simulator speaking Anthropic ---------------------------------


@pytest.fixture(scope="module")
def claude():
    with LocalEndpoint(dialect="anthropic", api_key=KEY) as server:
        yield server


@pytest.fixture
def sim(claude):
    claude.configure(dialect="anthropic", api_key=KEY)
    claude.reset()
    return claude


def _ask(sim, df=PROMPTS, key=KEY, **options):
    options.setdefault("cache", False)
    options.setdefault("prompt", "{text}")
    endpoint = Endpoint(sim.base_url, api_key=key, provider="anthropic")
    return df.pipe(llm_complete, model="sim", endpoint=endpoint, **options)


def test_a_job_gets_the_answers_the_openai_dialect_gets(sim):
    out = _ask(sim, system="be brief")
    as_openai = Endpoint(sim.root + "/v1", api_key=KEY)
    sim.configure(dialect="anthropic")  # the OpenAI route checks a bearer key: none here
    openai = PROMPTS.pipe(
        llm_complete,
        prompt="{text}",
        system="be brief",
        model="sim",
        endpoint=as_openai,
        cache=False,
    )
    assert out["completion"].to_list() == openai["completion"].to_list()
    assert out["completion"].to_list() == [
        expected_reply(t, model="sim", system="be brief") for t in PROMPTS["text"]
    ]
    assert sim.stats()["anthropic_requests"] == 3


def test_max_tokens_reached_is_truncated(sim):
    out = _ask(sim, df=PROMPTS.head(1), sampling=Sampling(max_tokens=2))
    assert out["completion_status"].cast(pl.String).to_list() == ["truncated"]


def test_a_refusal_is_filtered(sim):
    df = pl.DataFrame({"text": ["no [[sim:finish_reason=refusal]]"]})
    out = _ask(sim, df=df)
    assert out["completion_status"].cast(pl.String).to_list() == ["filtered"]


@pytest.mark.parametrize("status", ["529", "429"])
def test_overloaded_and_rate_limited_answers_are_retried(sim, status):
    df = pl.DataFrame({"text": [f"x [[sim:fail_times=1]][[sim:fail_status={status}]]"]})
    out = _ask(sim, df=df)
    assert out["completion_status"].cast(pl.String).to_list() == ["ok"]
    assert sim.stats()["by_status"] == {"200": 1, status: 1}


def test_a_429_with_retry_after_is_retried(sim):
    df = pl.DataFrame({"text": ["x [[sim:fail_times=1]][[sim:retry_after=0]]"]})
    out = _ask(sim, df=df)
    assert out["completion_status"].cast(pl.String).to_list() == ["ok"]


def test_a_bad_key_stops_the_job_without_showing_it(sim):
    with pytest.raises(JobAbortedError, match="ANTHROPIC_API_KEY") as raised:
        _ask(sim, key="sk-ant-wrong-key-123")
    assert "sk-ant-wrong-key-123" not in str(raised.value)
    assert sim.stats()["by_status"] == {"401": 1}


def test_an_account_out_of_credit_stops_the_job(sim):
    sim.configure(dialect="anthropic", api_key=KEY, insufficient_quota=True)
    with pytest.raises(JobAbortedError, match="out of quota"):
        _ask(sim)
    assert sim.stats()["by_status"] == {"400": 1}


def test_images_and_a_pdf_column_reach_the_model(sim, tmp_path):
    photo, contract = image("PNG", color=5), pdf(pages=1)
    df = pl.DataFrame({"text": ["see"], "photo": [photo], "contract": [contract]})
    out = _ask(sim, df=df, images="photo", documents="contract")
    assert out["completion"].to_list() == [
        expected_reply("see", model="sim", media=[photo, contract])
    ]
    assert media_tag(photo) in out["completion"][0]


def test_structured_output_is_answered_as_json(sim):
    out = _ask(sim, df=PROMPTS.head(1), schema=SCHEMA)
    assert out["completion_status"].cast(pl.String).to_list() == ["ok"]
    assert set(out["completion"][0]) == {"word"}


def test_thinking_is_kept_apart_from_the_answer(sim):
    out = _ask(
        sim, df=PROMPTS.head(1), sampling=Sampling(reasoning_effort="low"), keep_reasoning=True
    )
    assert out["completion"].to_list() == [expected_reply("alpha", model="sim")]
    assert out["completion_reasoning"].to_list() == [expected_reasoning("alpha", model="sim")]


def test_embeddings_are_a_config_error_before_anything_is_sent(sim):
    endpoint = Endpoint(sim.base_url, api_key=KEY, provider="anthropic")
    with pytest.raises(ConfigError, match="no embeddings"):
        PROMPTS.pipe(llm_embed, "text", model="sim-embed", endpoint=endpoint, cache=False)
    assert sim.stats()["requests"] == 0


# -- the simulator refuses what Anthropic refuses ---------------------------------------------


def _post(sim, body, **headers):
    sent = {"anthropic-version": "2023-06-01", "x-api-key": KEY, **headers}
    request = urllib.request.Request(
        f"{sim.base_url}/v1/messages",
        data=json.dumps(body).encode(),
        headers={k: v for k, v in sent.items() if v is not None},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as refused:
        return refused.code, json.load(refused)


GOOD = {"model": "sim", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("body", "headers", "status", "said"),
    [
        ({**GOOD, "max_tokens": None}, {}, 400, "max_tokens"),
        (
            {k: v for k, v in GOOD.items() if k != "max_tokens"},
            {},
            400,
            "max_tokens: Field required",
        ),
        (
            {**GOOD, "messages": [{"role": "system", "content": "s"}, *GOOD["messages"]]},
            {},
            400,
            'Unexpected role "system"',
        ),
        (GOOD, {"anthropic-version": None}, 400, "anthropic-version"),
        (GOOD, {"anthropic-version": "2099-01-01"}, 400, "anthropic-version"),
        (GOOD, {"x-api-key": "wrong"}, 401, "x-api-key"),
        ({**GOOD, "response_format": {}}, {}, 400, "Extra inputs"),
    ],
)
def test_the_simulator_refuses_what_anthropic_refuses(sim, body, headers, status, said):
    code, answer = _post(sim, body, **headers)
    assert code == status and answer["type"] == "error"
    assert said in answer["error"]["message"]


def test_the_simulator_answers_in_anthropics_shape(sim):
    code, answer = _post(sim, GOOD)
    assert code == 200 and answer["type"] == "message"
    assert answer["content"][0]["type"] == "text" and answer["stop_reason"] == "end_turn"
    assert set(answer["usage"]) >= {"input_tokens", "output_tokens"}


# -- prompt caching, priced -------------------------------------------------------------------

LONG_SYSTEM = "x" * 4096  # 1,028 tokens as both count them: over the least cached prefix
SHORT = pl.DataFrame({"text": ["abcd", "efgh", "ijkl"]})  # whole tokens: estimates agree
CLAUDE_PRICE = Price(3.0, 0.0, 0.30, cache_write_per_million=3.75)  # output free: cost_min


def _cached_job(sim, cache_file, **endpoint_options):
    endpoint = Endpoint(sim.base_url, api_key=KEY, provider="anthropic", **endpoint_options)
    return dict(
        prompt="{text}",
        system=LONG_SYSTEM,
        model="sim",
        endpoint=endpoint,
        pricing=CLAUDE_PRICE,
        sampling=Sampling(max_tokens=16),
        cache=cache_file,
    )


def test_the_system_prompt_is_written_once_then_read(sim, tmp_path):
    job = _cached_job(sim, tmp_path / "c.duckdb")
    _, report = SHORT.pipe(llm_complete, return_report=True, **job)
    assert (report.cache_write_tokens, report.cached_tokens) == (1028, 2 * 1028)


def test_the_estimate_prices_cache_writes_and_reads_as_the_report_does(sim, tmp_path):
    job = _cached_job(sim, tmp_path / "c.duckdb")
    plan = estimate(SHORT, **job)
    _, report = SHORT.pipe(llm_complete, return_report=True, **job)
    assert (plan.cache_write_tokens, plan.cache_read_tokens) == (1028, 2 * 1028)
    assert plan.input_tokens == report.prompt_tokens
    assert plan.cost_min == report.cost == plan.cost_max


def test_without_prompt_cache_nothing_is_written_or_projected(sim, tmp_path):
    job = _cached_job(sim, tmp_path / "c.duckdb", prompt_cache=False)
    plan = estimate(SHORT, **job)
    _, report = SHORT.pipe(llm_complete, return_report=True, **job)
    assert (report.cache_write_tokens, report.cached_tokens, plan.cache_write_tokens) == (0, 0, 0)
    assert plan.cost_min == report.cost


def test_cache_writes_are_kept_per_answer_and_per_run(sim, tmp_path):
    cache_file = tmp_path / "c.duckdb"
    SHORT.pipe(llm_complete, **_cached_job(sim, cache_file))
    with duckdb.connect(str(cache_file), read_only=True) as con:
        answers = con.sql("SELECT sum(cache_write_tokens) FROM llm_cache").fetchall()
        runs = con.sql("SELECT cache_write_tokens FROM llm_runs").fetchall()
    assert answers == [(1028,)] and runs == [(1028,)]


def test_a_cache_write_costs_more_than_the_input_and_a_read_far_less():
    price = PRICES["claude-sonnet-4-5"]
    fresh = price.cost(requests=0, input_tokens=10**6, output_tokens=0)
    written = price.cost(requests=0, input_tokens=10**6, output_tokens=0, cache_write_tokens=10**6)
    read = price.cost(requests=0, input_tokens=10**6, output_tokens=0, cached_input_tokens=10**6)
    assert (written / fresh, round(read / fresh, 9)) == (1.25, 0.1)


# -- keys: another provider is another key ----------------------------------------------------


def _job(dialect):
    options = {"system": "be brief", "sampling": Sampling(max_tokens=8)}
    return make_job(
        prompt="{text}", model="m", endpoint="e", cached=True, options=options, dialect=dialect
    )


def test_openai_keys_never_change_with_the_dialect_named():
    assert _job(OPENAI).spec.key("be brief", "hi") == _job(None).spec.key("be brief", "hi")


def test_another_provider_is_another_key():
    assert _job(ANTHROPIC).spec.key("be brief", "hi") != _job(OPENAI).spec.key("be brief", "hi")
    assert _job(ANTHROPIC).spec.request("be brief", "hi")["provider"] == "anthropic"


def test_vectorised_keys_hold_the_provider_as_the_reference_does(sim, tmp_path):
    cache_file = tmp_path / "c.duckdb"
    _ask(sim, system="S {text}", cache=cache_file)
    with duckdb.connect(str(cache_file), read_only=True) as con:
        stored = con.sql("SELECT key, request FROM llm_cache").fetchall()
    assert len(stored) == 3
    for key, request in stored:
        assert key == request_key(json.loads(request))
        assert json.loads(request)["provider"] == "anthropic"


def test_an_openai_answer_is_never_served_to_an_anthropic_job(sim, tmp_path):
    cache_file = tmp_path / "c.duckdb"
    as_openai = Endpoint(sim.root + "/v1", api_key=KEY, name="llm-sim")
    as_anthropic = Endpoint(sim.base_url, api_key=KEY, name="llm-sim", provider="anthropic")
    sim.configure(dialect="anthropic")  # no key checked: the OpenAI route takes a bearer one
    reports = [
        PROMPTS.pipe(
            llm_complete,
            prompt="{text}",
            model="sim",
            endpoint=endpoint,
            cache=cache_file,
            return_report=True,
        )[1]
        for endpoint in (as_openai, as_anthropic, as_anthropic)
    ]
    assert [r.cache_hits for r in reports] == [0, 0, 3]
    assert sim.stats()["anthropic_requests"] == 3


def test_the_key_and_the_url_come_from_anthropics_variables(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    resolved = Endpoint(provider="anthropic").resolve()
    assert (resolved.base_url, resolved.api_key) == ("https://api.anthropic.com", "sk-ant-env")
