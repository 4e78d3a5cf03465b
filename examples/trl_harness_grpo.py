"""TRL's black-box recipe (async GRPO over OpenEnv harness sessions) against `harbor serve`.

The TRL guide's script with one import changed: the session factory is ours,

    from harbor_server import HarborSessionFactory   # the guide: from harbor_env.harness import ...

and the rest is TRL 1.16's own code: `AsyncGRPOTrainer` with its `HarnessRolloutWorker` (loop-owning:
each rollout is an agent in a sandbox, its model calls captured by the server; TRL trains on the
captured token ids, never re-tokenised).

    harbor serve --dataset builtin --llm-url http://VLLM_HOST:8000/v1 --model MODEL --sandbox docker
    python examples/trl_harness_grpo.py --server-url http://localhost:8200 --vllm-url http://VLLM_HOST:8000 \\
        --model MODEL --harness mini-swe-agent

vLLM must serve MODEL with `--return-tokens-as-token-ids --logprobs-mode processed_logprobs` and its
weight-transfer endpoints. TRL's rollout worker imports vLLM; without it (on a machine with no GPU) the
script stops right there and says so, after it has built the factory and read the dataset from the server.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer  # noqa: E402
from trl.experimental.async_grpo.openenv_harness import HarnessRolloutWorker  # noqa: E402

from harbor_server import HarborSessionFactory  # noqa: E402


def my_reward(outcome) -> float | None:
    """The verifier's reward, plus a small bonus for solving the task in few tool calls; None (an
    unscoreable rollout) stays None, so it leaves its group's baseline instead of counting as 0."""
    if outcome.env_reward is None:
        return None
    bonus = 0.1 if outcome.env_reward >= 1.0 and outcome.tool_call_count <= 8 else 0.0
    return outcome.env_reward + bonus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server-url", default="http://localhost:8200")
    parser.add_argument("--vllm-url", default="http://localhost:8000", help="vLLM's root URL (no /v1)")
    parser.add_argument("--model", required=True, help="what vLLM serves: a Hub id or a model folder")
    parser.add_argument("--split", default="builtin")
    parser.add_argument("--harness", default="mini-swe-agent")
    parser.add_argument("--sandbox", default="docker")
    parser.add_argument("--output-dir", default="runs/trl-harness-grpo")
    args = parser.parse_args()

    factory = partial(
        HarborSessionFactory,
        args.server_url,
        split=args.split,
        harness=args.harness,
        sandbox=args.sandbox,
        llm_url=args.vllm_url.rstrip("/") + "/v1",
        model=args.model,
    )
    with factory() as lister:
        dataset = Dataset.from_list(list(lister.prompt_rows()))
    print(f"{len(dataset)} tasks from {args.server_url} (split {args.split!r})")

    config = AsyncGRPOConfig(
        output_dir=args.output_dir, num_generations=8, max_completion_length=2048,
        vllm_server_base_url=args.vllm_url, bf16=torch.cuda.is_available(),  # TRL's bf16 default needs a GPU
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    try:
        worker = HarnessRolloutWorker(
            harness_session_factory=factory,  # TRL calls it with its own sampling policy
            rollout_reward_fn=my_reward,
            model_name=args.model,
            dataset=dataset,
            reward_funcs=[],
            processing_class=tokenizer,
            eos_token_ids=[tokenizer.eos_token_id],
            num_generations=config.num_generations,
            vllm_server_url=config.vllm_server_base_url,
            max_tokens=config.max_completion_length,
            temperature=config.temperature,
        )
    except ImportError as exc:
        print(f"stopping where TRL needs vLLM: {exc}", file=sys.stderr)
        return 3
    trainer = AsyncGRPOTrainer(
        model=args.model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_worker=worker,
    )
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
