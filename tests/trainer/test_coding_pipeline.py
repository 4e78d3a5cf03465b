"""`harbor train --harness mini-swe-agent` on tiny numbers: the whole coding loop ran, through the real
harness. Scripted demonstrations were collected through mini-swe-agent in local sandboxes, SFT lowered
its loss on them, each GRPO step's rollouts were mini-swe-agent runs captured by the proxy whose engine
token ids build the training rows, and both evaluations ran on the same seeds. The first local sandbox
pip-installs mini-swe-agent's pinned wheels (a minute or two on two busy cores)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from capture_proxy.rows import build_training_rows
from capture_proxy.store import TraceStore
from harbor_rl.cli import app

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
MINI_SYSTEM = "You are a helpful assistant that can interact with a computer."


def test_the_coding_loop_runs_through_mini_swe_agent(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text(
        "max_steps: 2\nreport_to: jsonl\neval_episodes: 2\nsft_steps: 3\ndemo_episodes: 3\n"
        "num_generations: 2\nper_device_train_batch_size: 4\ngradient_accumulation_steps: 1\nmax_concurrent_rollouts: 4\n"
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["train", "--harness", "mini-swe-agent", "--config", str(cfg), "--output-dir", str(out)]
    )
    assert result.exit_code == 0, result.output
    for row in ("after SFT", "after GRPO", "GRPO gain", "reward per step"):
        assert row in result.output

    demos = [json.loads(line) for line in (out / "demos" / "results.jsonl").read_text().splitlines()]
    assert len(demos) == 3 and {d["task"]["task_id"] for d in demos} == {
        "fix-add",
        "fix-greeting",
        "write-double",
    }
    for demo in demos:  # the harness's own conversation, the solution played as its bash call
        assert demo["extra"]["harness"] == "mini-swe-agent" and demo["reward"] == 1.0
        assert demo["messages"][0] == {"role": "system", "content": MINI_SYSTEM}
        assert demo["messages"][2]["tool_calls"][0]["function"]["name"] == "bash"
    sft = json.loads((out / "sft" / "sft_summary.json").read_text())
    assert sft["steps"] == 3 and sft["final_loss"] < sft["first_loss"]

    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2] and steps[-1]["policy_version"] == 3
    assert all(m["rollout/scoreable"] + m["rollout/failed"] == 4 for m in steps)
    if any(m["frac_reward_zero_std"] < 1.0 for m in steps):  # a group with spread trains on its rows
        assert any(m["num_tokens"] > 0 for m in steps)

    # GRPO's rollouts: mini-swe-agent runs whose calls the proxy captured with the engine's token ids.
    store = TraceStore(f"sqlite:///{out}/traces.db")
    try:
        train = [r for r in store.list_sessions(purpose="train", limit=1000) if r.status == "completed"]
        assert len(train) >= 4 and {r.harness for r in train} == {"mini-swe-agent"}
        for record in train:
            turns = store.get_turns(record.session_id)
            assert turns and all(t.prompt_token_ids and t.completion_token_ids for t in turns)
            rows = build_training_rows(record.trace(turns))
            assert rows and all(row.num_trained_tokens > 0 for row in rows)
        evals = store.list_sessions(purpose="eval", limit=1000)
        seeds = sorted(r.metadata["rollout"]["seed"] for r in evals if r.harness == "mini-swe-agent")
        assert seeds and seeds[::2] == seeds[1::2]  # the same seeds before and after
    finally:
        store.close()
    assert (out / "reward_curve.png").stat().st_size > 0
