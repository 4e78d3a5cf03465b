"""The harbor-rl a job installs by default: the wheel of the checkout being launched (harbor-rl is not on
PyPI), uploaded to the user's Hub repo and installed on the job by its commit and sha256.

    wheel = hub.ship_checkout(api, config, say)   # at launch: build, upload; a WheelRef
    wheel_env(wheel), INSTALL_COMMAND             # what the job is told, and runs before the launcher

The repo is `wheel_repo`, else `push_to_hub` (the run's output repo), else `<namespace or your
user>/harbor-rl-wheels`, created private if missing. The wheel goes under `wheels/`; the job downloads
it with huggingface_hub at that exact commit (HF_TOKEN, a secret of the job, reads a private repo) and
checks its sha256 before `pip install`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import harbor_rl
from harbor_rl.jobs.errors import JobConfigError, LauncherError

if TYPE_CHECKING:
    from harbor_rl.jobs.config import LaunchConfig

DEFAULT_REPO_NAME = "harbor-rl-wheels"
EXTRAS = "e2b"
PENDING_REVISION = "<commit of the upload>"
PENDING_SHA256 = "<sha256 of the wheel>"


@dataclass(frozen=True)
class WheelRef:
    """A wheel on the Hub, pinned: repo, file, commit and content hash."""

    repo_id: str
    path_in_repo: str
    revision: str
    sha256: str

    @property
    def name(self) -> str:
        return self.path_in_repo.rpartition("/")[2]


def checkout_root() -> Path | None:
    """The source checkout harbor_rl runs from (a pyproject.toml naming harbor-rl above the package),
    None when it runs from an installed wheel."""
    root = Path(harbor_rl.__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        name = tomllib.loads(pyproject.read_text())["project"]["name"]
    except (OSError, tomllib.TOMLDecodeError, KeyError):
        return None
    return root if name == "harbor-rl" else None


def checkout_version(root: Path) -> str:
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]


def wheel_file_name(version: str) -> str:
    """setuptools' name for this project's pure-Python wheel."""
    return f"harbor_rl-{version}-py3-none-any.whl"


def wheel_repo(config: LaunchConfig, user: str | None) -> str:
    """Where the wheel goes; `user` None (a dry run asks the Hub nothing) shows a placeholder."""
    if config.wheel_repo:
        return config.wheel_repo
    if config.push_to_hub:
        return config.push_to_hub
    return f"{config.namespace or user or '<your user>'}/{DEFAULT_REPO_NAME}"


def pending_ref(config: LaunchConfig) -> WheelRef:
    """What the dry run shows: the wheel that launching would build and upload."""
    root = required_checkout()
    name = wheel_file_name(checkout_version(root))
    return WheelRef(wheel_repo(config, None), f"wheels/{name}", PENDING_REVISION, PENDING_SHA256)


def required_checkout() -> Path:
    root = checkout_root()
    if root is None:
        raise JobConfigError(
            "harbor-rl runs from an installed package, not a source checkout, so there is no wheel to "
            "build for the job: pass --install SPEC (a pip requirement the job can install) or --image"
        )
    return root


_NOT_SOURCE = ("build", "dist", "*.egg-info", ".git", ".venv", "runs", "__pycache__", ".cache", ".pytest_cache",
               ".ruff_cache")  # fmt: skip
"""Left out of the copy a wheel is built from: setuptools reuses `build/lib`, where a module deleted
from the checkout would live on."""


def build_wheel(root: Path, out_dir: Path) -> Path:
    """`pip wheel` of a clean copy of the checkout (no dependencies; setuptools from this environment
    when it has one, so no index is needed)."""
    source = out_dir / "source"
    shutil.copytree(root, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE), symlinks=True)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(out_dir), str(source)]
    if importlib.util.find_spec("setuptools") is not None:
        command.insert(4, "--no-build-isolation")
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    wheels = sorted(out_dir.glob("harbor_rl-*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        raise LauncherError(
            f"building the wheel of {root} failed (pip exited {result.returncode}): {result.stderr.strip()[-800:]}"
        )
    return wheels[0]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


WHEEL_DIR = "/tmp/harbor-wheel"
INSTALL_COMMAND = (
    'hf download "$HARBOR_WHEEL_REPO" "$HARBOR_WHEEL_FILE" --revision "$HARBOR_WHEEL_REVISION" '
    f"--local-dir {WHEEL_DIR} >/dev/null"
    f' && echo "$HARBOR_WHEEL_SHA256  {WHEEL_DIR}/$HARBOR_WHEEL_FILE" | sha256sum --check --quiet -'
    f' && python3 -m pip install --no-cache-dir "{WHEEL_DIR}/$HARBOR_WHEEL_FILE[{EXTRAS}]"'
)
"""What the job runs first: fetch the pinned wheel (huggingface_hub's `hf` CLI, in vLLM's image, which
needs huggingface_hub >= 1.31; HF_TOKEN, the job's secret, reads a private repo), check it, install it.
The wheel is named by the job's env (`wheel_env`), so the line needs no quoting."""


def wheel_env(wheel: WheelRef) -> dict[str, str]:
    return {
        "HARBOR_WHEEL_REPO": wheel.repo_id,
        "HARBOR_WHEEL_FILE": wheel.path_in_repo,
        "HARBOR_WHEEL_REVISION": wheel.revision,
        "HARBOR_WHEEL_SHA256": wheel.sha256,
    }
