"""`harbor train`: settings from YAML and flags, clear errors for bad ones, and the embedded default end
to end (real engine, real harbor serve, env-factory harness, gloo weight sync) on a tiny budget."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from harbor_rl.cli import app
from trainer.errors import TrainerConfigError
from trainer.run import split_settings


def test_one_mapping_splits_into_run_and_grpo_settings() -> None:
    run, grpo = split_settings({"model": "tiny", "split": "env-tasks", "max_steps": 3, "num_generations": 2,
                                "per_device_train_batch_size": 2})  # fmt: skip
    assert (run.model, run.split, grpo.max_steps, grpo.num_generations) == ("tiny", "env-tasks", 3, 2)
    with pytest.raises(TrainerConfigError, match="no_such_setting"):
        split_settings({"no_such_setting": 1})


def test_reward_curve_png(tmp_path) -> None:
    from PIL import Image

    from trainer.plot import reward_curve_png

    path = reward_curve_png(
        [{"step": 1, "reward": 0.1}, {"step": 2}, {"step": 3, "reward": 0.4}], tmp_path / "c.png"
    )
    assert Image.open(path).size == (640, 360)
    assert reward_curve_png([{"step": 1}], tmp_path / "none.png") is None


def test_bad_settings_are_named(tmp_path) -> None:
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text("epsilon: 5\n")
    result = CliRunner().invoke(app, ["train", "--config", str(cfg), "--server-url", "http://127.0.0.1:1"])
    assert result.exit_code != 0 and "epsilon" in result.output
    result = CliRunner().invoke(app, ["train", "--set", "no-equals-sign"])
    assert result.exit_code != 0 and "KEY=VALUE" in result.output


@pytest.mark.slow
def test_embedded_default_runs_end_to_end(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text("max_steps: 2\nreport_to: jsonl\neval_episodes: 2\nmax_completion_length: 16\n")
    result = CliRunner().invoke(app, ["train", "--config", str(cfg), "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "before" in result.output and "after" in result.output
    lines = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2] and lines[-1]["policy_version"] == 3
    assert (tmp_path / "out" / "checkpoint-2" / "model.safetensors").is_file()
    assert (tmp_path / "out" / "reward_curve.png").stat().st_size > 0
