"""Real public Harbor tasks score 1.0 with their own oracle, run as Harbor runs them, in Docker.

The 20 tasks of tests/fixtures/harbor_tasks whose image can be had here (SOURCES.toml `oracle_here`;
the others say why not in `oracle_skip`), copied byte for byte from repositories nobody here wrote:
Harbor's cookbook (ENTRYPOINT service, compose sidecar, multi-step, multi-metric, skills, a simulated
user), Terminal-Bench 2 tasks (a prebuilt `docker_image` that cannot be pulled here, so their
Dockerfile is built under --force-build, as Harbor needs it there too), Harbor's separate-verifier
examples and a Terminal-Bench math-modeling task (the tests in a container of their own, which sees
only the declared artifact; nop scores 0 there, SOURCES.toml `nop_here`), and others. Most keep
Harbor's template verifier, which apt-installs curl and runs pytest through `uvx` at verify time: the
network the task is given.
Public base images (ubuntu:24.04, python:3.13-slim...) are the stand-ins of docker/stand-ins/.

All rollouts go through one in-process server (the machinery of `harbor serve` and `harbor eval`),
three at a time, in one module fixture; each test then reads its task's result.
"""

from __future__ import annotations

import asyncio
import subprocess
import tomllib
from pathlib import Path

import pytest

from evaluation.rollouts import LocalHarbor
from harbor_server import RolloutRequest
from tasks import load_dataset_spec
from tests.sandboxes.conftest import REPO, base_image, docker_client  # noqa: F401 (fixtures, used by name)

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(2400)]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "harbor_tasks"
ENTRIES = tomllib.loads((FIXTURES / "SOURCES.toml").read_text())["task"]
RUNNABLE = [e for e in ENTRIES if "oracle_here" in e]
# Tasks whose verifier must also fail: nop leaves what the oracle writes unwritten (SOURCES.toml `nop_here`).
NOP = [e for e in RUNNABLE if "nop_here" in e]
# numpy's SIMD sorts (x86-simd-sort, used on AVX2 and AVX-512) order ties otherwise than its baseline
# quicksort; an oracle that sorts tied scores then scores `oracle_here_avx2` (SOURCES.toml says why).
CPUINFO = Path("/proc/cpuinfo")
AVX2 = CPUINFO.exists() and "avx2" in CPUINFO.read_text().split()


def _oracle_score(entry: dict) -> float:
    return entry.get("oracle_here_avx2", entry["oracle_here"]) if AVX2 else entry["oracle_here"]


def _split(entry: dict) -> str:
    return entry["path"].replace("/", "__")


@pytest.fixture(scope="module")
def oracle_results(tmp_path_factory, request):
    request.getfixturevalue("base_image")
    # The stand-ins for the public base images (scripts/setup.sh builds them; idempotent, cached).
    subprocess.run(["bash", str(REPO / "docker" / "stand-ins" / "build.sh")], check=True, timeout=1200)
    datasets = {_split(e): load_dataset_spec(str(FIXTURES / e["path"]), split=_split(e)) for e in RUNNABLE}
    store = tmp_path_factory.mktemp("public") / "traces.db"

    async def run_all():
        async with LocalHarbor(
            datasets, sandbox="docker", llm_url="http://127.0.0.1:9/v1", model="none",
            store_url=f"sqlite:///{store}", max_concurrent=3, force_build=True,
        ) as harbor:  # fmt: skip
            gate = asyncio.Semaphore(3)

            async def one(split: str, harness: str):
                async with gate:
                    request = RolloutRequest(split=split, task_index=0, harness=harness, purpose="eval")
                    return (split, harness), (await harbor.run(request)).result

            runs = [(split, "oracle") for split in datasets] + [(_split(e), "nop") for e in NOP]
            return dict(await asyncio.gather(*(one(*run) for run in runs)))

    return asyncio.run(run_all())


def test_at_least_15_public_tasks_run_here_and_every_other_says_why():
    assert len(RUNNABLE) >= 15
    assert all("oracle_here" in e or e.get("oracle_skip") for e in ENTRIES)


@pytest.mark.parametrize("entry", RUNNABLE, ids=lambda e: e["path"])
def test_the_oracle_of_a_public_task_scores_one(entry, oracle_results):
    result = oracle_results[_split(entry), "oracle"]
    explain = f"{result.status}: {result.error}\nagent: {result.agent_log_tail[-1500:]}\nverifier: {result.verifier_output[-2000:]}"
    assert result.status == "completed", explain
    # Every metric it reports is what SOURCES.toml says (1.0 bar one CPU-bound case): reward.txt's one,
    # or each of a multi-metric reward.json's.
    assert result.rewards and all(v == _oracle_score(entry) for v in result.rewards.values()), explain


@pytest.mark.parametrize("entry", NOP, ids=lambda e: e["path"])
def test_nop_on_a_public_task_scores_what_its_verifier_gives_no_work(entry, oracle_results):
    """The same verifier gives nothing for nothing: the oracle's 1.0 is the work's, not the setup's."""
    result = oracle_results[_split(entry), "nop"]
    explain = f"{result.status}: {result.error}\nverifier: {result.verifier_output[-2000:]}"
    assert result.status == "completed", explain
    assert result.rewards and all(v == entry["nop_here"] for v in result.rewards.values()), explain
