"""The env-factory harness with an OpenEnv session factory, on its own: given in Python or named in
task metadata, against a real capture proxy session (vLLM imitation upstream) and a local sandbox. The
session's verify() reward lands in /logs/agent/env_reward.json; settings that belong to the other kind
of environment, a missing OpenEnv and a rollout past its time are each answered by name."""

from __future__ import annotations

import json
import sys
import time

import pytest
from openenv.core.harness import HarnessRunLimits

from harnesses import AgentRun
from harnesses.env_factory import EnvFactoryHarness
from harnesses.env_factory.harness import ENV_REWARD_PATH, TRANSCRIPT_PATH
from harnesses.env_factory.openenv_sessions import EnvironmentSessionFactory
from tasks import load_task
from tasks.datasets import ENV_TASKS_DIR
from tasks.environments import echo_reward


@pytest.fixture
async def sandbox(local_backend):
    task = load_task(ENV_TASKS_DIR / "echo-hello-world")
    box = await local_backend.start(task.sandbox_spec("openenv-harness", proxy_port=9))
    await box.exec(["mkdir", "-p", "/logs/agent"], user="root")
    try:
        yield box
    finally:
        await box.stop()


def agent_run(session, timeout_s: float = 60, **extra) -> AgentRun:
    return AgentRun(
        instruction="Say the phrase.",
        base_url=session.base_url,
        api_key=session.api_key,
        model="imitation-model",
        timeout_s=timeout_s,
        extra={"seed": 3, "episode_id": "g1-2", **extra},
    )


async def test_a_session_factory_given_in_python_is_driven_by_openenvs_adapter(proxy, imitation, sandbox):
    session = proxy.session(imitation.url, "imitation-model")
    factory = EnvironmentSessionFactory("tasks.environments.echo:EchoEnv", reward_funcs=[echo_reward])
    harness = EnvFactoryHarness(factory, row={"target": "echo hello"}, limits=HarnessRunLimits(max_turns=2))
    outcome = await harness.run(sandbox, agent_run(session))
    assert outcome.error is None and outcome.exit_code == 0
    assert outcome.tool_calls_by_name == {"echo": 1} and outcome.tool_failures == 0
    assert json.loads(await sandbox.download_file(ENV_REWARD_PATH)) == {"reward": 1.0, "echo_reward": 1.0}
    transcript = json.loads(await sandbox.download_file(TRANSCRIPT_PATH))
    assert transcript["session_factory"].endswith(":EnvironmentSessionFactory")
    assert [m["role"] for m in transcript["messages"]] == ["user", "assistant", "tool"]
    assert transcript["verify"]["artifacts"]["environment"] == "tasks.environments.echo:EchoEnv"
    assert len(proxy.trace(session.session_id)["turns"]) == 1


def scores_nothing(environments, **kwargs):
    return [None for _ in environments]


async def test_an_unscored_verify_writes_no_reward_file(proxy, imitation, sandbox):
    session = proxy.session(imitation.url, "imitation-model")
    harness = EnvFactoryHarness(
        EnvironmentSessionFactory("tasks.environments.echo:EchoEnv", reward_funcs=[scores_nothing])
    )
    outcome = await harness.run(sandbox, agent_run(session))
    assert outcome.error is None and "env reward: None" in outcome.log_tail
    with pytest.raises(FileNotFoundError):
        await sandbox.download_file(ENV_REWARD_PATH)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"environment": "tasks.environments.echo:EchoEnv", "session_factory": "x:Y"},
            "names both environment and session_factory",
        ),
        (
            {"environment": "tasks.environments.echo:EchoEnv", "limits": {"max_turns": 2}},
            "limits are OpenEnv's",
        ),
        (
            {"session_factory": "tests.whitebox.test_openenv_serve:ECHO_SESSIONS", "reward_funcs": ["a:b"]},
            "['reward_funcs'] are for TRL-style classes",
        ),
        (
            {"session_factory": "tests.whitebox.test_openenv_serve:ECHO_SESSIONS", "limits": {"turns": 2}},
            "limits has unknown keys ['turns']",
        ),
        (
            {"session_factory": "tasks.environments.echo:EchoEnv"},
            "is the class EchoEnv, not a subclass of OpenEnv's ResourceSessionFactory",
        ),
        ({"session_factory": "tasks.environments.echo:NoSuchFactory"}, "has no 'NoSuchFactory'"),
    ],
)
async def test_settings_for_the_other_kind_of_environment_are_refused_by_name(
    proxy, imitation, sandbox, spec, message
):
    session = proxy.session(imitation.url, "imitation-model")
    outcome = await EnvFactoryHarness().run(sandbox, agent_run(session, task_metadata={"env_factory": spec}))
    assert outcome.error is not None and message in outcome.error


async def test_without_openenv_a_session_factory_names_the_extra_to_install(
    proxy, imitation, sandbox, monkeypatch
):
    monkeypatch.setitem(sys.modules, "openenv.core.harness", None)  # as if OpenEnv were not installed
    monkeypatch.delitem(sys.modules, "harnesses.env_factory.openenv_runner")
    monkeypatch.delattr("harnesses.env_factory.openenv_runner")
    session = proxy.session(imitation.url, "imitation-model")
    spec = {"session_factory": "tasks.environments.echo:EchoEnv"}
    outcome = await EnvFactoryHarness().run(sandbox, agent_run(session, task_metadata={"env_factory": spec}))
    assert "needs OpenEnv (openenv==0.10.0)" in outcome.error
    assert "pip install 'harbor-rl[openenv]'" in outcome.error


async def test_a_rollout_past_its_time_is_timed_out_and_stops_its_model_calls(proxy, imitation, sandbox):
    imitation.configure(latency_s=3.0)
    session = proxy.session(imitation.url, "imitation-model")
    harness = EnvFactoryHarness(EnvironmentSessionFactory("tasks.environments.echo:EchoEnv"))
    started = time.monotonic()
    outcome = await harness.run(sandbox, agent_run(session, timeout_s=1.0))
    assert outcome.timed_out and outcome.error is None
    assert time.monotonic() - started < 4.0
