"""`opencode`: the opencode coding agent (npm `opencode-ai`, pinned), run unchanged in `run` mode.

Install: `opencode-ai` is a thin npm wrapper whose postinstall picks a per-platform package holding
one self-contained executable (Bun-compiled, no Node needed). The host fetches that package with
`npm pack` (`harnesses.assets`) and the image layer copies the executable to /opt/harbor-rl/opencode.

Run: `opencode run --format json --auto -m harbor/<model> < instruction.md`, configured entirely through
OPENCODE_CONFIG_CONTENT: one `@ai-sdk/openai-compatible` provider whose baseURL is the capture proxy
and apiKey the session key. Start-up is made offline-safe: no models.dev fetch, no auto-update, no
plugin install from npm (OPENCODE_PURE), and no project config, so a task's own opencode.json cannot
redirect the agent. Training runs disable tools that leave the sandbox (webfetch, websearch,
codesearch). Its model entry carries `limit: {context, output}` sized to the engine's context
(`model_limit`): without it opencode asks for 32,000 completion tokens on every call, which an engine
with a 32k context refuses, so no call would be captured. opencode has no hard step limit of its own (`steps` only asks the model to stop), so the
proxy's `max_model_calls` is what ends a run at the step limit: it answers with a final message and
no tool call. Tool counts come from the JSON event stream it prints.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from harnesses._common import LOG_DIR, completion_budget, tail, timeout_grace
from harnesses.assets import ensure_asset, extract_member, linux_machine, npm_pack
from harnesses.base import AgentOutcome, AgentRun
from harnesses.tool_metrics import ToolResult, summarize
from sandboxes.base import ImageLayer

if TYPE_CHECKING:
    from pathlib import Path

    from sandboxes.base import Sandbox

VERSION = "1.18.33"
PROVIDER = "harbor"
INSTALL_DIR = "/opt/harbor-rl/opencode"
BINARY = f"{INSTALL_DIR}/opencode"
EVENTS_LOG = f"{LOG_DIR}/opencode.jsonl"
STDERR_LOG = f"{LOG_DIR}/opencode.stderr.txt"
STATE_DIR = "/tmp/harbor-rl-opencode"
"""opencode's XDG config/data/cache/state folders (its session database and logs live here)."""
INSTRUCTION_FILE = f"{STATE_DIR}/instruction.md"
OFF_SANDBOX_TOOLS = ("webfetch", "websearch", "codesearch")
OUTPUT_TOKEN_MAX = 32_000
"""opencode's completion size when its model has no `limit.output` (`OUTPUT_TOKEN_MAX` in its source)."""
OUTPUT_SHARE = 4
"""opencode asks for `limit.output` tokens on every call and compacts the conversation once it nears
`context - output`; a quarter of the context for the answer leaves three quarters for the prompt."""


class OpenCodeHarness:
    name = "opencode"

    def __init__(self, *, version: str = VERSION) -> None:
        self.version = version

    def image_layer(self) -> ImageLayer:
        """The pinned executable from the host cache (fetched with `npm pack` on first use)."""
        package = platform_package()
        assets = ensure_asset(f"{package}-{self.version}", lambda folder: self._fetch(package, folder))
        return ImageLayer(
            name=f"opencode-{self.version}",
            dockerfile_lines=[
                f"COPY opencode {BINARY}",
                f"RUN chmod 0755 {BINARY} && {BINARY} --version",
            ],
            context_dir=assets,
        )

    def _fetch(self, package: str, folder: Path) -> None:
        tarball = npm_pack(f"{package}@{self.version}", folder)
        extract_member(tarball, "package/bin/opencode", folder / "opencode")
        tarball.unlink()

    def command(self, run: AgentRun) -> list[str]:
        """The agent's argv; the instruction goes in on stdin (see `run`)."""
        # `--auto` approves permission prompts, which nobody is there to answer.
        return [BINARY, "run", "--format", "json", "--auto", "-m", f"{PROVIDER}/{run.model}"]

    def environment(self, run: AgentRun) -> dict[str, str]:
        return {
            "OPENCODE_CONFIG_CONTENT": json.dumps(render_config(run)),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
            "OPENCODE_PURE": "1",  # no plugin packages fetched from npm at start-up
            "XDG_CONFIG_HOME": f"{STATE_DIR}/config",
            "XDG_DATA_HOME": f"{STATE_DIR}/data",
            "XDG_CACHE_HOME": f"{STATE_DIR}/cache",
            "XDG_STATE_HOME": f"{STATE_DIR}/state",
            "NO_COLOR": "1",
            "TERM": "dumb",
        }

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        # The instruction goes in on stdin, verbatim: as an argument opencode would wrap it in quotes
        # (it quotes arguments that contain spaces) and read a leading dash as a flag.
        await sandbox.exec(["mkdir", "-p", LOG_DIR, STATE_DIR], timeout_s=30.0)
        await sandbox.upload_file(run.instruction.encode(), INSTRUCTION_FILE)
        script = (
            f'mkdir -p {LOG_DIR} && "$@" > {EVENTS_LOG} 2> {STDERR_LOG} < {INSTRUCTION_FILE}; code=$?; '
            f"tail -c 8000 {STDERR_LOG} >&2; exit $code"
        )
        argv = ["bash", "-c", script, "bash", "timeout", "--kill-after=10", str(max(1, int(run.timeout_s)))]
        result = await sandbox.exec(
            [*argv, *self.command(run)],
            cwd=run.workdir,
            env=self.environment(run),
            timeout_s=timeout_grace(run.timeout_s),
        )
        timed_out = result.timed_out or result.exit_code == 124
        try:
            raw = (await sandbox.download_file(EVENTS_LOG)).decode("utf-8", errors="replace")
        except Exception as exc:  # noqa: BLE001 - any backend's "file not found" means the same here
            return AgentOutcome(
                exit_code=result.exit_code,
                timed_out=timed_out,
                error=None
                if timed_out
                else f"opencode wrote no event log ({type(exc).__name__}: {exc}); exit code {result.exit_code}",
                log_tail=tail(result.stdout + result.stderr),
            )
        summary = parse_events(raw)
        metrics = summarize(summary.tool_results)
        error = summary.error
        if error is None and result.exit_code not in (0, None) and not timed_out:
            error = f"opencode exited with code {result.exit_code}"
        return AgentOutcome(
            exit_code=result.exit_code,
            timed_out=timed_out,
            error=error,
            tool_calls_by_name=metrics.calls_by_name,
            tool_failures_by_name=metrics.failures_by_name,
            log_tail=tail(f"{result.stderr}\n{summary.text}\n[steps: {summary.steps}]"),
        )


def platform_package() -> str:
    """The npm package holding opencode's executable for this host (opencode-ai's postinstall logic)."""
    if linux_machine() == "aarch64":
        return "opencode-linux-arm64"
    # The default build needs AVX2; older x86-64 CPUs get the baseline build.
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            has_avx2 = " avx2" in handle.read()
    except OSError:
        has_avx2 = False
    return "opencode-linux-x64" if has_avx2 else "opencode-linux-x64-baseline"


def render_config(run: AgentRun) -> dict[str, Any]:
    """opencode's config: one OpenAI-compatible provider at the proxy, nothing else reachable."""
    config: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Harbor capture proxy",
                "options": {"baseURL": run.base_url, "apiKey": run.api_key},
                "models": {run.model: model_entry(run)},
            }
        },
        "model": f"{PROVIDER}/{run.model}",
        "small_model": f"{PROVIDER}/{run.model}",
        "autoupdate": False,
        "share": "disabled",
    }
    if run.purpose == "train":
        config["tools"] = dict.fromkeys(OFF_SANDBOX_TOOLS, False)
    if run.step_limit > 0:
        config["agent"] = {"build": {"steps": run.step_limit}}
    return config


def model_entry(run: AgentRun) -> dict[str, Any]:
    """The provider's model entry; with a `limit` whenever the engine's context or a cap is known."""
    entry: dict[str, Any] = {"name": run.model}
    limit = model_limit(run.context_length, run.max_tokens)
    if limit is not None:
        entry["limit"] = limit
    return entry


def model_limit(context_length: int | None, max_tokens: int | None) -> dict[str, int] | None:
    """opencode's `limit` (both keys required by its schema; context 0 means unknown, no compaction):
    the completion size is a share of the context, the session's cap when lower, never above 32,000."""
    output = completion_budget(context_length, max_tokens, OUTPUT_TOKEN_MAX, share=OUTPUT_SHARE)
    return None if output is None else {"context": context_length or 0, "output": output}


class EventSummary(BaseModel):
    steps: int = 0
    text: str = ""
    """The agent's final text parts, for the log tail."""
    tool_results: list[ToolResult] = Field(default_factory=list)
    error: str | None = None


def parse_events(raw: str) -> EventSummary:
    """Tool calls, failures and errors from `opencode run --format json` output (one JSON event a line)."""
    summary = EventSummary()
    texts: list[str] = []
    for line in raw.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # opencode prints the odd non-JSON line (warnings)
        if not isinstance(event, dict):
            continue
        kind = event.get("type")
        part = event.get("part") or {}
        if kind == "tool_use":
            summary.tool_results.append(_tool_result(part))
        elif kind == "step_finish":
            summary.steps += 1
        elif kind == "text" and part.get("text"):
            texts.append(str(part["text"]))
        elif kind == "error":
            summary.error = f"opencode reported an error: {_error_text(event.get('error'))}"
    summary.text = "\n".join(texts)
    return summary


def _tool_result(part: dict[str, Any]) -> ToolResult:
    state = part.get("state") or {}
    metadata = state.get("metadata") or {}
    status = state.get("status")
    exit_code = metadata.get("exit")
    failed = status == "error" or (isinstance(exit_code, int) and exit_code != 0)
    output = state.get("output") if status != "error" else state.get("error")
    return ToolResult(
        name=str(part.get("tool") or "unknown"), output=str(output or ""), error_reported=failed
    )


def _error_text(error: Any) -> str:
    """`APIError: bad key (HTTP 401)` from opencode's error object."""
    if not isinstance(error, dict):
        return str(error)[:1000]
    data = error.get("data") if isinstance(error.get("data"), dict) else {}
    message = str(data.get("message") or error.get("message") or "")
    status = f" (HTTP {data['statusCode']})" if data.get("statusCode") else ""
    return f"{error.get('name') or 'error'}: {message}{status}"[:1000]
