"""Stores for the inspector's tests.

`real_rollouts`: rollouts captured for real: the `openai` client -> the capture proxy (uvicorn on
127.0.0.1) -> `engine.imitation`, a faithful local imitation of vLLM's OpenAI server (vLLM needs a
GPU). What `harbor serve` records when a rollout ends (task, harness, rewards, verifier output,
timings) is written with TraceStore.update_session, the same call the server makes.

`synthetic_store`: many sessions written straight into a real SQLite TraceStore, for the list queries.
"""

from __future__ import annotations

import calendar
import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest

from capture_proxy.models import TrainingTurn, TurnMetadata
from capture_proxy.store import SessionRecord, TraceStore
from tests.proxy.conftest import Imitation, Proxy, imitation, proxy, store  # noqa: F401  (fixtures)

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
SYSTEM = {"role": "system", "content": "You are a coding agent."}


@dataclass
class Rollouts:
    store_url: str
    agent: str
    """A tool-using rollout: root -> tool call -> a retried call (one sibling discarded) -> answer,
    plus a tool-less title call (auxiliary). Completed, reward 1.0, policy version 3, run `run-a`."""
    failed: str
    """Unscoreable (reward None), failed, policy version 4, run `run-a`."""
    other: str
    """Reward 0.0, another task and harness, policy version 4, run `run-b`."""
    ids: list[str] = field(default_factory=list)


def _assistant(reply) -> dict:
    message = reply.choices[0].message
    out: dict = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in message.tool_calls
        ]
    return out


def _agent_rollout(client: openai.OpenAI, task: str) -> None:
    messages = [SYSTEM, {"role": "user", "content": f"Task {task}: fix the failing test."}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    messages += [
        _assistant(first),
        {"role": "tool", "tool_call_id": call.id, "content": "1 failed, 3 passed"},
    ]
    client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)  # retried below
    retry = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    call = retry.choices[0].message.tool_calls[0]
    messages += [_assistant(retry), {"role": "tool", "tool_call_id": call.id, "content": "4 passed"}]
    client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, tool_choice="none")
    # A side call without tools (a title), as opencode makes: auxiliary.
    client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Title for: fix the failing test"}]
    )


def _simple_rollout(client: openai.OpenAI, task: str) -> None:
    messages = [SYSTEM, {"role": "user", "content": f"Task {task}: say hello."}]
    client.chat.completions.create(model="policy", messages=messages)


def _open(capture: Proxy, run: str, split: str) -> tuple[str, openai.OpenAI]:
    session = capture.create(
        multi_step_task=True, metadata={"rollout": {"split": split, "metadata": {"run": run}}}
    )
    return session.session_id, openai.OpenAI(
        base_url=session.base_url, api_key=session.api_key, max_retries=0
    )


def _finish(trace_store: TraceStore, session_id: str, **fields) -> None:
    record = trace_store.get_session(session_id)
    facts = dict(record.metadata["rollout"]) | fields.pop("facts", {})
    trace_store.update_session(session_id, metadata=dict(record.metadata) | {"rollout": facts}, **fields)


@pytest.fixture
def real_rollouts(proxy: Proxy, imitation: Imitation) -> Rollouts:  # noqa: F811
    imitation.configure(policy_version=3)
    agent, client = _open(proxy, "run-a", "builtin")
    _agent_rollout(client, "hello-world")
    _finish(
        proxy.store,
        agent,
        status="completed",
        task_id="builtin/hello-world",
        harness="mini-swe-agent",
        sandbox="docker",
        reward=1.0,
        rewards={"tests_passed": 1.0, "format": 0.5},
        facts={
            "verifier_output": "===== 4 passed in 0.12s =====\nreward: 1.0",
            "timings": {"sandbox_start": 0.41, "agent": 2.5, "verifier": 0.3, "total": 3.4},
            "tool_calls_by_name": {"bash": 2},
            "tool_failures": 1,
            "tool_failures_by_name": {"bash": 1},
        },
    )
    imitation.configure(policy_version=4)
    failed, client = _open(proxy, "run-a", "builtin")
    _simple_rollout(client, "fizzbuzz")
    _finish(
        proxy.store,
        failed,
        status="failed",
        task_id="builtin/fizzbuzz",
        harness="mini-swe-agent",
        reward=None,
        error="verifier gave no reward: reward.txt missing",
    )
    other, client = _open(proxy, "run-b", "extra")
    _simple_rollout(client, "sort-list")
    _finish(proxy.store, other, status="completed", task_id="extra/sort-list", harness="opencode", reward=0.0)
    return Rollouts(proxy.store.url, agent, failed, other, [agent, failed, other])


# -- synthetic sessions for the list queries -------------------------------------------------------


def synthetic_turn(seq: int, prompt: list[int], policy_version: int | None) -> TrainingTurn:
    completion = [1000 + seq, 1001 + seq, 1002 + seq]
    return TrainingTurn(
        node_id=f"t{seq}",
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        per_token_logps=[-0.5, -1.0, -2.0],
        loss_mask=[0] * len(prompt) + [1] * len(completion),
        request={"messages": [{"role": "user", "content": "hi"}]},
        response={"choices": [{"message": {"role": "assistant", "content": "ok"}}]},
        metadata=TurnMetadata(policy_version=policy_version),
    )


def add_session(
    trace_store: TraceStore,
    session_id: str,
    *,
    created_at: float,
    turns: int = 1,
    policy_version: int | None = 0,
    metadata: dict | None = None,
    **fields,
) -> None:
    trace_store.create_session(
        SessionRecord(
            session_id=session_id,
            api_key_hash=f"{abs(hash(session_id)):064x}"[-64:],
            model="m",
            llm_url="http://127.0.0.1:1/v1",
            created_at=created_at,
            metadata=metadata or {},
        )
    )
    prompt = [1, 2, 3]
    items = []
    for seq in range(turns):
        turn = synthetic_turn(seq, prompt, policy_version)
        items.append((session_id, seq, turn))
        prompt = prompt + turn.completion_token_ids + [7]
    trace_store.add_turns(items)
    if fields:
        trace_store.update_session(session_id, **fields)


@pytest.fixture
def synthetic_store(tmp_path):
    s = TraceStore(f"sqlite:///{tmp_path}/synthetic.db")
    yield s
    s.close()


DAY = 86_400.0
T0 = float(calendar.timegm((2026, 1, 10, 12, 0, 0)))


# -- a model's tokenizer, for token text ---------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    """A harbor cache folder with the tiny model built in it (set HARBOR_CACHE_DIR to it)."""
    from engine.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("harbor-cache")
    build_tiny_model(seed=0, cache_dir=root)
    return root


def tiny_tokenizer(tiny_cache):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny_cache / "tiny-0" / "tokenizer.json"))


def add_text_session(
    trace_store: TraceStore, session_id: str, *, model: str, prompt: list[int], completion: list[int]
) -> None:
    """One completed session of one turn: `prompt` as context (mask 0), `completion` trained (mask 1)."""
    trace_store.create_session(
        SessionRecord(
            session_id=session_id,
            api_key_hash=f"{abs(hash(session_id)):064x}"[-64:],
            model=model,
            llm_url="http://127.0.0.1:1/v1",
            created_at=T0,
            metadata={},
        )
    )
    turn = TrainingTurn(
        node_id="t0",
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        per_token_logps=[-0.5] * len(completion),
        loss_mask=[0] * len(prompt) + [1] * len(completion),
        request={"messages": [{"role": "user", "content": "hi"}]},
        response={"choices": [{"message": {"role": "assistant", "content": "ok"}}]},
        metadata=TurnMetadata(policy_version=0),
    )
    trace_store.add_turns([(session_id, 0, turn)])
    trace_store.update_session(session_id, status="completed", reward=1.0)


# -- a real browser: headless Debian Chromium through Selenium -----------------------------------------

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium driven by Selenium, with a profile of its own that goes with it."""
    webdriver = pytest.importorskip("selenium.webdriver")
    profile = tempfile.mkdtemp(prefix="harbor-inspector-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def browser():
    with chromium() as driver:
        yield driver


@contextlib.contextmanager
def served(app: Any, driver: Any) -> Iterator[str]:
    """Serve `app` (serve_in_thread) for `driver`, and close the page before the server stops. Gradio's
    page holds a request open (its queue's event stream), and uvicorn waits for open requests when it
    stops: serve_in_thread gave up only at its 30 s join, which was most of each browser test's time."""
    from engine.in_process import serve_in_thread

    with serve_in_thread(app) as url:
        try:
            yield url
        finally:
            driver.get("about:blank")


def wait_for(driver, condition, timeout: float = 30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition)


def load(driver, url: str, condition, attempts: int = 3, timeout: float = 30):
    """Open `url` until `condition` holds, loading it again if it does not within `timeout`. A Docker
    network or a network namespace made or removed meanwhile (other tests on the machine) changes the
    interfaces, and Chromium drops the page's loads (ERR_NETWORK_CHANGED): the page stays blank."""
    from selenium.common.exceptions import TimeoutException

    for attempt in range(attempts):
        driver.get(url)
        try:
            return wait_for(driver, condition, timeout)
        except TimeoutException:
            if attempt == attempts - 1:
                raise
    return None
