"""End-to-end rollouts per minute on the embedded default: GRPO training vs the same rollouts alone, and
where a training step's time goes.

    python bench/e2e_rollouts.py [--quick] [--steps N]

The pieces `harbor train` uses with no arguments, each a process as there: the embedded engine serving the
tiny model (harbor_rl.train_pipeline.embedded_engine), a Harbor server over the built-in white-box
environments with the local sandbox and a SQLite store (harbor_rl.train_pipeline.embedded_server), the
env-factory harness, and, in this process, HarnessAsyncGRPOTrainer pushing weights to the engine over gloo
after every step. Its GRPO settings are
`harbor train`'s embedded defaults (`EMBEDDED_DEFAULTS`: 8 generations, 16 rollouts per step in padded
batches, 16 in flight, staleness 1, 64 completion tokens, lr 1e-4).

Side by side, on the same engine and server:
- rollouts only: the trainer's own RolloutWorker, same settings and seeds, with nothing training (the
  groups are taken as soon as they finish), before and (full run) after the training run;
- training: the full trainer, whose logged metrics give the step-time split (rollout_wait_s,
  train_time_s, weight_sync_time_s; the rest of the step is "other").
The ratio of the two rates (against the mean of the rollouts-only runs, which evens out a shared
machine's drift) is the cost of training to the rollout side: they share 2 CPU cores.

The random tiny model scores 0 on the environments, and a group without reward spread trains nothing,
so the rollouts are scored by a dense stand-in reward (the share of even token ids in the
completions): every group has a spread and every step really runs forward/backward, with no pull on
rollout length. Rates are steady state: from the end of the first step (or its worth of groups) to
the end of the last, so start-up (first weight push, pipeline fill) is reported apart.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harbor_rl.train_pipeline import EMBEDDED_DEFAULTS, grpo_threads  # noqa: E402
from trainer.config import AsyncGRPOConfig  # noqa: E402
from trainer.outcome import HarnessRolloutOutcome  # noqa: E402

# `harbor train`'s embedded GRPO settings, taken from where it keeps them so the two cannot drift apart
# (they once did: this bench ran 4 generations in packed rows while `harbor train` ran 8 in padded
# batches), and a smaller CI version of them.
GRPO_KEYS = ("num_generations", "per_device_train_batch_size", "max_concurrent_rollouts", "learning_rate",
             "max_completion_length", "max_staleness", "padding_free")  # fmt: skip
FULL = {key: EMBEDDED_DEFAULTS[key] for key in GRPO_KEYS}
QUICK = {**FULL, "num_generations": 2, "per_device_train_batch_size": 4, "max_concurrent_rollouts": 4,
         "max_completion_length": 16}  # fmt: skip


def even_token_share(outcome: HarnessRolloutOutcome) -> float | None:
    """Dense stand-in reward: the share of even token ids among the completion tokens (None: no tokens)."""
    ids = [t for turn in outcome.training_trace.turns for t in turn.completion_token_ids]
    return sum(1 for t in ids if t % 2 == 0) / len(ids) if ids else None


@dataclass
class Phase:
    """One measured run of rollouts."""

    name: str
    rollouts: int
    """Rollouts delivered to the consumer (the trainer trains on them; dropped stale ones not counted)."""
    first_s: float
    """Seconds to the first step's worth of rollouts (start-up and pipeline fill)."""
    steady_s: float
    """Seconds from then to the last one."""
    steady_rollouts: int
    completion_tokens: float | None
    """Mean completion tokens per rollout."""
    failed: int
    baseline: bool = False
    """A rollouts-only run: the ratios are taken against the mean rate of these."""

    @property
    def per_min(self) -> float:
        return 60 * self.steady_rollouts / self.steady_s if self.steady_s > 0 else float("nan")


def rollouts_only(name: str, factory_builder, rows, config: AsyncGRPOConfig, steps: int) -> Phase:
    """The trainer's rollout worker alone: take `steps` steps' worth of groups as soon as they finish."""
    from trainer.rollout_worker import PromptSchedule, RolloutWorker, sampling_policy

    factory = factory_builder(sampling=sampling_policy(config))
    schedule = PromptSchedule(len(rows), config.seed, config.shuffle_dataset)
    worker = RolloutWorker(factory, rows, config, schedule, lambda: 0, even_token_share)
    arrivals: list[float] = []
    samples = []
    t0 = time.monotonic()
    worker.start()
    try:
        for _ in range(steps * config.groups_per_step):
            group = worker.next_group(timeout_s=config.rollout_timeout_s * 2)
            arrivals.append(time.monotonic())
            samples.extend(group.samples)
    finally:
        worker.stop()
    first = arrivals[config.groups_per_step - 1]
    lengths = [s.outcome.completion_tokens for s in samples if s.outcome is not None]
    return Phase(
        name,
        rollouts=len(samples),
        first_s=first - t0,
        steady_s=arrivals[-1] - first,
        steady_rollouts=(steps - 1) * config.rollouts_per_step,
        completion_tokens=statistics.fmean(lengths) if lengths else None,
        failed=sum(s.failed for s in samples),
        baseline=True,
    )


def training(factory_builder, rows, config: AsyncGRPOConfig, model_path: Path) -> tuple[Phase, list[dict]]:
    """The full trainer for `config.max_steps` steps; returns its phase and the per-step metrics, each with
    the step's wall time (`step_s`, from the previous step's end)."""
    from engine.tiny_model import load_model_and_tokenizer
    from trainer.grpo import HarnessAsyncGRPOTrainer

    model, tokenizer = load_model_and_tokenizer(model_path)
    ends: list[float] = []
    trainer = HarnessAsyncGRPOTrainer(
        model, factory_builder, config, train_dataset=rows, rollout_reward_fn=even_token_share,
        processing_class=tokenizer, step_callback=lambda step, metrics: ends.append(time.monotonic()),
    )  # fmt: skip
    t0 = time.monotonic()
    history = trainer.train()
    for metrics, start, end in zip(history, [t0, *ends[:-1]], ends, strict=True):
        metrics["step_s"] = end - start
    lengths = [h["completions/mean_length"] for h in history if "completions/mean_length" in h]
    phase = Phase(
        "GRPO training",
        rollouts=len(history) * config.rollouts_per_step,
        first_s=ends[0] - t0,
        steady_s=ends[-1] - ends[0],
        steady_rollouts=(len(history) - 1) * config.rollouts_per_step,
        completion_tokens=statistics.fmean(lengths) if lengths else None,
        failed=sum(int(h.get("rollout/failed", 0)) for h in history),
    )
    return phase, history


def split(history: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """Mean seconds per steady-state step (all but the first) in each part of the step."""
    steady = history[1:] or history
    parts = [
        ("waiting for rollouts", [h["rollout_wait_s"] for h in steady]),
        ("forward/backward + optimizer", [h["train_time_s"] for h in steady]),
        ("weight sync (gloo push to the engine)", [h.get("weight_sync_time_s", 0.0) for h in steady]),
    ]
    means = [(name, statistics.fmean(values)) for name, values in parts]
    step = statistics.fmean(h["step_s"] for h in steady)
    return [*means, ("other (rows, advantages, logging)", step - sum(v for _, v in means)), ("step", step)]


def render(phases: list[Phase], history: list[dict], config: AsyncGRPOConfig, steps: int) -> None:
    console = Console()
    # Before and after training when both ran: their mean evens out the shared machine's drift.
    base = statistics.fmean(p.per_min for p in phases if p.baseline)
    table = Table(
        title=f"End-to-end rollouts on the embedded default (tiny model, env-factory on the white-box envs, "
        f"local sandbox): {steps} steps of {config.rollouts_per_step} rollouts, "
        f"{config.max_concurrent_rollouts} in flight"
    )
    for col in ("run", "rollouts", "first step s", "steady rollouts/min", "vs rollouts only (mean)",
                "completion tok/rollout", "failed"):  # fmt: skip
        table.add_column(col, justify="left" if col == "run" else "right")
    for p in phases:
        table.add_row(
            p.name, str(p.rollouts), f"{p.first_s:.1f}", f"{p.per_min:.1f}", f"{p.per_min / base:.2f}x",
            "-" if p.completion_tokens is None else f"{p.completion_tokens:.1f}", str(p.failed),
        )  # fmt: skip
    console.print(table)

    parts = split(history)
    step = parts[-1][1]
    steady = len(history) - 1 if len(history) > 1 else 1
    table = Table(
        title=f"Training step-time split (mean of {steady} steady-state steps; from the trainer's metrics)"
    )
    for col in ("part", "s/step", "share"):
        table.add_column(col, justify="left" if col == "part" else "right")
    for name, seconds in parts:
        table.add_row(name, f"{seconds:.3f}", f"{100 * seconds / step:.0f}%" if step > 0 else "-")
    console.print(table)

    training_rate = next(p.per_min for p in phases if not p.baseline)
    tokens = sum(h["num_tokens"] for h in history[1:] or history)
    train_s = sum(h["train_time_s"] for h in history[1:] or history)
    trained = statistics.fmean(h["num_trained_tokens"] for h in history)
    dropped = sum(int(h.get("staleness/dropped_groups", 0)) for h in history)
    wait_share = parts[0][1] / step if step > 0 else 0.0
    bottleneck = (
        "the trainer is the bottleneck (it hardly waits for rollouts)"
        if wait_share < 0.1
        else "the rollouts are the bottleneck (the trainer waits for them)"
    )
    runs = sum(p.baseline for p in phases)
    mean = f" (mean of {runs} rollouts-only runs)" if runs > 1 else ""
    console.print(
        f"with training, {training_rate / base:.2f}x the rollouts/min of the rollouts alone{mean}: {bottleneck}"
    )
    console.print(
        f"{tokens / train_s:,.0f} training tok/s (forward/backward + optimizer), {trained:.0f} trained tokens "
        f"per step; first step (first weight push with gloo set-up, pipeline fill) {history[0]['step_s']:.1f} s; "
        f"{dropped} stale groups dropped; policy version {history[-1]['policy_version']} at the end"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small CI run (under a minute)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 12; quick 3)")
    parser.add_argument(
        "--threads", type=int, default=None,
        help="the trainer's torch threads (default: half the cores, as `harbor train` sets them)",
    )  # fmt: skip
    args = parser.parse_args()
    steps = args.steps or (3 if args.quick else 12)
    if steps < 2:
        parser.error("--steps must be at least 2 (the first step is start-up, the rest the steady state)")
    logging.basicConfig(level=logging.WARNING)

    import torch

    torch.set_num_threads(args.threads or grpo_threads())
    with tempfile.TemporaryDirectory(prefix="harbor-bench-e2e-") as scratch:
        os.environ["HARBOR_RUNS_DIR"] = str(Path(scratch) / "runs")
        phases, history, config = run(Path(scratch), steps, args.quick)
    render(phases, history, config, steps)


def run(scratch: Path, steps: int, quick: bool) -> tuple[list[Phase], list[dict], AsyncGRPOConfig]:
    from engine.tiny_model import resolve_model_path
    from harbor_rl.train_pipeline import embedded_engine, embedded_server
    from harbor_server.client import HarborSessionFactory

    settings = QUICK if quick else FULL
    model_path = resolve_model_path("tiny", seed=0)
    with embedded_engine(model_path, "tiny", scratch) as engine_url:
        config = AsyncGRPOConfig(
            output_dir=str(scratch / "train"), report_to="jsonl", max_steps=steps, seed=0,
            vllm_server_base_url=engine_url, weight_sync_backend="gloo", **settings,
        )  # fmt: skip
        llm_url = engine_url + "/v1"
        capacity = config.max_concurrent_rollouts + 1
        with embedded_server(scratch, llm_url, "tiny", capacity, "local") as server_url:
            factory = functools.partial(
                HarborSessionFactory, server_url, split="env-tasks", harness="env-factory", sandbox="local",
                llm_url=llm_url, model="tiny", agent_timeout_sec=120.0, capacity_wait_s=60.0,
            )  # fmt: skip
            with HarborSessionFactory(server_url, split="env-tasks", harness="env-factory") as lister:
                rows = list(lister.prompt_rows())
            print(f"{len(rows)} tasks; warming up the engine and server", flush=True)
            rollouts_only("warm-up", factory, rows, config, 1)
            print("rollouts only", flush=True)
            first = "rollouts only" if quick else "rollouts only, before training"
            phases = [rollouts_only(first, factory, rows, config, steps)]
            print("training", flush=True)
            trained, history = training(factory, rows, config, model_path)
            phases.append(trained)
            if not quick:  # the engine now serves the trained weights: does the rate alone still hold?
                print("rollouts only, after training", flush=True)
                phases.append(rollouts_only("rollouts only, after training", factory, rows, config, steps))
    return phases, history, config


if __name__ == "__main__":
    main()
