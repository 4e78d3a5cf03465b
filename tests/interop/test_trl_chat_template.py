"""The tiny model's chat template as TRL 1.16.0 sees it (`trl/chat_template_utils.py`, its own code):
TRL recognises it as Qwen2.5's, parses the engine's replies with the response template it picks for it,
finds it prefix-preserving, and the assistant tokens TRL's training template marks are the ones
`harbor sft` trains on."""

from __future__ import annotations

import json

import pytest

chat_template_utils = pytest.importorskip("trl.chat_template_utils")
from transformers import AutoTokenizer  # noqa: E402

from engine.chat import parse_tool_calls  # noqa: E402
from engine.tiny_model import build_tiny_model  # noqa: E402
from trainer.sft import IGNORE_INDEX, tokenize_conversation  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
SERVED = [
    {"role": "user", "content": "list the files"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"},
    {"role": "assistant", "content": "There are two files."},
]
"""The conversation as a server hands it to the template (arguments as objects)."""
OPENAI = [
    {**m, "content": m["content"] or None, "tool_calls": [
        {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}} for c in m["tool_calls"]
    ]} if m.get("tool_calls") else m
    for m in SERVED
]  # fmt: skip
"""The same conversation as `harbor collect` records it (OpenAI's wire format: arguments as JSON text)."""


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return build_tiny_model(seed=0, cache_dir=tmp_path_factory.mktemp("harbor-cache"))


@pytest.fixture
def tokenizer(model_folder):
    return AutoTokenizer.from_pretrained(model_folder)


def test_trl_recognises_the_template_as_qwen25(tokenizer):
    assert tokenizer.chat_template == chat_template_utils.qwen2_5_chat_template
    del tokenizer.response_template  # TRL picks one by recognising the template, not ours
    chat_template_utils.add_response_schema(tokenizer)
    assert chat_template_utils.supports_tool_calling(tokenizer)
    assert chat_template_utils.is_chat_template_prefix_preserving(tokenizer)


@pytest.mark.parametrize("response_template", ["shipped with the model", "chosen by TRL"])
def test_trl_parses_a_reply_as_the_engine_does(tokenizer, response_template):
    if response_template == "chosen by TRL":
        chat_template_utils.add_response_schema(tokenizer)
    prompt = tokenizer.apply_chat_template(SERVED[:1], tools=TOOLS, add_generation_prompt=True)["input_ids"]
    reply = 'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call><|im_end|>'
    ids = tokenizer.encode(reply, add_special_tokens=False)
    parsed = chat_template_utils.parse_response(tokenizer, ids, prefix=list(prompt), tools=TOOLS)
    content, calls = parse_tool_calls(reply.removesuffix("<|im_end|>"))
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in parsed["tool_calls"]] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls
    ]
    assert parsed["content"].strip() == content.strip() == "Let me look."


def test_sft_trains_on_the_tokens_trls_training_template_marks_less_what_the_engine_never_samples(tokenizer):
    """TRL's training variant of the template wraps assistant output in `{% generation %}`. `harbor sft`
    marks assistant tokens from prefix renderings instead; it must train on the same tokens except two
    newlines the engine never samples: the one ending the generation prompt `<|im_start|>assistant\n`
    (Qwen2.5 puts it inside the generation block of a tool-call turn) and the one after `<|im_end|>`."""
    training = chat_template_utils.get_training_chat_template(tokenizer)
    theirs = tokenizer.apply_chat_template(
        SERVED, tools=TOOLS, chat_template=training, return_dict=True, return_assistant_tokens_mask=True
    )
    ours = tokenize_conversation(tokenizer, OPENAI, tools=TOOLS)
    ids = ours.input_ids
    assert ids == list(theirs["input_ids"])
    ours_marked = {i for i, label in enumerate(ours.labels) if label != IGNORE_INDEX}
    theirs_marked = {i for i, m in enumerate(theirs["assistant_masks"]) if m}
    assert ours_marked and ours_marked <= theirs_marked
    extra = sorted(theirs_marked - ours_marked)
    assert [tokenizer.decode(ids[i - 1 : i + 1]) for i in extra] == [
        "assistant\n", "<|im_end|>\n", "assistant\n", "<|im_end|>\n"
    ]  # fmt: skip
