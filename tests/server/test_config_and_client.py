"""ServeConfig validation (flags and MAX_CONCURRENT_ENVS) and the client's own logic, without a server."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from capture_proxy.models import SamplingParams
from harbor_server.client import HarborClient, HarborSessionFactory, task_selector, verify_result
from harbor_server.config import ServeConfig
from harbor_server.embedded import free_port
from harbor_server.errors import ServerUnreachable
from harbor_server.models import RolloutRequest, RolloutResult


def test_max_concurrent_envs_from_env(monkeypatch):
    monkeypatch.setenv("MAX_CONCURRENT_ENVS", "7")
    assert ServeConfig().max_concurrent_envs == 7
    assert ServeConfig(max_concurrent_envs=3).max_concurrent_envs == 3  # the flag wins
    monkeypatch.setenv("MAX_CONCURRENT_ENVS", "lots")
    with pytest.raises(ValidationError, match="MAX_CONCURRENT_ENVS='lots' is not an integer"):
        ServeConfig()
    monkeypatch.setenv("MAX_CONCURRENT_ENVS", "0")
    with pytest.raises(ValidationError, match="must be at least 1"):
        ServeConfig()


def test_config_checks_what_a_user_can_get_wrong():
    assert ServeConfig(llm_url="http://127.0.0.1:8000").llm_url == "http://127.0.0.1:8000/v1"
    with pytest.raises(ValidationError, match="must start with http"):
        ServeConfig(llm_url="localhost:8000")
    with pytest.raises(ValidationError, match="--expose direct needs --public-url"):
        ServeConfig(expose="direct")
    with pytest.raises(ValidationError, match="at least one --dataset"):
        ServeConfig(datasets=[])
    with pytest.raises(ValidationError, match="sandbox"):
        ServeConfig(sandbox="vm")
    with pytest.raises(ValidationError, match="unknown_flag"):
        ServeConfig(unknown_flag=1)


def test_task_selector_accepts_index_id_and_prompt_rows():
    assert task_selector(3) == {"task_index": 3}
    assert task_selector("fix-pagination") == {"task_id": "fix-pagination"}
    assert task_selector({"task_id": "a", "task_index": 0, "prompt": []}) == {"task_id": "a"}
    assert task_selector({"task_index": 2}) == {"task_index": 2}
    with pytest.raises(TypeError, match="not a bool"):
        task_selector(True)
    with pytest.raises(ValueError, match="needs task_id or task_index"):
        task_selector({"prompt": []})


def test_factory_builds_requests_with_its_sampling_and_the_seed():
    factory = HarborSessionFactory(
        "http://127.0.0.1:1", split="builtin", harness="oracle", llm_url="http://e/v1", model="m",
        sampling={"temperature": 0.7}, agent_step_limit=5,
    )  # fmt: skip
    try:
        request = factory.config.request(1, seed=42, episode_id="g0-1")
    finally:
        factory.close()
    assert isinstance(request, RolloutRequest)
    assert request.sampling == SamplingParams(temperature=0.7, seed=42)
    assert (request.task_index, request.agent_step_limit, request.episode_id) == (1, 5, "g0-1")


def test_verify_result_keeps_none_as_unscoreable():
    result = RolloutResult(
        rollout_id="r", status="failed", tool_calls_by_name={"bash": 2, "edit": 1}, tool_failures=1
    )
    verdict = verify_result(result)
    assert verdict.env_reward is None
    assert verdict.metrics["tool_call_count"] == 3 and verdict.metrics["tool_failure_count"] == 1


def test_unreachable_server_is_a_clear_error():
    client = HarborClient(f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(ServerUnreachable, match="is unreachable"):
            client.health()
    finally:
        client.close()
