"""Isolation: a session key opens its own session's agent routes and nothing else; the sandbox-facing
port has no admin route even for the admin key; the host's secrets reach no sandbox, neither its
environment nor any file or process it can read, on the local (bubblewrap) and Docker backends; a local
sandbox reaches the capture proxy and no other port of the host unless its task allows the internet.

Real components: the capture proxy and `harbor serve` on 127.0.0.1, SQLite stores, bubblewrap, the
Docker engine (those cases are marked `docker` and skip without an engine or the base image). The
engine is `engine.imitation`, a faithful local imitation of vLLM's OpenAI server (vLLM needs a GPU).
"""

from __future__ import annotations

import json
import shutil
import socket
import uuid
from pathlib import Path

import httpx
import openai
import pytest

from harbor_server.client import HarborSessionFactory
from sandboxes import local_network
from tests.reliability._fixtures_input import ADMIN_KEY, MODEL, imitation, live_proxy
from tests.sandboxes.conftest import BASE_IMAGE, docker_client_or_skip
from tests.server.conftest import UNUSED_ENGINE, make_config, running_server

__all__ = ["imitation", "live_proxy"]  # fixtures used by name

pytestmark = pytest.mark.timeout(600)
MESSAGES = [{"role": "user", "content": "hi"}]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# -- session keys --------------------------------------------------------------------------------


def test_a_session_key_reaches_only_its_own_session(live_proxy):
    mine, other = live_proxy.create(), live_proxy.create()
    url = live_proxy.url
    # It opens no admin route: not the other session's record or trace, not closing it, not a new one.
    for method, path in [
        ("GET", "/sessions"),
        ("GET", f"/sessions/{other.session_id}"),
        ("GET", f"/sessions/{other.session_id}/trace"),
        ("DELETE", f"/sessions/{other.session_id}"),
        ("GET", f"/sessions/{mine.session_id}/trace"),  # not even its own trace: that is the trainer's
        ("POST", "/sessions"),
    ]:
        r = httpx.request(method, url + path, headers=bearer(mine.api_key), json={"model": MODEL})
        assert r.status_code == 401, (method, path, r.text)
    # Keys that are almost right, or the admin key, are not session keys.
    for key in (mine.api_key + "x", mine.api_key[:-1], mine.api_key.upper(), ADMIN_KEY, other.session_id):
        r = httpx.post(
            f"{url}/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES}, headers=bearer(key)
        )
        assert r.status_code == 401, key
    # Its calls land in its own session only.
    client = openai.OpenAI(base_url=mine.base_url, api_key=mine.api_key, max_retries=0)
    client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert live_proxy.store.get_session(mine.session_id).num_turns == 1
    record = live_proxy.store.get_session(other.session_id)
    assert (record.status, record.num_turns) == ("running", 0)
    # Once its session is closed the key writes nowhere, and the other session is untouched.
    httpx.delete(f"{url}/sessions/{mine.session_id}", headers=bearer(ADMIN_KEY)).raise_for_status()
    with pytest.raises(openai.ConflictError):
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert live_proxy.store.get_session(mine.session_id).num_turns == 1
    assert live_proxy.store.get_session(other.session_id).num_turns == 0


def test_the_sandbox_facing_port_has_no_admin_route_even_for_the_admin_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    admin_key = "isolation-admin-key-" + uuid.uuid4().hex
    with running_server(make_config(tmp_path, admin_key=admin_key)) as server:
        capture = server.capture_url
        for method, path in [
            ("POST", "/sessions"), ("GET", "/sessions"), ("GET", "/sessions/x/trace"), ("DELETE", "/sessions/x"),
            ("GET", "/sessions/"), ("GET", "//sessions"), ("GET", "/v1/sessions"), ("GET", "/rollouts"),
            ("POST", "/rollouts"), ("GET", "/info"), ("GET", "/metrics"), ("GET", "/openapi.json"),
            ("GET", "/inspect"),
        ]:  # fmt: skip
            r = httpx.request(method, capture + path, headers=bearer(admin_key), json={"model": MODEL})
            assert r.status_code in (404, 405), (method, path, r.status_code)
        # The admin key is not a session key either.
        r = httpx.post(
            f"{capture}/v1/chat/completions",
            json={"model": MODEL, "messages": MESSAGES},
            headers=bearer(admin_key),
        )
        assert r.status_code == 401


# -- host secrets --------------------------------------------------------------------------------

SCAN = r'''
"""Look for the host's secrets wherever a process in this sandbox can read them. The pattern is built
at run time, so this file itself never holds it."""
import glob, os

pattern = ("NONCE" + "-secret").encode()
names = ("E2B_API_KEY", "HF_TOKEN", "HARBOR_ADMIN_KEY")
hits = [f"env:{k}" for k, v in os.environ.items() if k in names or pattern in v.encode()]
for proc in glob.glob("/proc/[0-9]*"):
    for part in ("environ", "cmdline"):
        try:
            with open(f"{proc}/{part}", "rb") as f:
                if pattern in f.read():
                    hits.append(f"{proc}/{part}")
        except OSError:
            pass
for top in ("/app", "/logs", "/tmp", "/root", "/home", "/etc", "/var", "/opt", "/srv", "/mnt", "/run",
            "/tests", "/solution"):
    for folder, _, files in os.walk(top):
        for name in files:
            path = os.path.join(folder, name)
            try:
                if not os.path.islink(path) and os.path.isfile(path):
                    with open(path, "rb") as f:
                        if pattern in f.read(4 << 20):
                            hits.append(path)
            except OSError:
                pass
print("LEAKS " + " ".join(hits) if hits else "CLEAN")
'''

TASK_TOML = """\
schema_version = "1.0"

[task]
name = "test/secret-scan"

[verifier]
timeout_sec = 120.0

[agent]
timeout_sec = 120.0

[environment]
network_mode = "no-network"
workdir = "/app"
"""


def run_oracle(config, task_id: str):
    """One oracle rollout of `task_id` on a fresh `harbor serve`, an evaluation (its agent gets the network
    the task declares; training would deny it: test_task_phases.py); its finished result."""
    with (
        running_server(config) as server,
        HarborSessionFactory(
            server.url, split="tasks", harness="oracle", llm_url=UNUSED_ENGINE, model="m", purpose="eval"
        ) as f,
    ):
        return f.create(task_id, episode_id="probe").wait_for_completion(timeout_s=500)


def write_files(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def secret_scan_task(root: Path, nonce: str) -> Path:
    """A task whose solution (run by the oracle as the agent) and whose verifier both scan for secrets;
    the verifier's reward is 1 only when its scan is clean."""
    task = root / "secret-scan"
    scan = SCAN.replace("NONCE", nonce)
    files = {
        "task.toml": TASK_TOML,
        "instruction.md": "Nothing to do.\n",
        "environment/Dockerfile": f"FROM {BASE_IMAGE}\nWORKDIR /app\n",
        "solution/scan.py": scan,
        "solution/solve.sh": "#!/bin/bash\npython3 /solution/scan.py\n",
        "tests/scan.py": scan,
        "tests/test.sh": (
            "#!/bin/bash\nmkdir -p /logs/verifier\npython3 /tests/scan.py > /logs/verifier/scan.txt\n"
            "if grep -q '^CLEAN' /logs/verifier/scan.txt; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
        ),
    }
    write_files(task, files)
    return root


@pytest.mark.parametrize("sandbox", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_host_secrets_reach_no_sandbox_environment_file_or_process(sandbox, tmp_path, monkeypatch):
    if sandbox == "local" and shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed (the local sandbox's isolation needs it)")
    if sandbox == "docker":
        client = docker_client_or_skip()
        try:
            client.images.get(BASE_IMAGE)
        except Exception:
            pytest.skip(f"base image {BASE_IMAGE} missing: build it with docker/sandbox-base/build.sh")
    nonce = uuid.uuid4().hex[:12]
    secret = f"{nonce}-secret"
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("E2B_API_KEY", f"{secret}-e2b")
    monkeypatch.setenv("HF_TOKEN", f"{secret}-hf")
    monkeypatch.setenv("HARBOR_ADMIN_KEY", f"{secret}-admin-env")
    config = make_config(
        tmp_path,
        datasets=[str(secret_scan_task(tmp_path / "tasks", nonce))],
        sandbox=sandbox,
        capture_host="0.0.0.0" if sandbox == "docker" else "127.0.0.1",
        admin_key=f"{secret}-admin",
        llm_api_key=f"{secret}-engine-key",
    )
    result = run_oracle(config, "secret-scan")
    assert result.status == "completed", result.error
    assert result.sandbox == sandbox
    assert "CLEAN" in result.agent_log_tail and "LEAKS" not in result.agent_log_tail, result.agent_log_tail
    assert result.env_reward == 1.0, result.verifier_output  # the verifier's own scan was clean too


# -- the local sandbox's network -------------------------------------------------------------------

NET_PROBE = r'''
"""Try every host port this rollout knows of; only the capture port may answer."""
import json, socket, sys, urllib.error, urllib.request

ports = json.loads(sys.argv[1])
seen = {}
for name, port in ports.items():
    if name == "capture":
        try:
            seen[name] = urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10).status
        except urllib.error.HTTPError as exc:
            seen[name] = exc.code  # an answer from the proxy (401 without a session key): reachable
        except OSError as exc:
            seen[name] = type(exc).__name__
        continue
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        seen[name] = "open"
    except OSError as exc:
        seen[name] = type(exc).__name__
cut_off = all(v != "open" for k, v in seen.items() if k != "capture")
print(("NET-CLEAN " if cut_off and seen["capture"] == 401 else "NET-LEAK ") + json.dumps(seen, sort_keys=True))
'''


def net_probe_task(root: Path, ports: dict[str, int], *, allow_internet: bool) -> Path:
    """A task whose agent (the oracle) and verifier both probe the host's ports from inside the sandbox;
    the verifier's reward is 1 only when its own probe found the host cut off."""
    task = root / "net-probe"
    args = json.dumps(json.dumps(ports))
    toml = TASK_TOML.replace("secret-scan", "net-probe").replace(
        'network_mode = "no-network"\n', f"allow_internet = {'true' if allow_internet else 'false'}\n"
    )
    files = {
        "task.toml": toml,
        "instruction.md": "Nothing to do.\n",
        "environment/Dockerfile": f"FROM {BASE_IMAGE}\nWORKDIR /app\n",
        "solution/probe.py": NET_PROBE,
        "solution/solve.sh": f"#!/bin/bash\npython3 /solution/probe.py {args}\n",
        "tests/probe.py": NET_PROBE,
        "tests/test.sh": (
            f"#!/bin/bash\nmkdir -p /logs/verifier\npython3 /tests/probe.py {args} > /logs/verifier/probe.txt\n"
            "if grep -q '^NET-CLEAN' /logs/verifier/probe.txt; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
        ),
    }
    write_files(task, files)
    return root


@pytest.mark.parametrize("allow_internet", [False, True])
def test_a_local_sandbox_reaches_the_capture_proxy_and_no_other_host_port(
    allow_internet, imitation, tmp_path, monkeypatch
):
    if shutil.which("bwrap") is None or local_network.public_network_problem():
        pytest.skip(
            f"the local sandbox's network isolation needs bwrap, {local_network.public_network_problem()}"
        )
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    listener = socket.create_server(("127.0.0.1", 0))  # any service on the host's loopback
    config = make_config(tmp_path, llm_url=imitation.url + "/v1", sandbox="local")
    ports = {
        "capture": config.capture_port,
        "listener": listener.getsockname()[1],
        "engine": int(imitation.url.rsplit(":", 1)[1]),  # its weight-update routes among them
        "server_api": config.port,  # the trainer-facing API
    }
    config = config.model_copy(
        update={"datasets": [str(net_probe_task(tmp_path / "tasks", ports, allow_internet=allow_internet))]}
    )
    try:
        result = run_oracle(config, "net-probe")
    finally:
        listener.close()
    assert result.status == "completed", result.error
    seen = json.loads(result.agent_log_tail.split("NET-", 1)[1].split(" ", 1)[1].splitlines()[0])
    assert seen["capture"] == 401  # the proxy answered, at the address a harness is given
    # With internet or without, the host's own services stay out of reach (internet is not the host).
    assert seen["listener"] == seen["engine"] == seen["server_api"] == "ConnectionRefusedError"
    assert result.env_reward == 1.0, result.verifier_output  # the verifier is cut off too
