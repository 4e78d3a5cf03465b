import json
import threading
from pathlib import Path

from datasets import Dataset

from harbor_server import HarborSessionFactory

# The guide's `vllm serve <model> ...` is `harbor engine tiny ...` here, on vLLM's default port.
vllm_url = "http://localhost:8000"
model = "tiny"
# A Harbor dataset's rows are its tasks' instructions, as chat prompts (the server's own listing).
dataset = Dataset.from_list(
    [{"prompt": row["prompt"]} for row in HarborSessionFactory("http://localhost:8200", split="tiny-coding").prompt_rows()]
)

_one_at_a_time = threading.Lock()


def my_reward(outcome):
    """As the Harbor example: the verifier's correctness is the signal, plus a small tool-efficiency bonus
    only when the task is solved; None (unscoreable) when the verifier gave no reward. It also marks the
    first rollout it sees unscoreable, so the test sees that rollout leave its group's baseline, and
    notes what it was given and what it returned in outcomes.jsonl."""
    with _one_at_a_time:  # rollouts finish on several threads: the first to get here is line 1
        first = not Path("outcomes.jsonl").exists()
        if first or outcome.env_reward is None:
            reward = None
        else:
            reward = outcome.env_reward + (0.1 / (1 + outcome.tool_call_count) if outcome.env_reward >= 1.0 else 0.0)
        _note(outcome, reward)
    return reward


def _note(outcome, reward):
    with Path("outcomes.jsonl").open("a") as out:
        out.write(json.dumps({
            "env_reward": outcome.env_reward,
            "completion_roles": [m["role"] for m in outcome.completion],
            "trace": [{k: e[k] for k in ("prompt_token_ids", "completion_token_ids", "loss_mask")} for e in outcome.trace],
            "tool_call_count": outcome.tool_call_count,
            "tool_failure_count": outcome.tool_failure_count,
            "tool_calls_by_name": outcome.tool_calls_by_name,
            "timed_out": outcome.timed_out,
            "reward": reward,
        }) + "\n")


# -- the guide's block --
from functools import partial

from harbor_server import HarborSessionFactory

from harbor_rl import AsyncGRPOConfig
from harbor_rl import HarnessAsyncGRPOTrainer

factory = partial(
    HarborSessionFactory,
    "http://localhost:8200",       # the OpenEnv Harbor server
    split="tiny-coding",          # a Harbor task dataset the server serves
    harness="mini-swe-agent",      # or "opencode", "claude-code", ...
    sandbox="local",
    llm_url=vllm_url,
    model=model,
)
config = AsyncGRPOConfig(num_generations=8, max_concurrent_rollouts=8, vllm_server_base_url=vllm_url, max_steps=1, max_completion_length=32)
trainer = HarnessAsyncGRPOTrainer(
    model=model,
    harness_session_factory=factory,  # called by the trainer with its sampling policy
    args=config,
    train_dataset=dataset,
    rollout_reward_fn=my_reward,      # outcome -> float | None
)
trainer.train()
