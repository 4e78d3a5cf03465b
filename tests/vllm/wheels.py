"""vLLM's own source, for the CPU tests that judge the weight-sync wire: the release wheels of the pinned
range are downloaded once (`pip download`, the ordinary client) into a cache and only the files the
tests load are unzipped; nothing is installed.

    source = release_source("0.33.0")      # Path of an unzipped tree holding vllm/...

The cache is `$HARBOR_VLLM_WHEELS` (default `~/.cache/harbor-rl/vllm-wheels`); a wheel already there
(e.g. copied in on a machine without PyPI) is used as it is. CI runs on a fresh machine with PyPI: the
first test session downloads each wheel once (~330 MB each), later sessions reuse the cache.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from harnesses.assets import _file_lock

ROOT = Path(__file__).resolve().parents[2]
RELEASES = ("0.28.0", "0.33.0")
"""The lowest and the highest release of pyproject's `gpu` pin (`vllm>=0.28,<0.34`);
`test_releases_are_the_ends_of_the_pin` keeps the two in step."""

ROUTE_MODULE = {
    "0.28.0": "vllm/entrypoints/serve/dev/rlhf/api_router.py",
    "0.33.0": "vllm/entrypoints/rl/online/api_router.py",
}
"""Where each release keeps its RL routes (/pause ... /finish_weight_update): 0.33 moved them."""

NEEDED = (
    "vllm/distributed/weight_transfer/base.py",
    "vllm/distributed/weight_transfer/nccl_common.py",
    "vllm/distributed/weight_transfer/nccl_engine.py",
    "vllm/distributed/weight_transfer/packed_tensor.py",
    "vllm/config/weight_transfer.py",
    "vllm/entrypoints/serve/dev/cache/api_router.py",
    "vllm/entrypoints/serve/exception_handling/",
    "vllm/entrypoints/openai/engine/protocol.py",
    "vllm/entrypoints/serve/engine/protocol.py",
    "vllm/exceptions.py",
    "vllm/model_executor/model_loader/reload/",
    "vllm/model_executor/model_loader/weight_utils.py",
    "vllm/v1/engine/__init__.py",
    "vllm/v1/engine/async_llm.py",
    "vllm/v1/engine/core.py",
    "vllm/v1/engine/exceptions.py",
    "vllm/v1/worker/gpu_worker.py",
    "vllm/distributed/device_communicators/pynccl.py",
    "vllm/distributed/utils.py",
)
"""Files (or folders, with a trailing /) unzipped from every wheel, besides the route module; a
release that lacks one simply does not have it (0.28 has no serve/engine/protocol.py)."""


def cache_dir() -> Path:
    return Path(os.environ.get("HARBOR_VLLM_WHEELS") or Path.home() / ".cache" / "harbor-rl" / "vllm-wheels")


def pinned_range() -> str:
    """The `vllm` requirement of pyproject's `gpu` extra, e.g. `vllm>=0.28,<0.34`."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return next(r for r in extras["gpu"] if r.startswith("vllm"))


def _wheel(version: str, cache: Path) -> Path:
    found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if found:
        return found[0]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--dest", str(cache), f"vllm=={version}"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if result.returncode != 0 or not found:
        raise RuntimeError(
            f"could not download vllm=={version} into {cache} (pip exited {result.returncode}): "
            f"{result.stderr.strip()[-800:]}\nPut the wheel there by hand, or point HARBOR_VLLM_WHEELS at "
            "a folder that holds it."
        )
    return found[0]


def _wanted(name: str, version: str) -> bool:
    if name == ROUTE_MODULE[version]:
        return True
    return any(name == n or (n.endswith("/") and name.startswith(n)) for n in NEEDED)


def release_source(version: str) -> Path:
    """The unzipped files of vLLM `version` (downloaded and unzipped on first use, then cached)."""
    cache = cache_dir()
    stamp = hashlib.sha256("\n".join((ROUTE_MODULE[version], *NEEDED)).encode()).hexdigest()[:12]
    tree = cache / f"vllm-{version}-src-{stamp}"
    if (tree / ".complete").exists():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    with _file_lock(cache / ".lock"):  # one process at a time fills the cache (test sessions share it)
        if (tree / ".complete").exists():
            return tree
        wheel = _wheel(version, cache)
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if _wanted(name, version):
                    archive.extract(name, tree)
        (tree / ".complete").write_text(wheel.name)
    return tree


def top_of_pin() -> tuple[str, str]:
    """(floor, ceiling) of the pin as written, e.g. ("0.28", "0.34")."""
    spec = pinned_range()
    floor = re.search(r">=\s*([\d.]+)", spec)
    ceiling = re.search(r"<\s*([\d.]+)", spec)
    assert floor and ceiling, spec
    return floor.group(1), ceiling.group(1)
