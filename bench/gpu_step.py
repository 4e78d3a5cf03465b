"""Trainer step time and tokens/s for a mid-size random-init model, on a GPU (or a tiny one on CPU).

    python bench/gpu_step.py                 # Qwen2.5-0.5B-shaped model, bf16, CUDA
    python bench/gpu_step.py --quick --device cpu   # the same code path on a toy model (sanity check)

Rollouts are synthetic multi-turn traces (each call extends the previous one exactly, as an agent's
chat does); they go through the real capture path (`build_training_rows`) and the trainer's own
packing, logprob and loss code. Padding-free packing (under `document_sdpa`, the trainer's attention
for packs: sdpa once per row, trainer.attention), the same packs under sdpa's dense block-diagonal mask
(the path before it) and padded batches are timed side by side on the same rows, so the ratios are what
the packing and its attention buy. Never needed by CI: it is for lent GPU machines.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch
from rich.console import Console
from rich.table import Table

from capture_proxy.models import TrainingTrace, TrainingTurn, TurnMetadata
from capture_proxy.rows import build_training_rows
from trainer.attention import ATTENTION, register
from trainer.logprobs import token_logprobs
from trainer.loss import LossSettings, grpo_loss
from trainer.packing import TrainItem, pack, split_by_tokens

MODELS = {
    # Qwen2.5-0.5B's shape (random weights: no hub here).
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
    "toy": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
    ),
}


LAYOUTS = {"packed": ATTENTION, "packed-dense": "sdpa", "padded": "sdpa"}
"""Layout -> the attention implementation its steps run under."""


def synthetic_trace(
    session: str, turns: int, prompt: int, completion: int, tool: int, vocab: int, rng: random.Random
) -> TrainingTrace:
    """`turns` calls, each prompt = previous prompt + completion + a tool result of `tool` tokens."""
    ids = [rng.randrange(vocab) for _ in range(prompt)]
    out = []
    for t in range(turns):
        comp = [rng.randrange(vocab) for _ in range(completion)]
        out.append(
            TrainingTurn(
                node_id=f"t{t}",
                prompt_token_ids=list(ids),
                completion_token_ids=comp,
                per_token_logps=[-rng.uniform(0.05, 3.0) for _ in comp],
                loss_mask=[0] * len(ids) + [1] * len(comp),
                request={"tools": [{"type": "function"}]},
                metadata=TurnMetadata(policy_version=0),
            )
        )
        ids = ids + comp + [rng.randrange(vocab) for _ in range(tool)]
    return TrainingTrace(session_id=session, turns=out, multi_step_task=True)


def build_items(args, vocab: int) -> tuple[list[TrainItem], float]:
    rng = random.Random(0)
    started = time.perf_counter()
    items = []
    for r in range(args.rollouts):
        turns = rng.randint(max(1, args.turns // 2), args.turns)  # rollouts differ in length, as real ones do
        trace = synthetic_trace(f"s{r}", turns, args.prompt, args.completion, args.tool, vocab, rng)
        advantage = rng.choice([-1.0, 1.0])
        items += [TrainItem(row, advantage) for row in build_training_rows(trace)]
    return items, time.perf_counter() - started


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def one_step(model, optimizer, items, *, padded: bool, device: str, max_tokens: int) -> dict[str, float]:
    """Proximal logprobs (no grad), then forward/backward over token-budget micro-batches, then AdamW."""
    settings = LossSettings()
    groups = split_by_tokens(items, max_tokens)
    batches = [pack(g, padding_free=not padded) for g in groups]
    trained = sum(b.num_trained_tokens for b in batches)
    moved = [
        {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(b).items()} for b in batches
    ]
    batches = [type(b)(**m) for b, m in zip(batches, moved, strict=True)]
    sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        prox = [token_logprobs(model, b).logps for b in batches]
    sync(device)
    t1 = time.perf_counter()
    for b, p in zip(batches, prox, strict=True):
        lp = token_logprobs(model, b).logps
        out = grpo_loss(
            lp,
            p,
            b.behavior_logps,
            b.advantages,
            b.loss_mask,
            b.sequence_ids,
            b.num_sequences,
            trained,
            settings,
        )
        out.loss.backward()
    sync(device)
    t2 = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync(device)
    t3 = time.perf_counter()
    positions = sum(int(b.input_ids.numel()) for b in batches)
    return {
        "prox_s": t1 - t0,
        "fwd_bwd_s": t2 - t1,
        "optim_s": t3 - t2,
        "step_s": t3 - t0,
        "positions": positions,
        "tokens": sum(b.num_tokens for b in batches),
        "trained": trained,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="toy model, few rollouts")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", choices=sorted(MODELS), default=None)
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--completion", type=int, default=128)
    parser.add_argument("--tool", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=32768, help="token budget per micro-batch")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per layout (after one warm-up)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    if args.quick:
        args.model = args.model or "toy"
        args.rollouts, args.turns, args.prompt, args.completion, args.tool = 4, 5, 64, 16, 16
        args.max_tokens, args.steps = 4096, 1
    args.model = args.model or "0.5b"

    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    config = Qwen2Config(**MODELS[args.model], max_position_embeddings=65536, attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).to(device=args.device, dtype=dtype)
    getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    params = sum(p.numel() for p in model.parameters())

    items, build_s = build_items(args, config.vocab_size)
    unique = sum(len(t) for t in [it.row.input_ids for it in items])
    results = {}
    register()
    for layout, impl in LAYOUTS.items():
        model.set_attn_implementation(impl)
        one_step(
            model, optimizer, items, padded=layout == "padded", device=args.device, max_tokens=args.max_tokens
        )
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        runs = [
            one_step(
                model,
                optimizer,
                items,
                padded=layout == "padded",
                device=args.device,
                max_tokens=args.max_tokens,
            )
            for _ in range(args.steps)
        ]
        best = min(runs, key=lambda r: r["step_s"])
        best["peak_gib"] = (
            torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else 0.0
        )
        results[layout] = best

    console = Console()
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    console.print(
        f"[bold]trainer step[/] model={args.model} ({params / 1e6:.0f}M params, {dtype}) on {gpu}; "
        f"{args.rollouts} rollouts x {args.turns} turns -> {len(items)} rows, {unique:,} tokens; "
        f"rows built in {build_s * 1e3:.0f} ms"
    )
    table = Table(
        "layout",
        "step s",
        "prox fwd s",
        "fwd+bwd s",
        "optim s",
        "positions",
        "trained tok",
        "train tok/s",
        "all tok/s",
        "peak GiB",
    )
    for layout, r in results.items():
        table.add_row(
            layout,
            f"{r['step_s']:.3f}",
            f"{r['prox_s']:.3f}",
            f"{r['fwd_bwd_s']:.3f}",
            f"{r['optim_s']:.3f}",
            f"{r['positions']:,}",
            f"{r['trained']:,}",
            f"{r['trained'] / r['step_s']:,.0f}",
            f"{r['tokens'] / r['step_s']:,.0f}",
            f"{r['peak_gib']:.1f}",
        )
    console.print(table)
    speedup = results["padded"]["step_s"] / results["packed"]["step_s"]
    dense = results["packed-dense"]["step_s"] / results["packed"]["step_s"]
    console.print(
        f"padding-free packing ({ATTENTION}): {speedup:.2f}x the speed of padded batches, {dense:.2f}x that of "
        "the same packs under sdpa's dense mask (same rows, same run)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "args": vars(args),
                    "params": params,
                    "device": gpu,
                    "rows": len(items),
                    "unique_tokens": unique,
                    "build_rows_s": build_s,
                    "results": results,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
