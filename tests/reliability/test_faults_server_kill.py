"""`harbor serve` SIGKILLed with 16 live rollouts, then restarted on the same store.

A real `harbor serve` process (SQLite store, `local` bwrap sandboxes) runs the `caller` test harness
(tests/reliability/serve_with_callers.py), whose agents call the engine from inside their sandboxes
through the capture port. The engine is `engine.imitation`'s imitation of vLLM's server (vLLM
needs a GPU), slowed so that calls are in flight when the server dies.

What must hold: completed rollouts keep their results and valid traces; rollouts in flight become
failed (unscoreable) on restart; no stored turn is half-written; a client waiting on a pending
session gets a clean ServerUnreachable while the server is down and the failed result after. (The
trainer's policy for such a rollout, counted and dropped with reward None, is
tests/trainer/test_worker.py::test_failed_rollouts_are_counted_and_the_group_survives.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from capture_proxy.store import TraceStore
from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread
from harbor_server.client import HarborClient, HarborSessionFactory
from harbor_server.embedded import free_port
from harbor_server.errors import ServerUnreachable
from harbor_server.rollouts import RESTART_REASON
from tests.reliability.conftest import MODEL, REPO, assert_turns_complete, integrity_check, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

N_DONE, N_LIVE = 6, 10
CALLS_DONE = 3


class ServeProcess:
    """`harbor serve` (with the caller harness) as its own process group on fixed ports."""

    def __init__(self, tmp_path: Path, engine_url: str) -> None:
        self.tmp_path = tmp_path
        self.port, self.capture_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = tmp_path / "traces.db"
        self.engine_url = engine_url
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> ServeProcess:
        self.starts += 1
        args = [
            sys.executable, "-m", "tests.reliability.serve_with_callers", "serve",
            "--dataset", "builtin", "--llm-url", self.engine_url, "--model", MODEL,
            "--port", str(self.port), "--capture-port", str(self.capture_port), "--capture-host", "127.0.0.1",
            "--sandbox", "local", "--store", f"sqlite:///{self.db}", "--skip-engine-check",
            "--max-concurrent-envs", str(N_DONE + N_LIVE),
        ]  # fmt: skip
        env = os.environ | {"HARBOR_RUNS_DIR": str(self.tmp_path / "runs"), "COLUMNS": "200"}
        log = open(self.tmp_path / f"serve-{self.starts}.log", "wb")  # noqa: SIM115 (kept for the process)
        self.proc = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        wait_for(self._ready, 120, "harbor serve to answer /health")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"harbor serve exited with {self.proc.returncode}: {self.log()[-3000:]}")
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        return (self.tmp_path / f"serve-{self.starts}.log").read_text(errors="replace")

    def sigkill(self) -> None:
        """SIGKILL the server process alone (its sandboxes die with it: bwrap --die-with-parent)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        # Anything the group left behind (a killed server's sandboxes, if any outlived it).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture
def engine_url() -> Iterator[str]:
    # 0.3 s per call: a `forever` agent is nearly always inside a call when the server dies.
    with serve_in_thread(create_imitation_app(ImitationSettings(model=MODEL, latency_s=0.3))) as url:
        yield url + "/v1"


def _turns(store: TraceStore, rollout_id: str) -> int:
    return store.get_session(rollout_id).num_turns


def test_server_sigkilled_during_16_rollouts_then_restarted(tmp_path, engine_url):
    serve = ServeProcess(tmp_path, engine_url).start()
    store = TraceStore(f"sqlite:///{serve.db}")  # a second reader of the server's store, as the inspector is
    try:
        with HarborSessionFactory(
            serve.url, split="builtin", harness="caller", sandbox="local", llm_url=engine_url, model=MODEL,
            purpose="eval",
        ) as factory:  # fmt: skip
            done = [factory.create(i, episode_id=f"calls-{CALLS_DONE}") for i in range(N_DONE)]
            live = [factory.create(i, episode_id="forever") for i in range(N_LIVE)]
            before = {s.rollout_id: s.wait_for_completion(timeout_s=200) for s in done}
            assert all(r.status == "completed" for r in before.values()), before
            traces = {rid: factory.client.trace(rid) for rid in before}
            assert all(len(t.turns) == CALLS_DONE for t in traces.values())
            wait_for(
                lambda: all(_turns(store, s.rollout_id) >= 2 for s in live), 120, "every live agent's calls"
            )

            # A trainer thread blocked in a long poll on a pending session when the server dies.
            waiting: dict[str, BaseException | object] = {}
            poller = threading.Thread(target=lambda: _wait_into(live[0], waiting), daemon=True)
            poller.start()
            wait_for(lambda: "started" in waiting, 10, "the long poll")
            serve.sigkill()
            poller.join(60)
            assert isinstance(waiting.get("error"), ServerUnreachable), waiting
            assert "unreachable" in str(waiting["error"])
            with pytest.raises(ServerUnreachable, match="unreachable"):
                factory.create(0, episode_id="calls-1")

            assert integrity_check(serve.db) == "ok"
            stored = {s.rollout_id: assert_turns_complete(store, s.rollout_id) for s in done + live}
            assert all(n >= 2 for rid, n in stored.items() if rid in {s.rollout_id for s in live})

            serve.start()  # the same store and ports: the trainer's client reconnects as is
            for session in live:
                result = session.wait_for_completion(timeout_s=60)
                assert result.status == "failed" and result.error == RESTART_REASON
                assert result.env_reward is None
            for rid, result in before.items():
                assert factory.client.result(rid) == result
                assert factory.client.trace(rid) == traces[rid]
            for session in live:  # what the killed rollouts did stays readable, each turn whole
                assert assert_turns_complete(store, session.rollout_id) == stored[session.rollout_id]
            # The restarted server runs new rollouts as before.
            assert (
                factory.create(0, episode_id="calls-2").wait_for_completion(timeout_s=120).status
                == "completed"
            )
    finally:
        store.close()
        serve.stop()


def _wait_into(session, out: dict) -> None:
    out["started"] = True
    try:
        out["result"] = session.wait_for_completion(timeout_s=120)
    except BaseException as exc:  # handed to the test thread
        out["error"] = exc


def test_client_of_a_dead_server_gets_a_clean_error():
    """No server at all: the factory's first call says which URL is unreachable."""
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServerUnreachable, match=f"harbor server at {url} is unreachable"):
        HarborClient(url).health()
