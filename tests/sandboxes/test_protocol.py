"""Protocol tests run against every backend that can run on this machine (local with bwrap, Docker).

Real components only: the local backend runs real bwrap namespaces, the Docker one a real engine.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from sandboxes import Sandbox, SandboxBackend, SandboxError, SandboxPathError, SandboxSpec, get_backend

from .conftest import BASE_IMAGE


def spec(**overrides) -> SandboxSpec:
    values = {"name": f"t-{uuid.uuid4().hex[:8]}", "docker_image": BASE_IMAGE}
    values.update(overrides)
    return SandboxSpec(**values)


def host_processes_matching(marker: str) -> list[int]:
    """PIDs on this machine whose command line contains `marker` (containers' too: same kernel)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(proc.name))
    return found


async def test_exec_string_list_exit_codes_and_streams(backend):
    assert isinstance(backend, SandboxBackend)
    sandbox = await backend.start(spec())
    try:
        assert isinstance(sandbox, Sandbox)
        result = await sandbox.exec("echo out; echo err >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
        assert not result.ok and not result.timed_out
        listed = await sandbox.exec(["printf", "%s|", "a b", "c"])
        assert listed.ok and listed.stdout == "a b|c|"
        missing = await sandbox.exec(["/no/such/binary"])
        assert missing.exit_code not in (0, None)
    finally:
        await sandbox.stop()


async def test_timeout_kills_the_whole_process_tree(backend):
    sandbox = await backend.start(spec())
    marker = f"{31 + uuid.uuid4().int % 1000 / 1000:.3f}"
    try:
        result = await sandbox.exec(f"sleep {marker} & sleep {marker}; echo never", timeout_s=1.5)
        assert result.timed_out and result.exit_code is None
        assert result.duration_s < 15
        assert "never" not in result.stdout
        for _ in range(50):
            if not host_processes_matching(f"sleep {marker}"):
                break
            await asyncio.sleep(0.1)
        assert host_processes_matching(f"sleep {marker}") == []
        # The sandbox is still usable after a timeout.
        assert (await sandbox.exec("echo alive")).stdout == "alive\n"
    finally:
        await sandbox.stop()


async def test_cwd_defaults_to_workdir_and_accepts_relative_and_absolute(backend):
    sandbox = await backend.start(spec(workdir="/app"))
    try:
        assert (await sandbox.exec("pwd")).stdout == "/app\n"
        await sandbox.exec("mkdir -p sub/dir")
        assert (await sandbox.exec("pwd", cwd="sub/dir")).stdout == "/app/sub/dir\n"
        assert (await sandbox.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
    finally:
        await sandbox.stop()


async def test_env_from_spec_and_exec_with_exec_winning(backend):
    sandbox = await backend.start(spec(env={"TASK_A": "from-spec", "TASK_B": "spec"}))
    try:
        result = await sandbox.exec(
            'echo "$TASK_A $TASK_B $ONLY_EXEC"', env={"TASK_B": "exec", "ONLY_EXEC": "x"}
        )
        assert result.stdout == "from-spec exec x\n"
    finally:
        await sandbox.stop()


async def test_exec_as_another_user(backend):
    sandbox = await backend.start(spec())
    try:
        assert (await sandbox.exec(["id", "-u"])).stdout.strip() == "0"
        assert (await sandbox.exec(["id", "-u"], user="nobody")).stdout.strip() == "65534"
        assert (await sandbox.exec(["id", "-u"], user="1234")).stdout.strip() == "1234"
    finally:
        await sandbox.stop()


async def test_upload_and_download_files_and_folders(backend, tmp_path):
    sandbox = await backend.start(spec(workdir="/app"))  # the base image's own WORKDIR is /
    try:
        await sandbox.upload_file(b"hello bytes\n", "/app/in/bytes.txt")
        local_file = tmp_path / "from-path.bin"
        local_file.write_bytes(bytes(range(256)) * 10)
        await sandbox.upload_file(local_file, "relative/path.bin")  # relative to the workdir
        assert (await sandbox.exec("cat /app/in/bytes.txt")).stdout == "hello bytes\n"
        assert await sandbox.download_file("/app/relative/path.bin") == local_file.read_bytes()

        tree = tmp_path / "tree"
        (tree / "a" / "b").mkdir(parents=True)
        (tree / "top.txt").write_text("top")
        (tree / "a" / "b" / "deep.txt").write_text("deep")
        await sandbox.upload_dir(tree, "/logs/agent")
        assert (await sandbox.exec("cat /logs/agent/a/b/deep.txt")).stdout == "deep"
        await sandbox.exec("mkdir -p /logs/verifier && echo 0.5 > /logs/verifier/reward.txt")

        out = tmp_path / "out"
        await sandbox.download_dir("/logs", out)
        assert (out / "agent" / "top.txt").read_text() == "top"
        assert (out / "agent" / "a" / "b" / "deep.txt").read_text() == "deep"
        assert (out / "verifier" / "reward.txt").read_text() == "0.5\n"
        with pytest.raises(FileNotFoundError):
            await sandbox.download_file("/app/does-not-exist")
    finally:
        await sandbox.stop()


async def test_planted_symlinks_never_bring_host_files_out(backend, tmp_path):
    """An agent links to /etc/passwd: downloads give the sandbox's view or refuse, never the host's."""
    secret = tmp_path / "host-only-secret.txt"
    secret.write_text("host secret content")
    sandbox = await backend.start(spec())
    try:
        await sandbox.exec(
            f"mkdir -p /app/out && ln -s {secret} /app/out/link && ln -s ../../../../{secret} /app/out/rel"
        )
        for remote in ("/app/out/link", "/app/out/rel"):
            try:
                data = await sandbox.download_file(remote)
            except (SandboxPathError, FileNotFoundError):
                continue
            assert b"host secret content" not in data
        dest = tmp_path / "dl"
        await sandbox.download_dir("/app/out", dest)
        for path in dest.rglob("*"):
            assert (
                not path.is_symlink()
                or not path.resolve().is_relative_to(tmp_path)
                or path.resolve().is_relative_to(dest)
            )
            if path.is_file():
                assert "host secret content" not in path.read_text(errors="replace")
    finally:
        await sandbox.stop()


async def test_host_secrets_never_enter(backend, host_secrets):
    sandbox = await backend.start(spec(env={"ALLOWED": "yes"}))
    try:
        result = await sandbox.exec("env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'")
        assert "ALLOWED=yes" in result.stdout
        for key, value in host_secrets.items():
            assert value not in result.stdout, key
            assert f"{key}=" not in result.stdout, key
    finally:
        await sandbox.stop()


async def test_stop_is_idempotent_and_final(backend):
    sandbox = await backend.start(spec())
    await sandbox.stop()
    await sandbox.stop()
    with pytest.raises(SandboxError):
        await sandbox.exec("true")


async def test_concurrent_execs_in_one_sandbox(backend):
    sandbox = await backend.start(spec())
    try:
        results = await asyncio.gather(*(sandbox.exec(f"sleep 0.3; echo {i}") for i in range(4)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]
    finally:
        await sandbox.stop()


def test_get_backend_names_the_choices_for_an_unknown_backend():
    with pytest.raises(ValueError, match="local, docker, e2b"):
        get_backend("kubernetes")


async def test_housekeeping_makes_resets_and_reads_folders_as_the_sandbox_sees_them(backend):
    """make_dirs / reset_dir / stat_path: the local backend does them on its host folders, docker with a
    command as root; both give the same answers, and neither follows what an agent planted."""
    sandbox = await backend.start(spec(workdir="/app"))
    try:
        await sandbox.exec(
            "mkdir -p /app/keep /logs/verifier/sub && echo secret > /app/keep/secret && printf 12345 > /app/five"
            " && touch /logs/verifier/.hidden /logs/verifier/sub/x && ln -s /app/keep /logs/verifier/link"
            " && ln -s /app/keep /tests && ln -s /app/five /app/five-link",
            user="root",
        )
        await sandbox.make_dirs(["/logs/agent/deep", "/logs/verifier"], mode=0o777)
        assert (await sandbox.stat_path("/logs/verifier")).entries == 3  # made, contents kept
        await sandbox.reset_dir("/logs/verifier", mode=0o777)
        await sandbox.reset_dir("/tests")  # a symlink to /app/keep: replaced, not followed
        modes = await sandbox.exec("stat -c '%a %F' /logs/agent/deep /logs/verifier /tests", user="root")
        assert modes.stdout.split("\n")[:2] == ["777 directory", "777 directory"]
        assert modes.stdout.split("\n")[2].endswith("directory")
        assert (await sandbox.exec("cat /app/keep/secret")).stdout == "secret\n"  # the link's target is intact
        assert (await sandbox.stat_path("/logs/verifier")).model_dump() == {"kind": "dir", "size": 0, "entries": 0}
        assert (await sandbox.stat_path("/tests")).entries == 0
        assert (await sandbox.stat_path("/app/five")).model_dump() == {"kind": "file", "size": 5, "entries": 0}
        assert (await sandbox.stat_path("five-link")).size == 5  # relative to the workdir, link followed
        assert (await sandbox.stat_path("/app/keep")).entries == 1
        assert await sandbox.stat_path("/app/missing") is None
        assert (await sandbox.stat_path("/usr/bin")).kind == "dir"  # the image's (the host's, locally)
        await sandbox.exec("touch /app/plain", user="root")
        await sandbox.reset_dir("/app/plain")  # a file there becomes an empty folder
        assert (await sandbox.stat_path("/app/plain")).kind == "dir"
    finally:
        await sandbox.stop()
