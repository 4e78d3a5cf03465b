"""`GRPOTrainer` and `GRPOConfig` with TRL's signature, for the white-box `environment_factory` path: a TRL
script trains here with `from harbor_rl import GRPOConfig, GRPOTrainer` as its one changed line.

    trainer = GRPOTrainer(model="tiny", train_dataset=dataset, reward_funcs=reward_func,
                          args=GRPOConfig(chat_template_kwargs={"enable_thinking": False}),
                          environment_factory=EchoToolEnv)
    trainer.train()

It is one more entry point, not a second system. `train()` starts what it needs in this process: the
embedded engine serving `model` (or it uses the vLLM server `vllm_server_base_url` names), and a Harbor
server whose `env-factory` harness runs the user's class (harnesses/env_factory). Each dataset row is
one rollout of a task that carries the row (its columns go to `reset(**row)` and the reward functions,
its `prompt` is the prompt, as in TRL), captured by the same proxy into the same store, and trained by
`HarnessAsyncGRPOTrainer` with weights pushed back after each step. The inspector reads the store
(`harbor inspect --store <output_dir>/traces.db`).

TRL's meanings (trl 1.16.0 `trl/trainer/grpo_trainer.py`, `grpo_config.py`): `max_completion_length` is
the whole conversation's completion budget and `max_tool_calling_iterations` the rounds of tool calls
(both the env-factory loop's); `max_steps=-1` trains `num_train_epochs` passes; `environment_factory`
may be a dict of them, picked per row by its `environment` column, which `reset` does not get.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from harbor_server import HarborSessionFactory
from harbor_server.client import HarborSession
from harnesses.env_factory.harness import ROW_KEY
from tasks.datasets import ENV_TASKS_DIR
from trainer.config import AsyncGRPOConfig
from trainer.errors import TrainerConfigError

SERVED_NAME = "policy"
TASK_ID = "harbor-rl/grpo-trainer-row"
ENVIRONMENT_COLUMN = "environment"
"""TRL's multi-environment control column: which of a dict of factories runs the row."""
ENVIRONMENT_PREFIX = "env-factory:"
"""Harness names of a dict of environment factories: `env-factory:<key>`."""
ROW_TASK_TEMPLATE = ENV_TASKS_DIR / "echo-hi"
"""A built-in env task whose verifier (forward the environment's reward) and image the row task takes."""


class GRPOConfig(AsyncGRPOConfig):
    """TRL's GRPOConfig for `GRPOTrainer`: AsyncGRPOConfig's fields, with TRL's defaults and meanings
    where the white-box path differs."""

    output_dir: str = "trainer_output"
    """TRL's default output folder."""
    max_steps: int = Field(default=-1, ge=-1)
    """-1 (TRL's default): train `num_train_epochs` passes over the dataset."""
    num_train_epochs: float | None = Field(default=3.0, gt=0)
    vllm_server_base_url: str | None = None
    """A running vLLM server (`vllm serve`, or `harbor engine`) to sample from and push weights to;
    None starts the embedded engine on `model` in this process."""
    max_completion_length: int | None = Field(default=256, ge=1)
    """Completion tokens of the whole conversation, every turn together (TRL's)."""
    max_tokens_per_turn: int | None = Field(default=None, ge=1)
    """Cap on one model call's completion tokens (within what is left of max_completion_length)."""
    max_tool_calling_iterations: int | None = Field(default=None, ge=1)
    """Rounds of tool calls an episode may take (None: until the model stops calling tools, TRL's)."""
    system_prompt: str | None = None
    """Prepended as a system message when a row's prompt has none."""
    episode_timeout_s: float = Field(default=600.0, gt=0)
    """Wall-clock limit of one episode."""

    def __init__(self, **data: Any) -> None:
        """TRL's `GRPOConfig(**kwargs)`; a field or value that cannot be used is one TrainerConfigError
        line naming it (not pydantic's multi-line report), as a TRL script constructs it directly."""
        from harbor_rl.user_errors import validation_message

        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise TrainerConfigError(f"GRPOConfig: {validation_message(exc)}") from None

    def total_steps(self, num_prompts: int) -> int:
        if self.max_steps == -1:
            return max(1, math.ceil((self.num_train_epochs or 1.0) * num_prompts / self.groups_per_step))
        return super().total_steps(num_prompts)

    def loop(self) -> Any:
        """The env-factory loop's settings (harnesses.env_factory.LoopConfig)."""
        from harnesses.env_factory import LoopConfig

        return LoopConfig(
            max_tool_calling_iterations=self.max_tool_calling_iterations,
            max_completion_length=self.max_completion_length or LoopConfig().max_completion_length,
            max_tokens_per_turn=self.max_tokens_per_turn,
            system_prompt=self.system_prompt,
        )

    def harness_config(self, num_prompts: int, engine_url: str) -> AsyncGRPOConfig:
        """The AsyncGRPOConfig `HarnessAsyncGRPOTrainer` runs: the steps resolved, the engine's URL, and the
        limits left to the loop (the session's per-call cap is the turn cap; no step budget)."""
        own = set(AsyncGRPOConfig.model_fields) - {"max_steps", "num_train_epochs", "vllm_server_base_url"}
        data = self.model_dump(include=own)
        data.update(
            max_steps=self.total_steps(num_prompts),
            vllm_server_base_url=engine_url,
            max_completion_length=self.max_tokens_per_turn,
            max_tool_calling_iterations=None,
        )
        return AsyncGRPOConfig(**data)


class GRPOTrainer:
    """TRL's GRPOTrainer signature over Harbor-RL's rollout, capture and training machinery."""

    def __init__(
        self,
        model: Any,
        reward_funcs: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        environment_factory: Any = None,
        **unsupported: Any,
    ) -> None:
        """`model`: `tiny`, a model folder, a Hub id or a loaded transformers model. `reward_funcs`: one
        function or a list, called as TRL calls them (`environments=[...]`, the row's columns, `prompts`,
        `completions`); None reads `env.reward`. `environment_factory`: a class (or a dict of them)."""
        if unsupported:
            name = next(iter(unsupported))
            raise TrainerConfigError(
                f"GRPOTrainer({name}=...) is not supported here: rollouts come from environment_factory "
                "(tools are its methods, rollout_func is the env-factory loop); pass model, reward_funcs, "
                "args, train_dataset, processing_class and environment_factory"
            )
        if eval_dataset is not None:
            raise TrainerConfigError(
                "eval_dataset is not supported here: evaluate a checkpoint with `harbor eval`"
            )
        if environment_factory is None:
            raise TrainerConfigError(
                "GRPOTrainer here trains tool-using environments: pass environment_factory=YourEnvClass "
                "(TRL's white-box path); black-box agents train with HarnessAsyncGRPOTrainer"
            )
        self.args = args if args is not None else GRPOConfig()
        if not isinstance(self.args, GRPOConfig):
            raise TrainerConfigError(f"args must be a harbor_rl GRPOConfig, not {type(self.args).__name__}")
        self.model = model
        self.processing_class = processing_class
        self.reward_funcs = _as_list(reward_funcs)
        self.environments = _environment_factories(environment_factory)
        self.rows = _rows(train_dataset, self.environments)
        self.trainer: Any = None
        """The HarnessAsyncGRPOTrainer of the last `train()`."""

    def train(self, resume_from_checkpoint: str | bool | None = None) -> Any:
        """Run the loop; returns transformers' TrainOutput (global_step, training_loss, metrics)."""
        from transformers.trainer_utils import TrainOutput

        from trainer import HarnessAsyncGRPOTrainer

        args = self.args
        output_dir = Path(args.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        policy, tokenizer, model_path = self._policy(output_dir)
        with self._serving(model_path, output_dir) as (engine_url, factory):
            self.trainer = HarnessAsyncGRPOTrainer(
                policy, factory, args.harness_config(len(self.rows), engine_url), train_dataset=self.rows,
                processing_class=tokenizer,
            )  # fmt: skip
            history = self.trainer.train(resume_from_checkpoint=resume_from_checkpoint)
        losses = [h["loss"] for h in history if "loss" in h]
        return TrainOutput(
            global_step=self.trainer.step,
            training_loss=sum(losses) / len(losses) if losses else 0.0,
            metrics=history[-1] if history else {},
        )

    def save_model(self, output_dir: str | None = None) -> Path:
        """The trained policy and its tokenizer, as a model folder (TRL's `save_model`)."""
        if self.trainer is None:
            raise TrainerConfigError("save_model() before train(): there is nothing trained to save")
        path = Path(output_dir or self.args.output_dir)
        self.trainer.model.save_pretrained(path)
        if self.trainer.tokenizer is not None:
            self.trainer.tokenizer.save_pretrained(path)
        return path

    # -- what train() starts -----------------------------------------------------------------------

    def _policy(self, output_dir: Path) -> tuple[Any, Any, Path]:
        """(model to train, tokenizer, folder the engine serves)."""
        import torch

        from engine.tiny_model import resolve_model_path
        from trainer.models import load_policy

        if isinstance(self.model, torch.nn.Module):
            tokenizer = self.processing_class
            if tokenizer is None:
                raise TrainerConfigError(
                    "a loaded model needs its tokenizer: pass processing_class=tokenizer"
                )
            path = output_dir / "initial-model"  # what the embedded engine loads and serves
            self.model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            return self.model, tokenizer, path
        path = resolve_model_path(str(self.model), self.args.seed)
        model, tokenizer = load_policy(path)
        return model, self.processing_class or tokenizer, path

    @contextlib.contextmanager
    def _serving(self, model_path: Path, output_dir: Path) -> Iterator[tuple[str, Callable[..., Any]]]:
        """(engine URL, session factory builder): the engine and a server in this process."""
        from harbor_rl.train_pipeline import embedded_engine
        from harbor_server import ServeConfig, free_port, running_server
        from harnesses import get_harness, harness_names
        from harnesses.env_factory import EnvFactoryHarness

        args = self.args
        loop = args.loop()
        harnesses = {
            name: EnvFactoryHarness(factory, reward_funcs=self.reward_funcs or None, loop=loop)
            for name, factory in self.environments.items()
        }
        with contextlib.ExitStack() as stack:
            engine_url = args.vllm_server_base_url
            served = SERVED_NAME
            if engine_url is None:
                engine_url = stack.enter_context(embedded_engine(model_path, served, output_dir))
            else:
                served = _served_model(engine_url)
            config = ServeConfig(
                datasets=[str(write_row_task(output_dir / "task"))], llm_url=engine_url.rstrip("/") + "/v1",
                model=served, port=free_port(), capture_port=free_port(), capture_host="127.0.0.1",
                sandbox="local", store_url=f"sqlite:///{output_dir.resolve()}/traces.db", check_engine=False,
                max_concurrent_envs=args.max_concurrent_rollouts + 1, server_id="grpo-trainer",
            )  # fmt: skip
            server = stack.enter_context(running_server(
                config,
                harness_factory=lambda name: harnesses.get(name) or get_harness(name),
                harness_list=lambda: [*harnesses, *harness_names()],
            ))  # fmt: skip
            factory = functools.partial(
                RowSessionFactory, server.url, split="task", harness=next(iter(harnesses)), sandbox="local",
                model=served, agent_timeout_sec=args.episode_timeout_s, capacity_wait_s=60.0,
            )  # fmt: skip
            yield engine_url, factory


class RowSessionFactory(HarborSessionFactory):
    """HarborSessionFactory whose `create(row)` runs the one row task with `row` as its dataset row, on the
    harness of the row's environment."""

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> HarborSession:
        row = dict(task)
        request = self.request(0, seed, episode_id)  # the dataset's only task
        update: dict[str, Any] = {"metadata": {**request.metadata, ROW_KEY: row}}
        if ENVIRONMENT_COLUMN in row:  # TRL's control column: which factory; reset() does not get it
            update["harness"] = ENVIRONMENT_PREFIX + str(row.pop(ENVIRONMENT_COLUMN))
        return self.start(request.model_copy(update=update))


def _environment_factories(environment_factory: Any) -> dict[str, Any]:
    if isinstance(environment_factory, Mapping):
        if not environment_factory:
            raise TrainerConfigError("environment_factory is an empty dict: name at least one environment")
        return {ENVIRONMENT_PREFIX + str(k): v for k, v in environment_factory.items()}
    return {"env-factory": environment_factory}


def _as_list(reward_funcs: Any) -> list[Callable[..., Any]]:
    if reward_funcs is None:
        return []
    funcs = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    for func in funcs:
        if isinstance(func, str) or not callable(func):
            raise TrainerConfigError(
                f"reward function {func!r} is not supported here: reward models (a name or a model) are not "
                "implemented; pass functions called as f(environments, **kwargs) -> list[float | None]"
            )
    return funcs


def _rows(dataset: Any, environments: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dataset (a `datasets.Dataset` or a list of dicts) as JSON rows, checked before anything starts."""
    if dataset is None:
        raise TrainerConfigError(
            "train_dataset is required: a datasets.Dataset (or list of dicts) with a prompt column"
        )
    rows = [dict(row) for row in dataset]
    if not rows:
        raise TrainerConfigError("train_dataset is empty: the trainer needs prompt rows to roll out")
    multi = set(environments) != {"env-factory"}
    for i, row in enumerate(rows):
        if "prompt" not in row:
            raise TrainerConfigError(
                f"train_dataset row {i} has no 'prompt' column (chat messages or a string)"
            )
        if multi and ENVIRONMENT_PREFIX + str(row.get(ENVIRONMENT_COLUMN)) not in environments:
            names = ", ".join(k.removeprefix(ENVIRONMENT_PREFIX) for k in environments)
            raise TrainerConfigError(
                f"train_dataset row {i}: its 'environment' column ({row.get(ENVIRONMENT_COLUMN)!r}) names none "
                f"of the environment_factory dict's keys ({names})"
            )
        try:
            json.dumps(row)
        except TypeError as exc:
            raise TrainerConfigError(f"train_dataset row {i} is not JSON data: {exc}") from None
    return rows


def _served_model(engine_url: str) -> str:
    """The model a vLLM server serves (`GET /v1/models`, its first)."""
    import httpx

    try:
        models = httpx.get(engine_url.rstrip("/") + "/v1/models", timeout=30).json()["data"]
        return str(models[0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise TrainerConfigError(f"cannot read the served model from {engine_url}/v1/models: {exc}") from exc


def write_row_task(folder: Path) -> Path:
    """The one task every row runs. Its verifier and image are a built-in env task's: the env-factory
    harness writes the environment's reward and the verifier forwards it; no reward file, no reward
    (None, never 0)."""
    task = folder / "grpo-trainer-row"
    for part in ("tests", "environment"):
        shutil.copytree(ROW_TASK_TEMPLATE / part, task / part, dirs_exist_ok=True)
    (task / "task.toml").write_text(
        f'schema_version = "1.0"\n\n[task]\nname = "{TASK_ID}"\n'
        'description = "One dataset row of a GRPOTrainer run"\n\n'
        '[metadata]\ncategory = "white-box"\ntags = ["env-factory", "grpo-trainer"]\n\n'
        '[verifier]\ntimeout_sec = 30.0\n\n[environment]\nnetwork_mode = "no-network"\nworkdir = "/app"\n'
    )
    (task / "instruction.md").write_text("The prompt is the dataset row's `prompt` column.\n")
    return folder
