"""The simulator's world with known truth: texts carry latent facts (``[score=]``,
``[entity=]``) and the judge answers from them, through real HTTP."""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from llm_ops.testing import LocalEndpoint, distinct_facts, latent_score

VERDICT = {"answer": {"type": "boolean"}}
COMPARISON = {"better": {"type": "string", "enum": ["A", "B"]}}
RANKING = {"ranking": {"type": "array", "items": {"type": "integer"}}}
CHOICE = {"choice": {"type": "string", "enum": ["a", "b", "c", "none"]}}


def _sdk(endpoint: LocalEndpoint) -> openai.OpenAI:
    return openai.OpenAI(base_url=endpoint.base_url, api_key="unused", max_retries=0)


def _judge(endpoint: LocalEndpoint, content: str, properties: dict[str, Any]) -> Any:
    """The one judged field of the structured answer to ``content``."""
    schema = {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
    answer = _sdk(endpoint).chat.completions.create(
        model="sim",
        messages=[{"role": "user", "content": content}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "judgment", "schema": schema, "strict": True},
        },
    )
    return json.loads(answer.choices[0].message.content or "")[next(iter(properties))]


def _say(endpoint: LocalEndpoint, content: str, **options: Any) -> str:
    answer = _sdk(endpoint).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": content}], **options
    )
    return answer.choices[0].message.content or ""


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def _embed(endpoint: LocalEndpoint, texts: list[str]) -> list[list[float]]:
    answer = _sdk(endpoint).embeddings.create(model="sim-embed", input=texts)
    return [item.embedding for item in answer.data]


def test_a_verdict_on_two_entities_says_whether_they_are_one(endpoint):
    assert _judge(endpoint, "Same firm? Acme [entity=4] vs ACME Inc. [entity=4]", VERDICT)
    assert not _judge(endpoint, "Same firm? Acme [entity=4] vs Apex [entity=5]", VERDICT)


def test_a_verdict_on_a_score_passes_it_from_one_half(endpoint):
    assert _judge(endpoint, "Is this review positive? Lovely coat [score=0.5]", VERDICT)
    assert not _judge(endpoint, "Is this review positive? Torn coat [score=0.2]", VERDICT)


def test_a_comparison_answers_the_label_of_the_higher_score(endpoint):
    assert _judge(endpoint, "A: dull [score=0.3]\nB: sharp [score=0.8]", COMPARISON) == "B"


def test_a_ranking_orders_items_by_score_highest_first(endpoint):
    items = "1. ok [score=0.5]\n2. bad [score=0.1]\n3. great [score=0.9]"
    assert _judge(endpoint, items, RANKING) == [3, 1, 2]


def test_a_choice_answers_the_option_with_the_query_entity(endpoint):
    query = "Which is Acme [entity=5]? a: Apex [entity=2] b: ACME [entity=5] c: Ace [entity=9]"
    assert _judge(endpoint, query, CHOICE) == "b"


def test_a_choice_without_a_match_answers_none(endpoint):
    query = "Which is Acme [entity=5]? a: Apex [entity=2] b: Ace [entity=9]"
    assert _judge(endpoint, query, CHOICE) == "none"


def test_judge_error_one_flips_a_verdict(endpoint):
    endpoint.configure(judge_error=1.0)
    assert not _judge(endpoint, "Same? Acme [entity=4] vs ACME [entity=4]", VERDICT)


def test_position_bias_one_answers_the_first_label(endpoint):
    endpoint.configure(position_bias=1.0)
    assert _judge(endpoint, "A: dull [score=0.1]\nB: sharp [score=0.9]", COMPARISON) == "A"


def test_the_same_request_gets_the_same_answer_twice(endpoint):
    endpoint.configure(judge_error=0.5)
    items = "\n".join(f"{n}. item [score=0.{n}]" for n in range(1, 10))
    assert _judge(endpoint, items, RANKING) == _judge(endpoint, items, RANKING)


def test_a_ranking_is_always_a_permutation_of_its_items(endpoint):
    endpoint.configure(judge_error=0.5)
    for size in range(1, 9):
        items = "\n".join(f"{n}. size {size} [score=0.{n}]" for n in range(1, size + 1))
        assert sorted(_judge(endpoint, items, RANKING)) == list(range(1, size + 1))


def test_a_plain_answer_lists_the_distinct_facts_in_order(endpoint):
    text = "Sum up: Acme [entity=3] good [score=0.5], again Acme [entity=3], Apex [entity=4]"
    answer = _say(endpoint, text)
    assert answer.split(": ", 1)[1] == "[entity=3] [score=0.5] [entity=4]"
    assert distinct_facts(text) == ["[entity=3]", "[score=0.5]", "[entity=4]"]


def test_judge_error_one_leaves_one_fact_out_of_an_aggregation(endpoint):
    endpoint.configure(judge_error=1.0)
    named = _say(endpoint, "Sum up: [entity=1] [entity=2] [entity=3]").split(": ", 1)[1]
    assert len(named.split()) == 2
    assert set(named.split()) < {"[entity=1]", "[entity=2]", "[entity=3]"}


def test_the_judged_counters_count_each_kind(endpoint):
    _judge(endpoint, "Same? [entity=1] [entity=1]", VERDICT)
    _say(endpoint, "Sum up: [score=0.4]")
    _say(endpoint, "no facts at all")
    judged = endpoint.stats()["judged"]
    assert judged == {"verdict": 1, "comparison": 0, "ranking": 0, "choice": 0, "aggregation": 1}


def test_a_judgment_without_the_facts_it_needs_is_not_judged(endpoint):
    assert _judge(endpoint, "A: [score=0.3] and nothing else", COMPARISON) in ("A", "B")
    assert set(endpoint.stats()["judged"].values()) == {0}


def test_the_strings_of_a_schema_without_a_judgment_hold_the_facts(endpoint):
    summary = {"summary": {"type": "string"}}
    assert _judge(endpoint, "Sum up: [entity=2] and [score=0.7]", summary) == (
        "[entity=2] [score=0.7]"
    )
    assert endpoint.stats()["judged"]["aggregation"] == 1


def test_context_tokens_refuses_an_over_long_request_with_llama_cpps_400(endpoint):
    endpoint.configure(context_tokens=64)
    with pytest.raises(openai.BadRequestError) as refused:
        _say(endpoint, "word " * 200, max_tokens=16)
    error = refused.value.response.json()["error"]
    assert (error["type"], error["n_ctx"]) == ("exceed_context_size_error", 64)


def test_context_tokens_counts_max_tokens_into_the_request(endpoint):
    endpoint.configure(context_tokens=64)
    assert _say(endpoint, "short", max_tokens=16)
    with pytest.raises(openai.BadRequestError):
        _say(endpoint, "short", max_tokens=64)


def test_props_reports_the_context_per_slot(endpoint):
    endpoint.configure(context_tokens=512, slots=4)
    props = httpx.get(endpoint.base_url.removesuffix("/v1") + "/props", trust_env=False).json()
    assert props["default_generation_settings"]["n_ctx"] == 512
    assert props["total_slots"] == 4


def test_props_is_not_found_without_a_context(endpoint):
    answer = httpx.get(endpoint.base_url.removesuffix("/v1") + "/props", trust_env=False)
    assert answer.status_code == 404


def test_sim_embed_puts_texts_of_one_entity_nearer_than_of_two(endpoint):
    acme, acme_inc, apex = _embed(
        endpoint, ["Acme [entity=1]", "ACME Incorporated, Ohio [entity=1]", "Acme [entity=2]"]
    )
    assert _cosine(acme, acme_inc) > _cosine(acme, apex)


def test_sim_embed_orders_score_texts_by_cosine_to_best_when_noise_is_small(endpoint):
    endpoint.configure(embed_noise=0.05)
    texts = [f"review {word} [score=0.{n}]" for n, word in enumerate("abcdefghi", 1)]
    best, *vectors = _embed(endpoint, ["best", *texts])
    by_cosine = sorted(texts, key=lambda text: -_cosine(best, vectors[texts.index(text)]))
    assert by_cosine == sorted(texts, key=lambda text: -(latent_score(text) or 0))


@pytest.mark.parametrize(
    ("dialect", "path"), [("openai", "/v1"), ("anthropic", ""), ("gemini", "/v1beta")]
)
def test_the_base_url_is_the_one_the_dialect_sdk_takes(dialect, path):
    with LocalEndpoint(dialect=dialect) as endpoint:
        assert urlsplit(endpoint.base_url).path == path
