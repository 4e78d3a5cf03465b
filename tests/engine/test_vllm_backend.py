"""`harbor engine --backend vllm` without starting vLLM: the command line it builds (the guide's flags and
each workaround, overridable), and its one-line refusals. tests/vllm_live starts the real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import VllmNotInstalled
from engine.vllm_backend import PLUGIN_STAMP, STAMP, VllmLaunch, default_venv, plugin_source_hash, vllm_python


@pytest.fixture
def venv(tmp_path) -> Path:
    """A venv-shaped folder: bin/python and the stamps scripts/vllm_env.sh writes when it is done."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    (tmp_path / STAMP).write_text("x")
    (tmp_path / PLUGIN_STAMP).write_text(plugin_source_hash())
    return tmp_path


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_command_line_has_the_guides_flags_and_the_workarounds(venv):
    argv = VllmLaunch(model_path=Path("/models/tiny"), served_model_name="tiny", port=8123, venv=venv).argv()
    # -P: a checkout in the working directory must not shadow the venv's modules (its harbor_rl_vllm)
    assert argv[:4] == [str(venv / "bin" / "python"), "-P", "-m", "vllm.entrypoints.openai.api_server"]
    assert "serve" not in argv  # `vllm serve` fails on the CPU build's distribution name
    assert (_value(argv, "--model"), _value(argv, "--served-model-name"), _value(argv, "--port")) == (
        "/models/tiny", "tiny", "8123",
    )  # fmt: skip
    assert "--enable-auto-tool-choice" in argv and _value(argv, "--tool-call-parser") == "hermes"
    assert _value(argv, "--logprobs-mode") == "processed_logprobs" and "--return-tokens-as-token-ids" in argv
    assert "--no-enable-chunked-prefill" in argv
    assert _value(argv, "--dtype") == "float32"  # vLLM's auto would serve a float32 model in bfloat16
    assert int(_value(argv, "--kv-cache-memory-bytes")) == 1 << 30
    # the project's plugin (harbor_rl_vllm) adds gloo; vLLM's own backends need NCCL
    assert json.loads(_value(argv, "--weight-transfer-config")) == {"backend": "gloo"}


def test_the_users_own_flags_replace_the_workarounds(venv):
    extra = ["--enable-chunked-prefill", "--gpu-memory-utilization", "0.3", "--enforce-eager",
             "--weight-transfer-config", '{"backend":"nccl"}']  # fmt: skip
    launch = VllmLaunch(Path("/m"), "m", dtype="bfloat16", max_model_len=2048, extra=extra, venv=venv)
    argv = launch.argv()
    assert "--no-enable-chunked-prefill" not in argv and "--kv-cache-memory-bytes" not in argv
    assert argv.count("--weight-transfer-config") == 1
    assert argv[-len(extra) :] == extra
    assert _value(argv, "--dtype") == "bfloat16" and _value(argv, "--max-model-len") == "2048"


def test_dev_mode_on_and_the_projects_python_path_kept_out(venv, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/work/main")
    env = VllmLaunch(Path("/m"), "m", venv=venv).env()
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and "PYTHONPATH" not in env
    assert env["VLLM_USE_AOT_COMPILE"] == "0"  # its compile cache is hit (see VllmLaunch.env)
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    assert VllmLaunch(Path("/m"), "m", venv=venv).env()["VLLM_USE_AOT_COMPILE"] == "1"  # the user's choice


def test_a_missing_or_half_built_venv_names_the_set_up_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_VLLM_VENV", str(tmp_path / "nowhere"))
    assert default_venv() == tmp_path / "nowhere"
    with pytest.raises(
        VllmNotInstalled, match="no vLLM venv at .*nowhere: run `bash scripts/setup.sh --with-vllm`"
    ):
        vllm_python()
    (tmp_path / "half" / "bin").mkdir(parents=True)
    (tmp_path / "half" / "bin" / "python").write_text("")
    with pytest.raises(VllmNotInstalled, match="is not finished"):
        vllm_python(tmp_path / "half")
    (tmp_path / "half" / STAMP).write_text("x")
    with pytest.raises(VllmNotInstalled, match="lacks the project's plugin"):
        vllm_python(tmp_path / "half")
    (tmp_path / "half" / PLUGIN_STAMP).write_text("an older plugin")
    with pytest.raises(VllmNotInstalled, match="older copy of harbor_rl_vllm"):
        vllm_python(tmp_path / "half")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([], "no vLLM venv at"),
        (["--device", "cuda"], "--backend vllm runs vLLM's CPU build; use --device cpu"),
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size"),
    ],
)
def test_cli_mistakes_are_one_line_and_exit_2(tmp_path, args, words):
    env = os.environ | {"HARBOR_VLLM_VENV": str(tmp_path / "nowhere")}
    cmd = [sys.executable, "-m", "harbor_rl", "engine", "--backend", "vllm", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_an_unknown_backend_is_refused_in_one_line():
    cmd = [sys.executable, "-m", "harbor_rl", "engine", "--backend", "sglang"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert (
        done.returncode == 2
        and done.stderr.strip() == "harbor engine: --backend 'sglang': expected embedded or vllm"
    )
