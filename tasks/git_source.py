"""Task folders from a git repository at one commit, as Harbor's registry names them.

The fetch follows Harbor's `TaskClient._download_tasks_from_git_url` (laude-institute/harbor,
`src/harbor/tasks/client.py`): a shallow clone without blobs or checkout, a `--no-cone` sparse
checkout of just the task paths, `git fetch --depth 1 origin <commit>`, `git checkout <commit>`, then
each task folder copied out. Where we differ, on purpose:

- the cache is keyed by commit: `<cache>/git-tasks/<sha256(url)[:16]>/<commit>/<path>`. A registry
  entry whose `git_commit_id` is not a full commit id (a branch, a tag, or none: the default branch)
  is resolved to one with `git ls-remote` first; Harbor downloads such tasks again on every run.
- a task already in the cache costs no git call at all, so a registry pinned by commit loads offline
  once fetched.
- git never prompts for credentials (`GIT_TERMINAL_PROMPT=0`): a private or missing repository is an
  error that names it, not a hung server.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path, PurePosixPath

from tasks.cache import fill_once
from tasks.errors import DatasetError

FULL_COMMIT_RE = re.compile(r"^[0-9a-fA-F]{40}$|^[0-9a-fA-F]{64}$")
"""A resolved commit id (SHA-1 or SHA-256), Harbor's `_GIT_COMMIT_RE`."""
GIT_TIMEOUT_S = 600.0
"""Seconds one git command may take (a clone of a large benchmark repository is slow, not stuck)."""


def safe_repo_path(path: str, where: str) -> PurePosixPath:
    """A task's path inside its repository, refused when it is absolute or climbs out with `..`."""
    rel = PurePosixPath(path)
    if not path or rel.is_absolute() or ".." in rel.parts or "\\" in path or rel == PurePosixPath("."):
        raise DatasetError(f"{where}: path {path!r} must be a folder inside the repository")
    return rel


def resolve_commit(git_url: str, ref: str | None) -> str:
    """The commit id `ref` (a full id, a branch or tag name, `HEAD` or None for the default branch) names."""
    if ref is not None and FULL_COMMIT_RE.fullmatch(ref):
        return ref.lower()
    wanted = "HEAD" if ref is None or ref.lower() == "head" else ref  # registries write "HEAD" or "head"
    out = _git("ls-remote", git_url, wanted, what=f"look up {wanted!r} in {git_url}")
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        if name in (wanted, f"refs/heads/{wanted}", f"refs/tags/{wanted}", f"refs/tags/{wanted}^{{}}"):
            return sha
    raise DatasetError(
        f"{git_url} has no branch or tag {wanted!r}; give git_commit_id as a full commit id, "
        "a branch or a tag name"
    )


def fetch_task_folders(git_url: str, commit: str, paths: list[PurePosixPath], cache: Path) -> dict[str, Path]:
    """Each of `paths` at `commit` of `git_url`, as a folder in the cache (fetched once per commit)."""
    base = cache / "git-tasks" / hashlib.sha256(git_url.encode()).hexdigest()[:16] / commit
    targets = {p.as_posix(): base / p for p in paths}
    missing = [p for p in paths if not targets[p.as_posix()].is_dir()]
    if missing:
        scratch = cache / "git-tasks" / ".checkouts"
        scratch.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{commit[:12]}-", dir=scratch))
        try:
            _checkout(git_url, commit, missing, work)
            for rel in missing:
                source = work / rel
                if not source.is_dir():
                    raise DatasetError(f"{git_url} at {commit[:12]} has no folder {rel.as_posix()!r}")
                fill_once(targets[rel.as_posix()], lambda tmp, source=source: _copy_tree(source, tmp))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return targets


def _checkout(git_url: str, commit: str, paths: list[PurePosixPath], work: Path) -> None:
    what = f"fetch {commit[:12]} of {git_url}"
    clone = ["clone", "--no-checkout", "--depth", "1"]
    if "huggingface.co" not in git_url:  # Harbor's note: the Hub's git server has no lazy blob fetch
        clone.append("--filter=blob:none")
    _git(*clone, git_url, str(work), what=what)
    _git("sparse-checkout", "set", "--no-cone", "--stdin", cwd=work, what=what,
         stdin="\n".join(p.as_posix() for p in paths))  # fmt: skip
    _git("fetch", "--depth", "1", "origin", commit, cwd=work, what=what)
    _git("checkout", "--quiet", commit, cwd=work, what=what)


def _copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))


def _git(*args: str, what: str, cwd: Path | None = None, stdin: str | None = None) -> str:
    if shutil.which("git") is None:
        raise DatasetError(f"cannot {what}: git is not installed")
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, input=stdin, capture_output=True, text=True, env=env,
            timeout=GIT_TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise DatasetError(f"cannot {what}: git {args[0]} took over {GIT_TIMEOUT_S:.0f}s") from None
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise DatasetError(f"cannot {what}: git {args[0]} failed: {detail}")
    return done.stdout
