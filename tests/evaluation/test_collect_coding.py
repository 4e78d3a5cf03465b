"""`harbor collect --harness mini-swe-agent --provider scripted` on the tiny coding tasks: demonstrations
through the real mini-swe-agent in real local sandboxes, the capture proxy between it and the scripted
teacher, the task's own verifier scoring each; `harbor sft` then trains on them. The first local
sandbox pip-installs mini-swe-agent's pinned wheels (a minute or two on two busy cores)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from harbor_rl.cli import app
from tasks import load_dataset_spec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
MINI_SYSTEM = "You are a helpful assistant that can interact with a computer."


def test_scripted_demonstrations_through_mini_swe_agent_feed_harbor_sft(tmp_path, runs_dir, store_url):
    tasks = {t.id: t for t in load_dataset_spec("tiny-coding")}
    out = tmp_path / "demos"
    collect = CliRunner().invoke(
        app,
        ["collect", "--harness", "mini-swe-agent", "--provider", "scripted", "--dataset", "tiny-coding",
         "--agent-step-limit", "4", "--output-dir", str(out), "--store", store_url],
        catch_exceptions=False,
    )  # fmt: skip
    assert collect.exit_code == 0, collect.output
    episodes = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(e["task"]["task_id"] for e in episodes) == sorted(tasks)
    for episode in episodes:
        task = tasks[episode["task"]["task_id"]]
        assert episode["reward"] == 1.0, episode["artifacts"]  # the verifier passed the played solution
        assert episode["extra"]["harness"] == "mini-swe-agent"
        # The harness's own conversation: its system prompt, its instance template, its tool, its
        # observation format; the solution as its command, then its submit command.
        system, user, fix, observation, submit = episode["messages"]
        assert system == {"role": "system", "content": MINI_SYSTEM}
        assert user["content"].startswith(f"Please solve this issue: {task.instruction}")
        assert [t["function"]["name"] for t in episode["tools"]] == ["bash"]
        [call] = fix["tool_calls"]
        solve = task.paths.solve_script.read_text().split("\n", 1)[1].strip()
        assert json.loads(call["function"]["arguments"]) == {"command": solve}
        assert observation["role"] == "tool" and json.loads(observation["content"])["returncode"] == 0
        [done] = submit["tool_calls"]
        assert json.loads(done["function"]["arguments"]) == {
            "command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
        }
        assert episode["metrics"]["model_calls"] == 2

    sft = CliRunner().invoke(
        app,
        ["sft", str(out), "--output-dir", str(tmp_path / "sft"), "--max-steps", "4", "--batch-size", "3",
         "--learning-rate", "1e-3"],
        catch_exceptions=False,
    )  # fmt: skip
    assert sft.exit_code == 0, sft.output
    summary = json.loads((tmp_path / "sft" / "sft_summary.json").read_text())
    assert summary["steps"] == 4 and summary["episodes"] == 3
    assert summary["final_loss"] < summary["first_loss"], summary  # it learned from the harness's turns
