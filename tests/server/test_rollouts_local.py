"""Rollouts through a real `harbor serve` on the `local` sandbox: oracle scores 1.0, nop 0.0, and
the result is the same through the client, the REST API and after a server restart."""

from __future__ import annotations

import pytest

from harbor_server.client import HarborSessionFactory
from tests.server.conftest import UNUSED_ENGINE

pytestmark = pytest.mark.timeout(300)


def _factory(server, harness: str) -> HarborSessionFactory:
    return HarborSessionFactory(
        server.url, split="builtin", harness=harness, sandbox="local", llm_url=UNUSED_ENGINE, model="tiny"
    )


@pytest.mark.parametrize(("harness", "expected"), [("oracle", 1.0), ("nop", 0.0)])
def test_sanity_harness_through_server(server, harness, expected):
    with _factory(server, harness) as factory:
        rows = list(factory.prompt_rows())
        assert [r["task_index"] for r in rows] == list(range(len(rows)))
        session = factory.create(rows[0], seed=7, episode_id=f"{harness}-0")
        verdict = session.verify()
        result = session.wait_for_completion()
        assert verdict.env_reward == expected, result
        assert result.status == "completed"
        assert result.task_id == rows[0]["task_id"]
        assert result.episode_id == f"{harness}-0" and result.seed == 7
        assert result.rewards.get("reward") == expected
        assert set(result.timings) >= {"sandbox_start", "agent", "verifier", "sandbox_stop", "total"}
        trace = session.fetch_training_trace()
        assert trace.session_id == session.rollout_id
        assert trace.turns == []  # oracle and nop never call the model
        assert trace.reward == expected
        session.close()  # done: stays completed
        assert factory.client.rollout(session.rollout_id).status == "completed"
        [listed] = factory.client.rollouts(status="completed")
        assert listed.rollout_id == session.rollout_id and listed.result == result
        assert factory.client.rollouts(status="running") == []
