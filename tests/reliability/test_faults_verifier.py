"""A verifier that hangs and one that writes garbage, seen through a whole rollout on a real server
(`local` bwrap sandbox, `nop` agent): reward None (unscoreable, never 0) with an error that says what
went wrong, the sandbox stopped, and the server serving the next rollout.

The verifier's own behaviour is tested in depth in tests/tasks/test_verifier.py (timeouts kill the
hung tests, every kind of garbage file); this checks that the outcome reaches the trainer intact.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harbor_server.client import HarborSessionFactory
from tests.server.conftest import UNUSED_ENGINE, make_config, running_server

pytestmark = pytest.mark.timeout(300)

TASKS = {
    "hangs": (2.0, "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\nsleep 600\n"),
    "garbage": (60.0, "#!/bin/bash\necho 'all 7 tests passed' > /logs/verifier/reward.txt\n"),
    "honest": (60.0, "#!/bin/bash\necho 0.5 > /logs/verifier/reward.txt\n"),
}


def _write_tasks(root: Path) -> Path:
    for name, (timeout_sec, test_sh) in TASKS.items():
        files = {
            "instruction.md": "Do nothing.\n",
            "task.toml": f'[task]\nname = "test/{name}"\n\n[verifier]\ntimeout_sec = {timeout_sec}\n',
            "environment/Dockerfile": "FROM harbor-rl/sandbox-base:bookworm\nWORKDIR /app\n",
            "tests/test.sh": test_sh,
        }
        for rel, text in files.items():
            path = root / name / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
    return root


def test_hanging_and_garbage_verifiers_make_rollouts_unscoreable(tmp_path, sandbox_root):
    dataset = _write_tasks(tmp_path / "faulty")
    config = make_config(tmp_path, datasets=[str(dataset)])
    with (
        running_server(config) as server,
        HarborSessionFactory(server.url, split="faulty", harness="nop", sandbox="local", llm_url=UNUSED_ENGINE, model="tiny") as factory,
    ):  # fmt: skip
        sessions = {name: factory.create(name, episode_id=name) for name in TASKS}
        results = {name: s.wait_for_completion(timeout_s=200) for name, s in sessions.items()}

    hung = results["hangs"]
    assert hung.env_reward is None and hung.rewards == {}  # the reward.txt written before the hang is void
    assert "verifier timed out after 2s" in hung.error
    assert hung.timings["verifier"] < 60  # killed at its timeout, not waited out

    garbage = results["garbage"]
    assert garbage.env_reward is None and garbage.rewards == {}
    assert "reward.txt" in garbage.error and "all 7 tests passed" in garbage.error, garbage.error
    assert results["honest"].env_reward == 0.5 and results["honest"].error is None
    assert not sandbox_root.exists() or not any(sandbox_root.iterdir())  # every sandbox removed
