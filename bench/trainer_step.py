"""Trainer step benchmark: packed tokens vs unique tokens for long multi-turn rollouts, training
tokens/s of padding-free vs padded batches, the step with the lm head at the trained tokens only vs
over every position, and packed rows under `document_sdpa` vs sdpa's dense block-diagonal mask vs padded
batches, measured side by side in one run on the tiny model.

    python bench/trainer_step.py [--quick] [--logits-only | --attention-only]

A rollout of N turns grows the way an agent's conversation does: each call's prompt is the previous
call's prompt + completion + a tool output. Rows come from `capture_proxy.rows.build_training_rows`
(consecutive extensions merge into one row), so packed tokens should equal the unique tokens of the
rollout (target: packed/unique < 1.1); `per-turn` is what training each call as its own sequence costs.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capture_proxy.models import TrainingTrace  # noqa: E402
from capture_proxy.rows import build_training_rows  # noqa: E402
from engine.tiny_model import build_tiny_model, load_model_and_tokenizer  # noqa: E402
from trainer import grpo  # noqa: E402
from trainer.attention import ATTENTION, register  # noqa: E402
from trainer.config import AsyncGRPOConfig  # noqa: E402
from trainer.grpo import HarnessAsyncGRPOTrainer  # noqa: E402
from trainer.logprobs import TokenLogprobs, _cache_argument, shared_prefix_length, token_logprobs  # noqa: E402
from trainer.packing import Batch, TrainItem, pack  # noqa: E402

SYSTEM, COMPLETION, TOOL = 200, 30, 50
AGENT_COMPLETION, AGENT_TOOL = 20, 60
"""An agent turn: few trained tokens, a longer tool output (mini-swe-agent trains ~70 tokens a rollout)."""


def rollout(turns: int, rng: random.Random, session: str, compact_every: int = 0) -> TrainingTrace:
    """A multi-turn trace; with `compact_every`, history is rewritten (a new root) that often."""

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 4000) for _ in range(n)]

    system = ids(SYSTEM)
    context = list(system)
    out = []
    for i in range(turns):
        if compact_every and i and i % compact_every == 0:
            context = system + ids(20)  # a summary replaces the history
        completion = ids(COMPLETION)
        out.append({
            "node_id": f"n{i}", "prompt_token_ids": list(context), "completion_token_ids": completion,
            "per_token_logps": [-1.0] * COMPLETION, "loss_mask": [0] * len(context) + [1] * COMPLETION,
            "request": {"messages": [{"role": "user", "content": "task"}], "tools": [{"type": "function",
                        "function": {"name": "bash", "parameters": {"type": "object"}}}]},
            "response": {"choices": [{"message": {"role": "assistant", "content": "x"}}]},
            "metadata": {"policy_version": 0},
        })  # fmt: skip
        context = context + completion + ids(TOOL)
    return TrainingTrace.model_validate({"session_id": session, "turns": out, "multi_step_task": True})


def unique_tokens(trace: TrainingTrace) -> int:
    """Distinct token positions of the rollout tree: a turn adds what its prompt does not share with an
    earlier call's prompt + completion, plus its completion."""
    seen: list[list[int]] = []
    total = 0
    for turn in trace.turns:
        prompt = turn.prompt_token_ids
        shared = 0
        for prev in seen:
            n = 0
            for a, b in zip(prev, prompt, strict=False):
                if a != b:
                    break
                n += 1
            shared = max(shared, n)
        total += len(prompt) - shared + len(turn.completion_token_ids)
        seen.append(prompt + turn.completion_token_ids)
    return total


def packing_table(turn_counts: list[int]) -> Table:
    rng = random.Random(0)
    table = Table(title="Packed vs unique tokens per rollout (rows from build_training_rows)")
    for col in ("turns", "history", "rows", "unique", "packed", "packed/unique", "per-turn", "per-turn/unique",
                "rows build ms"):  # fmt: skip
        table.add_column(col, justify="right")
    for turns in turn_counts:
        for label, compact in (("extensions", 0), ("compaction/10", 10)):
            trace = rollout(turns, rng, f"s{turns}{label}", compact_every=compact)
            t0 = time.perf_counter()
            rows = build_training_rows(trace)
            build_ms = (time.perf_counter() - t0) * 1000
            packed = sum(len(r.input_ids) for r in rows)
            unique = unique_tokens(trace)
            per_turn = sum(len(t.prompt_token_ids) + len(t.completion_token_ids) for t in trace.turns)
            table.add_row(str(turns), label, str(len(rows)), str(unique), str(packed), f"{packed / unique:.3f}",
                          str(per_turn), f"{per_turn / unique:.1f}", f"{build_ms:.1f}")  # fmt: skip
    return table


def bench_model(shape: str, device: str) -> torch.nn.Module:
    """The tiny model, or a wider/deeper random Qwen2 with the same tokenizer (`medium`, ~150M params)."""
    model, _ = load_model_and_tokenizer(build_tiny_model(0))
    if shape == "medium":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        tiny = model.config
        config = Qwen2Config(
            vocab_size=tiny.vocab_size,
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=16,
            num_attention_heads=16,
            num_key_value_heads=4,
            max_position_embeddings=32768,
            tie_word_embeddings=True,
            pad_token_id=tiny.pad_token_id,
        )
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    return model.to(device)


def logprob_agreement(model: torch.nn.Module, items: list[TrainItem], device: str) -> float:
    """Largest |logp packed - logp padded| over trained tokens: packing must not change the numbers."""
    from trainer.grpo import _to
    from trainer.logprobs import token_logprobs
    from trainer.packing import pack

    got = []
    with torch.no_grad():
        for padding_free in (True, False):
            batch = _to(pack(items, padding_free=padding_free), torch.device(device))
            lp = token_logprobs(model, batch).logps
            got.append(torch.cat([lp[batch.sequence_ids == i][batch.loss_mask[batch.sequence_ids == i] > 0]
                                  for i in range(batch.num_sequences)]))  # fmt: skip
    return float((got[0] - got[1]).abs().max())


def throughput_table(turns: int, rollouts: int, repeats: int, shape: str, device: str, bf16: bool) -> Table:
    torch.set_num_threads(1)
    model = bench_model(shape, device)
    rng = random.Random(1)
    # Rollouts of different lengths, as a group has: padding has something to waste.
    items = []
    for i in range(rollouts):
        trace = rollout(max(2, turns * (i + 1) // rollouts), rng, f"t{i}")
        items.extend(TrainItem(row, 1.0 if i % 2 else -1.0) for row in build_training_rows(trace))
    params = sum(p.numel() for p in model.parameters()) / 1e6
    table = Table(
        title=f"Training step, {shape} model ({params:.0f}M params) on {device}{' bf16' if bf16 else ''}: "
        f"{rollouts} rollouts of up to {turns} turns"
    )
    for col in (
        "batches",
        "tokens in batch",
        "trained tokens",
        "step s",
        "training tok/s",
        "speed vs padded",
    ):
        table.add_column(col, justify="right")
    results = {}
    for padding_free in (True, False):
        config = AsyncGRPOConfig(num_generations=1, per_device_train_batch_size=rollouts, padding_free=padding_free,
                                 learning_rate=1e-5, report_to="none", bf16=bf16,
                                 vllm_server_base_url=None)  # fmt: skip
        trainer = HarnessAsyncGRPOTrainer(model, lambda **_: None, config, train_dataset=[{}])
        trainer._optimize(items)  # warm-up (allocator, kernels)
        best = None
        for _ in range(repeats):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            _, num_tokens, trained = trainer._optimize(items)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
            best = elapsed if best is None else min(best, elapsed)
        padded_tokens = len(items) * max(len(i.row.input_ids) for i in items)
        results[padding_free] = (num_tokens if padding_free else padded_tokens, num_tokens, trained, best)
    padded_time = results[False][3]
    for padding_free in (True, False):
        in_batch, real, trained, best = results[padding_free]
        table.add_row("padding-free" if padding_free else "padded", str(in_batch), str(trained), f"{best:.3f}",
                      f"{real / best:,.0f}", f"{padded_time / best:.2f}x")  # fmt: skip
    table.caption = (
        f"max |logp packed - logp padded| on trained tokens: {logprob_agreement(model, items, device):.2e}"
    )
    return table


def full_logits_logprobs(
    model: torch.nn.Module, batch: Batch, temperature: float = 1.0, with_entropy: bool = False
) -> TokenLogprobs:
    """token_logprobs as it was before it kept the trained tokens only (issue 35): the lm head, float
    copy, softmax and entropy at every position, the shared prompt still run once."""
    prefix = shared_prefix_length(batch)
    cache_arg = _cache_argument(model) if prefix else None
    if cache_arg is not None:
        rows = batch.input_ids.shape[0]
        head = model(input_ids=batch.input_ids[:1, :prefix], position_ids=batch.position_ids[:1, :prefix],
                     use_cache=True, logits_to_keep=1)  # fmt: skip
        cache = getattr(head, "cache", None) or head.past_key_values
        cache.batch_repeat_interleave(rows)
        tail = model(input_ids=batch.input_ids[:, prefix:], position_ids=batch.position_ids[:, prefix:],
                     attention_mask=batch.attention_mask, use_cache=True, **{cache_arg: cache})  # fmt: skip
        logits = torch.cat([head.logits.expand(rows, -1, -1), tail.logits[:, :-1]], dim=1)
    else:
        kwargs = {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "use_cache": False}
        if batch.attention_mask is not None:
            kwargs["attention_mask"] = batch.attention_mask
        logits, prefix = model(**kwargs).logits[:, :-1], 1
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    mask = batch.loss_mask[:, prefix:]
    picked = log_probs.gather(-1, batch.input_ids[:, prefix:, None]).squeeze(-1) * mask
    lead = picked.new_zeros(picked.shape[0], prefix)
    with torch.no_grad():
        entropy = -(log_probs.exp() * log_probs).sum(-1) * mask if with_entropy else None
    return TokenLogprobs(
        torch.cat([lead, picked], 1), None if entropy is None else torch.cat([lead, entropy], 1)
    )


def agent_items(rollouts: int, prompt: int, rng: random.Random, shared: bool = True) -> list[TrainItem]:
    """One group of an agent task: every rollout starts with the same long first prompt, then turns of
    a short trained completion and a longer untrained tool output (mini-swe-agent's shape). With
    `shared` False each rollout has a first prompt of its own (rollouts of different tasks)."""
    first = [rng.randrange(10, 4000) for _ in range(prompt)]
    items = []
    for i in range(rollouts):
        if not shared and i:
            first = [rng.randrange(10, 4000) for _ in range(prompt)]
        ids, mask = list(first), [0] * prompt
        for _ in range(2 + i % 5):
            ids += [rng.randrange(10, 4000) for _ in range(AGENT_COMPLETION + AGENT_TOOL)]
            mask += [1] * AGENT_COMPLETION + [0] * AGENT_TOOL
        row = build_training_rows(TrainingTrace.model_validate({"session_id": f"a{i}", "turns": [{
            "node_id": "n0", "prompt_token_ids": ids[:prompt], "completion_token_ids": ids[prompt:],
            "per_token_logps": [-1.0] * (len(ids) - prompt), "loss_mask": mask,
            "request": {"messages": [{"role": "user", "content": "task"}]},
            "response": {"choices": [{"message": {"role": "assistant", "content": "x"}}]},
            "metadata": {"policy_version": 0}}]}))[0]  # fmt: skip
        items.append(TrainItem(row, 1.0 if i % 2 else -1.0))
    return items


def logits_table(rollouts: int, prompt: int, repeats: int, device: str, bf16: bool) -> Table:
    """The step with token_logprobs (lm head at the trained tokens) vs full_logits_logprobs, interleaved
    repeat by repeat so both see the same machine load. On one torch thread the process's CPU time is
    the step's work; it is what compares on a shared machine, where wall time swings with the load."""
    torch.set_num_threads(1)
    model = bench_model("tiny", device)
    items = agent_items(rollouts, prompt, random.Random(2))
    trained = sum(item.row.num_trained_tokens for item in items)
    lengths = [item.num_tokens for item in items]
    table = Table(
        title=f"Training step, tiny model on {device}{' bf16' if bf16 else ''}, agent rows: {rollouts} rollouts "
        f"of {min(lengths)}-{max(lengths)} tokens sharing a {prompt}-token prompt, {trained} trained tokens"
    )
    for col in ("batches", "logits at", "step s", "CPU s", "training tok/s", "speed vs all", "CPU vs all"):
        table.add_column(col, justify="right")
    impls = {"all positions": full_logits_logprobs, "trained tokens": token_logprobs}
    trainers = {}
    for padding_free in (True, False):
        # One row a pack: a pack of all eight (~13k tokens) paid attention over the whole pack under
        # sdpa's dense mask, ~12x the padded step, which is not what this table measures (see
        # attention_table for packs under document_sdpa).
        config = AsyncGRPOConfig(num_generations=1, per_device_train_batch_size=rollouts, padding_free=padding_free,
                                 max_tokens_per_batch=max(lengths) if padding_free else None,
                                 learning_rate=1e-7, report_to="none", bf16=bf16,
                                 vllm_server_base_url=None)  # fmt: skip
        trainers[padding_free] = HarnessAsyncGRPOTrainer(model, lambda **_: None, config, train_dataset=[{}])
    times: dict[tuple[bool, str], list[tuple[float, float]]] = {
        (pf, name): [] for pf in trainers for name in impls
    }
    tokens = {}
    try:
        for rep in range(repeats + 1):  # the first round warms up (allocator, kernels) and is not kept
            for (padding_free, name), kept in times.items():
                grpo.token_logprobs = impls[name]
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                t0, c0 = time.perf_counter(), time.process_time()
                _, tokens[padding_free], _ = trainers[padding_free]._optimize(items)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                if rep:
                    kept.append((time.perf_counter() - t0, time.process_time() - c0))
    finally:
        grpo.token_logprobs = token_logprobs

    def medians(runs: list[tuple[float, float]]) -> tuple[float, float]:
        return tuple(sorted(column)[len(column) // 2] for column in zip(*runs, strict=True))

    for (padding_free, name), kept in times.items():
        (wall, cpu), (base_wall, base_cpu) = medians(kept), medians(times[(padding_free, "all positions")])
        table.add_row("padding-free, a row a pack" if padding_free else "padded, shared prompt once", name,
                      f"{wall:.3f}", f"{cpu:.3f}", f"{tokens[padding_free] / wall:,.0f}", f"{base_wall / wall:.2f}x",
                      f"{base_cpu / cpu:.2f}x")  # fmt: skip
    with torch.no_grad():
        batch = grpo._to(pack(items, padding_free=True), torch.device(device))
        gap = (token_logprobs(model, batch).logps - full_logits_logprobs(model, batch).logps).abs().max()
    table.caption = (
        f"medians of {repeats} interleaved steps; max |logp trained-tokens - logp all-positions| (packed): "
        f"{float(gap):.2e}"
    )
    return table


ATTENTION_LAYOUTS = {
    "packed, document_sdpa": (True, ATTENTION),
    "packed, sdpa dense mask": (True, "sdpa"),
    "padded": (False, "sdpa"),
}
"""Label -> (padding_free, the model's attention implementation for the step)."""


def attention_table(rollouts: int, prompt: int, repeats: int, device: str, bf16: bool, shared: bool) -> Table:
    """One pack of all the rows under document_sdpa (a sdpa call per row) vs the same pack under sdpa's
    dense block-diagonal mask (the path before it) vs padded batches (whose rows run a shared prompt
    once, trainer.logprobs), interleaved repeat by repeat on one torch thread; CPU time compares."""
    torch.set_num_threads(1)
    model = bench_model("tiny", device)
    register()
    items = agent_items(rollouts, prompt, random.Random(2), shared=shared)
    trained = sum(item.row.num_trained_tokens for item in items)
    lengths = [item.num_tokens for item in items]
    what = f"sharing a {prompt}-token prompt" if shared else f"each with its own {prompt}-token prompt"
    table = Table(
        title=f"Training step, tiny model on {device}{' bf16' if bf16 else ''}, agent rows: {rollouts} rollouts "
        f"of {min(lengths)}-{max(lengths)} tokens {what}, {trained} trained tokens (packed: one pack of all)"
    )
    for col in ("batches", "tokens in batch", "step s", "CPU s", "training tok/s", "speed vs padded",
                "CPU vs padded", "CPU vs dense"):  # fmt: skip
        table.add_column(col, justify="right")
    trainers = {}
    for label, (padding_free, _) in ATTENTION_LAYOUTS.items():
        config = AsyncGRPOConfig(num_generations=1, per_device_train_batch_size=rollouts, padding_free=padding_free,
                                 packed_attention="model", learning_rate=1e-7, report_to="none", bf16=bf16,
                                 vllm_server_base_url=None)  # fmt: skip
        trainers[label] = HarnessAsyncGRPOTrainer(model, lambda **_: None, config, train_dataset=[{}])
    times: dict[str, list[tuple[float, float]]] = {label: [] for label in trainers}
    in_batch = {}
    for rep in range(repeats + 1):  # the first round warms up (allocator, kernels) and is not kept
        for label, kept in times.items():
            model.set_attn_implementation(ATTENTION_LAYOUTS[label][1])
            batches = trainers[label]._micro_batches(items)
            in_batch[label] = sum(b.input_ids.numel() for b in batches)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0, c0 = time.perf_counter(), time.process_time()
            trainers[label]._optimize(items)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            if rep:
                kept.append((time.perf_counter() - t0, time.process_time() - c0))
            print(f"  {label}: {time.perf_counter() - t0:.2f} s", file=sys.stderr, flush=True)

    def medians(runs: list[tuple[float, float]]) -> tuple[float, float]:
        return tuple(sorted(column)[len(column) // 2] for column in zip(*runs, strict=True))

    real = sum(lengths)
    (pad_wall, pad_cpu), (_, dense_cpu) = medians(times["padded"]), medians(times["packed, sdpa dense mask"])
    for label, kept in times.items():
        wall, cpu = medians(kept)
        table.add_row(label, f"{in_batch[label]:,}", f"{wall:.3f}", f"{cpu:.3f}", f"{real / wall:,.0f}",
                      f"{pad_wall / wall:.2f}x", f"{pad_cpu / cpu:.2f}x", f"{dense_cpu / cpu:.2f}x")  # fmt: skip
    got = {}
    for label, (padding_free, impl) in ATTENTION_LAYOUTS.items():
        model.set_attn_implementation(impl)
        with torch.no_grad():
            batch = grpo._to(pack(items, padding_free=padding_free), torch.device(device))
            lp = token_logprobs(model, batch).logps
            got[label] = lp[batch.loss_mask.bool()] if padding_free else torch.cat(
                [lp[i][batch.loss_mask[i].bool()] for i in range(batch.num_sequences)])  # fmt: skip
    gaps = {label: float((got["packed, document_sdpa"] - v).abs().max()) for label, v in got.items()}
    table.caption = (
        f"medians of {repeats} interleaved steps; max |logp document_sdpa - logp| on trained tokens: "
        f"{gaps['packed, sdpa dense mask']:.2e} vs the dense mask, {gaps['padded']:.2e} vs padded"
    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer turns and repeats (a smoke run)")
    parser.add_argument("--device", default="cpu", help="torch device for the training step (cpu, cuda)")
    parser.add_argument("--shape", choices=["tiny", "medium"], default="tiny", help="model size for the step")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast in the training step")
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts in the timed step")
    parser.add_argument(
        "--logits-only", action="store_true", help="only the trained-tokens vs all-positions table"
    )
    parser.add_argument(
        "--attention-only", action="store_true",
        help="only the document_sdpa vs dense-mask vs padded tables (one pack of all the rows)",
    )  # fmt: skip
    args = parser.parse_args()
    console = Console(width=150)
    attention = [
        attention_table(rollouts=4 if args.quick else 8, prompt=400 if args.quick else 1300,
                        repeats=1 if args.quick else 3, device=args.device, bf16=args.bf16, shared=shared)
        for shared in (True, False)
    ]  # fmt: skip
    if args.attention_only:
        for table in attention:
            console.print(table)
        return
    logits = logits_table(rollouts=4 if args.quick else 8, prompt=400 if args.quick else 1300,
                          repeats=1 if args.quick else 3, device=args.device, bf16=args.bf16)  # fmt: skip
    if args.logits_only:
        console.print(logits)
        return
    console.print(packing_table([5, 20] if args.quick else [5, 20, 50]))
    console.print(throughput_table(turns=5 if args.quick else 20, rollouts=args.rollouts,
                                   repeats=1 if args.quick else 3, shape=args.shape, device=args.device,
                                   bf16=args.bf16))  # fmt: skip
    console.print(logits)
    for table in attention:
        console.print(table)
    console.print(
        "[dim]training tok/s: real (non-padding) tokens per second of forward + backward + optimizer step.[/]"
    )


if __name__ == "__main__":
    main()
