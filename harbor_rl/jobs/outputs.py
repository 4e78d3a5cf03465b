"""What a job keeps when its container goes: the outputs uploaded to a Hub model repo (`push_to_hub`).

One commit holds the final checkpoint (or every `checkpoint-*` with `push_all_checkpoints`), the
trainer's `metrics.jsonl` and `trace_summary.json` (the trace store's sessions by status and purpose,
and the train rollouts' rewards). It runs after the trainer exits, also when it failed, so what a broken
run produced is not lost with it.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harbor_rl.jobs.config import RunConfig
from harbor_rl.jobs.hub import hub_call

if TYPE_CHECKING:
    from huggingface_hub import HfApi

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
SUMMARY_FILE = "trace_summary.json"


def checkpoints(output_dir: Path) -> list[Path]:
    """The trainer's `checkpoint-<step>` folders, oldest step first."""
    found = [
        (int(m.group(1)), p) for p in output_dir.glob("checkpoint-*") if (m := _CHECKPOINT.match(p.name))
    ]
    return [p for _, p in sorted(found) if p.is_dir()]


def trace_summary(store_url: str) -> dict[str, Any]:
    """Counts of the store's sessions by status and purpose, and the train rollouts' rewards."""
    from capture_proxy.store import TraceStore

    store = TraceStore(store_url)
    try:
        sessions, offset = [], 0
        while page := store.list_sessions(limit=1000, offset=offset):
            sessions += page
            offset += len(page)
    finally:
        store.close()
    rewards = [s.reward for s in sessions if s.purpose == "train" and s.reward is not None]
    return {
        "sessions": len(sessions),
        "by_status": dict(Counter(s.status for s in sessions)),
        "by_purpose": dict(Counter(s.purpose for s in sessions)),
        "train_rewards": {
            "scored": len(rewards),
            "mean": statistics.fmean(rewards) if rewards else None,
        },
    }


def push_outputs(api: HfApi, config: RunConfig, on_event: Callable[[str], None]) -> str | None:
    """Upload the run's outputs to `config.push_to_hub` in one commit; returns the commit URL (None when
    there was nothing to upload)."""
    from huggingface_hub import CommitOperationAdd

    repo_id = config.push_to_hub
    assert repo_id is not None
    out = Path(config.resolved_output_dir)
    saved = checkpoints(out)
    folders = saved if config.push_all_checkpoints else saved[-1:]
    operations = [
        CommitOperationAdd(
            path_in_repo=f"{folder.name}/{file.relative_to(folder)}", path_or_fileobj=str(file)
        )
        for folder in folders
        for file in sorted(folder.rglob("*"))
        if file.is_file()
    ]
    if (out / "metrics.jsonl").is_file():
        operations.append(
            CommitOperationAdd(path_in_repo="metrics.jsonl", path_or_fileobj=str(out / "metrics.jsonl"))
        )
    store_url = config.store_url or f"sqlite:///{config.work_dir}/traces.db"
    if config.store_url or Path(config.work_dir, "traces.db").is_file():
        summary = json.dumps(trace_summary(store_url), indent=2).encode()
        operations.append(CommitOperationAdd(path_in_repo=SUMMARY_FILE, path_or_fileobj=summary))
    if not operations:
        on_event(f"nothing to push to {repo_id}: no checkpoint, metrics or trace store in {out}")
        return None
    hub_call(
        f"creating {repo_id}",
        lambda: api.create_repo(repo_id, repo_type="model", private=config.hub_private, exist_ok=True),
    )
    names = ", ".join(f.name for f in folders) or "no checkpoint"
    commit = hub_call(
        f"uploading the outputs to {repo_id}",
        lambda: api.create_commit(
            repo_id, operations=operations, repo_type="model",
            commit_message=f"{config.run_name}: {names}, metrics and trace summary",
        ),
    )  # fmt: skip
    url = getattr(commit, "commit_url", None) or f"https://huggingface.co/{repo_id}"
    on_event(f"pushed {len(operations)} file(s) ({names}) to {url}")
    return url
