"""`harbor train --engine vllm`: the embedded run with vLLM's CPU build as its engine, on the tiny model,
through the white-box env-factory harness and through the real mini-swe-agent. Each run starts its own
vLLM (as a user's would), samples every rollout from it through the capture proxy, and pushes the weights
to it over gloo (the project's vLLM plugin) after the warm-up and after every GRPO step. On-policy
(max_staleness 0), the trainer's logprobs of the tokens vLLM sampled must agree with vLLM's: a push that
left vLLM serving other weights than the trainer's shows as KL. (Through mini-swe-agent the barely warmed-up
tiny model scores 0 on every coding task, so no step trains there: that run checks the sampling, capture
and pushes of the coding path.)"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys

import pytest

from tests.vllm_live.conftest import require_venv

pytestmark = pytest.mark.timeout(900)

SMALL_RUN = {
    "max_steps": 2, "report_to": "jsonl", "eval_episodes": 2, "base_eval_episodes": 0, "sft_steps": 2,
    "demo_episodes": 2, "num_generations": 4, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
    "max_concurrent_rollouts": 4, "max_completion_length": 32, "max_staleness": 0,
}  # fmt: skip
"""Two GRPO steps of one group of four after a two-step warm-up: three pushes (the warm-up's weights and
each step's)."""
ENV_TASKS = ["echo-hi"]
"""Its reward gives partial credit for the target as plain text (`echo_shaped_reward`), so a group of the
barely trained tiny model's rollouts differs in reward and a step trains; on the tool-only echo task every
reward was 0 in two runs of 24 warm-up steps, and nothing was trained."""


@pytest.mark.parametrize("harness", ["env-factory", "mini-swe-agent"])
def test_harbor_train_samples_from_vllm_and_pushes_to_it_after_every_step(harness, tmp_path):
    require_venv()
    config = tmp_path / "run.yaml"
    settings = {**SMALL_RUN, "tasks": ENV_TASKS} if harness == "env-factory" else SMALL_RUN
    config.write_text(json.dumps(settings))  # JSON is YAML
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "harbor_rl", "train", "--engine", "vllm", "--harness", harness,
         "--config", str(config), "--output-dir", str(out)],
        capture_output=True, text=True, timeout=850, env={**os.environ, "HARBOR_RUNS_DIR": str(tmp_path)},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "starting vLLM (CPU build)" in run.stdout

    engine_log = (out / "engine.log").read_text(errors="replace")
    assert re.search(r"vLLM serves 'tiny' at http://127\.0\.0\.1:\d+/v1", engine_log)
    # The warm-up's weights, then each step's: three pushes, each finished and tagged by vLLM itself.
    assert engine_log.count('"POST /finish_weight_update HTTP/1.1" 200') == 3
    assert engine_log.count('"POST /resume HTTP/1.1" 200') >= 3
    sampled = len(re.findall(r'"POST /v1/chat/completions HTTP/1.1" 200', engine_log))

    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2] and steps[-1]["policy_version"] == 3
    trained = [m for m in steps if m.get("num_trained_tokens")]
    if harness == "env-factory":  # the coding tasks need ~70 warm-up steps before a rollout scores
        assert trained, f"no step trained a token: {steps}"
    for m in trained:  # k3 KL(vLLM's sampling || the trainer's logprobs), the mean over trained tokens
        assert m["kl"] < 1e-4, m

    with sqlite3.connect(out / "traces.db") as db:
        calls = db.execute("SELECT COUNT(*) FROM turns").fetchone()[0]
    assert calls > 0 and sampled >= calls  # every captured call was vLLM's
