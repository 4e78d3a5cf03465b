"""Rollout lifecycle on a real server: cancellation stops the sandbox, capacity answers 429, results
survive a restart (they live in the store), and rollouts a crashed server left running become failed."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from capture_proxy.store import SessionRecord, TraceStore
from harbor_server.client import AsyncHarborSessionFactory, HarborClient, HarborSessionFactory
from harbor_server.errors import CapacityExceeded, RolloutNotFinished
from harbor_server.rollouts import RESTART_REASON
from tests.server.conftest import UNUSED_ENGINE, make_config, running_server
from tests.server.scripted import SERVER_KWARGS, SLEEP_S, SleeperHarness, StubbornHarness

pytestmark = pytest.mark.timeout(300)


def _sleep_processes() -> list[int]:
    """PIDs whose command line is exactly the sleeper harness's `sleep`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"sleep", str(SLEEP_S).encode()]:
            found.append(int(proc.name))
    return found


def _wait_for(predicate, timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _sleeper_factory(url: str, harness: str = "sleeper", **kwargs) -> HarborSessionFactory:
    return HarborSessionFactory(
        url,
        split="builtin",
        harness=harness,
        sandbox="local",
        llm_url=UNUSED_ENGINE,
        model="tiny",
        **kwargs,
    )


@pytest.fixture
def sleeper_server(tmp_path, sandbox_root):
    SleeperHarness.sandboxes.clear()
    config = make_config(tmp_path, max_concurrent_envs=2)
    with running_server(config, **SERVER_KWARGS) as server:
        yield server


def test_cancel_stops_the_sandbox(sleeper_server):
    before = set(_sleep_processes())
    with _sleeper_factory(sleeper_server.url) as factory:
        session = factory.create(0, episode_id="to-cancel")
        _wait_for(lambda: factory.client.rollout(session.rollout_id).phase == "agent", what="agent phase")
        _wait_for(lambda: set(_sleep_processes()) - before, what="the sleep process")
        [sandbox] = SleeperHarness.sandboxes
        assert sandbox.folder.exists()

        state = session.cancel()
        assert state.status == "cancelled" and state.phase == "done"
        assert state.result is not None and state.result.error == "cancelled by request"
        assert state.result.env_reward is None
        assert "sandbox_stop" in state.result.timings
        assert not sandbox.folder.exists()
        _wait_for(lambda: not (set(_sleep_processes()) - before), timeout_s=10, what="the sleep to die")
        # Cancelling again, and closing, leave it as it is.
        assert factory.client.cancel(session.rollout_id).status == "cancelled"
        session.close()
    assert httpx.get(sleeper_server.url + "/health").json()["live_rollouts"] == 0


def test_cancel_ends_a_rollout_whose_code_swallowed_the_first_cancel(sleeper_server):
    StubbornHarness.swallowed = 0
    with _sleeper_factory(sleeper_server.url, harness="stubborn") as factory:
        session = factory.create(0)
        _wait_for(lambda: factory.client.rollout(session.rollout_id).phase == "agent", what="agent phase")
        _wait_for(lambda: len(StubbornHarness.sandboxes) == 1, what="the harness to start")
        state = session.cancel()
        assert state.status == "cancelled"
        assert StubbornHarness.swallowed == 1  # the first cancel was lost; a repeat ended it


def test_capacity_answers_429_and_frees_up(sleeper_server):
    with _sleeper_factory(sleeper_server.url) as factory:
        first, second = factory.create(0), factory.create(1)
        with pytest.raises(CapacityExceeded, match="MAX_CONCURRENT_ENVS=2"):
            factory.create(2)
        response = httpx.post(
            sleeper_server.url + "/rollouts",
            json={
                "split": "builtin",
                "task_index": 0,
                "harness": "sleeper",
                "llm_url": UNUSED_ENGINE,
                "model": "m",
            },
        )
        assert response.status_code == 429 and "MAX_CONCURRENT_ENVS" in response.json()["detail"]
        with pytest.raises(RolloutNotFinished):
            factory.client.result(first.rollout_id)
        first.close()  # cancels, wherever its start-up is: a slot frees
        third = factory.create(2)
        second.close()
        third.close()
        assert {factory.client.rollout(s.rollout_id).status for s in (first, second, third)} == {"cancelled"}


async def test_async_client_long_poll_and_cancel(sleeper_server):
    async with AsyncHarborSessionFactory(
        sleeper_server.url,
        split="builtin",
        harness="sleeper",
        sandbox="local",
        llm_url=UNUSED_ENGINE,
        model="m",
    ) as factory:
        rows = [row async for row in factory.prompt_rows()]
        session = await factory.create(rows[1], seed=3, episode_id="async-1")
        with pytest.raises(TimeoutError, match="still"):
            await session.wait_for_completion(timeout_s=0.5)
        state = await factory.client.wait(session.rollout_id, 0.2)
        assert state.status == "running" and state.task_id == rows[1]["task_id"]
        await session.close()
        result = await session.wait_for_completion()
        assert result.status == "cancelled" and result.episode_id == "async-1" and result.seed == 3


def test_results_survive_a_restart(tmp_path, sandbox_root):
    config = make_config(tmp_path)
    with (
        running_server(config) as server,
        HarborSessionFactory(
            server.url,
            split="builtin",
            harness="oracle",
            sandbox="local",
            llm_url=UNUSED_ENGINE,
            model="tiny",
        ) as factory,
    ):
        session = factory.create(0, episode_id="persist")
        before = session.wait_for_completion()
        assert before.env_reward == 1.0
    restarted = make_config(tmp_path, port=config.port, capture_port=config.capture_port)
    with running_server(restarted) as server:
        client = HarborClient(server.url)
        try:
            after = client.result(session.rollout_id)
            assert after == before
            assert client.rollout(session.rollout_id).result == before
            assert client.wait(session.rollout_id, 5).status == "completed"
            assert client.trace(session.rollout_id).reward == 1.0
        finally:
            client.close()


def test_start_up_marks_rollouts_left_running_as_failed(tmp_path, sandbox_root):
    config = make_config(tmp_path)
    store = TraceStore(config.store_url)
    store.create_session(SessionRecord(
        session_id="orphan-1", api_key_hash="0" * 64, model="tiny", llm_url=UNUSED_ENGINE, harness="nop",
        sandbox="local", task_id="fix-pagination", created_at=time.time(),
    ))  # fmt: skip
    store.close()
    with running_server(config) as server:
        assert server.server.orphans_marked == 1
        state = httpx.get(f"{server.url}/rollouts/orphan-1").json()
        assert state["status"] == "failed" and state["phase"] == "done"
        assert state["result"]["error"] == RESTART_REASON
        assert state["result"]["env_reward"] is None


def test_a_second_server_on_the_store_leaves_the_first_ones_live_rollout_alone(tmp_path, sleeper_server):
    """Server B starts on A's store while A runs a rollout: B fails none of it; a restart of A (same
    server id) would, since only A can know that rollout is gone."""
    a_id = sleeper_server.server.config.server_id
    with _sleeper_factory(sleeper_server.url) as factory:
        session = factory.create(0, episode_id="a-live")
        _wait_for(lambda: factory.client.rollout(session.rollout_id).phase == "agent", what="agent phase")
        second = make_config(tmp_path)  # same store file, other ports: another server id
        assert second.server_id != a_id
        with running_server(second) as server_b:
            assert server_b.server.orphans_marked == 0
            client_b = HarborClient(server_b.url)
            assert client_b.info().server_id == second.server_id
            client_b.close()
            seen_by_b = httpx.get(f"{server_b.url}/rollouts/{session.rollout_id}").json()
            assert seen_by_b["status"] == "running"
        store = TraceStore(second.store_url)
        record = store.get_session(session.rollout_id)
        store.close()
        assert (record.status, record.owner) == ("running", a_id)
        assert factory.client.rollout(session.rollout_id).phase == "agent"
        assert session.cancel().status == "cancelled"


def test_agent_timeout_is_reported_and_the_task_still_verified(sleeper_server):
    with _sleeper_factory(sleeper_server.url, agent_timeout_sec=1) as factory:
        result = factory.create(0, episode_id="slow").wait_for_completion(timeout_s=120)
    assert result.status == "timed_out" and result.timed_out
    assert result.env_reward == 0.0  # the verifier ran on the untouched task
    assert result.timings["agent"] < 30


def test_engine_down_makes_the_rollout_unscoreable_not_zero(tmp_path, sandbox_root):
    """The agent's model call gets a 502 from the capture port: reward None, with the reason."""
    config = make_config(tmp_path)  # llm_url points at a port nothing listens on
    with (
        running_server(config, **SERVER_KWARGS) as server,
        HarborSessionFactory(
            server.url,
            split="builtin",
            harness="scripted",
            sandbox="local",
            model="tiny",
            llm_url=UNUSED_ENGINE,
        ) as factory,
    ):
        session = factory.create(0, episode_id="engine-down")
        verdict = session.verify()
        result = session.wait_for_completion()
    assert verdict.env_reward is None
    assert result.status == "failed"
    assert "harness 'scripted' failed" in result.error and "502" in result.error


def test_engine_failure_an_agent_ignores_still_makes_the_rollout_unscoreable(tmp_path, sandbox_root):
    """The verifier runs and scores 0, but the policy's work was cut short: reward None, never 0."""
    config = make_config(tmp_path)
    with (
        running_server(config, **SERVER_KWARGS) as server,
        HarborSessionFactory(
            server.url,
            split="builtin",
            harness="scripted",
            sandbox="local",
            model="tiny",
            llm_url=UNUSED_ENGINE,
        ) as factory,
    ):
        result = factory.create(0, episode_id="tolerant-1").wait_for_completion()
    assert result.env_reward is None and result.status == "failed"
    assert result.error.startswith("rollout unscoreable, a model call failed")
    assert "reward" in result.rewards  # what the verifier said is kept, for the record
