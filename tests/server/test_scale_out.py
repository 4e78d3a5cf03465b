"""Scale-out: several `harbor serve` processes on one trace store, one trainer spreading over them.

The factory tests run two real servers in this process (threads, one SQLite store): sessions spread
over the servers, and a server that is full (429) or unreachable is skipped for the next. The
PostgreSQL test runs two real `harbor serve` subprocesses on one fresh PostgreSQL schema, the real
embedded engine, and HarnessAsyncGRPOTrainer taking its steps on rollouts from both.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from capture_proxy.store import TraceStore
from capture_proxy.validation import fatal, validate_trace
from harbor_server.client import AsyncHarborSessionFactory, HarborSessionFactory, server_urls
from harbor_server.config import ServeConfig
from harbor_server.errors import CapacityExceeded, ServerUnreachable
from tests.postgres import scratch_schema_url
from tests.server.conftest import UNUSED_ENGINE, free_port, make_config, running_server
from tests.server.scripted import SERVER_KWARGS

pytestmark = pytest.mark.timeout(300)

REPO_ROOT = Path(__file__).resolve().parents[2]


QUICK_SPLIT = "quick"
QUICK_TASK = {
    "instruction.md": "Nothing to do.\n",
    "task.toml": '[task]\nname = "test/noop"\n\n[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 60.0\n',
    "environment/Dockerfile": "FROM harbor-rl/sandbox-base:bookworm\nWORKDIR /app\n",
    "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
}
"""A task whose verifier answers at once (the built-in ones run pytest: seconds each on a loaded machine)."""


def _factory(urls, harness: str = "nop", **kwargs) -> HarborSessionFactory:
    return HarborSessionFactory(
        urls,
        split=QUICK_SPLIT,
        harness=harness,
        sandbox="local",
        llm_url=UNUSED_ENGINE,
        model="tiny",
        **kwargs,
    )


def test_server_id_defaults_to_host_and_port_and_urls_parse():
    assert ServeConfig(port=8201).server_id == f"{socket.gethostname()}:8201"  # the same after a restart
    assert ServeConfig(server_id="trainer-node-3").server_id == "trainer-node-3"
    with pytest.raises(ValidationError, match="server_id"):
        ServeConfig(server_id="two words")
    assert server_urls(" http://a:8200/, http://b:8200") == ["http://a:8200", "http://b:8200"]
    assert server_urls(["http://a:8200", "http://b:8200,http://c:8200"])[2] == "http://c:8200"
    with pytest.raises(ValueError, match="no harbor server URL"):
        server_urls(" , ")


@pytest.fixture
def two_servers(tmp_path, sandbox_root):
    """Server A (room for one rollout) and server B, in this process, on one SQLite store."""
    for rel, content in QUICK_TASK.items():
        path = tmp_path / QUICK_SPLIT / "noop" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    datasets = [str(tmp_path / QUICK_SPLIT)]
    config_a = make_config(tmp_path, max_concurrent_envs=1, datasets=datasets)
    config_b = make_config(tmp_path, datasets=datasets)
    with running_server(config_a, **SERVER_KWARGS) as a, running_server(config_b, **SERVER_KWARGS) as b:
        yield a, b


def test_sessions_spread_over_the_servers_round_robin_on_ties(two_servers, tmp_path):
    a, b = two_servers
    with _factory(f"{a.url},{b.url}") as factory:  # one comma-separated string works like a list
        first, second = factory.create(0, episode_id="s0"), factory.create(0, episode_id="s1")
        assert (first.server_url, second.server_url) == (a.url, b.url)  # one live session each
        assert factory.live_sessions == {a.url: 1, b.url: 1}
        for session in (first, second):
            assert session.verify().env_reward is not None
        assert factory.live_sessions == {a.url: 0, b.url: 0}  # done: no longer counted
        third = factory.create(0, episode_id="s2")  # a tie again: the turn moves on to A
        assert third.server_url == a.url
        third.wait_for_completion()
    store = TraceStore(a.server.store_url)
    try:
        owners = {r.session_id: r.owner for r in store.list_sessions()}
    finally:
        store.close()
    ids = (a.server.config.server_id, b.server.config.server_id)
    assert owners == {first.rollout_id: ids[0], second.rollout_id: ids[1], third.rollout_id: ids[0]}


def test_a_full_or_unreachable_server_is_skipped_for_the_next(two_servers):
    a, b = two_servers
    dead = f"http://127.0.0.1:{free_port()}"
    with _factory(a.url, harness="sleeper") as only_a:
        sleeping = only_a.create(0, episode_id="fills-a")  # A's one slot
        try:
            with pytest.raises(CapacityExceeded, match="MAX_CONCURRENT_ENVS"):  # one server: its own error
                only_a.create(0, episode_id="refused")
            with _factory([dead, a.url, b.url]) as factory:
                session = factory.create(0, episode_id="lands-on-b")
                assert session.server_url == b.url
                session.close()
                # The unreachable server now goes last: the next session does not try it first.
                assert factory._spread.take(set()) != 0
            with _factory([dead, a.url]) as factory, pytest.raises(CapacityExceeded) as refused:
                factory.create(0, episode_id="nowhere")
            assert dead in refused.value.message and a.url in refused.value.message
            assert "unreachable" in refused.value.message and "MAX_CONCURRENT_ENVS" in refused.value.message
        finally:
            sleeping.close()
    other_dead = f"http://127.0.0.1:{free_port()}"
    with _factory([dead, other_dead]) as factory, pytest.raises(ServerUnreachable) as unreachable:
        factory.create(0, episode_id="no-server")
    assert "none of the 2 harbor servers" in unreachable.value.message
    assert dead in unreachable.value.message and other_dead in unreachable.value.message
    with pytest.raises(ValueError, match="more than once"):
        _factory([a.url, a.url + "/"])


async def test_async_factory_spreads_concurrent_creates(two_servers):
    a, b = two_servers
    factory = AsyncHarborSessionFactory(
        [a.url, b.url], split=QUICK_SPLIT, harness="nop", sandbox="local", llm_url=UNUSED_ENGINE, model="tiny"
    )
    try:
        sessions = await asyncio.gather(*(factory.create(0, episode_id=f"c{i}") for i in range(2)))
        assert sorted(s.server_url for s in sessions) == sorted([a.url, b.url])
        for session in sessions:
            await session.wait_for_completion()
        assert factory.live_sessions == {a.url: 0, b.url: 0}
    finally:
        await factory.aclose()


# -- two `harbor serve` processes on PostgreSQL, one trainer --------------------------------------


@pytest.fixture
def pg_store_url() -> Iterator[str]:
    """A fresh schema of the test database (through the connection's search_path), dropped afterwards."""
    with scratch_schema_url("scale_out") as url:
        yield url


@contextlib.contextmanager
def serve_processes(store_url: str, llm_url: str, server_ids: list[str], folder: Path) -> Iterator[list[str]]:
    """One `harbor serve` process per server id, started together; yields their URLs once each answers
    /health, stops them with SIGTERM (as an operator would)."""
    procs: list[tuple[str, subprocess.Popen, Path]] = []
    try:
        for server_id in server_ids:
            port, log = free_port(), folder / f"{server_id}.log"
            command = [
                sys.executable, "-c", "from harbor_rl.cli import app; app()", "serve",
                "--dataset", "env-tasks", "--llm-url", llm_url, "--model", "tiny", "--sandbox", "local",
                "--port", str(port), "--capture-port", str(free_port()), "--capture-host", "127.0.0.1",
                "--store", store_url, "--server-id", server_id, "--max-concurrent-envs", "4",
                "--skip-engine-check",
            ]  # fmt: skip
            env = os.environ | {"HARBOR_RUNS_DIR": str(folder / server_id)}
            with open(log, "wb") as out:
                # From the repository root, so `-c` imports this tree's code whatever the install points at.
                proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
            procs.append((f"http://127.0.0.1:{port}", proc, log))
        for url, proc, log in procs:
            _wait_healthy(url, proc, log)
        yield [url for url, _, _ in procs]
    finally:
        for _, proc, _ in procs:
            proc.send_signal(signal.SIGTERM)
        for _, proc, _ in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"harbor serve exited ({proc.returncode}):\n{log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"harbor serve did not answer {url}/health in {timeout_s} s:\n{log.read_text()}"
            )
        time.sleep(0.1)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from engine.tiny_model import build_tiny_model

    return build_tiny_model(seed=0, cache_dir=tmp_path_factory.mktemp("harbor-cache"))


@pytest.mark.postgres
def test_two_serve_processes_on_one_postgres_store_behind_one_trainer(pg_store_url, tiny_dir, tmp_path):
    import torch

    from engine.tiny_model import load_model_and_tokenizer
    from tests.engine.conftest import engine_app, serve
    from trainer.config import AsyncGRPOConfig
    from trainer.grpo import HarnessAsyncGRPOTrainer

    torch.set_num_threads(1)
    with (
        serve(engine_app(tiny_dir)) as engine_url,
        serve_processes(pg_store_url, engine_url + "/v1", ["scale-a", "scale-b"], tmp_path) as urls,
    ):
        factory = functools.partial(
            HarborSessionFactory, urls, split="env-tasks", harness="env-factory",
            sandbox="local", llm_url=engine_url + "/v1", model="tiny", agent_timeout_sec=120, capacity_wait_s=60,
        )  # fmt: skip
        with factory() as lister:
            rows = [r for r in lister.prompt_rows() if r["task_id"].startswith("echo")]
        config = AsyncGRPOConfig(
            output_dir=str(tmp_path / "run"), report_to="jsonl", max_steps=2, num_generations=2,
            per_device_train_batch_size=2, max_concurrent_rollouts=2, max_completion_length=16,
            learning_rate=1e-3, rollout_timeout_s=120, vllm_server_base_url=None,
        )  # fmt: skip
        model, tokenizer = load_model_and_tokenizer(tiny_dir)
        trainer = HarnessAsyncGRPOTrainer(
            model, factory, config, train_dataset=rows, processing_class=tokenizer
        )
        history = trainer.train()

    assert [h["step"] for h in history] == [1, 2]
    assert all(h["rollout/failed"] == 0 for h in history)
    store = TraceStore(pg_store_url)
    try:
        sessions = store.list_sessions(purpose="train")
        completed = [s for s in sessions if s.status == "completed"]
        # Both servers ran rollouts into the one store, each under its own name.
        assert Counter(s.owner for s in completed).keys() == {"scale-a", "scale-b"}
        assert len(completed) >= 4  # two steps of one group of two
        for record in completed:
            trace = record.trace(store.get_turns(record.session_id))
            assert trace.turns and not fatal(validate_trace(trace))
            assert all(t.metadata.policy_version is not None for t in trace.turns)
        # Whatever the trainer stopped mid-flight was cancelled cleanly, none left running.
        assert {s.status for s in sessions} <= {"completed", "cancelled"}
    finally:
        store.close()
