"""Hostile and broken input gets a clear 4xx (or a clear error naming the file), never a 5xx, a hang or
a broken trace: integers no store column holds, invalid UTF-8, huge bodies and prompts, and tool calls
whose arguments are not JSON.

The engine is `engine.imitation`, a faithful local imitation of vLLM's OpenAI server (vLLM needs a
GPU); its `tool_arguments` setting makes it return tool calls with broken arguments, as models do.
Everything else is real: proxy and `harbor serve` on 127.0.0.1, SQLite stores, the `openai` client,
the env-factory harness in a bubblewrap sandbox.
"""

from __future__ import annotations

import json
import shutil
import socket
import sys
from urllib.parse import urlparse

import httpx
import openai
import orjson
import pytest

from tasks import BUILTIN_DIR, TaskFormatError, load_task
from tests.reliability._fixtures_input import ADMIN_KEY, MODEL, imitation, live_proxy
from tests.server.conftest import make_config, running_server

__all__ = ["imitation", "live_proxy"]  # fixtures used by name

pytestmark = pytest.mark.timeout(180)

HUGE = 2**70
BROKEN_ARGUMENTS = '{"message": "echo hello'
"""A tool call cut off mid-string, as a model that stops early or misformats writes it."""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "echo",
            "parameters": {
                "type": "object",
                "properties": {"message": {"type": "string"}},
                "required": ["message"],
            },
        },
    }
]


def chat(proxy, key: str, content: bytes) -> httpx.Response:
    return httpx.post(
        f"{proxy.url}/v1/chat/completions",
        content=content,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        timeout=60,
    )


def error_message(response: httpx.Response) -> str:
    body = response.json()
    error = body.get("error") or {}
    return error.get("message") if isinstance(error, dict) and "message" in error else str(body.get("detail"))


# -- malformed messages and tools (found by the schema fuzzer: they crashed the engine, 502) ------------

USER = {"role": "user", "content": "hi"}


def _tool(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"messages": [{"role": "tool", "tool_calls": True}]}, "messages[0].tool_calls must be an array"),
        (
            {"messages": [USER, {"role": "assistant", "tool_calls": [{"id": "c"}]}]},
            "messages[1].tool_calls[0]",
        ),
        ({"messages": [{"role": "assistant", "tool_calls": [7]}]}, "messages[0].tool_calls[0]"),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}
                ]
            },
            "arguments must be a string",
        ),
        ({"messages": [{"role": "user", "content": 42}]}, "messages[0].content"),
        ({"messages": [USER], "tools": [{"type": "function"}]}, "tools[0]"),
        ({"messages": [USER], "tools": ["bash"]}, "tools[0]"),
        # found by the mutation fuzzer (test_fuzz_api.py): each crashed the engine too
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": [1]}]}]}, "content[0].text"),
        ({"messages": [{"role": "user", "content": [None]}]}, "messages[0].content[0]"),
        ({"messages": [USER], "tools": [_tool({"properties": 5})]}, "parameters.properties"),
        ({"messages": [USER], "tools": [_tool({"required": 2**63})]}, "parameters.required"),
        ({"messages": [USER], "tools": [_tool({})], "tool_choice": {"function": "f"}}, "'tool_choice'"),
        # the engine listed a million alternatives per token, holding the call for minutes
        ({"messages": [USER], "logprobs": True, "top_logprobs": 10**6}, "'top_logprobs' must be between"),
    ],
)
def test_malformed_messages_and_tools_are_400_and_never_reach_the_engine(live_proxy, imitation, body, words):
    """Such a request crashed the engine, so the proxy answered 502 and marked the whole rollout failed
    (unscoreable) for what is the agent's own bad request."""
    session = live_proxy.create()
    r = chat(live_proxy, session.api_key, orjson.dumps({"model": MODEL} | body))
    assert r.status_code == 400, r.text
    assert words in error_message(r)
    assert imitation.requests() == []
    record = live_proxy.store.get_session(session.session_id)
    assert (record.num_turns, record.error) == (0, None)


# 2**31 and beyond: found by the mutation fuzzer; the engine echoed them, the store could not keep them (500)
@pytest.mark.parametrize("prompt", [[3.0], [-1], [True], [{"text": "hi"}], [3, 4.5], [2**31], [72, 2**63]])
def test_malformed_completion_prompts_are_400_and_never_reach_the_engine(live_proxy, imitation, prompt):
    session = live_proxy.create()
    r = httpx.post(
        f"{live_proxy.url}/v1/completions",
        content=orjson.dumps({"model": MODEL, "prompt": prompt}),
        headers={"Authorization": f"Bearer {session.api_key}"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert imitation.requests() == []
    assert live_proxy.store.get_session(session.session_id).num_turns == 0


DEEP = b"[" * 300 + b"]" * 300
"""Nesting orjson reads (up to 1024 levels) but cannot write back (254)."""


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": ' + DEEP + b"}"),
        ("chat/completions", b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}], "x": ' + DEEP + b"}"),
        ("completions", b'{"model": "m", "prompt": "hi", "x": ' + DEEP + b"}"),
        ("responses", b'{"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {"x": ' + DEEP + b"}}]}"),
        ("messages", b'{"model": "m", "max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {"x": ' + b"[" * 1000 + b"]" * 1000 + b"}}]}]}"),
    ],
)  # fmt: skip
def test_a_body_nested_deeper_than_json_is_written_is_400_and_never_reaches_the_engine(
    live_proxy, imitation, path, body
):
    """It parsed, and then crashed the proxy writing the engine's request: a 500."""
    session = live_proxy.create()
    auth = {"Authorization": f"Bearer {session.api_key}"}
    r = httpx.post(f"{live_proxy.url}/v1/{path}", content=body, headers=auth)
    assert r.status_code == 400, r.text
    assert "nested too deeply" in r.text
    assert imitation.requests() == []
    assert live_proxy.store.get_session(session.session_id).num_turns == 0


@pytest.mark.parametrize("recursion_limit", [1000, 3000])  # 3000: what importing jedi sets, for good
def test_a_deep_tool_input_is_refused_whatever_the_recursion_limit(live_proxy, imitation, recursion_limit):
    """The Messages route turned a 1000-deep tool input into an arguments string with `json.dumps`: a
    400 under Python's default limit, a 200 once some import had raised it (so CI flipped with the order)."""
    session = live_proxy.create()
    body = b'{"model": "m", "max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {"x": ' + DEEP + b"}}]}]}"  # fmt: skip
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(recursion_limit)
    try:
        r = httpx.post(f"{live_proxy.url}/v1/messages", content=body, headers={"x-api-key": session.api_key})
    finally:
        sys.setrecursionlimit(before)
    assert r.status_code == 400 and "nested too deeply" in r.text, r.text
    assert imitation.requests() == []


# -- integers beyond 64 bits (found by the schema fuzzer: they reached the store and gave 500) ---------


def test_proxy_admin_refuses_integers_no_store_column_holds(live_proxy):
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for spec, where in [
        ({"model": MODEL, "sampling": {"seed": HUGE}}, "session.sampling.seed"),
        ({"model": MODEL, "max_model_calls": HUGE}, "session.max_model_calls"),
        ({"model": MODEL, "metadata": {"run": {"steps": [1, HUGE]}}}, "session.metadata.run.steps[1]"),
    ]:
        r = httpx.post(f"{live_proxy.url}/sessions", content=json.dumps(spec), headers=admin)
        assert r.status_code == 422, r.text
        assert where in error_message(r) and "64 bits" in error_message(r)
    r = httpx.get(f"{live_proxy.url}/sessions", params={"offset": 2**64}, headers=admin)
    assert r.status_code == 422 and "offset" in error_message(r)
    assert httpx.get(f"{live_proxy.url}/sessions", headers=admin).json() == []


def test_server_refuses_integers_no_store_column_holds(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    rollout = {"split": "builtin", "task_index": 0, "harness": "nop", "sandbox": "local"}
    with running_server(make_config(tmp_path)) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        for extra, where in [
            ({"seed": HUGE}, "rollout.seed"),
            ({"sampling": {"seed": -HUGE}}, "rollout.sampling.seed"),
            ({"metadata": {"group": [HUGE]}}, "rollout.metadata.group[0]"),
        ]:
            r = c.post(
                "/rollouts", content=json.dumps(rollout | extra), headers={"content-type": "application/json"}
            )
            assert r.status_code == 422, r.text
            assert where in error_message(r) and "64 bits" in error_message(r)
        r = c.get("/rollouts", params={"offset": 2**64})
        assert r.status_code == 422 and "offset" in error_message(r)
        assert c.get("/health").json()["live_rollouts"] == 0
        assert c.get("/rollouts").json() == []


# -- invalid UTF-8 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        b'{"model": "imitation-model", "messages": [{"role": "user", "content": "bad \xff\xfe bytes"}]}',
        b'{"model": "imitation-model", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
        b'{"model": "imitation-model", "messages": [{"role": "user", "content": "lone \\ud800 surrogate"}]}',
    ],
    ids=["invalid-bytes", "encoded-surrogate", "escaped-lone-surrogate"],
)
def test_invalid_utf8_from_an_agent_is_400_and_nothing_is_recorded(live_proxy, imitation, content):
    session = live_proxy.create()
    r = chat(live_proxy, session.api_key, content)
    assert r.status_code == 400 and "not valid JSON" in error_message(r)
    assert live_proxy.store.get_session(session.session_id).num_turns == 0
    assert imitation.requests() == []
    ok = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "fine"}]})
    assert chat(live_proxy, session.api_key, ok).status_code == 200


def test_invalid_utf8_to_the_admin_and_server_apis_is_4xx(live_proxy, tmp_path, monkeypatch):
    bad = b'{"model": "m\xff\xfe"}'
    r = httpx.post(
        f"{live_proxy.url}/sessions", content=bad, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    assert r.status_code == 422 and "invalid session spec" in error_message(r)
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    with running_server(make_config(tmp_path)) as server:
        r = httpx.post(
            f"{server.url}/rollouts",
            content=b'{"split": "built\xffin", "task_index": 0, "harness": "nop"}',
            headers={"content-type": "application/json"},
        )
        assert 400 <= r.status_code < 500 and error_message(r)


@pytest.mark.parametrize("name", ["instruction.md", "task.toml"])
def test_task_file_with_invalid_utf8_names_the_file(tmp_path, name):
    task = tmp_path / "task"
    shutil.copytree(BUILTIN_DIR / "deep-merge", task)
    (task / name).write_bytes(b"valid start \xff\xfe then garbage\n")
    with pytest.raises(TaskFormatError) as err:
        load_task(task)
    assert str(err.value).startswith(str(task / name)) and "UTF-8" in str(err.value)


# -- huge bodies and prompts -----------------------------------------------------------------------


def _raw_request(url: str, head: bytes) -> bytes:
    """Send only the request head (a body is announced, never sent) and read the answer."""
    parsed = urlparse(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=60) as sock:
        sock.sendall(head)
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_the_sandbox_facing_port_refuses_a_huge_body_before_reading_it(tmp_path, monkeypatch):
    """An agent announcing a 4 GB body gets 413 at once: the server never waits for (or buffers) it."""
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    with running_server(make_config(tmp_path)) as server:
        answer = _raw_request(
            server.capture_url,
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-anything\r\n"
            b"Content-Type: application/json\r\nContent-Length: 4000000000\r\n\r\n",
        )
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"exceeds the proxy's limit" in answer
        assert httpx.get(f"{server.capture_url}/health").status_code == 200


def test_a_huge_prompt_within_the_limit_is_answered_and_recorded_once(live_proxy):
    """A 1 MB prompt (a million tokens for the imitation's byte tokenizer) is relayed, not hung on."""
    session = live_proxy.create()
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "y" * 1_000_000}]
    )
    assert reply.choices[0].message.content
    [turn] = live_proxy.store.get_turns(session.session_id)
    assert len(turn.prompt_token_ids) > 1_000_000 and turn.metadata.capture == "ok"


# -- tool calls whose arguments are not JSON ---------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_broken_tool_arguments_are_relayed_recorded_and_replayable(live_proxy, imitation, stream):
    """The agent gets the model's tool call verbatim, replays it with an error as the tool result, and
    the trace holds both turns, linked, with no FATAL finding."""
    imitation.configure(tool_arguments=BROKEN_ARGUMENTS)
    session = live_proxy.create(purpose="train")
    messages: list[dict] = [{"role": "user", "content": "say hello"}]
    async with openai.AsyncOpenAI(
        base_url=session.base_url, api_key=session.api_key, max_retries=0
    ) as client:
        if stream:
            chunks = [
                c
                async for c in await client.chat.completions.create(
                    model=MODEL, messages=messages, tools=TOOLS, stream=True
                )
            ]
            deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
            call_id, name = deltas[0].id, deltas[0].function.name
            arguments = "".join(d.function.arguments or "" for d in deltas)
        else:
            reply = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
            [call] = reply.choices[0].message.tool_calls
            call_id, name, arguments = call.id, call.function.name, call.function.arguments
        assert (name, arguments) == ("echo", BROKEN_ARGUMENTS)
        with pytest.raises(json.JSONDecodeError):
            json.loads(arguments)
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": "error: tool arguments are not valid JSON"},
        ]
        imitation.configure(tool_arguments=None)
        await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    r = httpx.get(
        f"{live_proxy.url}/sessions/{session.session_id}/trace",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    )
    assert r.status_code == 200, r.text  # 409 would mean a FATAL finding
    first, second = r.json()["turns"]
    assert (
        first["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        == BROKEN_ARGUMENTS
    )
    assert second["metadata"]["parent_node_id"] == first["node_id"]
    assert second["metadata"]["role"] == "agent" and set(
        second["loss_mask"][-len(second["completion_token_ids"]) :]
    ) == {1}


@pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bwrap is not installed (the local sandbox needs it)"
)
async def test_env_factory_harness_answers_broken_arguments_with_an_error_and_counts_a_failure(
    live_proxy, imitation, tmp_path
):
    from harnesses import AgentRun
    from harnesses.env_factory import EnvFactoryHarness, LoopConfig
    from harnesses.env_factory.harness import TRANSCRIPT_PATH
    from sandboxes.local import LocalBackend
    from tasks.datasets import ENV_TASKS_DIR
    from tasks.environments import EchoEnv, echo_reward

    imitation.configure(tool_arguments=BROKEN_ARGUMENTS)
    session = live_proxy.create(purpose="train")
    task = load_task(ENV_TASKS_DIR / "echo-hello-world")
    box = await LocalBackend(root=tmp_path / "sandboxes").start(
        task.sandbox_spec("broken-args", proxy_port=9)
    )
    try:
        await box.exec(["mkdir", "-p", "/logs/agent"], user="root")
        harness = EnvFactoryHarness(
            EchoEnv, reward_funcs=[echo_reward], loop=LoopConfig(max_tool_calling_iterations=2)
        )
        run = AgentRun(
            instruction="Say the phrase.",
            base_url=session.base_url,
            api_key=session.api_key,
            model=MODEL,
            timeout_s=60,
        )
        outcome = await harness.run(box, run)
        transcript = json.loads(await box.download_file(TRANSCRIPT_PATH))
    finally:
        await box.stop()
    assert outcome.error is None, outcome.error
    assert outcome.tool_calls_by_name == {"echo": 2} and outcome.tool_failures >= 1
    tool_replies = [m["content"] for m in transcript["messages"] if m["role"] == "tool"]
    assert len(tool_replies) == 2 and all("not valid JSON" in reply for reply in tool_replies)
    r = httpx.get(
        f"{live_proxy.url}/sessions/{session.session_id}/trace",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["turns"]) == 2
