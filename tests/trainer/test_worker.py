"""The rollout worker against the real embedded engine: groups, staleness admission, failed rollouts
survived, invalid captures stopping the run with their findings, and the prompt schedule."""

from __future__ import annotations

import time

import pytest

from tests.trainer.direct import AsyncDirectSessionFactory, DirectSession, DirectSessionFactory
from trainer.config import AsyncGRPOConfig
from trainer.errors import InvalidCaptureError
from trainer.rollout_worker import PromptSchedule, RolloutWorker, StalenessGate

TASKS = [{"task_id": f"t{i}", "prompt_ids": [20 + i, 31, 42], "targets": [100, 101]} for i in range(3)]


def config(**overrides) -> AsyncGRPOConfig:
    base = dict(num_generations=2, per_device_train_batch_size=2, max_concurrent_rollouts=4, max_staleness=4,
                max_completion_length=4, report_to="jsonl")  # fmt: skip
    return AsyncGRPOConfig(**{**base, **overrides})


def test_staleness_gate_counts_whole_steps_and_sync_intervals() -> None:
    gate = StalenessGate(max_staleness=1, groups_per_step=2, weight_sync_steps=1)
    # 0-1 groups ahead: trained in the current step (0 versions behind); 2-3: next step (1); 4: 2 steps.
    assert [gate.versions_behind(n) for n in range(6)] == [0, 0, 1, 1, 2, 2]
    assert gate.admit(3) and not gate.admit(4)
    slow_sync = StalenessGate(max_staleness=1, groups_per_step=1, weight_sync_steps=3)
    assert [slow_sync.versions_behind(n) for n in (0, 1, 3, 4)] == [0, 1, 1, 2]
    assert gate.is_stale(sample_version=3, trainer_version=5) and not gate.is_stale(4, 5)


def test_schedule_is_seeded_and_tracks_out_of_order_consumption() -> None:
    a, b = PromptSchedule(5, seed=3), PromptSchedule(5, seed=3)
    order = [a.index(p) for p in range(10)]
    assert order == [b.index(p) for p in range(10)]
    assert sorted(order[:5]) == sorted(order[5:]) == list(range(5))  # each epoch visits every prompt
    a.consume(1)
    a.consume(3)
    assert (a.prefix, a.beyond) == (0, {1, 3})
    a.consume(0)
    assert (a.prefix, a.beyond) == (2, {3})
    it = a.pending_positions()
    assert [next(it) for _ in range(3)] == [2, 4, 5]
    b.load_state_dict(a.state_dict())
    assert (b.prefix, b.beyond) == (2, {3})
    with pytest.raises(Exception, match="prompt order would differ"):
        PromptSchedule(6, seed=3).load_state_dict(a.state_dict())


def test_admission_holds_back_groups_that_would_be_too_stale(fresh_engine) -> None:
    factory = DirectSessionFactory(fresh_engine.url, sampling={"max_tokens": 4})
    worker = RolloutWorker(factory, TASKS, config(max_staleness=0), PromptSchedule(3, 0), lambda: 0)
    worker.start()
    try:
        first = worker.next_group(timeout_s=60)
        time.sleep(0.5)  # time enough to start more groups, were they admitted
        # With max_staleness 0 and one group per step, a group may only start when none is ahead of it.
        assert worker.started_groups == 2 and worker.qsize <= 1
        second = worker.next_group(timeout_s=60)
        assert (first.position, second.position) == (0, 1)
        assert [s.member for s in first.samples] == [0, 1]
        assert all(s.policy_version == 0 and s.rows and s.reward is not None for s in first.samples)
    finally:
        worker.stop()


class FlakyFactory(DirectSessionFactory):
    """Member 1 of every group fails the way a crashed agent or server error does."""

    def create(self, task, seed=None, episode_id=None) -> DirectSession:
        if episode_id.endswith("-g1"):
            raise ConnectionError("sandbox died")
        return super().create(task, seed, episode_id)


def test_failed_rollouts_are_counted_and_the_group_survives(fresh_engine) -> None:
    factory = FlakyFactory(fresh_engine.url, sampling={"max_tokens": 4})
    worker = RolloutWorker(factory, TASKS, config(num_generations=3, per_device_train_batch_size=3),
                           PromptSchedule(3, 0), lambda: 0)  # fmt: skip
    worker.start()
    try:
        group = worker.next_group(timeout_s=60)
        failed = group.samples[1]
        assert failed.failed and failed.reward is None and "sandbox died" in failed.error
        assert [s.failed for s in group.samples] == [False, True, False] and worker.failed_rollouts >= 1
    finally:
        worker.stop()


class CorruptFactory(DirectSessionFactory):
    """A capture bug: a positive logprob in the trace."""

    def create(self, task, seed=None, episode_id=None) -> DirectSession:
        session = super().create(task, seed, episode_id)
        session.trace.turns[0].per_token_logps[0] = 0.5
        return session


def test_an_invalid_capture_stops_the_run_with_its_findings(fresh_engine) -> None:
    worker = RolloutWorker(CorruptFactory(fresh_engine.url, sampling={"max_tokens": 4}), TASKS, config(),
                           PromptSchedule(3, 0), lambda: 0)  # fmt: skip
    worker.start()
    try:
        with pytest.raises(InvalidCaptureError, match="positive_logprob") as info:
            worker.next_group(timeout_s=60)
        assert any(f.code == "positive_logprob" for f in info.value.findings)
        with pytest.raises(InvalidCaptureError):  # stays stopped
            worker.next_group(timeout_s=1)
    finally:
        worker.stop()


def test_async_session_factories_are_awaited(fresh_engine) -> None:
    factory = AsyncDirectSessionFactory(fresh_engine.url, sampling={"max_tokens": 4})
    worker = RolloutWorker(factory, TASKS, config(), PromptSchedule(3, 0), lambda: 0)
    worker.start()
    try:
        group = worker.next_group(timeout_s=60)
        assert len(group.samples) == 2 and all(s.rows and not s.failed for s in group.samples)
    finally:
        worker.stop()
