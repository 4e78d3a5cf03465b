"""LLMJudge against the real embedded engine, through the real `openai` client. The engine serves a
"scripted" copy of the tiny model (tests/engine/scripted_model.py) whose greedy reply is "Score: 8"."""

from __future__ import annotations

import openai
import pytest

from tasks.rubrics import JudgeError, LLMJudge, RubricConfigError, WeightedSum
from tests.engine.scripted_model import build_scripted_model
from tests.rubrics.test_rubrics import Fixed
from tests.whitebox.conftest import serve_engine

TEMPLATE = "Question: {observation}\nAnswer: {action}\nRate the answer from 0 to 10."


@pytest.fixture(scope="module")
def judge_url(tiny_dir, tmp_path_factory):
    folder = build_scripted_model(tiny_dir, tmp_path_factory.mktemp("judge"), text="Score: 8")
    with serve_engine(folder) as url:
        yield url + "/v1"


@pytest.fixture
async def client(judge_url):
    client = openai.AsyncOpenAI(base_url=judge_url, api_key="unused", max_retries=0)
    yield client
    await client.close()


async def test_llm_judge_scores_through_an_openai_compatible_endpoint(client):
    judge = LLMJudge(client, model="tiny", prompt_template=TEMPLATE, max_score=10)
    assert judge.is_async
    assert await judge("Paris", "What is the capital of France?") == pytest.approx(0.8)
    assert judge.last_reply == "Score: 8" and judge.last_score == pytest.approx(0.8)
    assert (
        judge.render("Paris", "Capital?")[-1]["content"]
        == "Question: Capital?\nAnswer: Paris\nRate the answer from 0 to 10."
    )


async def test_llm_judge_inside_a_container_makes_it_async(client):
    rubric = WeightedSum(
        [LLMJudge(client, model="tiny", prompt_template=TEMPLATE), Fixed(1.0)], weights=[0.5, 0.5]
    )
    assert rubric.is_async
    assert await rubric("Paris", "Capital?") == pytest.approx(0.9)


def test_llm_judge_refuses_unreadable_replies_and_bad_configuration():
    judge = LLMJudge(
        openai.AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1"),
        model="m",
        prompt_template=TEMPLATE,
    )
    with pytest.raises(JudgeError, match="no score"):
        judge.parse("I cannot rate this.")
    assert judge.parse("12 out of 10") == 1.0  # clipped to [0, 1]
    with pytest.raises(RubricConfigError, match="must contain \\{action\\}"):
        LLMJudge(judge.client, model="m", prompt_template="Rate {observation}")
