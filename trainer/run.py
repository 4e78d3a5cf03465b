"""What `harbor train` runs: GRPO through a Harbor server, with before/after evaluation.

    harbor train --server-url http://localhost:8200 --split builtin --harness mini-swe-agent \\
                 --sandbox docker --llm-url http://localhost:8000/v1 --model /models/qwen
    harbor train                         # embedded: engine + server in-process, built-in white-box tasks

With no `server_url`, the embedded default starts the embedded engine (serving `model`, `tiny` by
default) and a Harbor server in this process (local sandbox, SQLite store in the output folder, the
built-in white-box environments), pushes weights over gloo, and evaluates before and after training.
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trainer.config import AsyncGRPOConfig
from trainer.errors import TrainerConfigError


class TrainRun(BaseModel):
    """Where `harbor train` gets its rollouts; the GRPO knobs live in AsyncGRPOConfig beside it."""

    model_config = ConfigDict(extra="forbid")

    model: str = "tiny"
    """The policy to train: `tiny` (built locally) or a local Hugging Face model folder."""
    server_url: str | None = None
    """A running `harbor serve`; None starts the embedded engine and server in this process."""
    split: str | None = None
    """Task split on the server (embedded default: the built-in white-box environments)."""
    tasks: list[str] | None = None
    """Task ids to train on (default: every task of the split)."""
    harness: str = "env-factory"
    sandbox: str = "local"
    llm_url: str | None = None
    """OpenAI base URL of the engine the agents call (embedded: the started engine)."""
    served_model_name: str | None = None
    """The name the engine serves the policy under (default: `model`, or `tiny`)."""
    agent_timeout_sec: float = Field(default=120.0, gt=0)
    eval_episodes: int = Field(default=16, ge=0)
    """Episodes evaluated before and after training (0: no evaluation)."""


@dataclass
class EvalResult:
    rewards: list[float]
    unscoreable: int

    @property
    def mean(self) -> float:
        return statistics.fmean(self.rewards) if self.rewards else math.nan

    @property
    def stderr(self) -> float:
        n = len(self.rewards)
        return statistics.stdev(self.rewards) / math.sqrt(n) if n > 1 else math.nan


def split_settings(data: dict[str, Any]) -> tuple[TrainRun, AsyncGRPOConfig]:
    """One flat mapping (a YAML file plus flags) -> the run settings and the GRPO config."""
    run_keys = set(TrainRun.model_fields)
    run_data = {k: v for k, v in data.items() if k in run_keys}
    try:
        run = TrainRun(**run_data)
    except ValueError as exc:
        raise TrainerConfigError(f"invalid run settings: {exc}") from exc
    grpo = AsyncGRPOConfig.validated({k: v for k, v in data.items() if k not in run_keys})
    return run, grpo


@contextlib.contextmanager
def embedded_engine(model_path: Path, served_name: str) -> Iterator[str]:
    """The embedded engine on 127.0.0.1 (random port) in a background thread; yields its base URL."""
    import uvicorn

    from trainer.engine.server import EngineConfig, create_app

    app = create_app(EngineConfig(model=str(model_path), served_model_name=served_name, max_model_len=4096))
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, name="embedded-engine", daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise TrainerConfigError(f"the embedded engine did not start for {model_path}")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


@contextlib.contextmanager
def embedded_server(output_dir: Path, llm_url: str, model: str, capacity: int, sandbox: str) -> Iterator[str]:
    """A Harbor server over the built-in white-box environments (split `env-tasks`) and the built-in
    coding tasks (split `builtin`), in this process; yields its URL."""
    from harbor_server.config import ServeConfig
    from harbor_server.testing import free_port, running_server
    from harnesses.env_factory.builtin import ENV_TASKS_DIR

    config = ServeConfig(
        datasets=[str(ENV_TASKS_DIR), "builtin"], llm_url=llm_url, model=model, port=free_port(),
        capture_port=free_port(), capture_host="127.0.0.1" if sandbox == "local" else "0.0.0.0", sandbox=sandbox, store_url=f"sqlite:///{output_dir.resolve()}/traces.db",
        check_engine=False, max_concurrent_envs=capacity,
    )  # fmt: skip
    with running_server(config) as thread:
        yield thread.url


def evaluate(
    factory_builder: Callable[..., Any], rows: list[dict[str, Any]], episodes: int, config
) -> EvalResult:
    """`episodes` fresh rollouts (cycling over `rows`) at the training temperature; env rewards only."""
    from trainer.rollout_worker import sampling_policy

    factory = factory_builder(sampling=sampling_policy(config), purpose="eval")

    def one(i: int) -> float | None:
        session = factory.create(rows[i % len(rows)], seed=1_000_000 + i, episode_id=f"eval-{i}")
        try:
            return session.verify().env_reward
        except Exception:  # a failed episode is unscoreable, not 0
            return None
        finally:
            session.close()

    with ThreadPoolExecutor(max_workers=config.max_concurrent_rollouts) as pool:
        rewards = list(pool.map(one, range(episodes)))
    factory.close()
    scored = [r for r in rewards if r is not None]
    return EvalResult(scored, len(rewards) - len(scored))


def run_training(
    run: TrainRun,
    config: AsyncGRPOConfig,
    *,
    resume: bool = False,
    on_phase: Callable[[str], None] = lambda _: None,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
) -> tuple[EvalResult | None, EvalResult | None, list[dict[str, Any]]]:
    """Evaluate, train, evaluate. Returns (before, after, logged metrics)."""
    from harbor_server.client import HarborSessionFactory
    from trainer.engine.tiny_model import load_model_and_tokenizer, resolve_model_path
    from trainer.grpo import HarnessAsyncGRPOTrainer

    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model_path = resolve_model_path(run.model, seed=config.seed)
    served = run.served_model_name or ("tiny" if run.model == "tiny" else run.model)
    with contextlib.ExitStack() as stack:
        llm_url, server_url, split = run.llm_url, run.server_url, run.split
        if server_url is None:
            on_phase("starting the embedded engine and server")
            engine_url = stack.enter_context(embedded_engine(model_path, served))
            llm_url = engine_url + "/v1"
            config = config.model_copy(
                update={"vllm_server_base_url": engine_url, "weight_sync_backend": "gloo"}
            )
            server_url = stack.enter_context(
                embedded_server(output_dir, llm_url, served, config.max_concurrent_rollouts + 1, run.sandbox)
            )
            split = split or ("env-tasks" if run.harness == "env-factory" else "builtin")
        elif config.vllm_server_base_url is None and llm_url is not None:
            config = config.model_copy(
                update={"vllm_server_base_url": llm_url.rstrip("/").removesuffix("/v1")}
            )
        if split is None:
            raise TrainerConfigError("--split is required with --server-url (the task split to train on)")
        if llm_url is None:
            raise TrainerConfigError("--llm-url is required with --server-url (the engine the agents call)")
        factory = functools.partial(
            HarborSessionFactory, server_url, split=split, harness=run.harness, sandbox=run.sandbox,
            llm_url=llm_url, model=served, agent_timeout_sec=run.agent_timeout_sec, capacity_wait_s=60.0,
        )  # fmt: skip
        with HarborSessionFactory(server_url, split=split, harness=run.harness) as lister:
            rows = list(lister.prompt_rows())
        if run.tasks:
            rows = [r for r in rows if r["task_id"] in set(run.tasks)]
        if not rows:
            raise TrainerConfigError(f"no tasks to train on in split {split!r} (tasks filter: {run.tasks})")
        before = after = None
        if run.eval_episodes:
            on_phase(f"evaluating before training ({run.eval_episodes} episodes)")
            before = evaluate(factory, rows, run.eval_episodes, config)
        model, tokenizer = load_model_and_tokenizer(model_path)
        on_phase(f"training for {config.max_steps} steps")
        trainer = HarnessAsyncGRPOTrainer(
            model, factory, config, train_dataset=rows, processing_class=tokenizer, step_callback=on_step
        )
        history = trainer.train(resume_from_checkpoint=True if resume else None)
        if run.eval_episodes:
            on_phase(f"evaluating after training ({run.eval_episodes} episodes)")
            after = evaluate(factory, rows, run.eval_episodes, config)
    return before, after, history
