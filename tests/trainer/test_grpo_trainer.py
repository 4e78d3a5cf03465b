"""`from harbor_rl import GRPOConfig, GRPOTrainer`: TRL's environment_factory signature, run on the embedded
engine, an in-process `harbor serve` and HarnessAsyncGRPOTrainer. The policy is a real model folder whose
weights make it call the `press` tool (tests/engine/scripted_model.py), so rewards are real."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset

from harbor_rl import GRPOConfig, GRPOTrainer
from tests.engine.scripted_model import build_scripted_model
from trainer.errors import TrainerConfigError

SEEN: list[tuple[str, dict]] = []
"""(environment, reset's keywords) of every episode."""


class Button:
    def __init__(self) -> None:
        self.pressed = 0

    def reset(self, **row) -> str | None:
        SEEN.append((type(self).__name__, dict(row)))
        self.pressed = 0
        return None

    def press(self) -> str:
        """
        Press the button.

        Returns:
            What happened.
        """
        self.pressed += 1
        return "pressed"


class OtherButton(Button):
    pass


def pressed(environments, **kwargs) -> list[float]:
    return [float(env.pressed) for env in environments]


def bonus(environments, bonus, **kwargs) -> list[float]:
    return [float(b) for b in bonus]  # a dataset column, one entry per sample, as TRL passes it


@pytest.fixture(scope="module")
def presser(tiny_dir, tmp_path_factory) -> str:
    return str(
        build_scripted_model(
            tiny_dir, tmp_path_factory.mktemp("presser"), 'Sure.<tool_call>{"name": "press"}</tool_call>'
        )
    )


@pytest.mark.slow
def test_rows_reach_reset_and_the_reward_functions_and_each_function_is_logged(presser, tmp_path) -> None:
    SEEN.clear()
    prompt = [{"role": "user", "content": "Press the button once."}]
    dataset = Dataset.from_dict({
        "prompt": [prompt] * 2, "bonus": [0.5, 0.25], "environment": ["a", "b"],
    })  # fmt: skip
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), report_to="jsonl", max_steps=2, num_generations=2,
        per_device_train_batch_size=2, max_concurrent_rollouts=2, max_tool_calling_iterations=1,
        max_completion_length=64, shuffle_dataset=False,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=presser, reward_funcs=[pressed, bonus], args=args, train_dataset=dataset,
        environment_factory={"a": Button, "b": OtherButton},
    )  # fmt: skip
    result = trainer.train()

    assert result.global_step == 2
    steps = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [s["rewards/pressed/mean"] for s in steps] == [1.0, 1.0]  # one round of tool calls: one press
    assert [s["rewards/bonus/mean"] for s in steps] == [0.5, 0.25]  # row a, then row b
    assert [s["reward"] for s in steps] == [1.5, 1.25]  # the functions' sum
    assert sorted({name for name, _ in SEEN}) == ["Button", "OtherButton"]
    for name, row in SEEN:  # every column but the control one, as TRL's reset gets them
        assert row["prompt"] == prompt and row["bonus"] == (0.5 if name == "Button" else 0.25)
        assert "environment" not in row
    saved = trainer.save_model(str(tmp_path / "final"))
    assert (saved / "config.json").is_file() and (saved / "tokenizer_config.json").is_file()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"environment_factory": None}, "pass environment_factory=YourEnvClass"),
        ({"train_dataset": [{"question": "hi"}]}, "row 0 has no 'prompt' column"),
        ({"reward_funcs": "my-org/reward-model"}, "reward models .* are not implemented"),
        ({"tools": [print]}, r"GRPOTrainer\(tools=...\) is not supported here"),
        ({"eval_dataset": [{"prompt": "x"}]}, "eval_dataset is not supported here"),
        ({"environment_factory": {"a": Button}, "train_dataset": [{"prompt": "x", "environment": "z"}]},
         "names none of the environment_factory dict's keys \\(a\\)"),
    ],
)  # fmt: skip
def test_what_has_no_counterpart_is_one_line(kwargs, message) -> None:
    given = {
        "model": "tiny",
        "train_dataset": [{"prompt": "Press."}],
        "environment_factory": Button,
        **kwargs,
    }
    with pytest.raises(TrainerConfigError, match=message):
        GRPOTrainer(**given)


def test_trls_step_and_length_meanings() -> None:
    config = GRPOConfig(num_generations=2, per_device_train_batch_size=4)
    assert config.total_steps(10) == 15  # max_steps=-1: 3 epochs of 10 prompts, 2 groups a step
    harness = config.harness_config(10, "http://127.0.0.1:1")
    assert harness.max_steps == 15 and harness.max_completion_length is None  # no per-call cap
    loop = GRPOConfig(max_completion_length=100, max_tokens_per_turn=30, max_tool_calling_iterations=2).loop()
    assert (loop.max_completion_length, loop.max_tokens_per_turn, loop.max_tool_calling_iterations) == (
        100,
        30,
        2,
    )


def test_a_grpo_config_that_cannot_run_here_is_one_line_naming_the_value() -> None:
    """TRL scripts construct GRPOConfig(...) directly: its refusals are one TrainerConfigError line, not
    pydantic's multi-line report."""
    with pytest.raises(TrainerConfigError) as colocate:
        GRPOConfig(use_vllm=True, vllm_mode="colocate", max_steps=150)
    assert "\n" not in str(colocate.value)
    assert str(colocate.value).startswith(
        "GRPOConfig: vllm_mode='colocate' is not supported here, only 'server'"
    )
    with pytest.raises(TrainerConfigError, match="^GRPOConfig: max_steps: Input should be greater than"):
        GRPOConfig(max_steps=-2)
