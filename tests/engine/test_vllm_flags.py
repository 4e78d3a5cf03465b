"""`harbor engine` takes `vllm serve`'s command line: the TRL/OpenEnv guide's line serves here as it is
(with `harbor engine` for `vllm serve`), and what the embedded engine cannot honour is one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from typer.testing import CliRunner

from engine.weight_client import WeightSyncClient
from harbor_rl.cli import app

GUIDE_FLAGS = [
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--logprobs-mode", "processed_logprobs",
    "--return-tokens-as-token-ids", "--weight-transfer-config", '{"backend":"nccl"}',
]  # fmt: skip
"""The flags of the guide's `vllm serve <model> ...` line (TRL's OpenEnv guide, the Harbor black-box path)."""


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--logprobs-mode", "raw_logprobs"], "--logprobs-mode raw_logprobs: the embedded engine reports processed_logprobs only"),
        (["--logprobs-mode", "nope"], "--logprobs-mode 'nope': expected one of raw_logprobs"),
        (["--tool-call-parser", "mistral"], "--tool-call-parser mistral: the embedded engine parses hermes tool calls only"),
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size 2: the embedded engine runs on one device"),
        (["--weight-transfer-config", '{"backend":"ipc"}'], "backend 'ipc': the embedded engine receives over gloo"),
        (["--weight-transfer-config", "nccl"], "--weight-transfer-config is not JSON"),
        (["--dtype", "int8"], "--dtype 'int8': expected one of auto, float32"),
        (["--enforce-eager"], "--enforce-eager: not an option of harbor engine"),
        (["other-model"], "the model is given twice: 'other-model' and --model"),
    ],
)  # fmt: skip
def test_what_the_embedded_engine_cannot_honour_is_one_line(args, words) -> None:
    extra = ["--model", "tiny2"] if args == ["other-model"] else []
    result = CliRunner(env={"COLUMNS": "250", "NO_COLOR": "1"}).invoke(app, ["engine", *args, *extra])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("harbor engine: ") and words in lines[0], result.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_guides_vllm_serve_line_serves_and_takes_a_push(reference) -> None:
    port = _free_port()
    argv = [sys.executable, "-m", "harbor_rl", "engine", "tiny", *GUIDE_FLAGS, "--dtype", "bfloat16",
            "--gpu-memory-utilization", "0.5", "--port", str(port), "--log-level", "warning"]  # fmt: skip
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=os.environ | {"NO_COLOR": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "the engine did not start"
            time.sleep(0.5)
        config = httpx.get(f"{url}/server_info", params={"config_format": "json"}).json()["vllm_config"]
        assert config["model_config"]["dtype"] == "torch.bfloat16"
        assert config["weight_transfer_config"] == {"backend": "gloo"}
        model, _ = reference
        with WeightSyncClient(
            url, timeout_s=60
        ) as sync:  # weight_sync_backend auto, as the trainer's default
            assert sync.push(model.named_parameters(), version=1) == 1
        assert sync.backend == "gloo" and httpx.get(f"{url}/weight_info").json() == {"weight_version": "1"}
        reply = httpx.post(f"{url}/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "logprobs": True,
        }).json()  # fmt: skip
        assert reply["choices"][0]["logprobs"]["content"][0]["token"].startswith("token_id:")
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    notes = [line for line in stderr.splitlines() if line.startswith("harbor engine: ")]
    assert notes == [
        "harbor engine: --weight-transfer-config backend nccl: the embedded engine receives weights over gloo "
        "(trainers on weight_sync_backend auto follow it)",
        "harbor engine: --gpu-memory-utilization is ignored: the embedded engine preallocates no KV-cache pool",
    ], stderr
