"""Guide 000's black-box section ("Training on a harness: training a real coding agent (Harbor)"): its
`HarnessAsyncGRPOTrainer` block and its two command lines run here with their import lines changed, plus
what cannot run offline: E2B's cloud sandbox becomes the local one, the Hub dataset the `tiny-coding` one
the server serves, the Hub model `tiny`, and the run is one step long with each model call capped at 32 tokens.

The block's server is the guide's `harbor serve` line, run as a subprocess on the guide's ports (8200,
8300) with `--expose gradio`, whose share server is a stand-in (tests/server/tunnel_stand_ins.py); its
engine is the guide's `vllm serve` line as `harbor engine tiny`, on vLLM's default port 8000. The agent is
the real mini-swe-agent in local sandboxes: with the tiny model it makes three malformed calls and stops
(RepeatedFormatError), 4-7 s a rollout on an idle machine here; the whole test takes 40-80 s, and about
four minutes when other jobs hold the two cores (load 30).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.seeds.guide_diff import HERE, allowed, changes, refused_changes, run_seed, running, wait_for
from tests.server.tunnel_stand_ins import FRPC_LOG, SHARE_URL, stand_in_binary

SEED = "trl_openenv_harbor"
COMMANDS = f"{SEED}_commands.sh"
LOCAL_DATASET = "tiny-coding"
"""What the guide's `<hf-dataset>` is here: a named dataset shipped with the package."""

# -- the block's rules ---------------------------------------------------------------------------------

HARBOR_IMPORTS = {
    "harbor_env.harness": "harbor_server",
    "trl.experimental.async_grpo.openenv_harness": "harbor_rl",
}
"""The block's imports from OpenEnv's Harbor client and TRL's experimental trainer, and ours."""


def harbor_imports(guide: str | None, ours: str | None) -> bool:
    """`from harbor_env.harness import X` / `from trl.experimental.async_grpo.openenv_harness import X`
    become `from harbor_server import X` / `from harbor_rl import X`, the names unchanged."""
    match = re.fullmatch(r"from (\S+) import (.+)", guide or "")
    return (
        bool(match and match[1] in HARBOR_IMPORTS)
        and ours == f"from {HARBOR_IMPORTS[match[1]]} import {match[2]}"
    )


def local_split(guide: str | None, ours: str | None) -> bool:
    """The placeholder `"<hf-dataset>"` becomes the local dataset, the rest of the line unchanged."""
    return bool(guide and '"<hf-dataset>"' in guide) and ours == guide.replace(
        '"<hf-dataset>"', f'"{LOCAL_DATASET}"'
    )


def offline_sandbox(guide: str | None, ours: str | None) -> bool:
    """`sandbox="e2b"` (E2B's cloud) becomes `sandbox="local"`; nothing else of the line changes."""
    return bool(guide and re.fullmatch(r'\s*sandbox="e2b",', guide)) and ours == guide.replace(
        '"e2b"', '"local"'
    )


def short_run(guide: str | None, ours: str | None) -> bool:
    """The config's call gains `max_steps=N` and, optionally, `max_completion_length=N` (each model call's
    max_tokens) as its last keywords: a one-step run for CI."""
    return (
        bool(guide and guide.endswith(")"))
        and re.fullmatch(
            re.escape(guide[:-1]) + r", max_steps=\d+(, max_completion_length=\d+)?\)", ours or ""
        )
        is not None
    )


BLOCK_RULES = (harbor_imports, local_split, offline_sandbox, short_run)

# -- the commands' rules -------------------------------------------------------------------------------

COMMAND_CHANGES = (
    ("openenv harbor serve", "harbor serve"),
    ("vllm serve <model>", "harbor engine tiny"),
    ("<hf-dataset>", LOCAL_DATASET),
    ("<parser>", "hermes"),  # the tiny model's tool-call format: Qwen's hermes-style <tool_call> JSON
)
"""Each guide command's program becomes ours and its placeholders local values; nothing else changes."""


def command_line(guide: str | None, ours: str | None) -> bool:
    if guide is None or ours is None:
        return False
    for theirs, here in COMMAND_CHANGES:
        guide = guide.replace(theirs, here)
    return ours == guide


def refused_command_changes(guide: str, ours: str) -> list[tuple[str | None, str | None]]:
    return [pair for pair in changes(guide, ours) if not command_line(*pair)]


def commands(text: str) -> list[tuple[dict[str, str], list[str]]]:
    """(environment, argv) of each command in a shell file: continuation lines joined, leading
    `NAME=value` words as the environment, `harbor` as this interpreter's `-m harbor_rl`."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line)
        env = {}
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        assert words[0] == "harbor", line
        out.append((env, [sys.executable, "-m", "harbor_rl", *words[1:]]))
    return out


# -- fast: the seed is the guide's code ----------------------------------------------------------------


def test_the_block_differs_from_the_guide_only_where_the_rules_allow() -> None:
    guide = (HERE / "guide" / f"{SEED}.py").read_text()
    ours = (HERE / f"{SEED}.py").read_text()
    assert ("from trl import AsyncGRPOConfig", "from harbor_rl import AsyncGRPOConfig") in changes(
        guide, ours
    )
    assert not refused_changes(SEED, extra=BLOCK_RULES)


@pytest.mark.parametrize(
    ("guide", "ours"),
    [
        ("from harbor_env.harness import HarborSessionFactory", "from harbor_server.client import HarborSessionFactory"),
        ("from harbor_env.harness import HarborSessionFactory", "from harbor_server import AsyncHarborSessionFactory"),
        ("from trl.experimental.async_grpo.openenv_harness import HarnessAsyncGRPOTrainer",
         "from trainer import HarnessAsyncGRPOTrainer"),
        ("from trl.foo import HarnessAsyncGRPOTrainer", "from harbor_rl import HarnessAsyncGRPOTrainer"),
        ('    split="<hf-dataset>",          # a Harbor task dataset the server serves',
         '    split="builtin",          # a Harbor task dataset the server serves'),
        ('    split="<hf-dataset>",          # a Harbor task dataset the server serves',
         '    split="tiny-coding", num_tasks=1,          # a Harbor task dataset the server serves'),
        ('    sandbox="e2b",', '    sandbox="docker",'),
        ('    harness="mini-swe-agent",      # or "opencode", "claude-code", ...',
         '    harness="oracle",      # or "opencode", "claude-code", ...'),
        ("config = AsyncGRPOConfig(num_generations=8, max_concurrent_rollouts=8, vllm_server_base_url=vllm_url)",
         "config = AsyncGRPOConfig(num_generations=2, max_concurrent_rollouts=8, vllm_server_base_url=vllm_url, max_steps=1)"),
        ("config = AsyncGRPOConfig(num_generations=8, max_concurrent_rollouts=8, vllm_server_base_url=vllm_url)",
         "config = AsyncGRPOConfig(num_generations=8, max_concurrent_rollouts=8, vllm_server_base_url=vllm_url, max_steps=1, beta=0.1)"),
        (None, "    agent_step_limit=3,"),
    ],
)  # fmt: skip
def test_the_blocks_rules_refuse_any_other_change(guide, ours) -> None:
    assert not allowed(guide, ours, extra=BLOCK_RULES)


def test_the_commands_differ_from_the_guide_only_where_the_rules_allow() -> None:
    guide = (HERE / "guide" / COMMANDS).read_text()
    ours = (HERE / COMMANDS).read_text()
    assert not refused_command_changes(guide, ours)
    assert len(changes(guide, ours)) == 3  # the serve line, and the engine line's program and parser
    assert [argv[3:5] for _, argv in commands(ours)] == [["serve", "--dataset"], ["engine", "tiny"]]


@pytest.mark.parametrize(
    "edit",
    [
        lambda text: text.replace("--port 8200", "--port 8201"),
        lambda text: text.replace("--expose gradio", "--expose none"),
        lambda text: text.replace("MAX_CONCURRENT_ENVS=9 ", ""),
        lambda text: text.replace("tiny-coding", "builtin"),
        lambda text: text.replace("harbor engine tiny", "harbor engine tiny --port 8001"),
        lambda text: text.replace('{"backend":"nccl"}', '{"backend":"gloo"}'),
        lambda text: text.replace("    --return-tokens-as-token-ids \\\n", ""),
        lambda text: text.replace("hermes", "mistral"),
    ],
)
def test_the_commands_rule_refuses_any_other_change(edit) -> None:
    guide = (HERE / "guide" / COMMANDS).read_text()
    ours = edit((HERE / COMMANDS).read_text())
    assert ours != (HERE / COMMANDS).read_text()
    assert refused_command_changes(guide, ours)


# -- the engine line alone (moved here from tests/engine/test_vllm_flags.py) ----------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_guides_vllm_serve_line_serves_and_takes_a_push() -> None:
    """The guide's engine line as it runs here, with three more of vLLM's flags (a dtype, one it ignores,
    a free port): its token ids are `token_id:N` (--return-tokens-as-token-ids), the nccl it was asked
    for is a note, and a trainer on weight_sync_backend auto pushes over the gloo it serves."""
    from engine.tiny_model import build_tiny_model, load_model_and_tokenizer
    from engine.weight_client import WeightSyncClient

    _, (env, argv) = commands((HERE / COMMANDS).read_text())
    port = _free_port()
    argv += [
        "--dtype",
        "bfloat16",
        "--gpu-memory-utilization",
        "0.5",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    process = subprocess.Popen(
        argv, stderr=subprocess.PIPE, text=True, env=os.environ | env | {"NO_COLOR": "1"}
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{url}/health", process, timeout_s=120)
        config = httpx.get(f"{url}/server_info", params={"config_format": "json"}).json()["vllm_config"]
        assert config["model_config"]["dtype"] == "torch.bfloat16"
        assert config["weight_transfer_config"] == {"backend": "gloo"}
        model, _ = load_model_and_tokenizer(build_tiny_model(0))
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


# -- fast: what the guide says of rollout_reward_fn, on the trainer's side ------------------------------


def _sample(member: int, reward: float | None, env_reward: float | None):
    from capture_proxy.models import TrainingTrace
    from trainer.outcome import HarnessRolloutOutcome
    from trainer.rollout_worker import RolloutSample

    trace = TrainingTrace(turns=[])
    outcome = HarnessRolloutOutcome(env_reward=env_reward, completion=[], trace=[], training_trace=trace)
    return RolloutSample(member, reward, outcome)


@pytest.mark.parametrize("reward_fn", [None, lambda outcome: outcome.env_reward])
def test_none_leaves_the_group_baseline_and_correctness_is_logged_only_with_a_reward_fn(reward_fn) -> None:
    """ "Return None to mark the rollout unscoreable, so it is dropped from the group baseline instead of
    counted as zero"; "rollout/correctness_mean is only logged with rollout_reward_fn"."""
    from types import SimpleNamespace

    from harbor_rl import AsyncGRPOConfig, HarnessAsyncGRPOTrainer
    from trainer.advantages import group_advantages
    from trainer.rollout_worker import RolloutGroup

    samples = [_sample(0, 1.0, 1.0), _sample(1, None, 0.0), _sample(2, 0.0, 0.0)]
    advantages = group_advantages([s.reward for s in samples]).advantages
    assert advantages[1] is None and advantages[0] == pytest.approx(-advantages[2])  # baseline 0.5, not 1/3
    trainer = SimpleNamespace(
        args=AsyncGRPOConfig(num_generations=3, per_device_train_batch_size=3),
        policy_version=0,
        reward_fn=reward_fn,
    )
    _, stats = HarnessAsyncGRPOTrainer._items(trainer, [RolloutGroup(0, {}, samples, started_version=0)])
    assert stats["rollout/scoreable"] == 2 and stats["reward"] == 0.5
    if reward_fn is None:
        assert "rollout/correctness_mean" not in stats
    else:
        assert stats["rollout/correctness_mean"] == pytest.approx(1 / 3)  # every rollout the verifier scored


# -- slow: the commands serve, and the block trains against them ---------------------------------------

GUIDE_PORTS = (8000, 8200, 8300)
"""The ports the guide's lines and block name: vLLM's default, the server's and its capture port."""


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _gradio_share_stand_in(tmp_path: Path) -> dict[str, str]:
    """The environment under which gradio's own tunnel code meets a stand-in share server: gradio takes a
    self-hosted share server from GRADIO_SHARE_SERVER_ADDRESS (no call to Gradio's API server), and runs
    the frpc it keeps under HF_HOME, here a stand-in that logs frpc's `start proxy success: URL`."""
    hf_home = tmp_path / "hf-home"
    from gradio import tunneling

    frpc = hf_home / "gradio" / "frpc" / Path(tunneling.BINARY_PATH).name
    frpc.parent.mkdir(parents=True)
    stand_in_binary(frpc, tmp_path / "frpc", FRPC_LOG, to="stdout", then="exec sleep 600")
    return {"HF_HOME": str(hf_home), "GRADIO_SHARE_SERVER_ADDRESS": "127.0.0.1:7000"}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_guides_commands_serve_and_its_block_trains_against_them(tmp_path) -> None:
    """What the guide says: every model call of the agent goes through the capture proxy to the engine,
    which records the engine's own prompt and completion ids; TRL builds its rows from those ids (never
    re-tokenising); rollout_reward_fn sees env_reward, completion, trace, tool counts and timed_out;
    None drops a rollout from its group's baseline; rollout/correctness_mean is logged with it."""
    busy = [port for port in GUIDE_PORTS if _port_in_use(port)]
    assert not busy, f"the guide's ports {busy} are in use on this machine: free them to run this test"
    (serve_env, serve_argv), (engine_env, engine_argv) = commands((HERE / COMMANDS).read_text())
    base = os.environ | {"NO_COLOR": "1", "HARBOR_RUNS_DIR": str(tmp_path / "runs")}
    base.pop("E2B_API_KEY", None)  # E2B is never called: the block's sandbox is local
    serve_env = base | serve_env | _gradio_share_stand_in(tmp_path)
    started = time.monotonic()
    with (
        running(
            engine_argv, base | engine_env, tmp_path / "engine.log", "http://127.0.0.1:8000/health"
        ) as engine,
        running(serve_argv, serve_env, tmp_path / "serve.log", "http://127.0.0.1:8200/health") as server,
    ):
        frpc = int((tmp_path / "frpc.pid").read_text())  # the tunnel's frpc (the stand-in) runs
        info = httpx.get("http://127.0.0.1:8200/info", timeout=30).json()
        assert (info["expose"], info["public_url"]) == ("gradio", f"{SHARE_URL}/v1")
        assert info["capacity"]["max_concurrent_envs"] == 9
        done = run_seed(SEED, tmp_path, timeout=420)
        assert done.returncode == 0, done.stderr[-4000:]
        from harbor_server import HarborClient

        client = HarborClient("http://127.0.0.1:8200")
        try:
            captured = [
                client.trace(state.rollout_id)
                for state in client.rollouts(status="completed")
                if state.harness == "mini-swe-agent"
            ]
        finally:
            client.close()
        assert server.poll() is None
    trained = time.monotonic() - started
    # Stopped as a user stops them (Ctrl-C): the server in order, with a shell's code for Ctrl-C (130,
    # harbor_rl.interrupts) and its one "interrupted" line, the engine with 0, and the tunnel stopped
    # with the server.
    assert (server.returncode, engine.returncode) == (130, 0)
    assert "harbor serve: interrupted" in (tmp_path / "serve.log").read_text()
    with pytest.raises(ProcessLookupError):
        os.kill(frpc, 0)
    serve_log = (tmp_path / "serve.log").read_text()
    engine_log = (tmp_path / "engine.log").read_text()
    assert "Traceback" not in serve_log and "Traceback" not in engine_log, (
        serve_log[-3000:] + engine_log[-3000:]
    )
    assert "harbor engine: --weight-transfer-config backend nccl" in engine_log  # a note, not a refusal

    outcomes = [json.loads(line) for line in (tmp_path / "outcomes.jsonl").read_text().splitlines()]
    (step,) = [
        json.loads(line) for line in (tmp_path / "runs" / "grpo" / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(outcomes) >= 8  # one group of num_generations=8 (the worker may have started more)
    # The outcome fields the guide lists, with their types.
    for outcome in outcomes:
        assert isinstance(outcome["env_reward"], float)  # the verifier scored every rollout
        assert outcome["completion_roles"][-1] == "assistant"
        assert isinstance(outcome["tool_call_count"], int) and isinstance(outcome["tool_failure_count"], int)
        assert isinstance(outcome["tool_calls_by_name"], dict) and outcome["timed_out"] is False
        assert outcome["trace"], "every mini-swe-agent rollout made model calls"
    # The trace TRL's side gets is the capture's own token ids, as the proxy recorded them from the engine.
    stored = {
        (tuple(t.prompt_token_ids), tuple(t.completion_token_ids), tuple(t.loss_mask))
        for trace in captured
        for t in trace.turns
    }
    for outcome in outcomes:
        for turn in outcome["trace"]:
            assert (
                tuple(turn["prompt_token_ids"]),
                tuple(turn["completion_token_ids"]),
                tuple(turn["loss_mask"]),
            ) in stored
            assert turn["loss_mask"][: len(turn["prompt_token_ids"])] == [0] * len(turn["prompt_token_ids"])
    # None drops the rollout it was returned for: the group counts one rollout fewer, not a zero.
    # The step trains the first group: 8 rollouts at once (max_concurrent_rollouts=8), none after them.
    group = outcomes[:8]
    assert [o["reward"] is None for o in group] == [True] + [False] * 7
    assert step["rollout/scoreable"] == 7 and step["rollout/failed"] == 0
    assert step["reward"] == pytest.approx(sum(o["reward"] for o in group[1:]) / 7)
    # With rollout_reward_fn: the verifier's correctness, averaged over the rollouts that have it.
    assert step["rollout/correctness_mean"] == pytest.approx(sum(o["env_reward"] for o in group) / 8)
    print(f"commands + one training step: {trained:.0f} s")
