"""The scripted teacher on coding tasks: it finds the task by the instruction the harness quotes, plays
its solve.sh as a `bash` call, then ends the way that harness ends; it streams like an OpenAI server.
The harness prompts here are mini-swe-agent 2.4.6's own (`minisweagent/config/mini.yaml`, abridged), and
opencode's `bash` schema is the one opencode-ai 1.18.33 sent in a captured collect run."""

from __future__ import annotations

import json

import pytest
from openai import AsyncOpenAI

from evaluation.errors import ProviderError
from evaluation.scripted import scripted_teacher
from evaluation.scripted_coding import SUBMIT, CodingScripts, solution_command
from tasks import load_dataset_spec

TASKS = list(load_dataset_spec("tiny-coding"))
FIX_ADD = next(t for t in TASKS if t.id == "fix-add")
MINI_SYSTEM = "You are a helpful assistant that can interact with a computer."
MINI_BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
OPENCODE_BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"},
                           "workdir": {"type": "string"}},
            "required": ["command"],
        },
    },
}  # fmt: skip


def mini_messages(instruction: str) -> list[dict]:
    return [
        {"role": "system", "content": MINI_SYSTEM},
        {
            "role": "user",
            "content": f"Please solve this issue: {instruction}\n\nYou can execute bash commands ...\n"
            f"6. Submit your changes and finish your work by issuing the following command: `{SUBMIT}`.",
        },
    ]


def answered(messages: list[dict], arguments: dict, output: str) -> list[dict]:
    call = {"id": f"c{len(messages)}", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps(arguments)}}  # fmt: skip
    return [
        *messages,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": output},
    ]


def test_solution_is_solve_sh_without_its_shebang():
    assert solution_command(FIX_ADD) == "sed -i 's/a - b/a + b/' calc.py"


def test_mini_swe_agent_gets_the_fix_then_its_submit_command_then_nothing():
    scripts = CodingScripts(TASKS)
    messages = mini_messages(FIX_ADD.instruction)
    first = scripts.move({"messages": messages, "tools": [MINI_BASH]})
    assert first == {"command": "sed -i 's/a - b/a + b/' calc.py"}
    messages = answered(messages, first, '{"returncode": 0, "output": ""}')
    second = scripts.move({"messages": messages, "tools": [MINI_BASH]})
    assert second == {"command": SUBMIT}
    messages = answered(messages, second, "")
    assert scripts.move({"messages": messages, "tools": [MINI_BASH]}) is None


def test_opencode_gets_the_fix_and_ends_without_a_tool_call():
    scripts = CodingScripts(TASKS)
    messages = [
        {"role": "system", "content": "You are opencode."},
        {"role": "user", "content": FIX_ADD.instruction},
    ]
    first = scripts.move({"messages": messages, "tools": [OPENCODE_BASH]})
    assert first == {"command": "sed -i 's/a - b/a + b/' calc.py"}
    messages = answered(messages, first, "(no output)")
    assert scripts.move({"messages": messages, "tools": [OPENCODE_BASH]}) is None  # no submit asked for


def test_other_required_string_parameters_of_bash_are_filled():
    strict = json.loads(json.dumps(OPENCODE_BASH))
    parameters = strict["function"]["parameters"]
    parameters["properties"]["description"] = {"type": "string"}
    parameters["required"] = ["command", "description", "timeout"]  # timeout is no string: left alone
    move = CodingScripts(TASKS).move({"messages": mini_messages(FIX_ADD.instruction), "tools": [strict]})
    assert move == {"command": "sed -i 's/a - b/a + b/' calc.py", "description": "Apply the fix"}


def test_a_conversation_about_no_known_task_gets_no_call():
    scripts = CodingScripts(TASKS)
    assert scripts.move({"messages": mini_messages("Fix something else."), "tools": [MINI_BASH]}) is None


def test_a_solution_that_reads_solution_files_is_refused(tmp_path):
    task = tmp_path / "uses-files"
    for name, text in {
        "task.toml": '[task]\nname = "test/uses-files"\n',
        "instruction.md": "Do it.\n",
        "environment/Dockerfile": "FROM harbor-rl/sandbox-base:bookworm\n",
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
        "solution/solve.sh": "#!/bin/bash\ncp /solution/fixed.py /app/\n",
    }.items():
        (task / name).parent.mkdir(parents=True, exist_ok=True)
        (task / name).write_text(text)
    from tasks import load_task

    with pytest.raises(ProviderError, match="reads files from /solution"):
        CodingScripts([load_task(task)])


async def test_the_teacher_streams_the_call_as_openai_chunks():
    async with scripted_teacher(CodingScripts(TASKS)) as url:
        client = AsyncOpenAI(base_url=url, api_key="unused")
        stream = await client.chat.completions.create(
            model="scripted", messages=mini_messages(FIX_ADD.instruction), tools=[MINI_BASH], stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = [chunk async for chunk in stream]
        await client.close()
    [call] = chunks[0].choices[0].delta.tool_calls
    assert call.index == 0 and call.function.name == "bash"
    assert json.loads(call.function.arguments) == {"command": "sed -i 's/a - b/a + b/' calc.py"}
    assert chunks[1].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
