"""AsyncGRPOConfig speaks TRL's dialect (trl 1.16.0, `trl/experimental/async_grpo/async_grpo_config.py`): a
TRL config's knobs that this trainer has mean the same here, and the ones it lacks fail naming the field."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from capture_proxy.upstream import rewrite_request
from tests.trainer.direct import DirectSessionFactory
from trainer import AsyncGRPOConfig, HarnessAsyncGRPOTrainer, TrainerConfigError
from trainer.rollout_worker import sampling_policy
from trainer.trl_names import TRL_FIELDS

TRL_STYLE = {
    "output_dir": "runs/x", "learning_rate": 1e-5, "lr_scheduler_type": "cosine", "num_train_epochs": 2,
    "num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 64, "temperature": 0.7,
    "top_p": 1.0, "top_k": 0, "min_p": None, "repetition_penalty": 1.0, "max_tool_calling_iterations": 6,
    "chat_template_kwargs": {"enable_thinking": False}, "vllm_server_timeout": 30.0, "report_to": ["none"],
    "epsilon": 0.2, "epsilon_high": 0.28, "max_staleness": 2, "weight_sync_steps": 1, "logging_steps": 1,
}  # fmt: skip


def test_a_trl_configs_knobs_mean_the_same_here() -> None:
    config = AsyncGRPOConfig.validated(TRL_STYLE)
    assert config.report_to == "none" and config.lr_scheduler_type == "cosine" and config.clip_high == 0.28
    assert config.vllm_server_base_url == "http://localhost:8000"  # TRL's default
    # 2 epochs over 10 prompts at 2 groups a step: 10 steps, below max_steps.
    assert config.total_steps(10) == 10 and AsyncGRPOConfig().total_steps(10) == 100
    policy = sampling_policy(config)
    assert policy["chat_template_kwargs"] == {"enable_thinking": False} and policy["temperature"] == 0.7


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("token_budget", 4096, "token_budget .* not supported here: use `max_tokens_per_batch`"),
        ("max_inflight_tasks", 64, "max_inflight_tasks .* use `max_concurrent_rollouts`"),
        ("top_p", 0.9, "top_p=0.9: this trainer samples the policy's full distribution"),
        ("repetition_penalty", 1.1, "repetition_penalty=1.1"),
        ("report_to", ["trackio", "wandb"], "one backend at a time"),
        ("no_such_knob", 1, "no_such_knob"),
    ],
)
def test_what_this_trainer_lacks_fails_naming_the_field(field, value, message) -> None:
    with pytest.raises(TrainerConfigError, match=message):
        AsyncGRPOConfig.validated({field: value})


def test_trl_fields_are_every_field_of_the_installed_trl() -> None:
    import dataclasses

    from trl import GRPOConfig
    from trl.experimental.async_grpo import AsyncGRPOConfig as TrlAsyncGRPOConfig

    installed = {f.name for cls in (GRPOConfig, TrlAsyncGRPOConfig) for f in dataclasses.fields(cls)}
    assert not installed - TRL_FIELDS  # each gets its own line, never pydantic's "extra inputs"


def test_a_trl_grpo_config_with_its_vllm_server_names_runs_here() -> None:
    config = AsyncGRPOConfig.validated({
        "use_vllm": True, "vllm_mode": "server", "vllm_server_host": "10.0.0.5", "vllm_server_port": 8001,
        "vllm_importance_sampling_mode": "sequence_mask", "vllm_importance_sampling_clip_max": 2.0,
        "vllm_importance_sampling_clip_min": 0.5, "beta": 0.0, "num_iterations": 1, "scale_rewards": "group",
        "log_completions": True, "num_completions_to_print": 4,
    })  # fmt: skip
    assert config.vllm_server_base_url == "http://10.0.0.5:8001"
    assert (config.importance_sampling_mode, config.importance_sampling_min, config.importance_sampling_max) == (
        "sequence_mask", 0.5, 2.0,
    )  # fmt: skip
    assert config.log_completions and config.num_completions_to_print == 4
    assert (
        AsyncGRPOConfig(vllm_server_base_url="http://a:1", vllm_server_port=9).vllm_server_base_url
        == "http://a:1"
    )
    assert AsyncGRPOConfig(vllm_importance_sampling_correction=False).importance_sampling_mode == "none"
    assert AsyncGRPOConfig(vllm_importance_sampling_cap=5.0).importance_sampling_max == 5.0  # TRL's old name


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "vllm_mode",
            "colocate",
            "vllm_mode='colocate' is not supported here, only 'server': vLLM runs as a server of its own",
        ),
        ("use_vllm", False, "use_vllm=False is not supported here, only True: .* always sampled by an engine server"),
        ("beta", 0.04, "beta=0.04 is not supported here, only 0.0: .* no reference model"),
        ("num_iterations", 2, "num_iterations=2 is not supported here, only 1"),
        ("vllm_gpu_memory_utilization", 0.3, "set it on the engine: `vllm serve --gpu-memory-utilization`"),
        ("vespo_k_pos", 1.0, r"vespo_k_pos \(a TRL GRPOConfig field\) is not supported here: remove it"),
        ("learning_rat", 1e-4, "learning_rat is not a setting .*; did you mean learning_rate\\?"),
        ("vllm_importance_sampling_mod", "none", "did you mean vllm_importance_sampling_mode\\?"),
        ("frobnicate", 1, r"frobnicate is not a setting of this trainer \(nor of TRL's GRPOConfig\)$"),
    ],
)
def test_a_trl_field_or_value_without_a_counterpart_is_one_line(field, value, message) -> None:
    with pytest.raises(TrainerConfigError, match=message) as caught:
        AsyncGRPOConfig.validated({field: value})
    assert "\n" not in str(caught.value)


def test_trl_and_own_names_that_disagree_are_refused() -> None:
    with pytest.raises(
        TrainerConfigError, match="vllm_importance_sampling_mode and importance_sampling_mode"
    ):
        AsyncGRPOConfig.validated(
            {"vllm_importance_sampling_mode": "token_mask", "importance_sampling_mode": "none"}
        )


def test_train_session_calls_carry_the_chat_template_kwargs() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"a": 1}}
    sampling = {"temperature": 0.7, "chat_template_kwargs": {"enable_thinking": False}}
    up, _, _ = rewrite_request(body, endpoint="chat", model="m", purpose="train", sampling=sampling)
    assert up["chat_template_kwargs"] == {"a": 1, "enable_thinking": False}


class RecordingFactory(DirectSessionFactory):
    built_with: list[dict] = []

    def __init__(self, engine_url: str, **kwargs) -> None:
        RecordingFactory.built_with.append(dict(kwargs))
        kwargs.pop("agent_step_limit", None)
        super().__init__(engine_url, **kwargs)


def test_epochs_cosine_schedule_and_step_limit_reach_the_run(fresh_engine, tiny_model, tmp_path) -> None:
    model, tokenizer = tiny_model
    tasks = [{"task_id": f"t{i}", "prompt_ids": [20 + i, 31, 42], "targets": [100, 101]} for i in range(2)]
    config = AsyncGRPOConfig(
        output_dir=str(tmp_path), report_to="jsonl", num_generations=2, per_device_train_batch_size=2,
        max_concurrent_rollouts=2, max_completion_length=4, num_train_epochs=1.5, max_steps=50,
        lr_scheduler_type="cosine", learning_rate=1e-3, max_tool_calling_iterations=3, vllm_server_base_url=None,
    )  # fmt: skip
    RecordingFactory.built_with.clear()
    trainer = HarnessAsyncGRPOTrainer(
        model, functools.partial(RecordingFactory, fresh_engine.url), config, train_dataset=tasks,
        processing_class=tokenizer,
    )  # fmt: skip
    history = trainer.train()
    assert [h["step"] for h in history] == [1, 2, 3]  # 1.5 passes over 2 prompts, one group a step
    rates = [h["learning_rate"] for h in history]
    assert rates[0] == pytest.approx(1e-3) and rates[0] > rates[1] > rates[2] > 0  # cosine decay over 3 steps
    assert RecordingFactory.built_with[0]["agent_step_limit"] == 3
    assert "rewards/harness_reward/mean" in history[0] and "rewards/harness_reward/std" in history[0]
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in history if h.get("num_trained_tokens"))


def test_tool_metrics_carry_trls_names(fresh_engine, tiny_model, tmp_path) -> None:
    """`tools/<name>/call_total` and `/failure_total` summed over a step's rollouts, as TRL's rollout
    worker counts them (trl/experimental/async_grpo/openenv_harness.py), from what sessions report."""
    model, tokenizer = tiny_model
    reported = {
        "tool_calls_by_name": {"bash": 3, "edit": 1}, "tool_failures_by_name": {"bash": 1},
        "tool_call_count": 4, "tool_failure_count": 1,
    }  # fmt: skip
    factory = functools.partial(DirectSessionFactory, fresh_engine.url, tool_metrics=reported)
    config = AsyncGRPOConfig(
        output_dir=str(tmp_path), report_to="jsonl", num_generations=2, per_device_train_batch_size=2,
        max_concurrent_rollouts=2, max_completion_length=4, max_steps=1, vllm_server_base_url=None,
        log_completions=True,
    )  # fmt: skip
    tasks = [{"task_id": "t0", "prompt_ids": [20, 31, 42], "targets": [100, 101]}]
    (step,) = HarnessAsyncGRPOTrainer(
        model, factory, config, train_dataset=tasks, processing_class=tokenizer
    ).train()
    logged = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert [(r["step"], r["task"], r["member"]) for r in logged] == [(1, "t0", 0), (1, "t0", 1)]
    assert all(r["status"] == "completed" and r["reward"] is not None for r in logged)
    assert step["tools/bash/call_total"] == 6 and step["tools/edit/call_total"] == 2
    assert step["tools/bash/failure_total"] == 2 and "tools/edit/failure_total" not in step
    assert step["tools/call_frequency"] == 4 and step["tools/failure_frequency"] == pytest.approx(2 / 8)
