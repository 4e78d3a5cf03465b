"""Shared pieces of the reliability suite: waiting for conditions, the vLLM imitation as a real
subprocess (so a test can SIGKILL it mid-reply), and checks that a trace store is intact.

The engine is `engine.imitation`, a faithful local imitation of vLLM's OpenAI server (vLLM
itself needs a GPU), run with `python -m engine.imitation` exactly as a benchmark would run it.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from capture_proxy.store import TraceStore
from capture_proxy.validation import fatal, validate_trace
from harbor_server.embedded import free_port

REPO = Path(__file__).resolve().parents[2]
MODEL = "imitation-model"


def wait_for(predicate: Callable[[], object], timeout_s: float = 60.0, what: str = "condition") -> None:
    """Poll `predicate` until it is true; generous timeouts, since the test machine may be loaded."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def store(tmp_path) -> Iterator[TraceStore]:
    """A SQLite trace store in the test's folder."""
    s = TraceStore(f"sqlite:///{tmp_path}/traces.db")
    yield s
    s.close()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class EngineProcess:
    """The imitation in its own process on a fixed port: `kill()` is a real SIGKILL, `start()`
    brings it back on the same port (as a supervisor restarting the engine would)."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log_dir = log_dir
        self.proc: subprocess.Popen | None = None

    def start(self) -> EngineProcess:
        log = open(self._log_dir / f"engine-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115 (kept for the process)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.imitation", "--port", str(self.port), "--model", MODEL],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        wait_for(self._ready, 60, "the engine to start")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the engine exited with {self.proc.returncode} (port {self.port} taken?)")
        return _answers(self.url + "/health")

    def configure(self, **settings) -> None:
        httpx.post(f"{self.url}/imitation/settings", json=settings, timeout=10).raise_for_status()

    def kill(self) -> None:
        """SIGKILL: no shutdown, no closing handshake beyond what the kernel does for a dead process."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def engine_process(tmp_path) -> Iterator[EngineProcess]:
    engine = EngineProcess(tmp_path).start()
    try:
        yield engine
    finally:
        engine.stop()


def integrity_check(db_path: Path) -> str:
    """SQLite's own verdict on the database file (`ok` when nothing is corrupt)."""
    connection = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return connection.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        connection.close()


def assert_turns_complete(store: TraceStore, session_id: str) -> int:
    """Every stored turn of the session is whole: it reads back, and it is either a complete capture
    (ids, logprobs and mask agree) or a transport failure that kept no token at all. Returns the count."""
    record = store.get_session(session_id)
    turns = store.get_turns(session_id)
    assert record.num_turns == len(turns), f"{session_id}: num_turns {record.num_turns} != {len(turns)} rows"
    for turn in turns:
        prompt, completion = turn.prompt_token_ids, turn.completion_token_ids
        assert len(turn.loss_mask) == len(prompt) + len(completion), (
            f"{session_id}/{turn.node_id}: mask length"
        )
        assert len(turn.per_token_logps) == len(completion), f"{session_id}/{turn.node_id}: logprob count"
        if turn.metadata.capture == "transport_error":
            assert prompt == [] and completion == [] and turn.metadata.error, f"{session_id}/{turn.node_id}"
        else:
            assert turn.metadata.capture == "ok" and prompt and completion, f"{session_id}/{turn.node_id}"
    fatal_findings = fatal(validate_trace(record.trace(turns)))
    assert not fatal_findings, f"{session_id}: {fatal_findings}"
    return len(turns)


@pytest.fixture
def sandbox_root(tmp_path, monkeypatch) -> Path:
    """Sandboxes' folders and the runs dir under this test's tmp dir (as tests/server/conftest.py)."""
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs" / "tmp" / "sandboxes"
