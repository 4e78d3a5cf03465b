"""Captured turns as an ATIF trajectory (`capture_proxy.atif`, a trial's agent/trajectory.json): the steps
a conversation gives, with Harbor's own model and validator as the judge of every document built here."""

from __future__ import annotations

import json

import pytest

from capture_proxy.atif import Agent, trajectory_from_turns
from capture_proxy.models import TrainingTurn, TurnMetadata
from tests.harbor_ref import validate_trajectory

AGENT = Agent(name="mini-swe-agent", version="unknown", model_name="m")
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
TASK = {"role": "user", "content": "Fix the bug."}
BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}


def call(call_id: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": arguments}}


def turn(
    n: int, messages: list[dict], answer: dict, *, ids: bool = True, role: str = "agent"
) -> TrainingTurn:
    prompt, completion = ([10 + n, 11 + n], [20 + n, 21 + n, 22 + n]) if ids else ([], [])
    return TrainingTurn(
        node_id=f"t{n}",
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        per_token_logps=[-0.5, -0.25, -0.125] if ids else [],
        loss_mask=[0] * len(prompt) + [1] * len(completion),
        request={"messages": messages, "tools": [BASH]},
        response={
            "model": "m",
            "choices": [{"message": {"role": "assistant", **answer}}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 3},
        },
        metadata=TurnMetadata(role=role, created_at=1_700_000_000.0 + n, finish_reason="stop"),
    )


def _check(tmp_path, trajectory) -> dict:
    """The trajectory as written, after Harbor's model and validator accepted it."""
    path = tmp_path / "trajectory.json"
    path.write_bytes(trajectory.to_json())
    assert validate_trajectory(path) == []
    return json.loads(path.read_text())


def test_a_tool_calling_conversation_becomes_one_agent_step_per_call(tmp_path):
    first_call = {"content": "", "tool_calls": [call("c1", '{"command": "ls"}')]}
    second_call = {
        "content": "let me look",
        "tool_calls": [call("c2", "not json")],
        "reasoning_content": "hmm",
    }
    after_first = [
        SYSTEM,
        TASK,
        {"role": "assistant", **first_call},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    ]
    after_second = [*after_first, {"role": "assistant", **second_call},
                    {"role": "tool", "tool_call_id": "c2", "content": "out"},
                    {"role": "user", "content": "Submit when done."}]  # fmt: skip
    turns = [
        turn(1, [SYSTEM, TASK], first_call),
        turn(2, after_first, second_call),
        turn(3, after_second, {"content": "done"}),
    ]
    doc = _check(tmp_path, trajectory_from_turns(turns, AGENT, session_id="rollout-1"))
    assert doc["schema_version"] == "ATIF-v1.8" and doc["session_id"] == "rollout-1"
    assert doc["agent"]["tool_definitions"] == [BASH]
    steps = doc["steps"]
    assert [(s["step_id"], s["source"]) for s in steps] == [
        (1, "system"),
        (2, "user"),
        (3, "agent"),
        (4, "agent"),
        (5, "agent"),
    ]
    assert steps[1]["message"] == "Fix the bug."
    one, two, three = steps[2:]
    assert one["tool_calls"] == [
        {"tool_call_id": "c1", "function_name": "bash", "arguments": {"command": "ls"}}
    ]
    assert one["observation"] == {"results": [{"source_call_id": "c1", "content": "a.py"}]}
    assert one["metrics"] == {"prompt_tokens": 40, "completion_tokens": 3, "prompt_token_ids": [11, 12],
                              "completion_token_ids": [21, 22, 23], "logprobs": [-0.5, -0.25, -0.125]}  # fmt: skip
    assert one["llm_call_count"] == 1 and one["timestamp"].startswith("2023-11-14T22:13:21")
    assert one["extra"] == {"node_id": "t1", "turn_role": "agent", "capture": "ok", "finish_reason": "stop"}
    # Arguments that are no JSON object are kept, not dropped; the nudge the harness sent is observed too.
    assert two["tool_calls"][0]["arguments"] == {"raw": "not json"} and two["reasoning_content"] == "hmm"
    assert two["observation"]["results"] == [
        {"source_call_id": "c2", "content": "out"},
        {"content": "Submit when done."},
    ]
    assert three["message"] == "done" and "observation" not in three and "tool_calls" not in three
    assert doc["final_metrics"] == {
        "total_prompt_tokens": 120,
        "total_completion_tokens": 9,
        "total_steps": 5,
    }


def test_results_are_found_past_an_interleaved_call_and_history_the_agent_brought_is_marked_copied(tmp_path):
    earlier = {"role": "assistant", "content": "", "tool_calls": [call("c0", "{}")]}
    history = [SYSTEM, TASK, earlier, {"role": "tool", "tool_call_id": "c0", "content": "ok"}]
    answer = {"content": "", "tool_calls": [call("c1", "{}")]}
    title = [{"role": "system", "content": "Title this chat."}, TASK]
    turns = [
        turn(1, history, answer),
        turn(2, title, {"content": "Bug fix"}, role="auxiliary", ids=False),
        turn(3, [*history, {"role": "assistant", **answer}, {"role": "tool", "tool_call_id": "c1", "content": "x"}],
             {"content": "done"}),
    ]  # fmt: skip
    steps = _check(tmp_path, trajectory_from_turns(turns, AGENT))["steps"]
    assert [s["source"] for s in steps] == ["system", "user", "agent", "agent", "agent", "agent"]
    copied = steps[2]
    assert copied["is_copied_context"] is True and "metrics" not in copied
    assert copied["observation"] == {"results": [{"source_call_id": "c0", "content": "ok"}]}
    assert steps[3]["observation"] == {"results": [{"source_call_id": "c1", "content": "x"}]}
    # The auxiliary call is a step of its own, says so, and has no token ids to give.
    auxiliary = steps[4]
    assert auxiliary["extra"]["turn_role"] == "auxiliary" and "observation" not in auxiliary
    assert auxiliary["metrics"] == {"prompt_tokens": 40, "completion_tokens": 3}


def test_a_completions_call_and_no_call_at_all():
    completion = TrainingTurn(
        node_id="t0",
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        per_token_logps=[-1.0],
        loss_mask=[0, 0, 1],
        request={"prompt": "2 + 2 ="},
        response={"choices": [{"text": " 4"}]},
        metadata=TurnMetadata(endpoint="completions"),
    )
    trajectory = trajectory_from_turns([completion], AGENT)
    assert trajectory is not None
    assert [(s.source, s.message) for s in trajectory.steps] == [("user", "2 + 2 ="), ("agent", " 4")]
    assert trajectory_from_turns([], AGENT) is None  # oracle and nop: Harbor writes no trajectory either


@pytest.mark.parametrize(
    "content", [[{"type": "text", "text": "look "}, {"type": "image_url", "image_url": {}}], None]
)
def test_content_parts_read_as_text(content):
    trajectory = trajectory_from_turns(
        [turn(1, [{"role": "user", "content": content}], {"content": None})], AGENT
    )
    assert trajectory is not None
    assert trajectory.steps[0].message == ("look [image_url]" if content else "")
    assert trajectory.steps[1].message == ""


def test_harbors_validator_refuses_what_atif_forbids(tmp_path):
    """The judge is awake: a result that answers no call of its step, and metrics on a user step."""
    answer = {"content": "", "tool_calls": [call("c1", "{}")]}
    doc = json.loads(trajectory_from_turns([turn(1, [TASK], answer)], AGENT).to_json())
    doc["steps"][1]["observation"] = {"results": [{"source_call_id": "elsewhere", "content": "x"}]}
    doc["steps"][0]["metrics"] = {"prompt_tokens": 1}
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(doc))
    errors = validate_trajectory(path)
    assert errors and "only applicable when source is 'agent'" in " ".join(errors)
