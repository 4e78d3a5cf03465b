"""The guides' snippets run here with only their import lines changed, plus what cannot run offline
(the Hub model becomes `tiny`, a remote environment a local one of the same shape) and short settings
for CI; and what each guide says happens, happens. SOURCES.md says where each snippet comes from."""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
SHORT_SETTINGS = (
    r"\s*max_steps=\d+, num_generations=\d+, per_device_train_batch_size=\d+, max_completion_length=\d+,"
)
"""The one line a seed may add: a short run for CI."""


def _import_line(guide: str | None, ours: str | None) -> bool:
    return bool(guide and guide.startswith("from trl import")) and ours == guide.replace(
        "trl", "harbor_rl", 1
    )


def _model(guide: str | None, ours: str | None) -> bool:
    """The Hub model becomes the offline tiny one."""
    return bool(guide and re.fullmatch(r'\s*model="[^"]+",', guide)) and ours == re.sub(
        r'"[^"]+"', '"tiny"', guide
    )


def _rows(guide: str | None, ours: str | None) -> bool:
    """Fewer dataset rows (`[...] * N`)."""
    size = r"\] \* \d+\}"
    return bool(guide and ours and re.search(size, guide)) and re.sub(size, "", guide) == re.sub(
        size, "", ours
    )


def _short_settings(guide: str | None, ours: str | None) -> bool:
    return guide is None and ours is not None and re.fullmatch(SHORT_SETTINGS, ours) is not None


RULES = (_import_line, _model, _rows, _short_settings)
"""What a seed may change of its guide's code: (guide line, our line) -> allowed."""


def changes(guide: str, ours: str) -> list[tuple[str | None, str | None]]:
    """(guide line, our line) for each line that differs (None on the side that has none)."""
    out: list[tuple[str | None, str | None]] = []
    matcher = difflib.SequenceMatcher(a=guide.splitlines(), b=ours.splitlines(), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        a, b = matcher.a[i1:i2], matcher.b[j1:j2]
        out += [
            (a[k] if k < len(a) else None, b[k] if k < len(b) else None) for k in range(max(len(a), len(b)))
        ]
    return out


def allowed(guide_line: str | None, our_line: str | None) -> bool:
    return any(rule(guide_line, our_line) for rule in RULES)


@pytest.mark.parametrize("name", ["trl_openenv_echo"])
def test_a_seed_differs_from_its_guide_only_where_the_rules_allow(name) -> None:
    guide = (HERE / "guide" / f"{name}.py").read_text()
    ours = (HERE / f"{name}.py").read_text()
    differing = changes(guide, ours)
    assert (
        "from trl import GRPOConfig, GRPOTrainer",
        "from harbor_rl import GRPOConfig, GRPOTrainer",
    ) in differing
    refused = [pair for pair in differing if not allowed(*pair)]
    assert not refused, f"{name}.py changes the guide beyond its imports and offline settings: {refused}"


def test_the_rules_refuse_any_other_change() -> None:
    assert not allowed("    reward_funcs=reward_func,", "    reward_funcs=[reward_func],")
    assert not allowed(None, "import harbor_rl.testing")
    assert allowed("from trl import GRPOTrainer", "from harbor_rl import GRPOTrainer")


def run_seed(name: str, cwd: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE / "offline")]), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, str(HERE / f"{name}.py")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_the_echo_quick_start_trains_and_does_what_the_guide_says(tmp_path) -> None:
    """The guide: one EchoToolEnv per generation, reset() at the start of each episode, echo() found from
    its docstring and offered as a tool, the reward function reading env.reward after the episode."""
    done = run_seed("trl_openenv_echo", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "trainer_output"  # TRL's default output_dir
    (step,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert step["rollout/scoreable"] == 2 and step["rollout/failed"] == 0
    assert step["rewards/reward_func/mean"] == step["reward"]  # the one function is the reward
    logged = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert len(logged) == 2 and "step 1: completions" in done.stderr  # log_completions=True

    from capture_proxy.store import TraceStore

    store = TraceStore(f"sqlite:///{out / 'traces.db'}")
    try:
        # Newest first; the worker may have started rollouts the run ended before they made a call.
        turns = [turn for s in store.list_sessions() for turn in store.get_turns(s.session_id)]
        request = turns[0].request
    finally:
        store.close()
    (tool,) = request["tools"]
    assert tool["function"]["name"] == "echo"
    assert tool["function"]["description"] == "Echo the message back from the environment."
    assert tool["function"]["parameters"]["properties"]["message"] == {
        "type": "string", "description": "The message to echo"
    }  # fmt: skip
    assert request["messages"][-1]["content"] == "Try to echo 'Hello World!' in the environment."
