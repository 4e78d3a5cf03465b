"""Test harnesses that follow the real Harness protocol (they are not mocks of it):

- `sleeper` runs `sleep` inside the sandbox and remembers the sandbox, so a test can see that a
  cancelled rollout's sandbox was really stopped and its process killed.
- `stubborn` swallows the first cancel it gets and sleeps on, as code under a Python 3.11
  `asyncio.wait_for` can (gh-86296), so a test can see that the server's cancel still ends it.
- `scripted` makes one chat-completion call from INSIDE the sandbox to the capture port, with the
  session key the server handed it, asking with the rollout's episode id as the message, so a test
  can check that every trace holds its own rollout's call and nobody else's. With an episode id
  starting `tolerant` it ignores a failed call (as real agents do) instead of reporting an error.
- `recorder` does nothing but keep the AgentRun it was given, so a test can see what a harness is told.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from harnesses import AgentOutcome, AgentRun, get_harness, harness_names

if TYPE_CHECKING:
    from sandboxes.base import ImageLayer, Sandbox

SLEEP_S = 313.25
"""An unusual duration, so the test can find exactly this process in /proc."""

CALL_SCRIPT = r"""
import json, sys, urllib.request
base, key, model, marker = sys.argv[1:5]
body = {"model": model, "messages": [{"role": "user", "content": marker}], "max_tokens": 8}
req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                             headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(req, timeout=60))
print(json.dumps({"marker": marker, "content": reply["choices"][0]["message"]["content"]}))
"""


class SleeperHarness:
    name = "sleeper"
    sandboxes: list[Sandbox] = []

    def image_layer(self) -> ImageLayer | None:
        return None

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        type(self).sandboxes.append(sandbox)
        result = await sandbox.exec(f"sleep {SLEEP_S}", timeout_s=run.timeout_s)
        return AgentOutcome(exit_code=result.exit_code, timed_out=result.timed_out)


class ScriptedHarness:
    name = "scripted"

    def image_layer(self) -> ImageLayer | None:
        return None

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        marker = str(run.extra["episode_id"])
        await sandbox.upload_file(CALL_SCRIPT.encode(), "/logs/agent/call.py")
        result = await sandbox.exec(
            ["python3", "/logs/agent/call.py", run.base_url, run.api_key, run.model, marker],
            timeout_s=run.timeout_s,
        )
        if not result.ok:
            if marker.startswith("tolerant"):  # an agent that shrugs off a failed call, as real ones do
                return AgentOutcome(exit_code=result.exit_code, log_tail=result.stderr[-500:])
            return AgentOutcome(exit_code=result.exit_code, error=f"call failed: {result.stderr[-500:]}")
        reply = json.loads(result.stdout.strip().splitlines()[-1])
        return AgentOutcome(
            exit_code=0,
            tool_calls_by_name={"chat": 1, f"marker:{reply['marker']}": 1},
            log_tail=result.stdout,
        )


class StubbornHarness(SleeperHarness):
    name = "stubborn"
    swallowed = 0

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        try:
            return await super().run(sandbox, run)
        except asyncio.CancelledError:
            type(self).swallowed += 1
            return await super().run(sandbox, run)


class RecorderHarness:
    name = "recorder"
    runs: list[AgentRun] = []

    def image_layer(self) -> ImageLayer | None:
        return None

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        type(self).runs.append(run)
        return AgentOutcome(exit_code=0)


EXTRA = {
    "sleeper": SleeperHarness,
    "scripted": ScriptedHarness,
    "stubborn": StubbornHarness,
    "recorder": RecorderHarness,
}


def harness_factory(name: str):
    return EXTRA[name]() if name in EXTRA else get_harness(name)


def harness_list() -> list[str]:
    return harness_names() + list(EXTRA)


SERVER_KWARGS = {"harness_factory": harness_factory, "harness_list": harness_list}
