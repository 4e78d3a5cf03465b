"""Hub ids (`--model ORG/NAME`) resolve through huggingface_hub's cache: offline, a model already in the
cache trains, and a missing one is one line naming the id and how to fetch it. The cache is laid out
here exactly as huggingface_hub lays it out (models--ORG--NAME/{refs/main, snapshots/<commit>/...})."""

from __future__ import annotations

import json
import shutil

import huggingface_hub.constants
import pytest
from typer.testing import CliRunner

from engine.errors import ModelBuildError
from engine.tiny_model import resolve_model_path
from harbor_rl.cli import app

REPO_ID = "harbor-test/tiny-policy"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def offline_hub_cache(tmp_path, tiny_dir, monkeypatch):
    """The tiny model saved in a Hugging Face cache under REPO_ID; the Hub switched off."""
    cache = tmp_path / "hf-cache"
    repo = cache / f"models--{REPO_ID.replace('/', '--')}"
    shutil.copytree(tiny_dir, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    # huggingface_hub reads these at import: the environment alone would not reach this process.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return repo / "snapshots" / COMMIT


def test_a_cached_hub_id_resolves_to_its_snapshot_offline(offline_hub_cache) -> None:
    assert resolve_model_path(REPO_ID) == offline_hub_cache


def test_a_missing_hub_id_names_the_model_and_how_to_fetch_it(offline_hub_cache) -> None:
    with pytest.raises(ModelBuildError, match=r"harbor-test/absent.*hf download harbor-test/absent"):
        resolve_model_path("harbor-test/absent")
    with pytest.raises(ModelBuildError, match="neither 'tiny' nor a local.*nor a Hub id"):
        resolve_model_path("not a model")


def test_harbor_train_with_a_missing_hub_id_is_one_line(offline_hub_cache, tmp_path) -> None:
    result = CliRunner().invoke(app, ["train", "--model", "harbor-test/absent", "-o", str(tmp_path / "o")])
    assert result.exit_code != 0 and "hf download harbor-test/absent" in result.output
    assert "Traceback" not in result.output


def test_harbor_train_runs_offline_from_the_hub_cache(offline_hub_cache, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text(
        "max_steps: 1\nreport_to: jsonl\neval_episodes: 0\nmax_completion_length: 8\nnum_generations: 2\n"
        "per_device_train_batch_size: 2\nmax_concurrent_rollouts: 2\n"
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["train", "--model", REPO_ID, "--config", str(cfg), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "training on cpu, weights float32" in result.output
    (line,) = (out / "metrics.jsonl").read_text().splitlines()
    assert json.loads(line)["step"] == 1
    saved = json.loads((out / "checkpoint-1" / "config.json").read_text())
    assert saved["vocab_size"] == json.loads((offline_hub_cache / "config.json").read_text())["vocab_size"]


def test_harbor_engine_and_sft_take_hub_ids_too(offline_hub_cache, tmp_path) -> None:
    from engine.config import EngineConfig, load_engine

    state = load_engine(EngineConfig(model=REPO_ID))  # what `harbor engine --model ORG/NAME` serves
    assert state.model_path == offline_hub_cache and state.served_name == REPO_ID
    result = CliRunner().invoke(app, ["engine", "--model", "harbor-test/absent"])
    assert result.exit_code == 2 and "hf download harbor-test/absent" in result.output
    result = CliRunner().invoke(
        app, ["sft", str(tmp_path), "--model", "harbor-test/absent", "-o", str(tmp_path)]
    )
    assert result.exit_code != 0 and "hf download harbor-test/absent" in result.output
