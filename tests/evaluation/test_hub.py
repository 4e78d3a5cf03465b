"""`--push-to-hub`: the exact calls made on `huggingface_hub.HfApi` and the dataset card they upload.

The Hub cannot be reached from here, so HfApi is an autospec'd mock (its real signatures are
enforced: a wrong argument name fails the test); the card is checked by parsing its YAML."""

from __future__ import annotations

import json
from unittest import mock

import pytest
import yaml
from huggingface_hub import HfApi
from typer.testing import CliRunner

from evaluation.hub import dataset_card, push_to_hub
from harbor_rl.cli import app


def _folder(tmp_path):
    folder = tmp_path / "sft"
    folder.mkdir()
    (folder / "results.jsonl").write_text('{"episode_id": "episode-000000"}\n')
    (folder / "metadata.json").write_text(json.dumps({"provider": "scripted", "num_written": 1}))
    (folder / "stray.txt").write_text("not part of the dataset")
    return folder


def test_push_creates_the_repo_and_uploads_the_dataset_with_its_card(tmp_path):
    folder = _folder(tmp_path)
    api = mock.create_autospec(HfApi, instance=True)
    url = push_to_hub(folder, "me/harbor-sft", private=True, api=api)
    assert url == "https://huggingface.co/datasets/me/harbor-sft"
    assert api.mock_calls == [
        mock.call.create_repo(repo_id="me/harbor-sft", repo_type="dataset", private=True, exist_ok=True),
        mock.call.upload_folder(
            repo_id="me/harbor-sft",
            repo_type="dataset",
            folder_path=str(folder),
            allow_patterns=["results.jsonl", "metadata.json", "README.md"],
            commit_message="harbor collect: 1 episodes",
        ),
    ]
    card = (folder / "README.md").read_text()
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["configs"] == [
        {"config_name": "default", "data_files": [{"split": "train", "path": "results.jsonl"}]}
    ]
    assert 'load_dataset("me/harbor-sft", split="train")' in card


def test_push_without_results_is_refused(tmp_path):
    api = mock.create_autospec(HfApi, instance=True)
    with pytest.raises(FileNotFoundError, match="run harbor collect first"):
        push_to_hub(tmp_path, "me/x", api=api)
    assert api.mock_calls == []


def test_cli_push_to_hub_uses_hf_token(tmp_path, runs_dir, store_url, monkeypatch):
    """`harbor collect ... --push-to-hub` after a real scripted collect; HfApi is the autospec'd class."""
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    out = tmp_path / "sft"
    with mock.patch("huggingface_hub.HfApi", autospec=True) as api_class:
        result = CliRunner().invoke(
            app,
            [
                "collect",
                "--provider",
                "scripted",
                "-n",
                "1",
                "--output-dir",
                str(out),
                "--store",
                store_url,
                "--push-to-hub",
                "me/harbor-sft",
            ],  # fmt: skip
            catch_exceptions=False,
        )
    assert result.exit_code == 0, result.output
    api_class.assert_called_once_with(token="hf_test_token")
    api = api_class.return_value
    assert [c[0] for c in api.mock_calls] == ["create_repo", "upload_folder"]
    assert api.upload_folder.call_args.kwargs["folder_path"] == str(out)
    assert (out / "README.md").read_text() == dataset_card(
        "me/harbor-sft", json.loads((out / "metadata.json").read_text())
    )
