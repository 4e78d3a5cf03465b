"""`harbor proxy` as a user runs it: a real process in front of the vLLM imitation (`engine.imitation`,
a faithful local imitation of vLLM's OpenAI server, since vLLM needs a GPU)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import openai

from tests.proxy.conftest import MODEL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_harbor_proxy_command(imitation, tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "HARBOR_ADMIN_KEY"}
    cmd = [sys.executable, "-c", "from harbor_rl.cli import app; app()", "proxy", "--upstream", imitation.url + "/v1/",
           "--port", str(port), "--store", f"sqlite:///{tmp_path}/traces.db"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "harbor proxy did not start"
            time.sleep(0.1)
        proc.terminate()
        output = proc.communicate(timeout=20)[0]
        key = next(
            line.split(": ", 1)[1].strip() for line in output.splitlines() if line.startswith("admin key: ")
        )
    finally:
        if proc.poll() is None:
            proc.kill()
    # The generated admin key was printed; a second run with it (from the environment) serves sessions.
    env["HARBOR_ADMIN_KEY"] = key
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                r = httpx.post(
                    f"{url}/sessions", json={"model": MODEL}, headers={"Authorization": f"Bearer {key}"}
                )
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, "harbor proxy did not start"
                time.sleep(0.1)
        assert r.status_code == 201, r.text
        created = r.json()
        client = openai.OpenAI(base_url=created["base_url"], api_key=created["api_key"], max_retries=0)
        assert client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        ).choices
        info = httpx.get(
            f"{url}/sessions/{created['session_id']}", headers={"Authorization": f"Bearer {key}"}
        ).json()
        assert info["num_turns"] == 1 and info["llm_url"] == imitation.url + "/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
