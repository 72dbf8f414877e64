"""The semantic cache: near-duplicate requests reuse a cached answer, openly."""

from __future__ import annotations

import duckdb
import polars as pl
import pytest

from llm_ops import Budget, ConfigError, Sampling, SemanticCache, request_key
from llm_ops._outcome import Outcome
from llm_ops._pipeline.similar import follow_leaders
from llm_ops.testing import expected_reply

SEMANTIC = SemanticCache("sim-embed", threshold=0.9)
PROMPT = "Summarize: {text}"


def _ask(complete, *texts, **options):
    return pl.DataFrame({"text": list(texts)}).pipe(complete, prompt=PROMPT, **options)


@pytest.fixture
def warm(complete, endpoint):
    """A cache holding the answer to 'the red dress is lovely', indexed for similarity."""
    _ask(complete, "the red dress is lovely", semantic_cache=SEMANTIC)
    endpoint.reset()
    return complete


def test_a_near_duplicate_reuses_the_cached_answer(warm, endpoint):
    out = _ask(warm, "The red dress is LOVELY!", semantic_cache=SEMANTIC)
    assert out["completion_status"].to_list() == ["similar"]
    assert out["completion"][0] == expected_reply("Summarize: the red dress is lovely", model="sim")
    assert endpoint.stats()["requests"] == 0


def test_the_reused_request_and_its_similarity_are_recorded(warm, endpoint):
    out = _ask(warm, "The red dress is LOVELY!", semantic_cache=SEMANTIC)
    original = {
        "endpoint": endpoint.base_url,
        "model": "sim",
        "messages": [{"role": "user", "content": "Summarize: the red dress is lovely"}],
    }
    assert out["completion_similar_to"][0] == request_key(original)
    assert out["completion_similarity"][0] == pytest.approx(1.0)


def test_below_the_threshold_the_request_is_sent(warm, endpoint):
    strict = SemanticCache("sim-embed", threshold=0.99)
    out = _ask(warm, "the red dress is lovely but too long", semantic_cache=strict)
    assert out["completion_status"].to_list() == ["ok"]
    assert out["completion_similar_to"].to_list() == [None]
    assert endpoint.stats()["requests"] == 1


def test_off_by_default(warm, endpoint):
    out = _ask(warm, "The red dress is LOVELY!")
    assert out["completion_status"].to_list() == ["ok"]
    assert "completion_similar_to" not in out.columns
    assert endpoint.stats()["embedding_requests"] == 0


def test_answers_are_reused_only_within_the_same_system_message(warm):
    out = _ask(warm, "The red dress is LOVELY!", system="Be brief.", semantic_cache=SEMANTIC)
    assert out["completion_status"].to_list() == ["ok"]


def test_exact_hits_are_not_embedded(warm, endpoint):
    _ask(warm, "the red dress is lovely", semantic_cache=SEMANTIC)
    assert endpoint.stats()["embedding_requests"] == 0


def test_embeddings_are_cached(warm, endpoint):
    _ask(warm, "the red dress is lovely", sampling=Sampling(max_tokens=50), semantic_cache=SEMANTIC)
    assert endpoint.stats()["embedding_requests"] == 0


def test_a_failed_embedding_leaves_the_row_to_be_sent(complete, endpoint):
    endpoint.configure(max_embedding_inputs=0)
    out = _ask(complete, "a green hat", semantic_cache=SEMANTIC)
    assert out["completion_status"].to_list() == ["ok"]


def test_report_and_runs_table_show_what_it_saved(warm, cache):
    _, report = _ask(
        warm, "The red dress is LOVELY!", "a green hat", semantic_cache=SEMANTIC, return_report=True
    )
    assert report.savings["semantic_cache"].requests == 1
    assert report.models["sim-embed"].requests == 1
    with duckdb.connect(str(cache), read_only=True) as con:
        saved = con.sql(
            "SELECT savings['semantic_cache'].requests FROM llm_runs "
            "ORDER BY finished_at DESC LIMIT 1"
        ).fetchall()
    assert saved == [(1,)]


@pytest.mark.parametrize("threshold", [0, 1.5, "high"])
def test_threshold_must_be_a_similarity(threshold):
    with pytest.raises(ConfigError, match="cosine similarity"):
        SemanticCache("sim-embed", threshold=threshold)


def test_it_needs_a_cache_file(complete):
    with pytest.raises(ConfigError, match="cache database"):
        _ask(complete, "x", cache=False, semantic_cache=SEMANTIC)


def test_misses_are_searched_a_slice_at_a_time(warm, monkeypatch):
    monkeypatch.setattr("llm_ops._pipeline.similar._SLICE", 2)
    out = _ask(warm, "a", "b", "The red dress is LOVELY!", "c", "d", semantic_cache=SEMANTIC)
    assert out["completion_status"].to_list() == ["ok", "ok", "similar", "ok", "ok"]


def test_embeddings_count_against_the_budget(warm, endpoint):
    out = _ask(
        warm, "a green hat", "a blue hat", semantic_cache=SEMANTIC, budget=Budget(max_requests=2)
    )
    assert sorted(out["completion_status"].to_list()) == ["ok", "skipped"]  # 1 embedding, 1 sent


def test_near_duplicates_within_one_job_are_sent_once(complete, endpoint):
    out = _ask(
        complete,
        "The red dress is lovely",
        "the red dress is LOVELY!",
        "a green hat",
        semantic_cache=SEMANTIC,
    )
    assert sorted(out["completion_status"].to_list()) == ["ok", "ok", "similar"]
    assert out["completion"][0] == out["completion"][1]
    assert endpoint.stats()["requests"] == 2


def test_a_follower_whose_leader_got_no_answer_is_sent_itself():
    followers = pl.DataFrame(
        {
            "key": ["f1", "f2"],
            "system": [None, None],
            "prompt": ["1", "2"],
            "rows": [1, 1],
            "similar_to": ["l1", "l2"],
            "similarity": [1.0, 1.0],
        }
    )
    outcomes = [
        Outcome(key="l1", status="ok", text="answer"),
        Outcome(key="l2", status="failed", error="HTTP 500"),
    ]
    settled, resend = follow_leaders(followers, outcomes)
    assert settled.select("key", "text", "status").rows() == [("f1", "answer", "similar")]
    assert resend["key"].to_list() == ["f2"]


def test_a_failed_answer_is_never_passed_on_by_similarity(complete):
    # Same words, but only the first carries the directive that makes the endpoint refuse.
    out = _ask(
        complete, "coat [[sim:status=400]]", "COAT [[SIM:STATUS=400]]", semantic_cache=SEMANTIC
    )
    statuses = out["completion_status"].to_list()
    assert statuses[1] == "ok" and statuses[0] in ("rejected", "similar")


def test_progress_covers_the_embeddings(complete):
    seen = []
    _ask(complete, "a green hat", "a red coat", semantic_cache=SEMANTIC, progress=seen.append)
    assert {snapshot.phase for snapshot in seen} == {"embedding", "sending"}


def test_max_cost_needs_a_price_for_the_embedding_model(complete):
    with pytest.raises(ConfigError, match="price for model 'my-embedder'"):
        _ask(
            complete, "x", budget=Budget(max_cost=1.0), semantic_cache=SemanticCache("my-embedder")
        )


@pytest.mark.parametrize(
    "setting", [{"model": ""}, {"dimensions": 0}, {"inputs_per_request": True}]
)
def test_bad_settings_are_refused(setting):
    with pytest.raises(ConfigError, match="SemanticCache"):
        SemanticCache(**{"model": "sim-embed", **setting})


def test_semantic_cache_must_be_a_semantic_cache(complete):
    with pytest.raises(ConfigError, match="takes a SemanticCache"):
        _ask(complete, "x", semantic_cache="sim-embed")
