"""Datasets of tasks: a local folder, the built-in tasks, or a Hugging Face dataset.

`load_dataset_spec(spec)` takes one `--dataset` value:

- a named dataset shipped with the package (`NAMED_DATASETS`): `builtin`, the coding tasks in
  `tasks/builtin/` (split `builtin`), or `env-tasks`, the white-box environments of
  `tasks.environments` run by the `env-factory` harness, in `tasks/env-tasks/` (split `env-tasks`), or
  `tiny-coding`, coding tasks whose whole solution is one short command (a one-line fix, a one-line
  function), small enough for the embedded tiny model to learn through a real harness (`tasks/tiny-coding/`);
- `PATH`: a folder of task folders, or one task folder (split: the folder's name);
- `hf:REPO[@split]`: a Hugging Face dataset read with `datasets` (split defaults to `train`). REPO is a
  Hub id, a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`, or a local
  `.json` / `.jsonl` file of rows.

Task ids are stable: the task folder's name, or a row's `task_id`; they are unique within a dataset
and tasks are ordered by id, so an index means the same task on every load.

Row schema of a Hugging Face task dataset (one row = one task folder):

    task_id: string                 stable, unique in the split; letters, digits, '.', '_', '-'
    files:   list of struct          every file of the task folder
        path:     string            relative POSIX path inside the task folder, e.g. "tests/test.sh"
        content:  string            the file's text (or base64 when encoding == "base64")
        encoding: string            "utf-8" or "base64" (for binary files)

`task_to_row(path)` builds such a row from a task folder, so `datasets.Dataset.from_list([...])`
then `push_to_hub` publishes a local dataset. Rows are written out under the cache folder
(`$HARBOR_CACHE_DIR` or `~/.cache/harbor-rl`) in a folder named by the row's content hash, then loaded
like any task, so a malformed row fails exactly as a malformed folder would.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tasks.errors import DatasetError, TaskFormatError, TaskNotFound
from tasks.loader import Task, load_task

BUILTIN_DIR = Path(__file__).parent / "builtin"
ENV_TASKS_DIR = Path(__file__).parent / "env-tasks"
TINY_CODING_DIR = Path(__file__).parent / "tiny-coding"
NAMED_DATASETS: dict[str, Path] = {
    "builtin": BUILTIN_DIR,
    "env-tasks": ENV_TASKS_DIR,
    "tiny-coding": TINY_CODING_DIR,
}
"""The datasets shipped with the package, by the name `--dataset` takes (the name is also the split)."""
_TASK_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SKIPPED_PARTS = {"__pycache__", ".pytest_cache", ".git"}


@dataclass(frozen=True)
class Dataset:
    """An ordered, id-addressable set of tasks from one source and split."""

    source: str
    split: str
    tasks: tuple[Task, ...]

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self):
        return iter(self.tasks)

    def __getitem__(self, index: int) -> Task:
        try:
            return self.tasks[index]
        except IndexError:
            raise TaskNotFound(
                f"{self.source} split {self.split!r} has {len(self)} tasks, no index {index}"
            ) from None

    @property
    def ids(self) -> list[str]:
        return [task.id for task in self.tasks]

    def get(self, task_id: str) -> Task:
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise TaskNotFound(f"{self.source} split {self.split!r} has no task {task_id!r}")


def load_dataset_spec(spec: str, *, split: str | None = None, cache_dir: Path | None = None) -> Dataset:
    """Resolve one `--dataset` value (see the module docstring)."""
    if spec in NAMED_DATASETS:
        return load_folder(NAMED_DATASETS[spec], split=split or spec, source=spec)
    if spec.startswith("hf:"):
        repo, _, at_split = spec[3:].partition("@")
        if not repo:
            raise DatasetError(f"dataset spec {spec!r}: expected hf:REPO[@split]")
        return load_hf(repo, split=split or at_split or "train", cache_dir=cache_dir)
    path = Path(spec).expanduser()
    if not path.is_dir():
        names = ", ".join(repr(n) for n in NAMED_DATASETS)
        raise DatasetError(
            f"dataset {spec!r} is neither a named dataset ({names}), 'hf:REPO[@split]' nor an existing folder"
        )
    return load_folder(path, split=split or path.absolute().name, source=str(path))


def task_dirs(folder: Path) -> list[Path]:
    """The task folders of a dataset folder (itself, when it is one task), sorted by name."""
    folder = Path(folder)
    if (folder / "task.toml").is_file():
        return [folder]
    return sorted(p for p in folder.iterdir() if p.is_dir() and (p / "task.toml").is_file())


def load_folder(folder: Path, *, split: str, source: str) -> Dataset:
    dirs = task_dirs(folder)
    if not dirs:
        raise DatasetError(f"{folder} holds no task folders (folders with a task.toml)")
    return _dataset(source, split, [load_task(d) for d in dirs])


def _dataset(source: str, split: str, tasks: list[Task]) -> Dataset:
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise DatasetError(f"{source} split {split!r}: task id {task.id!r} appears twice")
        seen.add(task.id)
    return Dataset(source=source, split=split, tasks=tuple(sorted(tasks, key=lambda t: t.id)))


# --- Hugging Face -----------------------------------------------------------------------------


def task_to_row(task_dir: Path, task_id: str | None = None) -> dict[str, Any]:
    """One dataset row (see the module docstring) holding every file of `task_dir`."""
    task_dir = Path(task_dir)
    files = []
    for file in sorted(p for p in task_dir.rglob("*") if p.is_file()):
        rel = file.relative_to(task_dir)
        if _SKIPPED_PARTS & set(rel.parts):
            continue
        data = file.read_bytes()
        try:
            files.append({"path": rel.as_posix(), "content": data.decode("utf-8"), "encoding": "utf-8"})
        except UnicodeDecodeError:
            files.append(
                {"path": rel.as_posix(), "content": base64.b64encode(data).decode(), "encoding": "base64"}
            )
    return {"task_id": task_id or task_dir.name, "files": files}


def load_hf(repo: str, *, split: str, cache_dir: Path | None = None) -> Dataset:
    rows = _hf_rows(repo, split)
    source = f"hf:{repo}"
    root = (cache_dir or _cache_root()) / "hf-tasks"
    tasks = [_materialize_row(row, index, source, split, root) for index, row in enumerate(rows)]
    if not tasks:
        raise DatasetError(f"{source} split {split!r} has no rows")
    return _dataset(source, split, tasks)


def _cache_root() -> Path:
    return Path(os.environ.get("HARBOR_CACHE_DIR", Path.home() / ".cache" / "harbor-rl"))


def _hf_rows(repo: str, split: str) -> list[dict[str, Any]]:
    import datasets  # heavy (pyarrow, pandas): only when a Hugging Face dataset is asked for

    local = Path(repo).expanduser()
    try:
        if local.is_file() and local.suffix in (".json", ".jsonl"):
            loaded = datasets.load_dataset("json", data_files={split: str(local)}, split=split)
        elif local.is_dir():
            loaded = datasets.load_from_disk(str(local))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise DatasetError(f"hf:{repo} has splits {sorted(loaded)}, not {split!r}")
                loaded = loaded[split]
        else:
            loaded = datasets.load_dataset(repo, split=split)
    except (FileNotFoundError, ValueError) as exc:
        raise DatasetError(f"hf:{repo} split {split!r} could not be loaded: {exc}") from exc
    return [dict(row) for row in loaded]


def _materialize_row(row: dict[str, Any], index: int, source: str, split: str, root: Path) -> Task:
    where = f"{source}@{split} row {index}"
    task_id = row.get("task_id")
    if not isinstance(task_id, str) or not _TASK_ID_RE.match(task_id):
        raise TaskFormatError(
            where, f"task_id must be a non-empty string of [A-Za-z0-9._-], got {task_id!r}", "task_id"
        )
    files = row.get("files")
    if not isinstance(files, list) or not files:
        raise TaskFormatError(where, "files must be a non-empty list of {path, content, encoding}", "files")
    decoded = {rel: data for rel, data in (_decode_file(f, i, where) for i, f in enumerate(files))}
    if len(decoded) != len(files):
        raise TaskFormatError(where, "two files share one path", "files")
    digest = hashlib.sha256(json.dumps([task_id, sorted(decoded)]).encode())
    for rel in sorted(decoded):
        digest.update(decoded[rel])
    folder = root / digest.hexdigest()[:24] / task_id
    if not (folder.parent / ".complete").exists():
        for rel, data in decoded.items():
            target = folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            if rel.endswith(".sh"):
                target.chmod(0o755)
        (folder.parent / ".complete").touch()
    return load_task(folder, task_id=task_id)


def _decode_file(entry: Any, i: int, where: str) -> tuple[str, bytes]:
    key = f"files[{i}]"
    if not isinstance(entry, dict):
        raise TaskFormatError(where, "must be a struct {path, content, encoding}", key)
    path, content = entry.get("path"), entry.get("content")
    encoding = entry.get("encoding") or "utf-8"
    if not isinstance(path, str) or not isinstance(content, str):
        raise TaskFormatError(where, "path and content must be strings", key)
    rel = PurePosixPath(path)
    if not path or rel.is_absolute() or ".." in rel.parts or "\\" in path:
        raise TaskFormatError(where, f"path {path!r} escapes the task folder", f"{key}.path")
    if encoding == "utf-8":
        return rel.as_posix(), content.encode("utf-8")
    if encoding == "base64":
        try:
            return rel.as_posix(), base64.b64decode(content, validate=True)
        except ValueError as exc:
            raise TaskFormatError(where, f"content is not valid base64 ({exc})", f"{key}.content") from exc
    raise TaskFormatError(where, f"encoding must be 'utf-8' or 'base64', got {encoding!r}", f"{key}.encoding")
