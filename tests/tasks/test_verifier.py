"""The verifier on the real `local` (bwrap) and `docker` backends: reward files, timeouts, anti-spoofing.

Reward-file parsing is a pure function and is tested directly; everything else starts a real sandbox
from a task folder, acts as the agent with `exec`, then runs `verify`.
"""

from __future__ import annotations

import subprocess
import time
import uuid

import pytest

from tasks import load_task, verify
from tasks.verifier import (
    RewardFileError,
    host_identity,
    kill_leftover_processes,
    parse_reward_json,
    parse_reward_txt,
    process_snapshot,
)


def _task(make_task, test_sh: str, toml_extra: str = ""):
    toml = f"[verifier]\ntimeout_sec = 60.0\n{toml_extra}\n[environment]\nmemory_mb = 512\n"
    return load_task(make_task(files={"tests/test.sh": test_sh, "task.toml": toml}))


async def _run(backend, task, agent: str | None = None, timeout_sec: float | None = None):
    sandbox = await backend.start(task.sandbox_spec(f"verify-{uuid.uuid4().hex[:8]}"))
    try:
        if agent:
            done = await sandbox.exec(agent, timeout_s=60)
            assert done.ok, done.stderr
        return await verify(sandbox, task, timeout_sec=timeout_sec), sandbox
    finally:
        await sandbox.stop()


# --- parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "reward"),
    [
        ('{"reward": 0.5, "tests_passed": 3}', None, 0.5),
        ('{"score": 1}', None, 1.0),
        ('{"accuracy": 0.25, "speed": 9}', "accuracy", 0.25),
    ],
)
def test_parse_reward_json(text, key, reward):
    assert parse_reward_json(text, key)[0] == reward


def test_a_multi_metric_reward_json_is_a_valid_result():
    # Harbor's multi-reward recipe writes {"correctness": c, "performance": p} and no `reward` key.
    assert parse_reward_json('{"correctness": 1, "performance": 0}', None) == (
        None, {"correctness": 1.0, "performance": 0.0}
    )  # fmt: skip
    assert parse_reward_json('{"correctness": 1, "performance": 0}', "performance")[0] == 0.0


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("not json", None, "not JSON"),
        ("[1, 2]", None, "object"),
        ("{}", None, "object"),
        ('{"reward": "high"}', None, "finite number"),
        ('{"reward": true}', None, "finite number"),
        ('{"reward": NaN}', None, "finite number"),
        ('{"reward": 1}', "accuracy", "no key 'accuracy'"),
    ],
)
def test_parse_reward_json_rejects(text, key, words):
    with pytest.raises(RewardFileError, match=words):
        parse_reward_json(text, key)


@pytest.mark.parametrize(("text", "value"), [("1\n", 1.0), (" 0.75 ", 0.75), ("0", 0.0)])
def test_parse_reward_txt(text, value):
    assert parse_reward_txt(text) == value


@pytest.mark.parametrize("text", ["", "passed", "1 1", "inf", "nan", "0.5\n0.7"])
def test_parse_reward_txt_rejects(text):
    with pytest.raises(RewardFileError):
        parse_reward_txt(text)


# --- on real sandboxes -----------------------------------------------------------------------------


async def test_reward_txt_and_tests_visible_only_to_the_verifier(backend, make_task):
    test_sh = """\
    #!/bin/bash
    # Uses a file uploaded next to it and runs in the task's workdir.
    [ "$(pwd)" = /app ] && [ -f /tests/helper.txt ] && cat /tests/helper.txt > /logs/verifier/reward.txt
    """
    root = make_task(files={"tests/test.sh": test_sh, "tests/helper.txt": "0.75\n"})
    task = load_task(root)
    sandbox = await backend.start(task.sandbox_spec(f"verify-{uuid.uuid4().hex[:8]}"))
    try:
        peek = await sandbox.exec("ls -A /tests 2>/dev/null; cat /tests/helper.txt 2>&1; true")
        assert "0.75" not in peek.stdout  # the agent cannot see the tests before verification
        result = await verify(sandbox, task)
    finally:
        await sandbox.stop()
    assert result.reward == 0.75 and result.rewards == {"reward": 0.75}
    assert result.error is None and not result.timed_out and result.exit_code == 0


async def test_reward_json_with_reward_key(backend, make_task):
    test_sh = """#!/bin/bash\necho '{"accuracy": 0.5, "reward": 0.1}' > /logs/verifier/reward.json\n"""
    result, _ = await _run(backend, _task(make_task, test_sh, 'reward_key = "accuracy"'))
    assert result.reward == 0.5 and result.rewards == {"accuracy": 0.5, "reward": 0.1}


async def test_exit_code_is_not_the_reward(backend, make_task):
    failing_but_scored = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\nexit 3\n"
    result, _ = await _run(backend, _task(make_task, failing_but_scored))
    assert result.reward == 1.0 and result.exit_code == 3
    passing_but_silent = "#!/bin/bash\necho all tests passed\nexit 0\n"
    result, _ = await _run(backend, _task(make_task, passing_but_silent))
    assert result.reward is None and result.exit_code == 0
    assert "wrote no" in result.error and "all tests passed" in result.stdout


@pytest.mark.parametrize("garbage", ["1 point", "", "NaN", "\x00\x01"])
async def test_garbage_reward_file_gives_none(local_backend, make_task, garbage):
    test_sh = f"#!/bin/bash\nprintf '%s' {garbage!r} > /logs/verifier/reward.txt\n"
    result, _ = await _run(local_backend, _task(make_task, test_sh))
    assert result.reward is None and "reward.txt" in result.error


async def test_garbage_reward_json_gives_none_even_with_a_good_txt(backend, make_task):
    test_sh = (
        "#!/bin/bash\necho '{\"reward\": ' > /logs/verifier/reward.json\necho 1 > /logs/verifier/reward.txt\n"
    )
    result, _ = await _run(backend, _task(make_task, test_sh))
    assert result.reward is None and "not JSON" in result.error


async def test_agent_written_reward_does_not_count(backend, make_task):
    agent = "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && echo '{\"reward\": 1}' > /logs/verifier/reward.json"
    silent = "#!/bin/bash\ntrue\n"
    result, _ = await _run(backend, _task(make_task, silent), agent=agent)
    assert result.reward is None
    honest = "#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n"
    result, _ = await _run(backend, _task(make_task, honest), agent=agent)
    assert result.reward == 0.0


async def test_background_process_cannot_write_the_reward(backend, make_task):
    """An agent that leaves a process rewriting reward.txt is stopped before the tests run."""
    agent = (
        "mkdir -p /logs/verifier; "
        "setsid nohup bash -c 'while true; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; sleep 0.05; done' "
        ">/dev/null 2>&1 < /dev/null & disown; sleep 0.3"
    )
    slow_silent = "#!/bin/bash\nsleep 1.5\n"
    result, _ = await _run(backend, _task(make_task, slow_silent), agent=agent)
    assert result.reward is None and "wrote no" in result.error


async def test_planted_tests_folder_is_replaced(backend, make_task):
    agent = "mkdir -p /app/fake && printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /app/fake/test.sh; rm -rf /tests 2>/dev/null; ln -sfn /app/fake /tests 2>/dev/null; mkdir -p /tests; cp /app/fake/test.sh /tests/ 2>/dev/null; true"
    honest = "#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n"
    result, _ = await _run(backend, _task(make_task, honest), agent=agent)
    assert result.reward == 0.0


async def test_hanging_verifier_is_killed_at_its_timeout(backend, make_task):
    hangs = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\nsleep 600\n"
    task = _task(make_task, hangs)
    sandbox = await backend.start(task.sandbox_spec(f"verify-{uuid.uuid4().hex[:8]}"))
    try:
        started = time.monotonic()
        result = await verify(sandbox, task, timeout_sec=2.0)
        elapsed = time.monotonic() - started
        after = await sandbox.exec("ps -eo args | grep -c '[s]leep 600' || true")
    finally:
        await sandbox.stop()
    assert result.reward is None and result.timed_out and "timed out after 2s" in result.error
    assert elapsed < 30
    assert after.stdout.strip() == "0"  # the hung test is gone and the sandbox still answers


async def test_verifier_in_a_stopped_sandbox_never_ran(local_backend, make_task):
    task = _task(make_task, "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    sandbox = await local_backend.start(task.sandbox_spec(f"verify-{uuid.uuid4().hex[:8]}"))
    await sandbox.stop()
    result = await verify(sandbox, task)
    assert result.reward is None and "never ran" in result.error


async def test_kill_is_skipped_where_the_sandbox_is_the_host(tmp_path, make_task):
    """An unisolated local sandbox shares this process's PID namespace: `kill -9 -1` as root there would
    kill the machine, so the verifier detects it and skips the kill (the identity is checked first,
    so this test never runs the kill itself on the host)."""
    from sandboxes.local import LocalBackend

    task = _task(make_task, "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    backend = LocalBackend(root=tmp_path / "unisolated", isolation="none")
    sandbox = await backend.start(task.sandbox_spec(f"verify-{uuid.uuid4().hex[:8]}"))
    try:
        probe = await sandbox.exec(
            ["bash", "-c", 'echo "$(readlink /proc/self/ns/pid) $(cat /proc/sys/kernel/random/boot_id)"']
        )
        assert probe.stdout.strip() == host_identity()
        assert await kill_leftover_processes(sandbox) is False
    finally:
        await sandbox.stop()


async def test_isolated_sandboxes_are_not_the_host(backend, make_task):
    task = _task(make_task, "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    sandbox = await backend.start(task.sandbox_spec(f"verify-{uuid.uuid4().hex[:8]}"))
    try:
        assert await kill_leftover_processes(sandbox) is True
        assert (await sandbox.exec("echo alive")).stdout.strip() == "alive"  # the sandbox survives the kill
    finally:
        await sandbox.stop()


async def test_what_a_local_exec_starts_ends_with_it_so_there_is_nothing_to_snapshot(backend, make_task):
    """Each exec in a bwrap sandbox is a PID namespace of its own: a daemon the agent leaves (setsid,
    nohup, disowned) is gone once its exec returns, which is why the verifier asks no process list of
    such a sandbox. A container keeps what an exec started, and there the snapshot sees it."""
    task = _task(make_task, "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    sandbox = await backend.start(task.sandbox_spec(f"verify-{uuid.uuid4().hex[:8]}"))
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}"
    try:
        await sandbox.exec(f"setsid nohup sleep {marker} >/dev/null 2>&1 < /dev/null & disown")
        time.sleep(0.3)
        left = await sandbox.exec(f"pgrep -f '[s]leep {marker}' || true")
        host = subprocess.run(["pgrep", "-f", f"[s]leep {marker}"], capture_output=True, text=True).stdout
        snapshot = await process_snapshot(sandbox)
    finally:
        await sandbox.stop()
    if sandbox.processes_outlive_exec:  # docker: the daemon lives on, and the snapshot lists it
        assert left.stdout.strip() and len(snapshot) >= 1
    else:  # local: gone from the sandbox and from the host
        assert (left.stdout.strip(), host.strip(), snapshot) == ("", "", ())


@pytest.mark.docker
async def test_image_services_survive_the_kill_and_agent_leftovers_do_not(docker_backend, make_task):
    """The image's ENTRYPOINT starts a server and ends in `exec "$@"` (as Harbor's dns-blacklisting recipe
    does): the verifier's tests need it alive. What the agent leaves behind must still die: here a loop
    that keeps writing 7 into reward.txt, which would outlast the test's own 1."""
    entrypoint = '#!/bin/bash\npython3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &\nexec "$@"\n'
    dockerfile = (
        "FROM harbor-rl/sandbox-base:bookworm\nWORKDIR /app\nCOPY start.txt /app/start.txt\n"
        'COPY entrypoint.sh /entrypoint.sh\nRUN chmod +x /entrypoint.sh\nENTRYPOINT ["/entrypoint.sh"]\n'
    )
    test_sh = (
        "#!/bin/bash\nsleep 1\n"
        "curl -sf http://127.0.0.1:8000/ >/dev/null && echo 1 > /logs/verifier/reward.txt\nsleep 1\n"
    )
    root = make_task(
        files={
            "environment/Dockerfile": dockerfile,
            "environment/entrypoint.sh": entrypoint,
            "tests/test.sh": test_sh,
        }
    )
    task = load_task(root)
    sandbox = await docker_backend.start(task.sandbox_spec(f"verify-{uuid.uuid4().hex[:8]}"))
    try:
        for _ in range(50):  # the server comes up with the container
            if (await sandbox.exec("curl -sf http://127.0.0.1:8000/ >/dev/null")).ok:
                break
            time.sleep(0.1)
        spare = await process_snapshot(sandbox)  # the agent phase begins
        await sandbox.exec(
            "setsid nohup bash -c 'while true; do echo 7 > /logs/verifier/reward.txt 2>/dev/null; sleep 0.05; "
            "done' >/dev/null 2>&1 < /dev/null & disown; sleep 0.3"
        )
        result = await verify(sandbox, task, spare=spare)
        alive = await sandbox.exec("curl -sf http://127.0.0.1:8000/ >/dev/null")
    finally:
        await sandbox.stop()
    assert result.reward == 1.0, result
    assert alive.ok  # the image's server outlives the verifier too
