"""Harbor's dataset registry: `--dataset NAME@VERSION` as the task folders the registry names.

The registry is Harbor's `registry.json`, a JSON list of datasets; the models below follow Harbor's
`DatasetSpec` and `RegistryTaskId` (laude-institute/harbor, `src/harbor/models/registry.py`):

    [{"name": "terminal-bench", "version": "2.0", "description": "...",
      "tasks": [{"name": "hello-world", "git_url": "https://github.com/org/repo.git",
                 "git_commit_id": "<40 hex>", "path": "tasks/hello-world"}, ...],
      "metrics": [...]}, ...]

A task with a `git_url` is fetched from that repository at `git_commit_id` (`tasks.git_source`, cached
by commit); one without is a local folder (Harbor's `LocalTaskId`), relative to the registry file's
folder (Harbor: to the working directory, which is what a registry fetched from a URL gets here too).

Which registry: `$HARBOR_REGISTRY_PATH` (a local file; `harbor --registry-path FILE` sets it), else
`$HARBOR_REGISTRY_URL` (`--registry-url`), else Harbor's public registry (`DEFAULT_REGISTRY_URL`, the
default of Harbor's `RemoteRegistryInfo`). A fetched registry is kept in the cache; with
`HARBOR_OFFLINE=1`, or when the fetch fails, that copy is used, and without one the error says to give
`--registry-path`. OpenEnv 0.10's Harbor server resolves the same `name@version` through Harbor's
`DatasetConfig.get_task_configs` (`openenv/harbor/tasks.py`, `_registry_task_dirs`).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from tasks.cache import cache_root
from tasks.errors import DatasetError
from tasks.git_source import fetch_task_folders, resolve_commit, safe_repo_path
from tasks.loader import TASK_ID_RE

DEFAULT_REGISTRY_URL = "https://raw.githubusercontent.com/laude-institute/harbor/main/registry.json"
REGISTRY_PATH_ENV = "HARBOR_REGISTRY_PATH"
REGISTRY_URL_ENV = "HARBOR_REGISTRY_URL"
OFFLINE_ENV = "HARBOR_OFFLINE"
REGISTRY_SPEC_RE = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._/-]*)@(?P<version>[A-Za-z0-9][A-Za-z0-9._+-]*)$"
)
"""`terminal-bench@2.0`: what `--dataset` takes as a registry dataset (a folder of that name wins)."""
_FETCH_TIMEOUT_S = 30.0


class RegistryTask(BaseModel):
    """One task of a registry dataset (Harbor's `RegistryTaskId`)."""

    model_config = ConfigDict(extra="ignore")

    name: str
    git_url: str | None = None
    git_commit_id: str | None = None
    """A full commit id, a branch or tag, or None (the repository's default branch)."""
    path: str
    """The task folder inside the repository (or on disk, without `git_url`)."""


class RegistryDataset(BaseModel):
    """One `name@version` of the registry (Harbor's `DatasetSpec`)."""

    model_config = ConfigDict(extra="ignore")

    name: str
    version: str
    description: str
    tasks: list[RegistryTask]
    metrics: list[dict] = []


@dataclass(frozen=True)
class Registry:
    source: str
    """The file or URL it was read from (for messages)."""
    base_dir: Path
    """What a local task's relative path is relative to."""
    datasets: tuple[RegistryDataset, ...]

    def find(self, name: str, version: str) -> RegistryDataset:
        """The dataset `name@version`; an error that lists what the registry has when it is not there."""
        versions = [d.version for d in self.datasets if d.name == name]
        for dataset in self.datasets:
            if dataset.name == name and dataset.version == version:
                return dataset
        if versions:
            raise DatasetError(
                f"registry {self.source} has no version {version!r} of {name!r}; "
                f"its versions: {', '.join(sorted(versions))}"
            )
        names = sorted({d.name for d in self.datasets})
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        shown = ", ".join(names[:30]) + (f" and {len(names) - 30} more" if len(names) > 30 else "")
        raise DatasetError(
            f"registry {self.source} has no dataset {name!r}; {hint}it has: {shown or 'none'} "
            f"(another registry: --registry-path FILE or --registry-url URL)"
        )


def parse_registry(text: str, source: str, base_dir: Path) -> Registry:
    """A registry from its JSON text; malformed JSON or entries name the source and the entry."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"registry {source} is not JSON: {exc}") from exc
    if not isinstance(raw, list):
        raise DatasetError(f"registry {source}: expected a JSON list of datasets, got {type(raw).__name__}")
    datasets = []
    for index, entry in enumerate(raw):
        try:
            datasets.append(RegistryDataset.model_validate(entry))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
            raise DatasetError(f"registry {source}: entry [{index}]{where}: {first['msg']}") from exc
    return Registry(source=source, base_dir=base_dir, datasets=tuple(datasets))


def load_registry(
    *, path: Path | None = None, url: str | None = None, cache_dir: Path | None = None
) -> Registry:
    """The registry at `path`, else at `url`, else the one the environment names (see the module doc)."""
    path = path or (Path(os.environ[REGISTRY_PATH_ENV]) if os.environ.get(REGISTRY_PATH_ENV) else None)
    if path is not None:
        path = Path(path).expanduser()
        if not path.is_file():
            raise DatasetError(f"registry file {path} does not exist")
        return parse_registry(path.read_text(encoding="utf-8"), str(path), path.absolute().parent)
    url = url or os.environ.get(REGISTRY_URL_ENV) or DEFAULT_REGISTRY_URL
    return parse_registry(_fetch_registry(url, cache_root(cache_dir)), url, Path.cwd())


def _fetch_registry(url: str, cache: Path) -> str:
    """The registry's text from `url`, kept in the cache; the cached copy when offline or unreachable."""
    copy = cache / "registry" / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}.json"
    problem = f"{OFFLINE_ENV} is set"
    if not _offline():
        try:
            response = httpx.get(url, timeout=_FETCH_TIMEOUT_S, follow_redirects=True)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            problem = f"fetching it failed ({exc})"
        else:
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(response.text, encoding="utf-8")
            return response.text
    if copy.is_file():
        return copy.read_text(encoding="utf-8")
    raise DatasetError(
        f"cannot read the registry {url}: {problem} and no copy is cached; "
        "give a local registry file with --registry-path FILE"
    )


def _offline() -> bool:
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def registry_task_dirs(
    name: str, version: str, *, registry: Registry | None = None, cache_dir: Path | None = None
) -> list[tuple[str, Path]]:
    """(task id, folder) for every task of `name@version`, git tasks fetched into the cache."""
    registry = registry or load_registry(cache_dir=cache_dir)
    dataset = registry.find(name, version)
    if not dataset.tasks:
        raise DatasetError(f"registry {registry.source}: {name}@{version} lists no tasks")
    cache = cache_root(cache_dir)
    where = f"registry {registry.source} {name}@{version}"
    found: dict[int, Path] = {}
    # One checkout per repository and commit, however many tasks it holds (as Harbor groups them).
    by_commit: dict[tuple[str, str], list[tuple[int, PurePosixPath]]] = {}
    resolved: dict[tuple[str, str | None], str] = {}
    for index, task in enumerate(dataset.tasks):
        if task.git_url is None:
            found[index] = _local_task(task, registry.base_dir, where)
            continue
        rel = safe_repo_path(task.path, f"{where} task {task.name!r}")
        key = (task.git_url, task.git_commit_id)
        if key not in resolved:
            resolved[key] = _in(where, resolve_commit, task.git_url, task.git_commit_id)
        by_commit.setdefault((task.git_url, resolved[key]), []).append((index, rel))
    for (git_url, commit), members in by_commit.items():
        folders = _in(where, fetch_task_folders, git_url, commit, [rel for _, rel in members], cache)
        for index, rel in members:
            found[index] = folders[rel.as_posix()]
    return [(task_id(task, found[i]), found[i]) for i, task in enumerate(dataset.tasks)]


def _in(where: str, fetch, *args):
    """`fetch(*args)`, its error prefixed with the dataset it was fetching for."""
    try:
        return fetch(*args)
    except DatasetError as exc:
        raise DatasetError(f"{where}: {exc}") from exc


def _local_task(task: RegistryTask, base_dir: Path, where: str) -> Path:
    folder = Path(task.path).expanduser()
    folder = folder if folder.is_absolute() else base_dir / folder
    if not folder.is_dir():
        raise DatasetError(f"{where}: local task {task.name!r} has no folder {folder}")
    return folder


def task_id(task: RegistryTask, folder: Path) -> str:
    """The registry's task name (its last `/` part) where it is a valid id, else the folder's name."""
    name = task.name.rsplit("/", 1)[-1]
    return name if TASK_ID_RE.fullmatch(name) else folder.name
