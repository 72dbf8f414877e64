"""The waves of a set operator: one job per round, on one client, budgeted and reported."""

from __future__ import annotations

import pytest

from llm_ops import Budget, Client, RowsFailedError
from llm_ops._options import Columns
from llm_ops._sets import Waves, estimate_set, priced

VERDICT = {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]}


@pytest.fixture
def waves(endpoint, cache):
    with Waves(
        "llm_test",
        model="sim",
        client=None,
        options={"endpoint": endpoint.base_url, "cache": cache},
    ) as w:
        yield w


def test_a_wave_answers_its_prompts_in_order(waves):
    answers = waves.ask(["one", "two", "three"])
    assert [a.split()[-1] for a in answers.values] == ["one", "two", "three"]


def test_a_wave_with_a_schema_answers_objects(waves):
    answers = waves.ask(["is it?"], schema=VERDICT)
    assert isinstance(answers.values[0]["answer"], bool)


def test_the_same_judgment_asked_again_is_not_sent_again(waves, endpoint):
    waves.ask(["a", "b"])
    waves.ask(["b", "a"])
    assert endpoint.stats()["requests"] == 2


def test_the_report_adds_up_the_waves(waves):
    waves.ask(["a"])
    waves.ask(["b", "c"])
    waves.plan, waves.plan_why = "naive", "small input"
    report = waves.report()
    assert (report.rows, report.waves, report.operator, report.plan) == (3, 2, "llm_test", "naive")


def test_a_spent_budget_sends_nothing_more(endpoint, cache):
    options = {"endpoint": endpoint.base_url, "cache": cache, "budget": Budget(max_requests=2)}
    with Waves("llm_test", model="sim", client=None, options=options) as waves:
        waves.ask(["a", "b"])
        later = waves.ask(["c"])
    assert later.statuses == ["skipped"] and "budget" in later.errors[0]
    assert endpoint.stats()["requests"] == 2


def test_a_failed_judgment_is_no_answer(waves):
    answers = waves.ask(["[[sim:status=400]]"])
    assert answers.values == [None] and not answers.ok(0)


def test_on_error_raise_raises_once_at_the_end(endpoint, cache):
    import polars as pl

    options = {"endpoint": endpoint.base_url, "cache": cache, "on_error": "raise"}
    with Waves("llm_test", model="sim", client=None, options=options) as waves:
        added = pl.DataFrame({"x": [None], "x_status": ["failed"], "x_error": ["boom"]})
        with pytest.raises(RowsFailedError):
            waves.finish(added, Columns("x"))


def test_a_given_client_is_not_closed(endpoint, cache):
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        with Waves("llm_test", model="sim", client=client, options={}) as waves:
            waves.ask(["a"])
        assert client.complete is not None and waves.client is client


def test_an_operator_sets_its_own_schema():
    with pytest.raises(Exception, match="takes no schema="):
        Waves("llm_test", model="sim", client=None, options={"schema": VERDICT})


def test_estimate_set_names_the_set_operators_for_another_function():
    with pytest.raises(Exception, match=r"llm_ops\.estimate"):
        estimate_set(print, None)


def test_a_priced_estimate_counts_tokens_and_cost():
    estimate = priced(
        "llm_test",
        plan="p",
        plan_why="w",
        calls=10,
        waves=2,
        prompt_chars=400,
        output_tokens=5,
        model="gpt-4o-mini",
        options={},
    )
    assert (estimate.input_tokens, estimate.output_tokens) == (1040, 50)
    assert estimate.cost is not None and estimate.batch_cost < estimate.cost


def test_nearest_neighbours_come_most_similar_first():
    import numpy as np

    from llm_ops._sets._pairs import nearest

    similarity = np.array([[0.1, 0.9, 0.5], [0.3, 0.2, 0.8]], dtype=np.float32)
    assert nearest(similarity, 2).tolist() == [[1, 2], [2, 0]]


def test_texts_are_embedded_as_unit_rows(waves):
    import numpy as np

    from llm_ops._sets._pairs import unit_vectors

    matrix, errors = unit_vectors(waves, ["red dress", "blue coat"], model="sim-embed")
    assert np.allclose(np.linalg.norm(matrix, axis=1), 1.0) and errors == [None, None]
