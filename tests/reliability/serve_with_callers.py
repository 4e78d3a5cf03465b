"""`harbor serve` with one extra test harness registered, for the server-kill test to run as a real
process: `python -m tests.reliability.serve_with_callers serve --dataset builtin ...`.

The `caller` harness follows the real Harness protocol (it is not a mock of it): from INSIDE the
sandbox it makes a chain of chat completions through the capture port with the session key the server
handed it, each call extending the conversation (every other one streamed, as opencode streams). An
episode id `calls-N` makes N calls and stops; `forever` keeps calling until the rollout is ended.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harnesses import AgentOutcome, AgentRun, register_harness

if TYPE_CHECKING:
    from sandboxes.base import ImageLayer, Sandbox

CALL_LOOP = r"""
import itertools, json, sys, urllib.request
base, key, model, episode = sys.argv[1:5]
calls = itertools.count() if episode == "forever" else range(int(episode.split("-")[1]))
messages = [{"role": "user", "content": "episode " + episode}]
for i in calls:
    stream = i % 2 == 1
    body = {"model": model, "messages": messages, "max_tokens": 12, "stream": stream}
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as reply:
        if stream:
            text = ""
            for line in reply:
                line = line.strip()
                if line.startswith(b"data: {"):
                    for choice in json.loads(line[6:]).get("choices") or ():
                        text += (choice.get("delta") or {}).get("content") or ""
        else:
            text = json.load(reply)["choices"][0]["message"]["content"]
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
    print("call", i, flush=True)
"""


class CallerHarness:
    name = "caller"

    def image_layer(self) -> ImageLayer | None:
        return None

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        episode = str(run.extra["episode_id"])
        await sandbox.upload_file(CALL_LOOP.encode(), "/logs/agent/calls.py")
        result = await sandbox.exec(
            ["python3", "/logs/agent/calls.py", run.base_url, run.api_key, run.model, episode],
            timeout_s=run.timeout_s,
        )
        if not result.ok:
            return AgentOutcome(exit_code=result.exit_code, error=f"calls failed: {result.stderr[-500:]}")
        return AgentOutcome(exit_code=0, tool_calls_by_name={"chat": result.stdout.count("call ")})


def main() -> None:
    register_harness("caller", CallerHarness)
    from harbor_rl.cli import app

    app()


if __name__ == "__main__":
    main()
