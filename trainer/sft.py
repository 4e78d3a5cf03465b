"""Supervised warm-up (`harbor sft`): fine-tune a policy on the episodes `harbor collect` wrote.

    result = run_sft(SFTConfig(data="demos/results.jsonl", model="models/base", output_dir="runs/sft", max_steps=50))
    # result.output_dir is a Hugging Face model folder: `harbor engine --model runs/sft` serves it

GRPO needs a policy that sometimes succeeds; a random or weak model rarely does. This trains on each
kept episode's `messages` (with the `tools` it was offered, so the prompt renders as the engine will
render it) through the tokenizer's chat template. The loss is on assistant tokens only: the template
rendering of each prefix marks where every assistant message starts and ends (the template need not
support `{% generation %}`), so prompts, tool results and the template's own scaffolding are context,
never targets. Training on messages is what SFT is; GRPO never re-tokenises traces (it trains on the
captured token ids).
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from capture_proxy.episodes import Episode, read_episodes
from capture_proxy.rows import TrainingRow
from trainer.errors import SFTDataError, TrainerConfigError
from trainer.logprobs import SHARED_PREFIX_MIN_TOKENS, token_logprobs
from trainer.packing import TrainItem, chunk_by_prefix, pack

IGNORE_INDEX = -100
"""Label of tokens that are not trained (torch's cross-entropy ignore index)."""


class SFTConfig(BaseModel):
    """One `harbor sft` run (names as in TRL's SFTConfig where they exist)."""

    model_config = ConfigDict(extra="forbid")

    data: str
    """A `results.jsonl` from `harbor collect`, or the folder holding it."""
    model: str
    """The policy to start from: a local Hugging Face model folder or a Hub id (`harbor sft` also takes
    `tiny`, the embedded engine's model, and resolves it to its folder)."""
    output_dir: str = "runs/sft"
    """Where the fine-tuned model folder (model, tokenizer, `sft_summary.json`) is saved."""
    seed: int = 0
    """Seeds torch and the order of the examples."""
    min_reward: float | None = 0.0
    """Keep episodes whose reward is >= this (the keep-filter); None keeps every episode, unscored too."""
    task_ids: list[str] | None = None
    """Train only on episodes of these task ids (None: all)."""
    max_episodes: int | None = Field(default=None, ge=1)
    """Use at most this many kept episodes, in file order (None: all)."""
    num_train_epochs: float = Field(default=1.0, gt=0)
    """Passes over the kept episodes (ignored when `max_steps` is set)."""
    max_steps: int | None = Field(default=None, ge=1)
    """Optimizer steps to run; overrides `num_train_epochs`."""
    per_device_train_batch_size: int = Field(default=8, ge=1)
    """Conversations per optimizer step."""
    learning_rate: float = Field(default=2e-5, gt=0)
    """AdamW learning rate (constant after `warmup_steps`)."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warm-up of the learning rate over this many steps."""
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradients are clipped to this global norm."""
    max_length: int = Field(default=4096, ge=8)
    """Conversations longer than this many tokens are cut at the end (their tail is not trained)."""


@dataclass
class SFTExample:
    """One tokenised conversation: `labels` is `input_ids` with non-assistant tokens set to IGNORE_INDEX."""

    input_ids: list[int]
    labels: list[int]

    @property
    def trained_tokens(self) -> int:
        return sum(label != IGNORE_INDEX for label in self.labels)


@dataclass
class SFTResult:
    output_dir: Path
    episodes: int
    """Episodes kept and trained on."""
    steps: int
    trained_tokens: int
    """Assistant tokens per epoch."""
    losses: list[float] = field(default_factory=list)
    """Mean loss per assistant token at each step."""
    seconds: float = 0.0


# -- the assistant-token mask ---------------------------------------------------------------------------


def _render(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None, **kw
) -> str:
    return tokenizer.apply_chat_template(
        [_as_served(m) for m in messages], tools=tools or None, tokenize=False, **kw
    )


def _as_served(message: dict[str, Any]) -> dict[str, Any]:
    """A message as an OpenAI-compatible server hands it to the chat template, so SFT trains on the text
    the engine will show the model: null content as "", tool-call arguments (OpenAI's JSON strings) as
    objects. vLLM does this in `_postprocess_messages` (vllm/entrypoints/chat_utils.py in 0.28,
    vllm/renderers/chat_utils/chat_message.py in 0.33), and so does our
    engine (`engine.chat.normalize_messages`); without it Qwen2.5's template would render the arguments as a
    quoted string, a format the model never sees at serving time."""
    out = {**message, "content": message.get("content") or ""}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [
            {**call, "function": {**call["function"], "arguments": _arguments(call["function"].get("arguments"))}}
            for call in calls
        ]
    elif calls is not None:
        del out["tool_calls"]
    return out


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            raw = {}
    return raw if isinstance(raw, dict) else {}


def assistant_spans(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of every assistant message in it.

    An assistant message at index i starts where the rendering of `messages[:i]` with the generation
    prompt ends, and ends where the rendering of `messages[:i+1]` ends (less the newline after the end
    token, which the engine never samples). Each prefix must render as a prefix of the whole, which holds
    for ChatML-style templates; a template that rewrites earlier turns is refused.
    """
    if not messages:
        raise SFTDataError("an episode has no messages")
    if messages[0].get("role") == "assistant":
        raise SFTDataError("a conversation must start with a system or user message, not the assistant")
    text = _render(tokenizer, messages, tools)
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prompt = _render(tokenizer, messages[:i], tools, add_generation_prompt=True)
        upto = _render(tokenizer, messages[: i + 1], tools).rstrip("\n")
        if not (text.startswith(prompt) and text.startswith(upto) and len(upto) > len(prompt)):
            raise SFTDataError(
                f"the chat template does not render message {i} as an extension of the messages before it, "
                "so assistant tokens cannot be located; use a template with prefix-stable rendering"
            )
        spans.append((len(prompt), len(upto)))
    return text, spans


def tokenize_conversation(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    max_length: int | None = None,
) -> SFTExample:
    """Token ids of the rendered conversation, labelled on assistant tokens only."""
    text, spans = assistant_spans(tokenizer, messages, tools)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    labels = [
        token if any(lo <= start < hi for lo, hi in spans) else IGNORE_INDEX
        for token, (start, _end) in zip(ids, encoded["offset_mapping"], strict=True)
    ]
    if max_length is not None:
        ids, labels = ids[:max_length], labels[:max_length]
    return SFTExample(ids, labels)


# -- data -----------------------------------------------------------------------------------------------


def results_file(data: str | Path) -> Path:
    path = Path(data)
    if path.is_dir():
        path = path / "results.jsonl"
    if not path.is_file():
        raise SFTDataError(f"no results.jsonl at {data} (write one with `harbor collect`)")
    return path


def load_episodes(config: SFTConfig) -> list[Episode]:
    """The episodes of `config.data` that pass the keep-filter, the task filter and `max_episodes`."""
    path = results_file(config.data)
    episodes = read_episodes(path)  # corrupt lines are skipped with a warning, as collect does
    kept = [
        ep
        for ep in episodes
        if (config.min_reward is None or (ep.reward is not None and ep.reward >= config.min_reward))
        and (config.task_ids is None or ep.task.get("task_id") in config.task_ids)
    ]
    if config.max_episodes is not None:
        kept = kept[: config.max_episodes]
    if not kept:
        raise SFTDataError(
            f"no episode of {path} ({len(episodes)} read) passes the filters "
            f"(min_reward={config.min_reward}, task_ids={config.task_ids})"
        )
    return kept


# -- training -------------------------------------------------------------------------------------------


def sft_loss(model: Any, examples: Sequence[SFTExample], pad_id: int):
    """Mean cross-entropy over the assistant tokens of `examples` (next-token prediction). Examples that
    begin with the same prompt (one task's demonstrations) run it once, and the vocabulary projection
    runs at the assistant tokens only (trainer.logprobs, as a GRPO step does)."""
    items = [TrainItem(_row(example), 0.0) for example in examples]
    total = sum(example.trained_tokens for example in examples)
    summed = 0.0
    for chunk in chunk_by_prefix(items, len(items), SHARED_PREFIX_MIN_TOKENS):
        batch = pack(chunk, padding_free=False, pad_token_id=pad_id)
        summed = summed + (token_logprobs(model, batch).logps * batch.loss_mask).sum()
    return -summed / total


def _row(example: SFTExample) -> TrainingRow:
    mask = tuple(int(label != IGNORE_INDEX) for label in example.labels)
    return TrainingRow(
        input_ids=tuple(example.input_ids), loss_mask=mask, behavior_logps=(0.0,) * len(mask),
        node_ids=("sft",), policy_versions=(None,), session_id=None, trained_node_ids=("sft",),
    )  # fmt: skip


def _batches(n_examples: int, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """`steps` batches of example indices: seeded shuffles of the whole set, one after another."""
    rng = random.Random(seed)
    order: list[int] = []
    out = []
    for _ in range(steps):
        while len(order) < batch_size:
            epoch = list(range(n_examples))
            rng.shuffle(epoch)
            order.extend(epoch)
        out.append(order[:batch_size])
        order = order[batch_size:]
    return out


def run_sft(
    config: SFTConfig,
    *,
    on_start: Callable[[int], None] = lambda _steps: None,
    on_step: Callable[[int, float], None] = lambda _step, _loss: None,
) -> SFTResult:
    """Fine-tune `config.model` on the kept episodes and save the model folder. `on_start(total_steps)`
    runs once before training, `on_step(step, loss)` after every optimizer step."""
    import torch

    from trainer.models import load_policy

    started = time.monotonic()
    episodes = load_episodes(config)
    model, tokenizer = load_policy(config.model)
    if tokenizer.chat_template is None:
        raise TrainerConfigError(
            f"the tokenizer of {config.model} has no chat template to render messages with"
        )
    examples = [tokenize_conversation(tokenizer, ep.messages, ep.tools, config.max_length) for ep in episodes]
    trained_tokens = sum(e.trained_tokens for e in examples)
    if trained_tokens == 0:
        raise SFTDataError(f"the {len(examples)} kept episodes have no assistant tokens to train on")
    batch_size = min(config.per_device_train_batch_size, len(examples))
    steps = config.max_steps or max(1, math.ceil(config.num_train_epochs * len(examples) / batch_size))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    torch.manual_seed(config.seed)
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    warmup = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / config.warmup_steps) if config.warmup_steps else 1.0
    )
    on_start(steps)
    losses = []
    for step, indices in enumerate(_batches(len(examples), batch_size, steps, config.seed), start=1):
        loss = sft_loss(model, [examples[i] for i in indices], pad_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        warmup.step()
        losses.append(float(loss.detach()))
        on_step(step, losses[-1])
    model.eval()
    result = SFTResult(
        Path(config.output_dir), len(episodes), steps, trained_tokens, losses, time.monotonic() - started
    )
    save_model_folder(model, tokenizer, result, config)
    return result


def save_model_folder(model: Any, tokenizer: Any, result: SFTResult, config: SFTConfig) -> Path:
    """A Hugging Face model folder (`from_pretrained` and the engine load it) plus `sft_summary.json`."""
    out = result.output_dir
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    summary = {
        "config": config.model_dump(),
        "episodes": result.episodes,
        "steps": result.steps,
        "trained_tokens": result.trained_tokens,
        "first_loss": result.losses[0] if result.losses else None,
        "final_loss": result.losses[-1] if result.losses else None,
        "seconds": round(result.seconds, 2),
    }
    (out / "sft_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return out
