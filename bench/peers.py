"""The capture proxy's peers for `bench/proxy_peers.py`: install them in their own venvs and start them.

Nothing of theirs enters Harbor-RL's dependencies. Each peer gets a venv of its own under
`~/.cache/harbor-rl/bench-peers/<name>` (override with $HARBOR_BENCH_PEERS), created on first use with
`python -m venv` + pip, because the two cannot share one: OpenEnv pulls fastmcp, which needs mcp < 2,
while LiteLLM's proxy extra needs mcp >= 2.3.

- OpenEnv's capture proxy (`openenv`, `openenv.core.harness.capture.server.create_app`): served with
  uvicorn like ours, capture level `tokens` given (the imitation returns token ids and logprobs, so
  this is what its own probe would decide), an admin key; sessions are minted with `POST /sessions`
  and the session id is the agent's API key.
- LiteLLM's proxy (`litellm[proxy]`): its own CLI, one worker, a `hosted_vllm/` model, a master key
  and no database. 1.108.5 is the newest release whose proxy extra resolves from this machine's
  package index (1.110 moved it into a `litellm-proxy` package the index lacks).

A peer that cannot be installed or started is a `PeerUnavailable` with the reason; the benchmark
reports it in the peer's row and goes on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

PEERS_HOME = Path(os.environ.get("HARBOR_BENCH_PEERS", "~/.cache/harbor-rl/bench-peers")).expanduser()
INSTALL_TIMEOUT_S = 1200
START_TIMEOUT_S = 120


class PeerUnavailable(RuntimeError):
    """A peer could not be installed or started; the message says why, for the report."""


@dataclass(frozen=True)
class Peer:
    name: str
    """The target's name in the tables."""
    requirements: tuple[str, ...]
    module: str
    """The import that must work for the peer to run."""
    distribution: str
    """The distribution whose version the report shows."""

    @property
    def venv(self) -> Path:
        return PEERS_HOME / self.name

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


# uvloop and httptools: the same uvicorn stack ours runs on (`uvicorn[standard]`), so the comparison is
# of the proxies, not of their HTTP servers.
SERVER_STACK = ("uvloop", "httptools")
OPENENV = Peer(
    "openenv", ("openenv==0.10.0", *SERVER_STACK), "openenv.core.harness.capture.server", "openenv"
)
LITELLM = Peer("litellm", ("litellm[proxy]==1.108.5", *SERVER_STACK), "litellm.proxy.proxy_server", "litellm")
PEERS = (OPENENV, LITELLM)


def installed_version(peer: Peer) -> str | None:
    """The peer's version in its venv, or None when the venv cannot import it."""
    if not peer.python.exists():
        return None
    code = (
        f"import importlib.metadata as m, {', '.join(SERVER_STACK)}; "
        f"__import__({peer.module!r}); print(m.version({peer.distribution!r}))"
    )
    try:
        done = subprocess.run([str(peer.python), "-c", code], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def ensure_installed(peer: Peer, install: bool = True) -> str:
    """The peer's version, creating its venv and installing it first if needed."""
    version = installed_version(peer)
    if version:
        return version
    if not install:
        raise PeerUnavailable(f"not installed in {peer.venv} (and installing was turned off)")
    peer.venv.parent.mkdir(parents=True, exist_ok=True)
    log = peer.venv.parent / f"{peer.name}-install.log"
    try:
        if not peer.python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(peer.venv)], check=True, timeout=300)
        with log.open("w") as out:
            subprocess.run(
                [str(peer.python), "-m", "pip", "install", "--disable-pip-version-check", *peer.requirements],
                stdout=out, stderr=subprocess.STDOUT, check=True, timeout=INSTALL_TIMEOUT_S,
            )  # fmt: skip
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        tail = log.read_text()[-300:].strip().replace("\n", " ") if log.exists() else ""
        raise PeerUnavailable(f"pip install {' '.join(peer.requirements)} failed ({exc}): {tail}") from exc
    version = installed_version(peer)
    if not version:
        raise PeerUnavailable(f"installed {' '.join(peer.requirements)} but cannot import {peer.module}")
    return version


def _pinned(core: int | None):
    return None if core is None else (lambda: os.sched_setaffinity(0, {core}))


def wait_healthy(proc: subprocess.Popen, url: str, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            tail = log.read_text()[-400:].strip().replace("\n", " ") if log and log.exists() else ""
            raise PeerUnavailable(f"{what} exited with {proc.returncode} before answering {url}: {tail}")
        time.sleep(0.2)
    stop(proc)
    raise PeerUnavailable(f"{what} did not answer {url} within {START_TIMEOUT_S} s")


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


_OPENENV_MAIN = """
import sys, uvicorn
from openenv.core.harness.capture.server import create_app
port, llm_url, model, admin_key = sys.argv[1:5]
app = create_app(llm_url=llm_url, model=model, capture_level="tokens", admin_key=admin_key)
uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning", access_log=False,
            timeout_keep_alive=75)
"""


def start_openenv(
    port: int, engine_url: str, model: str, admin_key: str, core: int | None, logdir: Path,
    script: str | None = None, name: str = "openenv",
):  # fmt: skip
    """OpenEnv's capture proxy in front of `engine_url`, served by uvicorn as ours is, or by `script`
    (which takes the same arguments); its log is `<name>.log`."""
    log = logdir / f"{name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(OPENENV.python), "-c", script or _OPENENV_MAIN, str(port), engine_url, model, admin_key],
            stdout=out, stderr=subprocess.STDOUT, preexec_fn=_pinned(core), cwd=logdir,
        )  # fmt: skip
    wait_healthy(proc, f"http://127.0.0.1:{port}/health", f"OpenEnv's capture proxy ({name})", log)
    return proc


def litellm_config(engine_url: str, model: str, master_key: str) -> str:
    return f"""model_list:
  - model_name: {model}
    litellm_params:
      model: hosted_vllm/{model}
      api_base: {engine_url}/v1
      api_key: unused
litellm_settings:
  drop_params: false
  set_verbose: false
  telemetry: false
general_settings:
  master_key: {master_key}
  disable_spend_logs: true
"""


def start_litellm(port: int, engine_url: str, model: str, master_key: str, core: int | None, logdir: Path):
    """LiteLLM's proxy CLI: one worker, no database (no DATABASE_URL), a master key."""
    config = logdir / "litellm.yaml"
    config.write_text(litellm_config(engine_url, model, master_key))
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env |= {"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "NO_DOCS": "True"}
    log = logdir / "litellm.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(LITELLM.venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1",
             "--port", str(port), "--num_workers", "1"],
            stdout=out, stderr=subprocess.STDOUT, preexec_fn=_pinned(core), cwd=logdir, env=env,
        )  # fmt: skip
    wait_healthy(proc, f"http://127.0.0.1:{port}/health/liveliness", "LiteLLM's proxy", log)
    return proc


def scratch_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="harbor-bench-peers-"))
