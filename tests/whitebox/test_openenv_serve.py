"""An OpenEnv environment, deployed as OpenEnv deploys one, trained on through a real `harbor serve`.

`SayEnv` is an OpenEnv `Environment` (reset/step/state, typed Action and Observation, its reward born
in step()), served by OpenEnv's own HTTP server (`create_app`) and reached with OpenEnv's
`GenericEnvClient`; `SaySessionFactory` is a `ResourceSessionFactory` that wraps each client in
OpenEnv's `StepEnvSessionAdapter`. A task folder written here names it in task.toml, and the env-factory
harness drives its sessions with OpenEnv's `MCPHarnessAdapter` against the rollout's capture session
(vLLM imitation upstream): the trace is valid and trains only the model's tokens, and the reward is
what the session's `verify()` returned. Our own EchoEnv goes the same way as an
`EnvironmentSessionFactory` named in task.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from openenv.core import GenericEnvClient
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import Tool
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.harness import ResourceSessionFactory, StepEnvSessionAdapter

from engine.imitation import create_imitation_app
from engine.in_process import serve_in_thread
from harbor_server import HarborSessionFactory
from harbor_server.config import ServeConfig
from harbor_server.embedded import free_port, running_server
from harnesses.env_factory.openenv_sessions import EnvironmentSessionFactory
from tasks.datasets import ENV_TASKS_DIR
from tasks.environments import echo_reward
from tests.whitebox.conftest import assert_masks_train_only_model_tokens

SPLIT = "openenv-tasks"


class SayAction(Action):
    message: str


class SayObservation(Observation):
    target: str = ""
    heard: str = ""


class SayEnv(Environment):
    """Say the target: reward 1 and done when said exactly, else 0."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.target = ""
        self._state = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> SayObservation:
        self.target = kwargs.get("target", "hello")
        self._state = State(episode_id=episode_id, step_count=0)
        return SayObservation(target=self.target)

    def step(self, action: SayAction, timeout_s: float | None = None, **kwargs: Any) -> SayObservation:
        self._state.step_count += 1
        said = action.message == self.target
        return SayObservation(target=self.target, heard=action.message, reward=float(said), done=said)

    @property
    def state(self) -> State:
        return self._state


SAY_TOOL = Tool(
    name="say",
    description="Say a message to the environment.",
    input_schema={
        "type": "object",
        "properties": {"message": {"type": "string", "description": "What to say"}},
        "required": ["message"],
    },
)


class SaySessionFactory(ResourceSessionFactory[StepEnvSessionAdapter]):
    """One OpenEnv client session per rollout; the task row says where the environment is served."""

    def create(
        self, task: Any, seed: int | None = None, episode_id: str | None = None
    ) -> StepEnvSessionAdapter:
        return StepEnvSessionAdapter(
            GenericEnvClient(base_url=task["env_url"]),
            task=task,
            seed=seed,
            episode_id=episode_id,
            tool_specs=[SAY_TOOL],
            action_builder=lambda name, args: {"message": args["message"]},
            initial_messages_builder=lambda result, task: [
                {
                    "role": "user",
                    "content": f"{task['instruction']}\n\nTarget: {result.observation['target']}",
                }
            ],
            reset_kwargs={"target": task["target"]},
        )


ECHO_SESSIONS = EnvironmentSessionFactory("tasks.environments.echo:EchoEnv", reward_funcs=[echo_reward])
"""Our EchoEnv as an OpenEnv session factory, named in task.toml as a module-level instance."""


def write_task(root: Path, name: str, env_factory_toml: str) -> None:
    """The echo task's folder (instruction, sandbox, test.sh forwarding env_reward.json) with our
    [metadata.env_factory] table."""
    folder = root / name
    shutil.copytree(ENV_TASKS_DIR / "echo-hello-world", folder)
    toml = folder / "task.toml"
    text = toml.read_text()
    start = text.index("[metadata.env_factory]")
    end = text.index("[verifier]")
    toml.write_text(text[:start] + "[metadata.env_factory]\n" + env_factory_toml + "\n\n" + text[end:])


@pytest.fixture(scope="module")
def say_env_url():
    with serve_in_thread(
        create_app(SayEnv, SayAction, SayObservation, env_name="say", max_concurrent_envs=4)
    ) as url:
        yield url


@pytest.fixture
def server(tmp_path, monkeypatch, say_env_url):
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    root = tmp_path / SPLIT
    module = __name__
    write_task(
        root,
        "say-openenv",
        f'session_factory = "{module}:SaySessionFactory"\n'
        f'row = {{ env_url = "{say_env_url}", target = "echo hello" }}\n'
        "limits = { max_turns = 3, sampling = { max_tokens = 128 } }",
    )
    # `environment` naming a ResourceSessionFactory is detected as one.
    write_task(
        root,
        "echo-openenv",
        f'environment = "{module}:ECHO_SESSIONS"\nrow = {{ target = "echo hello" }}\nlimits = {{ max_turns = 2 }}',
    )
    write_task(
        root,
        "say-with-loop",
        f'session_factory = "{module}:SaySessionFactory"\nloop = {{ max_tool_calling_iterations = 2 }}',
    )
    config = ServeConfig(
        datasets=[str(root)],
        model="imitation-model",
        port=free_port(),
        capture_port=free_port(),
        capture_host="127.0.0.1",
        sandbox="local",
        store_url=f"sqlite:///{tmp_path}/traces.db",
        check_engine=False,
        max_concurrent_envs=4,
    )
    with running_server(config) as thread:
        yield thread


@pytest.fixture
def imitation_url():
    with serve_in_thread(create_imitation_app()) as url:
        yield url


def rollout(server, llm_url: str, task: str):
    factory = HarborSessionFactory(
        server.url,
        split=SPLIT,
        harness="env-factory",
        sandbox="local",
        llm_url=llm_url + "/v1",
        model="imitation-model",
        agent_timeout_sec=120,
    )
    session = factory.create(task, seed=7, episode_id="g0-0")
    try:
        result = session.wait_for_completion(timeout_s=180)
        trace = session.fetch_training_trace() if result.status == "completed" else None
        return result, trace
    finally:
        session.close()
        factory.close()


def test_an_openenv_session_factory_runs_against_harbor_serve(server, imitation_url):
    result, trace = rollout(server, imitation_url, "say-openenv")
    assert result.status == "completed", result.error
    # The imitation says "echo hello": SayEnv's step() rewards it 1 and ends the episode, and the
    # default verify() of StepEnvSessionAdapter forwards that reward (its step_count is a metric).
    assert result.env_reward == 1.0 and result.rewards == {"reward": 1.0, "step_count": 1.0}
    assert result.tool_calls_by_name == {"say": 1} and result.tool_failures == 0
    assert "OpenEnv MCPHarnessAdapter; done: True; model calls: 1" in result.agent_log_tail
    assert trace.harness == "env-factory" and len(trace.turns) == 1
    assert_masks_train_only_model_tokens({"turns": [t.model_dump(mode="json") for t in trace.turns]})
    request = trace.turns[0].request
    say = {"name": "say", "description": SAY_TOOL.description, "parameters": SAY_TOOL.input_schema}
    assert request["tools"] == [{"type": "function", "function": say}]
    assert request["messages"][0]["content"].endswith("Target: echo hello")
    assert request["max_tokens"] == 128  # the task's OpenEnv sampling reached the engine


def test_a_session_whose_tool_raises_fails_the_rollout_unscoreable(server, imitation_url):
    """OpenEnv's adapter lets a raising call_tool end the rollout; here the action builder raises on a
    call without its argument, so the rollout is the harness's failure, never a 0."""
    httpx.post(f"{imitation_url}/imitation/settings", json={"tool_arguments": "{}"}).raise_for_status()
    result, _ = rollout(server, imitation_url, "say-openenv")
    assert result.status == "failed" and result.env_reward is None
    assert "OpenEnv session factory" in result.error and "SaySessionFactory failed: KeyError" in result.error


def test_our_environment_as_an_openenv_session_factory_under_harbor_serve(server, imitation_url):
    result, trace = rollout(server, imitation_url, "echo-openenv")
    assert result.status == "completed", result.error
    assert result.env_reward == 1.0 and result.rewards == {"reward": 1.0, "echo_reward": 1.0}
    assert result.tool_calls_by_name == {"echo": 1} and len(trace.turns) == 1
    assert "OpenEnv MCPHarnessAdapter; done: True" in result.agent_log_tail
    assert trace.turns[0].request["messages"][0]["content"].startswith("Use the echo tool")
    assert_masks_train_only_model_tokens({"turns": [t.model_dump(mode="json") for t in trace.turns]})


def test_loop_settings_for_a_session_factory_are_refused_by_name(server, imitation_url):
    result, _ = rollout(server, imitation_url, "say-with-loop")
    assert result.status == "failed" and result.env_reward is None
    assert "['loop'] are for TRL-style classes" in result.error
