"""Datasets: the built-in tasks, local folders, and Hugging Face datasets the tests create and save locally.

The Hub is unreachable here, so `hf:` specs point at datasets written with `save_to_disk` or as JSON
lines; both go through the real `datasets` library, the same code path a Hub repo takes after download.
"""

from __future__ import annotations

import base64
import json

import pytest

from tasks import (
    BUILTIN_DIR,
    DatasetError,
    TaskFormatError,
    TaskNotFound,
    load_dataset_spec,
    load_task,
    task_to_row,
)

datasets = pytest.importorskip("datasets")


def test_builtin_has_at_least_12_tasks_of_different_kinds():
    dataset = load_dataset_spec("builtin")
    assert dataset.split == "builtin" and len(dataset) >= 12
    assert dataset.ids == sorted(dataset.ids)
    kinds = {task.config.metadata.get("category") for task in dataset}
    assert {"bugfix", "implement", "failing-tests", "refactor", "file-format", "cli", "shell"} <= kinds
    for task in dataset:
        assert task.paths.has_solution, task.id
        assert "FROM harbor-rl/sandbox-base:bookworm" in task.paths.dockerfile.read_text()
        assert any(task.paths.tests_dir.glob("test_*.py")), task.id


def test_ids_are_stable_across_loads_and_addressable():
    first, second = load_dataset_spec("builtin"), load_dataset_spec("builtin")
    assert first.ids == second.ids
    assert first.get("fix-pagination").id == "fix-pagination"
    assert first[0].id == first.ids[0]
    with pytest.raises(TaskNotFound):
        first.get("no-such-task")
    with pytest.raises(TaskNotFound):
        first[len(first)]


def test_local_folder_dataset(make_task, tmp_path):
    make_task("beta")
    make_task("alpha")
    (tmp_path / "tasks" / "not-a-task").mkdir()
    dataset = load_dataset_spec(str(tmp_path / "tasks"))
    assert dataset.ids == ["alpha", "beta"] and dataset.split == "tasks"
    assert load_dataset_spec(str(tmp_path / "tasks"), split="dev").split == "dev"


def test_a_single_task_folder_is_a_dataset(make_task):
    root = make_task("solo")
    assert load_dataset_spec(str(root)).ids == ["solo"]


def test_unknown_spec_and_empty_folder(tmp_path):
    with pytest.raises(DatasetError, match="neither"):
        load_dataset_spec(str(tmp_path / "missing"))
    with pytest.raises(DatasetError, match="no task folders"):
        load_dataset_spec(str(tmp_path))


def test_a_malformed_task_is_listed_and_the_rest_load(make_task, tmp_path):
    make_task("good")
    make_task("bad", files={"instruction.md": None})
    dataset = load_dataset_spec(str(tmp_path / "tasks"))
    assert dataset.ids == ["good"]
    assert [r.task_id for r in dataset.refused] == ["bad"] and "instruction.md" in dataset.refused[0].reason
    with pytest.raises(TaskNotFound, match="was refused: .*instruction.md"):
        dataset.get("bad")
    with pytest.raises(DatasetError, match="'bad' is refused: .*instruction.md"):
        load_dataset_spec(str(tmp_path / "tasks"), strict=True)


def _builtin_rows(n=3):
    return [task_to_row(task.paths.root) for task in list(load_dataset_spec("builtin"))[:n]]


def test_hf_dataset_saved_to_disk_round_trips_the_task_files(tmp_path):
    rows = _builtin_rows()
    saved = tmp_path / "hf-saved"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(saved))
    loaded = load_dataset_spec(f"hf:{saved}@test", cache_dir=tmp_path / "cache")
    assert loaded.split == "test" and loaded.source == f"hf:{saved}"
    assert loaded.ids == sorted(row["task_id"] for row in rows)
    for task in loaded:
        original = load_task(BUILTIN_DIR / task.id)
        assert task.digest() == original.digest()
        assert task.instruction == original.instruction
        assert task.config == original.config
    again = load_dataset_spec(f"hf:{saved}@test", cache_dir=tmp_path / "cache")
    assert [t.paths.root for t in again] == [t.paths.root for t in loaded]  # same content, same folder


def test_hf_missing_split(tmp_path):
    saved = tmp_path / "hf-saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(_builtin_rows(1))}).save_to_disk(str(saved))
    with pytest.raises(DatasetError, match="not 'test'"):
        load_dataset_spec(f"hf:{saved}@test", cache_dir=tmp_path / "cache")
    assert len(load_dataset_spec(f"hf:{saved}", cache_dir=tmp_path / "cache")) == 1  # default split: train


def test_hf_json_rows_with_a_binary_file(tmp_path, make_task):
    root = make_task("with-binary")
    (root / "environment" / "blob.bin").write_bytes(bytes(range(256)))
    row = task_to_row(root, task_id="custom-id")
    assert {
        "path": "environment/blob.bin",
        "content": base64.b64encode(bytes(range(256))).decode(),
        "encoding": "base64",
    } in row["files"]
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(row) + "\n")
    loaded = load_dataset_spec(f"hf:{data}@validation", cache_dir=tmp_path / "cache")
    assert loaded.split == "validation" and loaded.ids == ["custom-id"]
    assert (loaded[0].paths.environment_dir / "blob.bin").read_bytes() == bytes(range(256))


def _save_rows(tmp_path, rows):
    saved = tmp_path / "bad"
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    return f"hf:{saved}"


@pytest.mark.parametrize(
    ("mutate", "key", "words"),
    [
        (
            lambda row: row["files"].append({"path": "../escape.sh", "content": "x", "encoding": "utf-8"}),
            "files[",
            "escapes",
        ),
        (
            lambda row: row["files"].append({"path": "/etc/cron.d/x", "content": "x", "encoding": "utf-8"}),
            "files[",
            "escapes",
        ),
        (
            lambda row: row["files"].append({"path": "blob", "content": "%%%", "encoding": "base64"}),
            ".content",
            "base64",
        ),
        (
            lambda row: row["files"].append({"path": "x", "content": "x", "encoding": "latin-1"}),
            ".encoding",
            "encoding",
        ),
        (lambda row: row.update(task_id="has space"), "task_id", "task_id"),
    ],
)
def test_hf_malformed_rows_name_row_and_field(tmp_path, mutate, key, words):
    row = task_to_row(BUILTIN_DIR / "fix-pagination")
    mutate(row)
    with pytest.raises(TaskFormatError) as info:
        load_dataset_spec(_save_rows(tmp_path, [row]), cache_dir=tmp_path / "cache")
    assert "row 0" in info.value.file
    assert key in info.value.key and words in info.value.problem


def test_hf_row_with_a_malformed_task_fails_like_a_folder(tmp_path):
    row = task_to_row(BUILTIN_DIR / "fix-pagination")
    row["files"] = [f for f in row["files"] if f["path"] != "tests/test.sh"]
    with pytest.raises(TaskFormatError, match="tests/test.sh"):
        load_dataset_spec(_save_rows(tmp_path, [row]), cache_dir=tmp_path / "cache")


def test_hf_duplicate_task_ids(tmp_path):
    row = task_to_row(BUILTIN_DIR / "fix-pagination")
    with pytest.raises(DatasetError, match="appears twice"):
        load_dataset_spec(_save_rows(tmp_path, [row, row]), cache_dir=tmp_path / "cache")
