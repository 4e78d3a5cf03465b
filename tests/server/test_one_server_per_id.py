"""One live `harbor serve` per port and per server id, with real processes.

A first server (SQLite store, `local` sandboxes) runs rollouts of the `caller` test harness, whose
agents call the engine (the vLLM imitation, slowed) from inside their sandboxes, so they are in flight
for seconds. A second `harbor serve` on its busy port, on its busy capture port, or with its server id
on the same store must exit 2 with one line naming the flag to change, within seconds, and touch
nothing: the first server's rollouts all complete. A server that stops beating its lock (SIGSTOP) is
taken over once the lock is stale, its rollouts swept as after a crash, and it stops itself when it
wakes. (SIGKILL and an immediate restart: tests/reliability/test_faults_server_kill.py.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from capture_proxy.store import TraceStore
from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread
from harbor_server.client import HarborSessionFactory
from harbor_server.embedded import free_port
from harbor_server.rollouts import RESTART_REASON
from tests.reliability.conftest import MODEL, REPO, wait_for

pytestmark = pytest.mark.timeout(240)

N_LIVE = 3
CALLS = 100
"""Model calls per rollout: at 0.5 s each, in flight through all three second servers' starts (the
engine is then made fast, so they finish in seconds)."""


@pytest.fixture
def engine_url() -> Iterator[str]:
    # 0.5 s a call (the first test makes it fast once its checks are done).
    with serve_in_thread(create_imitation_app(ImitationSettings(model=MODEL, latency_s=0.5))) as url:
        yield url + "/v1"


def serve_args(engine_url: str, db: Path, port: int, capture_port: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "tests.reliability.serve_with_callers", "serve",
        "--dataset", "builtin", "--llm-url", engine_url, "--model", MODEL,
        "--port", str(port), "--capture-port", str(capture_port), "--sandbox", "local",
        "--store", f"sqlite:///{db}", "--skip-engine-check", *extra,
    ]  # fmt: skip


def serve_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return os.environ | {"HARBOR_RUNS_DIR": str(tmp_path / "runs"), "COLUMNS": "80"} | extra


@contextlib.contextmanager
def first_server(tmp_path: Path, engine_url: str, *extra: str, env: dict[str, str] | None = None):
    """The live server, in its own process group, until it answers /health."""
    port, capture_port = free_port(), free_port()
    log_path = tmp_path / "first.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            serve_args(engine_url, tmp_path / "traces.db", port, capture_port, *extra),
            cwd=REPO, env=env or serve_env(tmp_path), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    try:
        wait_for(lambda: answers(proc, port, log_path), 120, "the first harbor serve")
        yield proc, port, capture_port
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def answers(proc: subprocess.Popen, port: int, log_path: Path) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"harbor serve exited {proc.returncode}: {log_path.read_text()[-3000:]}")
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def refused(args: list[str], env: dict[str, str]) -> tuple[int, list[str], float]:
    """Run a second `harbor serve` to its end: exit code, its output's lines, seconds it took."""
    started = time.monotonic()
    result = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=90)
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    return result.returncode, lines, time.monotonic() - started


def test_a_second_server_on_a_busy_port_or_a_live_id_exits_2_and_the_first_ones_rollouts_complete(
    tmp_path, engine_url
):
    db = tmp_path / "traces.db"
    with (
        first_server(tmp_path, engine_url) as (_, port, capture_port),
        HarborSessionFactory(
            f"http://127.0.0.1:{port}", split="builtin", harness="caller", sandbox="local",
            llm_url=engine_url, model=MODEL, purpose="eval",
        ) as factory,
    ):  # fmt: skip
        sessions = [factory.create(i, episode_id=f"calls-{CALLS}") for i in range(N_LIVE)]
        store = TraceStore(f"sqlite:///{db}")
        try:
            wait_for(
                lambda: all(store.get_session(s.rollout_id).num_turns >= 1 for s in sessions),
                120,
                "every agent's first model call",
            )
            held = store.server_locks.get(f"{socket.gethostname()}:{port}")
            env = serve_env(tmp_path / "second")
            cases = {
                "--port": serve_args(engine_url, db, port, free_port()),
                "--capture-port": serve_args(engine_url, db, free_port(), capture_port),
                "--server-id": serve_args(
                    engine_url, db, free_port(), free_port(), "--server-id", f"{socket.gethostname()}:{port}"
                ),
            }
            said = {}
            for flag, args in cases.items():
                code, lines, took = refused(args, env)
                said[flag] = lines[0]
                print(f"{flag}: refused in {took:.1f} s: {lines[0]}")
                assert code == 2, (flag, lines)
                assert len(lines) == 1, (flag, lines)  # one line: no traceback, no summary
                assert lines[0].startswith("harbor serve cannot start: ") and lines[0].endswith(
                    f"pass {flag} to choose another"
                ), lines
                assert took < 30, (flag, took)
                assert all(store.get_session(s.rollout_id).status == "running" for s in sessions), flag
            assert f"trainer API port {port} on 127.0.0.1 is in use" in said["--port"]
            assert f"capture port {capture_port} on 127.0.0.1 is in use" in said["--capture-port"]
            assert (
                f"is in use by a live server (pid {held.pid} on {held.host}, heartbeat" in said["--server-id"]
            )
            assert store.server_locks.get(held.server_id) == held or (
                store.server_locks.get(held.server_id).token == held.token  # only its heartbeat moved
            )
            engine = engine_url.removesuffix("/v1")
            httpx.post(f"{engine}/imitation/settings", json={"latency_s": 0}, timeout=10).raise_for_status()
            results = [s.wait_for_completion(timeout_s=120) for s in sessions]
        finally:
            store.close()
    assert [r.status for r in results] == ["completed"] * N_LIVE, [r.error for r in results]
    assert all(r.error is None and r.num_turns == CALLS for r in results), results


def test_a_server_that_stops_beating_is_taken_over_its_rollouts_swept_and_it_stops_when_it_wakes(
    tmp_path, engine_url
):
    db = tmp_path / "traces.db"
    fast = serve_env(tmp_path, HARBOR_SERVER_LOCK_HEARTBEAT_S="0.5")
    with (
        first_server(tmp_path, engine_url, "--server-id", "node-a", env=fast) as (first, port, _),
        HarborSessionFactory(
            f"http://127.0.0.1:{port}", split="builtin", harness="caller", sandbox="local",
            llm_url=engine_url, model=MODEL, purpose="eval",
        ) as factory,
    ):  # fmt: skip
        sessions = [factory.create(i, episode_id="forever") for i in range(2)]
        store = TraceStore(f"sqlite:///{db}")
        try:
            wait_for(
                lambda: all(store.get_session(s.rollout_id).num_turns >= 1 for s in sessions),
                120,
                "agents' calls",
            )
            os.kill(first.pid, signal.SIGSTOP)  # alive, but neither serving nor beating
            second_port = free_port()
            second_log = tmp_path / "second.log"
            with open(second_log, "wb") as log:
                second = subprocess.Popen(
                    serve_args(engine_url, db, second_port, free_port(), "--server-id", "node-a"),
                    cwd=REPO, env=serve_env(tmp_path / "second"), stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            try:
                wait_for(
                    lambda: answers(second, second_port, second_log), 60, "the second server to take over"
                )
                for session in sessions:
                    record = store.get_session(session.rollout_id)
                    assert (record.status, record.error) == ("failed", RESTART_REASON)
                assert store.server_locks.get("node-a").pid == second.pid
                assert "took over the lock of pid" in second_log.read_text()

                os.kill(first.pid, signal.SIGCONT)
                first.wait(timeout=30)  # it notices at its next beat and stops on its own
                output = (tmp_path / "first.log").read_text()
                assert first.returncode == 1, output[-2000:]
                assert "another server took over server id 'node-a'" in " ".join(output.split())
                assert store.server_locks.get("node-a").pid == second.pid  # the stopped one left it alone
                for session in sessions:  # and did not overwrite what the new holder recorded
                    assert store.get_session(session.rollout_id).error == RESTART_REASON
            finally:
                second.terminate()
                second.wait(timeout=60)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(second.pid, signal.SIGKILL)
            assert store.server_locks.get("node-a") is None  # released on a clean stop
        finally:
            store.close()


def test_an_app_that_fails_to_start_is_one_error_not_a_process_exit(tmp_path, monkeypatch):
    """uvicorn ends a failed start-up with sys.exit(3); out of a task that used to end `harbor serve`
    with a wall of "Task exception was never retrieved". It is the server's error, said once."""
    import asyncio

    from fastapi import FastAPI

    import harbor_server.app
    from harbor_server.errors import HarborServerError
    from harbor_server.server import HarborServer
    from tests.server.conftest import make_config

    @contextlib.asynccontextmanager
    async def broken_lifespan(app):
        raise RuntimeError("the app's start-up failed")
        yield

    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(harbor_server.app, "create_api_app", lambda server: FastAPI(lifespan=broken_lifespan))
    server = HarborServer(make_config(tmp_path))

    async def main() -> None:
        await server.start()
        try:
            with pytest.raises(
                HarborServerError, match=r"could not serve on .*uvicorn exited with 3 while starting"
            ):
                await server.run_http()
        finally:
            await server.stop()

    asyncio.run(main())
    assert TraceStore(server.store_url).server_locks.get(server.config.server_id) is None  # released
