"""Tool calls end to end: a model that really writes `<tool_call>...` (see scripted_model.py), served by
the engine, parsed the way vLLM's hermes parser does, streamed and not."""

from __future__ import annotations

import openai
import pytest

from tests.engine.conftest import engine_app, serve
from tests.engine.scripted_model import build_scripted_model

TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}
]
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def scripted(tiny_dir, tmp_path_factory):
    folder = build_scripted_model(tiny_dir, tmp_path_factory.mktemp("scripted"))
    with (
        serve(engine_app(folder)) as url,
        openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c,
    ):
        yield c


def test_tool_call_is_parsed_into_the_message(scripted):
    resp = scripted.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Sure."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "bash" and call.function.arguments == "{}"
    assert call.id.startswith("chatcmpl-tool-")


def test_streamed_tool_call_arrives_as_a_tool_calls_delta(scripted):
    chunks = list(
        scripted.chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, temperature=0, stream=True
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert content == "Sure."  # the `<tool_call>` markup never leaks into content
    assert [(tc.index, tc.function.name, tc.function.arguments) for tc in calls] == [(0, "bash", "{}")]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_leaves_the_text_alone(scripted):
    resp = scripted.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="none", temperature=0
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content == 'Sure.<tool_call>{"name": "bash"}</tool_call>'
