"""TRL's config names on this trainer: a mapping written for TRL's GRPOConfig or AsyncGRPOConfig runs here
with the same meaning, or fails with one line naming the field and what to use instead.

Read from trl 1.16.0: `trl/trainer/grpo_config.py`, `trl/experimental/async_grpo/async_grpo_config.py`
and the transformers TrainingArguments both extend. tests/trainer/test_trl_names.py checks
`TRL_FIELDS` against the installed trl.

    translate_trl_names({"use_vllm": True, "vllm_mode": "server", "vllm_importance_sampling_mode":
                         "token_mask"}, own=AsyncGRPOConfig.model_fields)
    -> {"importance_sampling_mode": "token_mask"}
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from capture_proxy.models import NEUTRAL_SAMPLING, is_neutral

_TRL_FIELD_NAMES = """
accelerator_config activation_checkpointing activation_checkpointing_kwargs adam_beta1 adam_beta2
adam_epsilon auto_find_batch_size average_tokens_across_devices batch_eval_metrics beta bf16 bf16_full_eval
cache_implementation cast_lm_head_to_fp32 chat_template_kwargs data_seed dataloader_drop_last
dataloader_in_order dataloader_multiprocessing_context dataloader_num_workers dataloader_persistent_workers
dataloader_pin_memory dataloader_prefetch_factor ddp_backend ddp_broadcast_buffers ddp_bucket_cap_mb
ddp_find_unused_parameters ddp_static_graph ddp_timeout debug deepspeed delta disable_dropout disable_tqdm
do_eval do_predict do_train ds3_gather_for_generation dtype enable_jit_checkpoint entropy_coef
entropy_coef_delta entropy_coef_max entropy_coef_min entropy_target epsilon epsilon_high
eval_accumulation_steps eval_delay eval_do_concat_batches eval_on_start eval_steps eval_strategy
eval_use_gather_object fork_threshold_tokens fp16 fp16_full_eval fsdp fsdp_config full_determinism
generation_batch_size generation_kwargs gradient_accumulation_steps gradient_checkpointing
gradient_checkpointing_kwargs greater_is_better heartbeat_stale_after_s hub_always_push hub_model_id
hub_private_repo hub_revision hub_strategy hub_token ignore_data_skip importance_sampling_level
include_for_metrics include_num_input_tokens_seen label_names label_smoothing_factor learning_rate
length_column_name liger_kernel_config load_best_model_at_end local_rank log_completions
log_completions_hub_repo log_level log_level_replica log_multimodal log_on_each_node log_unique_prompts
logging_first_step logging_nan_inf_filter logging_steps logging_strategy loss_type lr_scheduler_kwargs
lr_scheduler_type mask_truncated_completions max_completion_length max_grad_norm max_inflight_tasks
max_staleness max_steps max_tool_calling_iterations metric_for_best_model min_p model_init_kwargs
multi_objective_aggregation neftune_noise_alpha num_completions_to_print num_generations
num_generations_eval num_iterations num_train_epochs off_policy_mask_threshold optim optim_args
optim_target_modules output_dir pad_to_multiple_of parallelism_config per_device_eval_batch_size
per_device_train_batch_size prediction_loss_only project push_to_hub queue_maxsize ref_model_mixup_alpha
ref_model_sync_steps remove_unused_columns repetition_penalty report_to request_timeout
restore_callback_states_from_checkpoint resume_from_checkpoint reward_weights router_aux_loss_coef run_name
sapo_temperature_neg sapo_temperature_pos save_on_each_node save_only_model save_steps save_strategy
save_total_limit scale_rewards seed shuffle_dataset skip_memory_metrics steps_per_generation sync_ref_model
temperature tf32 token_budget top_entropy_quantile top_k top_p torch_compile torch_compile_backend
torch_compile_mode torch_empty_cache_steps trackio_bucket_id trackio_space_id trackio_static_space_id
train_sampling_strategy transformers_continuous_batching_config trust_remote_code use_adaptive_entropy
use_bias_correction_kl use_cache use_cpu use_liger_kernel use_transformers_continuous_batching
use_transformers_paged use_vllm vespo_k_neg vespo_k_pos vespo_lambda_neg vespo_lambda_pos
vllm_enable_sleep_mode vllm_gpu_memory_utilization vllm_group_port vllm_importance_sampling_cap
vllm_importance_sampling_clip_max vllm_importance_sampling_clip_min vllm_importance_sampling_correction
vllm_importance_sampling_mode vllm_max_model_length vllm_mode vllm_model_impl vllm_server_base_url
vllm_server_host vllm_server_port vllm_server_timeout vllm_structured_outputs_regex
vllm_tensor_parallel_size warmup_steps weight_decay weight_sync_steps weight_sync_timeout
"""
TRL_FIELDS = frozenset(_TRL_FIELD_NAMES.split())
"""Every field of trl 1.16.0's GRPOConfig and AsyncGRPOConfig, TrainingArguments' included (transformers
releases add some; the test checks that every field of the installed ones is here)."""

RENAMED = {
    "vllm_importance_sampling_mode": "importance_sampling_mode",
    "vllm_importance_sampling_clip_max": "importance_sampling_max",
    "vllm_importance_sampling_cap": "importance_sampling_max",  # TRL's deprecated name of clip_max
    "vllm_importance_sampling_clip_min": "importance_sampling_min",
}
"""TRL names of fields this trainer has under its own name (same meaning, same values)."""

TRL_SAMPLING_KNOBS = ("top_p", "top_k", "min_p", "repetition_penalty")
"""Accepted at their neutral values only (and `min_p` at TRL's None): the policy samples its full
distribution (TRL's loop-owning path refuses anything else through OpenEnv's `training_sampling` too)."""

ACCEPTED_AT: dict[str, tuple[Any, ...]] = {
    "beta": (0.0,),
    "num_iterations": (1,),
    "use_vllm": (True,),
    "vllm_mode": ("server",),
    "scale_rewards": ("group", True),
    "mask_truncated_completions": (False,),
}
"""TRL fields whose supported values are this trainer's behaviour (the first one named in errors); any other
value is refused."""

WHY_NOT = {
    "beta": "there is no reference model, so no KL term (TRL's default beta=0.0)",
    "num_iterations": "each batch of rollouts is trained once, as in TRL's async GRPO",
    "use_vllm": "rollouts are always sampled by an engine server: `vllm serve` or `harbor engine` at "
    "vllm_server_base_url (TRL's model.generate path is not implemented)",
    "vllm_mode": "vLLM runs as a server of its own, never inside the training process: leave vllm_mode out "
    "(the embedded engine serves the model), or start `vllm serve` (or `harbor engine`) and set "
    "vllm_server_base_url",
    "model_init_kwargs": "pass a loaded model (or its folder) as `model` instead",
    "dtype": "pass a loaded model in the dtype you want; `bf16` runs the forward passes in bfloat16",
    "trust_remote_code": "load the model yourself and pass it as `model`",
    "router_aux_loss_coef": "MoE auxiliary losses are not implemented",
    "fork_threshold_tokens": "rows come from the capture's rollout graph, never from re-tokenising",
    "request_timeout": "the server's client has its own timeouts (HarborSessionFactory timeout_s)",
    "token_budget": "use `max_tokens_per_batch`",
    "max_inflight_tasks": "use `max_concurrent_rollouts`",
    "queue_maxsize": "admission control (`max_staleness`) bounds the queue",
    "heartbeat_stale_after_s": "the rollout worker runs in this process: there is no heartbeat",
    "warmup_ratio": "use `warmup_steps`",
    "lr_scheduler_kwargs": "the schedules take no extra arguments here",
    "scale_rewards": "advantages are (reward - group mean) / group std: TRL's default, 'group'",
    "mask_truncated_completions": "a rollout cut off by its limits is scored by its verifier like any other",
    "vllm_gpu_memory_utilization": "set it on the engine: `vllm serve --gpu-memory-utilization`",
    "vllm_tensor_parallel_size": "set it on the engine: `vllm serve --tensor-parallel-size`",
    "vllm_max_model_length": "set it on the engine: `vllm serve --max-model-len`",
    "push_to_hub": "push the output folder's checkpoint with `huggingface-cli upload`",
    "eval_strategy": "evaluate with `harbor eval` on a checkpoint",
    "use_cpu": "use `device: cpu`",
    "fp16": "use `bf16`",
}
"""Why a TRL field is refused here, and what to use."""


def translate_trl_names(data: dict[str, Any], own: Collection[str]) -> dict[str, Any]:
    """`data` with TRL's names turned into this trainer's (`own` are its field names); ValueError with one
    line for a TRL field or value that has no counterpart here."""
    data = dict(data)
    for name in TRL_SAMPLING_KNOBS:
        value = data.pop(name, None)
        if value is not None and not is_neutral(name, value):
            raise ValueError(
                f"{name}={value!r}: this trainer samples the policy's full distribution, so {name} must be "
                f"{NEUTRAL_SAMPLING[name]} (only the temperature is a knob)"
            )
    for name, accepted in ACCEPTED_AT.items():
        if name in data and (value := data.pop(name)) not in accepted:
            raise ValueError(f"{name}={value!r} is not supported here, only {accepted[0]!r}: {WHY_NOT[name]}")
    host, port = data.pop("vllm_server_host", None), data.pop("vllm_server_port", None)
    if (host is not None or port is not None) and data.get("vllm_server_base_url") is None:
        data["vllm_server_base_url"] = f"http://{host or 'localhost'}:{port or 8000}"  # TRL: the URL wins
    if data.pop("vllm_importance_sampling_correction", True) is False:
        _put(data, "importance_sampling_mode", "none", "vllm_importance_sampling_correction=False")
    for trl_name, ours in RENAMED.items():
        if trl_name in data:
            _put(data, ours, data.pop(trl_name), trl_name)
    for name in data:
        if name in own:
            continue
        if name in WHY_NOT or name in TRL_FIELDS:
            why = (
                WHY_NOT.get(name)
                or "remove it: this trainer has no such setting (its fields: AsyncGRPOConfig)"
            )
            raise ValueError(f"{name} (a TRL GRPOConfig field) is not supported here: {why}")
        raise ValueError(
            f"{name} is not a setting of this trainer (nor of TRL's GRPOConfig){_did_you_mean(name, own)}"
        )
    return data


def _did_you_mean(name: str, own: Collection[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, [*own, *RENAMED], n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


def _put(data: dict[str, Any], name: str, value: Any, given_as: str) -> None:
    if name in data and data[name] != value:
        raise ValueError(f"{given_as} and {name}={data[name]!r} disagree: give one of them")
    data[name] = value
