"""The Gemini dialect (``provider="gemini"``) against the simulator speaking Gemini: the same
answers as the OpenAI dialect for the same prompts, Google's finish reasons and errors onto
our statuses, media, structured output, thoughts and embeddings; and what the simulator
refuses as Google does."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import polars as pl
import pytest

from llm_ops import (
    Endpoint,
    JobAbortedError,
    Retries,
    Sampling,
    llm_complete,
    llm_embed,
)
from llm_ops._dialects.gemini import GEMINI
from llm_ops._endpoint import ResolvedEndpoint, dialect_for
from llm_ops.testing import LocalEndpoint, expected_reasoning
from tests.media_files import image, pdf

KEY = "g-test-key-8d1f"
ROWS = pl.DataFrame({"text": ["a red bicycle", "two small cats", "the tide at noon"]})
FAST = Retries(max_attempts=3)


@pytest.fixture(scope="module")
def gemini_server():
    with LocalEndpoint(dialect="gemini", api_key=KEY) as server:
        yield server


@pytest.fixture
def sim(gemini_server):
    gemini_server.configure(dialect="gemini", api_key=KEY)
    gemini_server.reset()
    return gemini_server


def gemini(sim: LocalEndpoint, key: str = KEY) -> Endpoint:
    return Endpoint(sim.base_url, api_key=key, provider="gemini")


def openai(sim: LocalEndpoint) -> Endpoint:
    """The same simulator in the OpenAI dialect (its paths are served too), keyed alike."""
    sim.configure(dialect="gemini", api_key=KEY, api_key_header="Authorization")
    return Endpoint(sim.root + "/v1", api_key=KEY)


def ask(endpoint: Endpoint, frame: pl.DataFrame = ROWS, **options) -> pl.DataFrame:
    options.setdefault("prompt", "Describe {text}")
    return frame.pipe(llm_complete, model="sim", endpoint=endpoint, cache=False, **options)


def statuses(out: pl.DataFrame) -> list[str]:
    return out["completion_status"].cast(pl.String).to_list()


def post(sim: LocalEndpoint, body: object, *, key: str | None = KEY, model: str = "sim"):
    """``generateContent`` sent by hand: (HTTP status, JSON body)."""
    request = urllib.request.Request(
        f"{sim.base_url}/models/{model}:generateContent",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **({"x-goog-api-key": key} if key else {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as refused:
        return refused.code, json.load(refused)


HELLO = {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}


# -- answers --------------------------------------------------------------------------------


def test_a_frame_gets_the_answers_the_openai_dialect_gets(sim):
    answered = ask(gemini(sim), system="Answer in one line.")
    assert statuses(answered) == ["ok"] * 3
    expected = ask(openai(sim), system="Answer in one line.")
    assert answered["completion"].to_list() == expected["completion"].to_list()


def test_requests_carry_the_key_in_googles_header_and_no_bearer(sim):
    ask(gemini(sim), ROWS.head(1))
    names = {name.lower() for name in sim.stats()["header_names"]}
    assert "x-goog-api-key" in names and "authorization" not in names


def test_an_answer_cut_at_max_output_tokens_is_truncated(sim):
    out = ask(gemini(sim), ROWS.head(1), sampling=Sampling(max_tokens=2))
    assert statuses(out) == ["truncated"]


def test_a_safety_stop_is_filtered(sim):
    out = ask(gemini(sim), ROWS.head(1), prompt="{text} [[sim:finish_reason=content_filter]]")
    assert statuses(out) == ["filtered"]


def test_a_prompt_blocked_before_any_candidate_is_filtered(sim):
    out = ask(gemini(sim), ROWS.head(1), prompt="{text} [[sim:finish_reason=prompt_blocked]]")
    assert statuses(out) == ["filtered"]


@pytest.mark.parametrize("status", [429, 503])
def test_a_429_and_a_503_are_retried(sim, status):
    prompt = f"{{text}} [[sim:fail_times=1]][[sim:fail_status={status}]]"
    out, report = ask(gemini(sim), ROWS.head(1), prompt=prompt, return_report=True)
    assert statuses(out) == ["ok"] and report.retries == 1


def test_the_wait_a_429s_retry_info_asks_for_is_heeded(sim):
    # an hour, over max_retry_after: the row fails at once saying so, which only a wait read
    # from the body (Gemini sends no Retry-After) can make it do
    out = ask(gemini(sim), ROWS.head(1), prompt="{text} [[sim:retry_after=3600]]", retries=FAST)
    assert statuses(out) == ["failed"]
    assert "asked to wait 60 min" in out["completion_error"][0]


def test_a_wrong_key_stops_the_job_with_googles_words_and_never_the_key(sim):
    with pytest.raises(JobAbortedError, match="refused the credentials") as refused:
        ask(gemini(sim, key="wrong-key-77a1"))
    assert "API key not valid" in str(refused.value)
    assert "wrong-key-77a1" not in str(refused.value)
    assert sim.stats()["requests"] == 1


def test_an_exhausted_daily_quota_stops_the_job(sim):
    sim.configure(dialect="gemini", api_key=KEY, insufficient_quota=True)
    with pytest.raises(JobAbortedError, match="out of quota"):
        ask(gemini(sim))


# -- media, structured output, thoughts, embeddings ------------------------------------------


def test_an_image_and_a_pdf_column_answer_as_on_the_openai_dialect(sim, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.png").write_bytes(image("PNG", color=9))
    (tmp_path / "b.pdf").write_bytes(pdf(pages=2, color=4))
    frame = pl.DataFrame({"text": ["label"], "photo": ["a.png"], "doc": ["b.pdf"]})
    media = {"prompt": "Read {text}", "images": "photo", "documents": "doc"}
    answered = ask(gemini(sim), frame, **media)
    assert statuses(answered) == ["ok"] and sim.stats()["media_parts"] == 2
    assert (
        answered["completion"].to_list() == ask(openai(sim), frame, **media)["completion"].to_list()
    )


SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string"}, "score": {"type": "integer"}},
    "required": ["label", "score"],
    "additionalProperties": False,
}


def test_structured_output_matches_the_schema_as_on_the_openai_dialect(sim):
    answered = ask(gemini(sim), schema=SCHEMA)
    assert statuses(answered) == ["ok"] * 3
    assert (
        answered["completion"].to_list() == ask(openai(sim), schema=SCHEMA)["completion"].to_list()
    )


def test_thoughts_are_kept_apart_from_the_answer(sim):
    out = ROWS.head(2).pipe(
        llm_complete,
        prompt="{text}",
        model="sim-think",
        endpoint=gemini(sim),
        cache=False,
        sampling=Sampling(reasoning_effort="low"),
        keep_reasoning=True,
    )
    thoughts = [expected_reasoning(text, model="sim-think") for text in ROWS["text"][:2]]
    assert out["completion_reasoning"].to_list() == thoughts
    assert all(
        thought not in answer for thought, answer in zip(thoughts, out["completion"], strict=True)
    )


def test_thinking_tokens_are_counted_as_reasoning(sim):
    _, report = ROWS.head(1).pipe(
        llm_complete,
        prompt="{text}",
        model="sim-think",
        endpoint=gemini(sim),
        cache=False,
        return_report=True,
    )
    assert 0 < report.reasoning_tokens < report.completion_tokens


def test_embeddings_are_the_openai_dialects(sim):
    embedded = ROWS.pipe(
        llm_embed, column="text", model="sim-embed", endpoint=gemini(sim), cache=False
    )
    expected = ROWS.pipe(
        llm_embed, column="text", model="sim-embed", endpoint=openai(sim), cache=False
    )
    assert embedded["embedding"].to_list() == expected["embedding"].to_list()


# -- the simulator refuses what Google refuses -----------------------------------------------


def test_the_simulator_answers_in_googles_shape(sim):
    status, body = post(sim, HELLO)
    assert status == 200
    assert body["candidates"][0]["finishReason"] == "STOP"
    assert body["usageMetadata"]["promptTokenCount"] > 0


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "valid role: user, model"),
        ({"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]}, "valid role"),
        ({**HELLO, "temperature": 0}, 'Unknown name "temperature"'),
        ({**HELLO, "generationConfig": {"max_tokens": 5}}, 'Unknown name "max_tokens"'),
        ({"contents": [{"role": "user", "parts": []}]}, "must not be empty"),
        ({"contents": []}, "contents is not specified"),
        (
            {
                **HELLO,
                "generationConfig": {
                    "responseMimeType": "application/json",
                    "responseSchema": {"type": "OBJECT", "additionalProperties": False},
                },
            },
            'Unknown name "additionalProperties"',
        ),
        (
            {**HELLO, "generationConfig": {"responseSchema": {"type": "STRING"}}},
            "must be application/json",
        ),
        (
            {
                **HELLO,
                "generationConfig": {
                    "responseMimeType": "application/json",
                    "responseSchema": {"type": "TEXT"},
                },
            },
            "not a Type",
        ),
        ({**HELLO, "generationConfig": {"temperature": 3}}, "between 0 and 2"),
    ],
)
def test_what_google_refuses_is_a_400_invalid_argument(sim, body, says):
    status, answer = post(sim, body)
    assert (status, answer["error"]["status"]) == (400, "INVALID_ARGUMENT")
    assert says in answer["error"]["message"]


def test_a_missing_key_is_a_403_and_a_wrong_one_a_400_naming_it_invalid(sim):
    assert post(sim, HELLO, key=None)[1]["error"]["status"] == "PERMISSION_DENIED"
    status, answer = post(sim, HELLO, key="nope")
    assert status == 400
    assert answer["error"]["details"][0]["reason"] == "API_KEY_INVALID"


def test_a_rate_limit_says_when_to_come_back_in_retry_info(sim):
    status, answer = post(sim, {"contents": [{"parts": [{"text": "[[sim:retry_after=7]]"}]}]})
    assert (status, answer["error"]["status"]) == (429, "RESOURCE_EXHAUSTED")
    assert {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"} in answer[
        "error"
    ]["details"]


def test_thoughts_come_back_only_when_asked_for(sim):
    thinking = {"thinkingConfig": {"thinkingBudget": 1024, "includeThoughts": True}}
    asked = post(sim, {**HELLO, "generationConfig": thinking}, model="sim-think")[1]
    silent = post(sim, HELLO, model="sim-think")[1]
    assert [p.get("thought") for p in asked["candidates"][0]["content"]["parts"]] == [True, None]
    assert [p.get("thought") for p in silent["candidates"][0]["content"]["parts"]] == [None]
    assert silent["usageMetadata"]["thoughtsTokenCount"] > 0


def test_the_model_listing_names_models_as_google_does(sim):
    request = urllib.request.Request(f"{sim.base_url}/models", headers={"x-goog-api-key": KEY})
    with urllib.request.urlopen(request, timeout=10) as answer:
        listed = json.load(answer)
    assert GEMINI.read_models(json.dumps(listed).encode()) == set(sim.config.models)
    assert "models/sim" in [model["name"] for model in listed["models"]]


# -- the dialect's reading of Google's words -------------------------------------------------


def _error(status: str, message: str, *details: dict) -> bytes:
    return json.dumps(
        {"error": {"code": 0, "message": message, "status": status, "details": details}}
    ).encode()


def _quota(quota_id: str) -> dict:
    return {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [{"quotaId": quota_id}],
    }


PER_MINUTE = "You exceeded your current quota, please check your plan and billing details."


@pytest.mark.parametrize(
    ("status", "payload", "kind"),
    [
        (
            429,
            _error("RESOURCE_EXHAUSTED", PER_MINUTE, _quota("GenerateRequestsPerMinute")),
            "rate_limited",
        ),
        (429, _error("RESOURCE_EXHAUSTED", PER_MINUTE, _quota("GenerateRequestsPerDay")), "quota"),
        (429, _error("RESOURCE_EXHAUSTED", "Your prepayment credits are depleted."), "quota"),
        (403, _error("PERMISSION_DENIED", "no"), "credentials"),
        (401, _error("UNAUTHENTICATED", "no"), "credentials"),
        (503, _error("UNAVAILABLE", "overloaded"), "retryable"),
        (500, _error("INTERNAL", "oops"), "retryable"),
        (504, _error("DEADLINE_EXCEEDED", "slow"), "retryable"),
        (400, _error("FAILED_PRECONDITION", "not in your region"), "rejected"),
        (404, _error("NOT_FOUND", "no such model"), "rejected"),
        (502, b"<html>bad gateway</html>", "retryable"),
    ],
)
def test_googles_error_statuses_map_onto_what_they_do_to_a_job(status, payload, kind):
    assert GEMINI.read_error(status, payload).kind == kind


def test_a_finish_reason_other_than_googles_known_ones_is_tried_again():
    body = {"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": "OTHER"}]}
    assert GEMINI.read_completion(json.dumps(body).encode()).stop == "unfinished"


def test_cached_and_thought_tokens_read_into_the_neutral_usage():
    metadata = {
        "promptTokenCount": 100,
        "candidatesTokenCount": 10,
        "thoughtsTokenCount": 30,
        "cachedContentTokenCount": 60,
    }
    body = {"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": "STOP"}]}
    reply = GEMINI.read_completion(json.dumps({**body, "usageMetadata": metadata}).encode())
    assert reply.usage == (100, 40, 60, 30)


# -- where a Gemini endpoint is, and its key ---------------------------------------------------


def test_googles_host_speaks_gemini_without_naming_it():
    assert dialect_for(None, "https://generativelanguage.googleapis.com/v1beta") is GEMINI


def test_provider_gemini_alone_goes_to_google_with_the_gemini_key_never_openais(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-secret")
    monkeypatch.setenv("GEMINI_API_KEY", "g-from-env")
    resolved = ResolvedEndpoint.resolve(provider="gemini")
    assert resolved.base_url == "https://generativelanguage.googleapis.com/v1beta"
    assert resolved.api_key == "g-from-env"


def test_a_stop_without_any_text_is_tried_again():
    body = {"candidates": [{"content": {"role": "model"}, "finishReason": "STOP"}]}
    assert GEMINI.read_completion(json.dumps(body).encode()).stop == "unfinished"
