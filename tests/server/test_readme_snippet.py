"""The README's client snippet, run as written (only its two URLs point at this test's server and a dead
engine): a rollout whose engine is down must read as failed with its error, not as a reward of None."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.conftest import make_config, running_server
from tests.server.test_docker import docker_ready  # noqa: F401 - fixture

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

README = Path(__file__).resolve().parents[2] / "README.md"
DEAD_ENGINE = "http://127.0.0.1:9/v1"


def readme_snippet() -> str:
    match = re.search(r"python - <<'EOF'\n(.*?)\nEOF\n", README.read_text(), re.S)
    assert match, "README lost its client snippet"
    return match.group(1)


def test_the_readme_snippet_shows_a_failed_rollouts_status_and_error(docker_ready, tmp_path, sandbox_root):  # noqa: F811
    config = make_config(
        tmp_path, sandbox="docker", capture_host="0.0.0.0", llm_url=DEAD_ENGINE, model="tiny"
    )
    with running_server(config) as server:
        code = (
            readme_snippet()
            .replace("http://127.0.0.1:8200", server.url)
            .replace("http://127.0.0.1:8000/v1", DEAD_ENGINE)
        )
        done = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, timeout=800,
                              cwd=README.parent)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = done.stdout.splitlines()[:2]
    assert first.startswith("failed None")
    assert second.startswith("error:") and "engine call failed" in second
