"""The guides' snippets run here with only their import lines changed, plus what cannot run offline
(the Hub model becomes `tiny`, a remote environment a local one of the same shape) and short settings
for CI; and what each guide says happens, happens. SOURCES.md says where each snippet comes from."""

from __future__ import annotations

import json

import pytest

from tests.seeds.guide_diff import (
    BLOCK_MARKER,
    HERE,
    allowed,
    changes,
    free_names,
    preamble_strays,
    refused_changes,
    run_seed,
    split_seed,
)


@pytest.mark.parametrize("name", ["trl_openenv_echo"])
def test_a_seed_differs_from_its_guide_only_where_the_rules_allow(name) -> None:
    guide = (HERE / "guide" / f"{name}.py").read_text()
    ours = (HERE / f"{name}.py").read_text()
    assert (
        "from trl import GRPOConfig, GRPOTrainer",
        "from harbor_rl import GRPOConfig, GRPOTrainer",
    ) in changes(guide, ours)
    refused = refused_changes(name)
    assert not refused, f"{name}.py changes the guide beyond its imports and offline settings: {refused}"


def test_the_rules_refuse_any_other_change() -> None:
    assert not allowed("    reward_funcs=reward_func,", "    reward_funcs=[reward_func],")
    assert not allowed(None, "import harbor_rl.testing")
    assert allowed("from trl import GRPOTrainer", "from harbor_rl import GRPOTrainer")


@pytest.mark.slow
def test_the_echo_quick_start_trains_and_does_what_the_guide_says(tmp_path) -> None:
    """The guide: one EchoToolEnv per generation, reset() at the start of each episode, echo() found from
    its docstring and offered as a tool, the reward function reading env.reward after the episode."""
    done = run_seed("trl_openenv_echo", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "trainer_output"  # TRL's default output_dir
    (step,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert step["rollout/scoreable"] == 2 and step["rollout/failed"] == 0
    assert step["rewards/reward_func/mean"] == step["reward"]  # the one function is the reward
    logged = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert len(logged) == 2 and "step 1: completions" in done.stderr  # log_completions=True

    from capture_proxy.store import TraceStore

    store = TraceStore(f"sqlite:///{out / 'traces.db'}")
    try:
        # Newest first; the worker may have started rollouts the run ended before they made a call.
        turns = [turn for s in store.list_sessions() for turn in store.get_turns(s.session_id)]
        request = turns[0].request
    finally:
        store.close()
    (tool,) = request["tools"]
    assert tool["function"]["name"] == "echo"
    assert tool["function"]["description"] == "Echo the message back from the environment."
    assert tool["function"]["parameters"]["properties"]["message"] == {
        "type": "string", "description": "The message to echo"
    }  # fmt: skip
    assert request["messages"][-1]["content"] == "Try to echo 'Hello World!' in the environment."


def test_a_preamble_may_define_only_what_the_block_uses() -> None:
    block = "trainer = Trainer(model=model, train_dataset=dataset)\n"
    assert free_names(block) == {"Trainer", "model", "dataset"}
    assert preamble_strays("import os\nmodel = 'tiny'\ndataset = []\n", block) == set()
    assert preamble_strays("model = 'tiny'\nreward_funcs = []\n", block) == {"reward_funcs"}
    assert split_seed(f"x = 1\n{BLOCK_MARKER}\ny = x\n") == ("x = 1\n", "y = x\n")
