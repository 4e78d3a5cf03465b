"""The capture proxy in front of the live vLLM (CPU build, tiny model): what it stores is exactly what
vLLM sampled. Each call through the proxy is repeated directly against vLLM with the same seed and the
body the proxy sends (a train session: the policy's sampling, logprobs, token ids), and the stored prompt
ids, completion ids and logprobs must be equal; a transformers forward of the stored ids re-scores them.
Also: harbor serve's engine probe gives vLLM the right verdict."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from capture_proxy.app import create_app as create_proxy_app
from capture_proxy.config import ProxyConfig
from capture_proxy.store import TraceStore
from capture_proxy.validation import validate_trace
from engine.in_process import serve_in_thread
from engine.tiny_model import load_model_and_tokenizer
from harbor_server.engine_check import probe_engine

pytestmark = pytest.mark.timeout(900)  # the module's first test waits for vLLM's start
ADMIN = "vllm-live-admin-key"
TEMPERATURE = 0.9
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
# A conversation with a tool call and its result, as an agent sends its second turn.
MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "List the files."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "ls"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "README.md\nsetup.py"},
]


@pytest.fixture(scope="module", params=["relay", "replay"])
def proxy(request, tmp_path_factory):
    """The capture proxy in each of its stream modes (relay: streamed on; replay: fetched whole, replayed)."""
    folder = tmp_path_factory.mktemp(f"proxy-{request.param}")
    store = TraceStore(f"sqlite:///{folder}/traces.db")
    app = create_proxy_app(ProxyConfig(admin_key=ADMIN, stream_mode=request.param), store)
    with serve_in_thread(app, start_timeout_s=60, log_level="warning") as url:
        yield url
    store.close()


@pytest.fixture(scope="module")
def reference(tiny_path):
    torch.set_num_threads(1)
    return load_model_and_tokenizer(tiny_path)


def _session(proxy: str, vllm, multi_step: bool = False) -> tuple[str, openai.OpenAI]:
    r = httpx.post(
        f"{proxy}/sessions",
        json={"llm_url": vllm.url, "model": vllm.served_model_name, "multi_step_task": multi_step,
              "sampling": {"temperature": TEMPERATURE}},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )  # fmt: skip
    assert r.status_code == 201, r.text
    body = r.json()
    return body["session_id"], openai.OpenAI(
        base_url=body["base_url"], api_key=body["api_key"], max_retries=0
    )


def _turns(proxy: str, session_id: str) -> list[dict]:
    r = httpx.get(f"{proxy}/sessions/{session_id}/trace", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    trace = r.json()
    assert [f for f in validate_trace(trace) if f.severity == "FATAL"] == []
    for turn in trace["turns"]:
        assert turn["metadata"]["capture"] == "ok", turn["metadata"]
    return trace["turns"]


def _direct(vllm, endpoint: str, **body) -> dict:
    """The call as the proxy sends it upstream in a train session (capture_proxy/upstream.py)."""
    body |= {
        "model": vllm.served_model_name, "return_token_ids": True, "temperature": TEMPERATURE, "top_p": 1.0,
        "top_k": -1, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
    }  # fmt: skip
    body |= {"logprobs": True, "top_logprobs": 0} if endpoint == "chat/completions" else {"logprobs": 0}
    r = httpx.post(f"{vllm.v1}/{endpoint}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _chat_direct(vllm, **body) -> tuple[tuple[list[int], list[int], list[float]], str | None]:
    """The ids and logprobs of the call made directly, and the message content the agent should get."""
    payload = _direct(vllm, "chat/completions", **body)
    choice = payload["choices"][0]
    logps = [e["logprob"] for e in choice["logprobs"]["content"]]
    return (payload["prompt_token_ids"], choice["token_ids"], logps), choice["message"]["content"]


def _stored(turn: dict) -> tuple[list[int], list[int], list[float]]:
    return turn["prompt_token_ids"], turn["completion_token_ids"], turn["per_token_logps"]


async def test_the_engine_probe_finds_processed_logprobs(vllm):
    status = await probe_engine(vllm.v1, vllm.served_model_name, timeout_s=120)
    assert status.errors == [] and status.warnings == []
    assert status.token_ids and status.logprobs and status.processed_logprobs is True


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_with_tools_is_stored_as_vllm_sampled_it(proxy, vllm, reference, stream):
    session_id, agent = _session(proxy, vllm)
    kwargs = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 12, "seed": 7}
    reply = agent.chat.completions.create(model="any", stream=stream, **kwargs)
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
    else:
        text = reply.choices[0].message.content or ""
    (turn,) = _turns(proxy, session_id)
    assert turn["metadata"]["streamed"] is stream
    prompt, completion, logps = _stored(turn)
    direct, content = _chat_direct(vllm, **kwargs)
    assert (prompt, completion, logps) == direct  # exact: same seed, same engine
    assert text == (content or "")  # the agent got what vLLM answered, relayed or replayed
    # vLLM's chat template rendering: the tool schema and the tool result are in the prompt it saw.
    rendered = reference[1].decode(prompt)
    assert (
        '"name": "bash"' in rendered and "README.md\nsetup.py" in rendered and "<tool_response>" in rendered
    )
    # Processed logprobs: log_softmax(logits / T) of a transformers forward of the stored ids.
    model = reference[0]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    expected = (
        torch.log_softmax(logits / TEMPERATURE, -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)
    )
    assert logps == pytest.approx(expected.tolist(), abs=1e-5)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_are_stored_as_vllm_sampled_them(proxy, vllm, stream):
    session_id, agent = _session(proxy, vllm)
    reply = agent.completions.create(
        model="any", prompt="def add(a, b):", max_tokens=10, seed=11, stream=stream
    )
    if stream:
        list(reply)
    (turn,) = _turns(proxy, session_id)
    direct = _direct(vllm, "completions", prompt="def add(a, b):", max_tokens=10, seed=11)["choices"][0]
    assert _stored(turn) == (
        direct["prompt_token_ids"],
        direct["token_ids"],
        direct["logprobs"]["token_logprobs"],
    )


def test_a_multi_turn_session_extends_the_earlier_ids(proxy, vllm):
    """The second turn's prompt begins with the first turn's prompt, as vLLM tokenized both."""
    session_id, agent = _session(proxy, vllm, multi_step=True)
    first = agent.chat.completions.create(
        model="any", messages=MESSAGES[:2], tools=TOOLS, max_tokens=6, seed=1
    )
    history = [*MESSAGES[:2], {"role": "assistant", "content": first.choices[0].message.content or ""}]
    agent.chat.completions.create(
        model="any", messages=[*history, {"role": "user", "content": "Now run the tests."}], tools=TOOLS,
        max_tokens=6, seed=2,
    )  # fmt: skip
    one, two = _turns(proxy, session_id)
    assert two["prompt_token_ids"][: len(one["prompt_token_ids"])] == one["prompt_token_ids"]
