"""Every built-in task is sound on every backend: its oracle scores 1.0 and doing nothing scores 0.0.

Runs on the real `local` (bwrap) backend and, marked `docker`, on the real Docker engine; the oracle
and nop runs of a task share one image build (the backend caches images by content hash).
"""

from __future__ import annotations

import pytest

from tasks import BUILTIN_DIR, load_task, sanity_check, task_dirs

TASK_IDS = [path.name for path in task_dirs(BUILTIN_DIR)]


def _explain(outcome) -> str:
    verifier = outcome.verifier
    agent = outcome.agent_run
    return (
        f"{outcome.agent} on {outcome.backend}: reward {outcome.reward}, error {outcome.error}\n"
        f"agent: {agent.stderr[-1500:] if agent else ''}\n"
        f"verifier: {verifier.stdout[-3000:] if verifier else ''}{verifier.stderr[-1500:] if verifier else ''}"
    )


def test_there_are_at_least_12_builtin_tasks():
    assert len(TASK_IDS) >= 12


@pytest.mark.parametrize("task_id", TASK_IDS)
async def test_oracle_scores_one_and_nop_zero(backend, task_id):
    task = load_task(BUILTIN_DIR / task_id)
    oracle = await sanity_check(task, backend, "oracle")  # builds the image (docker) once...
    assert oracle.passed and oracle.reward == 1.0, _explain(oracle)
    nop = await sanity_check(task, backend, "nop")  # ...and this run reuses it
    assert nop.passed and nop.reward == 0.0, _explain(nop)
