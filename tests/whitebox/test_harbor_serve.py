"""Each built-in white-box environment through a real `harbor serve` (HTTP API, capture port, SQLite
store, local sandbox, the task's verifier) with the real embedded engine: the env-factory harness runs
the loop against the rollout's capture session, and the trace it leaves is valid and trains only the
model's tokens (tool results, which reach the model inside later prompts, are 0).

The engine serves real model folders: the random tiny model, and "scripted" copies of it whose
weights make greedy decoding emit a fixed hermes tool call (tests/engine/scripted_model.py). A tiny
random model cannot write a tool call with arguments, so the scripted ones call tools without any:
the environment's method raises TypeError, which must come back as the tool message, counted as a
failure, for as many rounds as the task's loop allows.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harbor_server import HarborSessionFactory
from harbor_server.config import ServeConfig
from harbor_server.embedded import free_port, running_server
from tasks.datasets import ENV_TASKS_DIR
from tests.engine.scripted_model import build_scripted_model
from tests.whitebox.conftest import assert_masks_train_only_model_tokens, serve_engine

ENV_SPLIT = "env-tasks"


@pytest.fixture(scope="module")
def engines(tiny_dir, tmp_path_factory):
    """URLs of engines that call `echo`, `guess`, `submit` without arguments, and the random model."""
    urls = {}
    stack = []
    for tool in ("echo", "guess", "submit"):
        folder = build_scripted_model(
            tiny_dir,
            tmp_path_factory.mktemp(f"scripted-{tool}"),
            text=f'Sure.<tool_call>{{"name": "{tool}"}}</tool_call>',
        )
        stack.append(serve_engine(folder))
        urls[tool] = stack[-1].__enter__() + "/v1"
    stack.append(serve_engine(tiny_dir))
    urls["random"] = stack[-1].__enter__() + "/v1"
    yield urls
    for server in reversed(stack):
        server.__exit__(None, None, None)


BROKEN_SPLIT = "broken-envs"


def broken_dataset(root: Path) -> Path:
    """A copy of the echo task whose [metadata.env_factory] names a class that does not exist."""
    folder = root / BROKEN_SPLIT
    shutil.copytree(ENV_TASKS_DIR / "echo-hello-world", folder / "missing-env")
    toml = folder / "missing-env" / "task.toml"
    toml.write_text(toml.read_text().replace("environments.echo:EchoEnv", "environments.echo:NoSuchEnv"))
    return folder


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    config = ServeConfig(
        datasets=["env-tasks", "builtin", str(broken_dataset(tmp_path))],
        model="tiny",
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


def rollout(server, llm_url: str, split: str, task: str, sandbox: str = "local", **kwargs):
    factory = HarborSessionFactory(
        server.url,
        split=split,
        harness="env-factory",
        sandbox=sandbox,
        llm_url=llm_url,
        model="tiny",
        agent_timeout_sec=120,
        **kwargs,
    )
    session = factory.create(task, seed=7, episode_id="g0-0")
    try:
        result = session.wait_for_completion(timeout_s=180)
        trace = session.fetch_training_trace() if result.status == "completed" else None
        return result, trace
    finally:
        session.close()
        factory.close()


def check_trace(trace, tool_errors: int) -> None:
    turns = [t.model_dump(mode="json") for t in trace.turns]
    assert_masks_train_only_model_tokens({"turns": turns})
    assert trace.harness == "env-factory"
    # Every call after the first carries the previous tool results in its (masked) prompt.
    for turn in turns[1:]:
        assert turn["request"]["messages"][-1]["role"] == "tool"
        assert turn["request"]["messages"][-1]["content"].startswith("Error: TypeError")
    assert len(turns) == tool_errors


def test_echo_environment_through_harbor_serve(server, engines):
    result, trace = rollout(server, engines["echo"], ENV_SPLIT, "echo-hello-world")
    assert result.status == "completed", result.error
    # The task allows 3 rounds; every echo() without its argument raised.
    assert result.tool_calls_by_name == {"echo": 3} and result.tool_failures == 3
    assert result.tool_failures_by_name == {"echo": 3}
    assert result.env_reward == 0.0 and result.rewards == {"reward": 0.0, "echo_reward": 0.0}
    check_trace(trace, tool_errors=3)
    first = trace.turns[0].request
    assert first["tools"][0]["function"]["name"] == "echo"
    assert first["messages"][0]["content"].startswith("Use the echo tool")


def test_the_sandbox_of_a_white_box_rollout_has_no_route_to_the_capture_proxy(server, engines, monkeypatch):
    """The loop calls the model from the server's process, so its sandbox (where a coding environment's
    tools run model-written commands) is given no way to the proxy, and a local one starts no
    forwarder for its commands."""
    from sandboxes.local import LocalBackend

    specs = []
    start = LocalBackend.start

    async def recording(self, spec):
        specs.append(spec)
        return await start(self, spec)

    monkeypatch.setattr(LocalBackend, "start", recording)
    result, _ = rollout(server, engines["echo"], ENV_SPLIT, "echo-hello-world")
    assert result.status == "completed", result.error
    assert [spec.proxy_port for spec in specs] == [None]


def test_word_game_through_harbor_serve(server, engines):
    result, trace = rollout(server, engines["guess"], ENV_SPLIT, "wordle-crane")
    assert result.status == "completed", result.error
    assert result.tool_calls_by_name == {"guess": 6} and result.tool_failures == 6
    # No valid guess: no partial credit and no invalid-move penalty (the method was never entered).
    assert result.env_reward == 0.0
    assert result.rewards == {"reward": 0.0, "wordle_win": 0.0, "wordle_partial": 0.0, "wordle_invalid": 0.0}
    check_trace(trace, tool_errors=6)


def test_coding_environment_on_a_harbor_task_through_harbor_serve(server, engines):
    """No env spec in task.toml: the coding environment works on the task's own sandbox; submit()
    ends the episode and the task's real verifier scores the untouched work 0."""
    result, trace = rollout(server, engines["submit"], "builtin", "wordcount-cli")
    assert result.status == "completed", result.error
    assert result.tool_calls_by_name == {"submit": 1} and result.tool_failures == 0
    assert result.tool_failures_by_name == {}
    assert result.env_reward == 0.0
    assert "stop: env_done" in result.agent_log_tail
    assert len(trace.turns) == 1  # one call is a whole white-box episode here, not a degenerate capture
    assert_masks_train_only_model_tokens({"turns": [t.model_dump(mode="json") for t in trace.turns]})
    assert [t["function"]["name"] for t in trace.turns[0].request["tools"]] == [
        "bash",
        "read_file",
        "write_file",
        "submit",
    ]


@pytest.mark.docker
def test_coding_environment_in_a_docker_sandbox_through_harbor_serve(
    server, engines, base_image, no_leftover_containers
):
    """The same episode with the task in a real Docker container: the loop runs on the host and
    reaches the capture port locally, while the tools and the verifier act in the container."""
    result, trace = rollout(server, engines["submit"], "builtin", "wordcount-cli", sandbox="docker")
    assert result.status == "completed", result.error
    assert result.sandbox == "docker" and result.tool_calls_by_name == {"submit": 1}
    assert result.env_reward == 0.0 and len(trace.turns) == 1


def test_random_tiny_model_through_harbor_serve(server, engines):
    """The real random tiny model sampling at temperature 1: whatever it writes, the capture is valid."""
    result, trace = rollout(server, engines["random"], ENV_SPLIT, "echo-hi", sampling={"max_tokens": 48})
    assert result.status == "completed", result.error
    # The shaped reward (computed from the completions) scores every played episode, in [0, 1].
    assert set(result.rewards) == {"reward", "echo_shaped_reward"}
    assert 0.0 <= result.env_reward <= 1.0
    assert len(trace.turns) >= 1
    assert_masks_train_only_model_tokens({"turns": [t.model_dump(mode="json") for t in trace.turns]})
    for turn in trace.turns:
        assert 0 < len(turn.completion_token_ids) <= 48


def test_an_unreachable_engine_makes_the_rollout_failed_and_unscoreable(server):
    result, trace = rollout(server, "http://127.0.0.1:9/v1", ENV_SPLIT, "echo-hello-world")
    assert result.status == "failed" and result.env_reward is None
    assert "harness 'env-factory' failed: model call 1 failed" in result.error


def test_a_task_naming_a_missing_environment_fails_with_a_clear_error(server, engines):
    result, _ = rollout(server, engines["echo"], BROKEN_SPLIT, "missing-env")
    assert result.status == "failed" and result.env_reward is None
    assert "has no 'NoSuchEnv'" in result.error


def test_a_failed_rollouts_trace_is_refused_not_a_list_of_empty_turns(server):
    """Against a dead engine the capture holds only transport failures: fetching it for training says
    the rollout failed (409 with a finding) instead of handing back turns without token ids."""
    from harbor_server import TraceNotTrainable

    with HarborSessionFactory(
        server.url, split=ENV_SPLIT, harness="env-factory", sandbox="local", llm_url="http://127.0.0.1:9/v1",
        model="tiny", agent_timeout_sec=120,
    ) as factory:  # fmt: skip
        session = factory.create("echo-hello-world", episode_id="dead-engine")
        assert session.verify().metrics["status"] == "failed"
        with pytest.raises(
            TraceNotTrainable, match="failed, so its capture is not a trainable trace"
        ) as caught:
            session.fetch_training_trace()
        assert caught.value.findings[0]["code"] == "rollout_failed"
        session.close()
