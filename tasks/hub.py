"""Hugging Face dataset repos laid out as task folders: `tasks/<name>/task.toml ...` (or grouped deeper).

The download follows OpenEnv 0.10's Harbor server (`openenv/harbor/tasks.py`,
`_materialise_hf_dataset`): `snapshot_download(repo, repo_type="dataset", allow_patterns=["tasks/**"])`,
so a repo of rows downloads nothing here and is read as rows instead (`tasks.datasets`). We differ in
where the files land: OpenEnv downloads with `local_dir=` to get real files, because the Hub cache is
a farm of symlinks into `blobs/` and tar uploads keep those links (a sandbox then sees dangling
`test.sh` links). We download into the Hub's own cache, so `HF_HOME`, `HF_HUB_CACHE`,
`HF_HUB_OFFLINE=1` and a pre-filled cache behave as for every `huggingface_hub` user, and copy the
snapshot's `tasks/`, links resolved, to `<cache>/hf-repos/<org>__<name>/<commit>/tasks/` once per
commit; the task loader refuses links that leave a task folder for OpenEnv's reason.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tasks.cache import cache_root, fill_once
from tasks.errors import DatasetError

TASKS_FOLDER = "tasks"
"""Where a task-folder repo keeps its tasks (OpenEnv's layout, `allow_patterns=["tasks/**"]`)."""


class HubSnapshotUnavailable(DatasetError):
    """The repo's snapshot is neither reachable nor cached (offline, or the Hub is down)."""


def hub_task_root(repo: str, *, cache_dir: Path | None = None) -> Path | None:
    """A local folder holding `tasks/` of the Hub dataset `repo`, or None when the repo has no `tasks/`."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        snapshot = Path(snapshot_download(repo, repo_type="dataset", allow_patterns=[f"{TASKS_FOLDER}/**"]))
    except HFValidationError as exc:
        raise DatasetError(f"hf:{repo}: not a Hub repo id (org/name) nor a local dataset: {exc}") from exc
    except (GatedRepoError, RevisionNotFoundError) as exc:
        raise DatasetError(f"hf:{repo}: {exc}") from exc
    except RepositoryNotFoundError as exc:
        raise DatasetError(
            f"hf:{repo}: no dataset repo {repo!r} on the Hub (a private one needs HF_TOKEN)"
        ) from exc
    except LocalEntryNotFoundError as exc:
        from huggingface_hub.constants import is_offline_mode

        why = "HF_HUB_OFFLINE is set" if is_offline_mode() else "the Hub is unreachable"
        raise HubSnapshotUnavailable(f"hf:{repo}: no cached snapshot and {why}") from exc
    if not (snapshot / TASKS_FOLDER).is_dir():
        return None
    # snapshot_download returns `.../snapshots/<commit>`: the commit names our copy.
    target = cache_root(cache_dir) / "hf-repos" / repo.replace("/", "__") / snapshot.name
    return fill_once(target, lambda tmp: _copy_resolved(snapshot / TASKS_FOLDER, tmp / TASKS_FOLDER))


def _copy_resolved(source: Path, target: Path) -> None:
    shutil.copytree(source, target, symlinks=False)
