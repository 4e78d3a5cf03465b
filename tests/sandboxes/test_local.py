"""The local backend: provisioning from a task Dockerfile, refusals, isolation, sweep (real bwrap)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid

import pytest

from sandboxes import ImageLayer, SandboxBuildError, SandboxPathError, SandboxSpec, UnsupportedEnvironment
from sandboxes.local import LocalBackend

from .conftest import write_env

BASE = "FROM harbor-rl/sandbox-base:bookworm\n"


def spec(env_dir=None, **overrides) -> SandboxSpec:
    return SandboxSpec(name=f"local-{uuid.uuid4().hex[:8]}", environment_dir=env_dir, **overrides)


async def test_provisions_workdir_copy_env_arg_run_and_layers(local_backend, tmp_path):
    env_dir = write_env(
        tmp_path / "environment",
        BASE
        + "ARG GREETING=hello\n"
        + "WORKDIR /app\n"
        + "ENV APP_MODE=test \\\n    GREET=${GREETING}\n"
        + "COPY src/ ./src/\n"
        + "COPY --chmod=755 run.sh /usr/../opt/tools/\n"
        + 'RUN ["/bin/sh", "-c", "echo $GREET > greeting.txt"]\n'
        + "RUN python3 -c 'import pytest' && mkdir -p data && echo built > data/marker\n"
        + 'CMD ["bash"]\n',
        {"src/pkg/mod.py": "VALUE = 42\n", "run.sh": "#!/bin/sh\necho tool ran\n"},
    )
    layer_ctx = tmp_path / "layer"
    (layer_ctx / "wheels").mkdir(parents=True)
    (layer_ctx / "wheels" / "agent.txt").write_text("agent wheel")
    layer = ImageLayer(
        name="agent-1",
        dockerfile_lines=["COPY wheels /opt/agent/", "ENV AGENT_HOME=/opt/agent"],
        context_dir=layer_ctx,
    )
    sandbox = await local_backend.start(spec(env_dir, image_layers=[layer]))
    try:
        result = await sandbox.exec(
            "cat greeting.txt data/marker src/pkg/mod.py; echo $APP_MODE $AGENT_HOME; /opt/tools/run.sh; cat /opt/agent/agent.txt"
        )
        assert result.stdout == "hello\nbuilt\nVALUE = 42\ntest /opt/agent\ntool ran\nagent wheel", (
            result.stderr
        )
    finally:
        await sandbox.stop()


async def test_a_harness_layer_is_installed_once_then_copied(local_backend, tmp_path, caplog):
    env_dir = write_env(tmp_path / "environment", BASE + "WORKDIR /app\n", {})
    layer_ctx = tmp_path / "layer"
    layer_ctx.mkdir()
    (layer_ctx / "tool.sh").write_text("#!/bin/sh\necho tool v1\n")
    layer = ImageLayer(
        name="stamped-agent",
        dockerfile_lines=[
            "COPY --chmod=755 tool.sh /opt/agent/bin/",
            # A fresh random stamp each time the RUN runs: equal stamps mean the files were copied.
            "RUN ln -s /opt/agent/bin/tool.sh /opt/agent/bin/tool && od -An -N8 -tx8 /dev/urandom > /opt/agent/stamp",
            "ENV AGENT_HOME=/opt/agent",
        ],
        context_dir=layer_ctx,
    )
    outputs, said = [], []
    caplog.set_level(logging.INFO, logger="sandboxes.local")
    for _ in range(2):
        caplog.clear()
        sandbox = await local_backend.start(spec(env_dir, image_layers=[layer]))
        said.append([r.getMessage() for r in caplog.records if "layer stamped-agent" in r.getMessage()])
        try:
            result = await sandbox.exec("/opt/agent/bin/tool; echo $AGENT_HOME; cat /opt/agent/stamp")
            outputs.append(result.stdout.split())
            await sandbox.exec("echo 'echo changed' > /opt/agent/bin/tool.sh")  # must not reach the cache
        finally:
            await sandbox.stop()
    first, second = outputs
    assert first[:3] == ["tool", "v1", "/opt/agent"] and len(first) == 4
    assert second == first  # files, symlink and ENV as installed; the RUN did not run again
    # The slow first install says so, and how long it took; the copy says nothing.
    assert said[0][0].startswith("installing layer stamped-agent into a local sandbox for the first time")
    assert re.fullmatch(
        r"installed layer stamped-agent in \d+\.\d s \(cached for the next sandboxes\)", said[0][1]
    )
    assert said[1] == []


async def test_sandboxes_started_together_install_a_layer_once_and_bind_it_read_only(
    local_backend, tmp_path, caplog
):
    """The cached layer is bound, not copied: nothing to copy at start or delete at stop, and no agent
    can change what later rollouts get. Files it wrote into the agent's own folders are copied."""
    env_dir = write_env(tmp_path / "environment", BASE + "WORKDIR /app\n", {})
    context = tmp_path / "layer"
    context.mkdir()
    (context / "README").write_text("agent\n")
    layer = ImageLayer(
        name="bound-agent",
        dockerfile_lines=[
            "COPY README /opt/agent/",  # a RUN sees only the top-level folders that exist
            "RUN od -An -N8 -tx8 /dev/urandom > /opt/agent/stamp"
            " && mkdir -p /root/.agent && echo settings > /root/.agent/config",
        ],
        context_dir=context,
    )
    caplog.set_level(logging.INFO, logger="sandboxes.local")
    first = await asyncio.gather(
        *(local_backend.start(spec(env_dir, image_layers=[layer])) for _ in range(3))
    )
    later = await local_backend.start(spec(env_dir, image_layers=[layer]))
    sandboxes = [*first, later]
    try:
        stamps = {(await s.exec("cat /opt/agent/stamp")).stdout for s in sandboxes}
        # One install, reused by the two that waited and by the later one.
        assert len(stamps) == 1 and len(stamps.copy().pop()) > 8
        assert sum("installing layer bound-agent" in r.getMessage() for r in caplog.records) == 1
        tamper = await later.exec("echo evil > /opt/agent/stamp; cat /opt/agent/stamp")
        assert "Read-only file system" in tamper.stderr and tamper.stdout == stamps.pop()
        assert not (later.fs / "opt").exists()  # bound from the cache, not copied into the folder
        own = await later.exec("cat /root/.agent/config && echo mine >> /root/.agent/config")
        assert own.ok and own.stdout == "settings\n"  # under /root: a copy, the agent's to change
    finally:
        for sandbox in sandboxes:
            await sandbox.stop()


@pytest.mark.parametrize(
    "dockerfile",
    [
        "FROM python:3.11-slim\nWORKDIR /app\n",
        BASE + "FROM harbor-rl/sandbox-base:bookworm AS second\n",
        BASE + "ADD https://example.invalid/file.tgz /app/\n",
        BASE + "COPY --from=builder /x /app/\n",
        BASE + 'SHELL ["/bin/zsh", "-c"]\n',
        BASE + "COPY a.txt /usr/local/bin/\n",
        BASE + "RUN <<EOF\necho hi\nEOF\n",
    ],
    ids=["other-from", "multi-stage", "add-url", "copy-from", "shell", "system-dest", "heredoc"],
)
async def test_refuses_what_it_cannot_provision_safely(local_backend, tmp_path, dockerfile):
    env_dir = write_env(tmp_path / "environment", dockerfile, {"a.txt": "a"})
    with pytest.raises(UnsupportedEnvironment) as info:
        await local_backend.start(spec(env_dir))
    assert "Dockerfile" in str(info.value) or "heredoc" in str(info.value)
    if "heredoc" not in str(info.value):
        assert "--sandbox docker" in str(info.value)
    assert not any((local_backend.root).glob("*/fs")), "a refused sandbox must not leave its folder"


async def test_refuses_copy_escaping_the_build_context(local_backend, tmp_path):
    (tmp_path / "outside.txt").write_text("not part of the context")
    env_dir = write_env(tmp_path / "environment", BASE + "COPY ../outside.txt /app/\n")
    with pytest.raises(SandboxPathError, match="escapes the build context"):
        await local_backend.start(spec(env_dir))


async def test_failing_run_step_is_a_build_error_with_output(local_backend, tmp_path):
    env_dir = write_env(tmp_path / "environment", BASE + "RUN echo about to fail && exit 7\n")
    with pytest.raises(SandboxBuildError, match=r"Dockerfile:2.*exited with 7[\s\S]*about to fail"):
        await local_backend.start(spec(env_dir))


async def test_prebuilt_image_other_than_the_base_is_refused(local_backend):
    with pytest.raises(UnsupportedEnvironment, match="--sandbox docker"):
        await local_backend.start(spec(docker_image="ubuntu:24.04"))


async def test_path_traversal_is_refused(local_backend):
    sandbox = await local_backend.start(spec())
    try:
        for bad in ("/app/../../etc/passwd", "../../../etc/shadow", "/usr/bin/evil", "/"):
            with pytest.raises(SandboxPathError):
                await sandbox.upload_file(b"x", bad)
        with pytest.raises(SandboxPathError):
            await sandbox.download_file("/etc/passwd")
    finally:
        await sandbox.stop()


async def test_isolation_hides_the_host_and_keeps_system_read_only(local_backend, tmp_path):
    marker = tmp_path / "host-file.txt"
    marker.write_text("host")
    sandbox = await local_backend.start(spec())
    try:
        result = await sandbox.exec(
            f"test -e {marker} && echo visible; touch /usr/x 2>&1; cat /etc/shadow | wc -c; ps -e | wc -l"
        )
        lines = result.stdout.splitlines()
        assert "visible" not in lines
        assert "Read-only file system" in lines[0]
        assert lines[1] == "0"  # shadow is masked
        assert int(lines[2]) <= 5  # own pid namespace: bwrap, bash, ps, wc (+ header)
    finally:
        await sandbox.stop()


async def test_rollouts_do_not_see_each_other(local_backend):
    first, second = await local_backend.start(spec()), await local_backend.start(spec())
    try:
        await first.exec("echo mine > /app/private.txt")
        assert (await second.exec("cat /app/private.txt")).exit_code != 0
    finally:
        await first.stop()
        await second.stop()


async def test_stop_removes_the_folder_and_sweep_removes_orphans(local_backend):
    sandbox = await local_backend.start(spec())
    folder = sandbox.folder
    assert folder.is_dir()
    await sandbox.stop()
    assert not folder.exists()

    orphan = local_backend.root / "orphan-1234"
    (orphan / "fs").mkdir(parents=True)
    (orphan / "owner.json").write_text(json.dumps({"pid": 2**22 + 7, "host": "elsewhere-or-dead"}))
    live = await local_backend.start(spec())
    try:
        assert await local_backend.sweep() == 1
        assert not orphan.exists() and live.folder.is_dir()
    finally:
        await live.stop()


async def test_without_bwrap_it_warns_and_still_runs(tmp_path, caplog, host_secrets):
    backend = LocalBackend(root=tmp_path / "plain", isolation="none")
    with caplog.at_level(logging.WARNING):
        health = await backend.health()
    assert "WITHOUT isolation" in health
    sandbox = await backend.start(spec())
    try:
        result = await sandbox.exec("pwd; env")
        assert result.stdout.startswith(str(sandbox.fs / "app"))
        assert all(value not in result.stdout for value in host_secrets.values())
    finally:
        await sandbox.stop()


async def test_upload_never_writes_through_a_planted_symlink(local_backend, tmp_path):
    """The agent plants /tests/test.sh -> <a host file>; uploading tests must not overwrite that file."""
    victim = tmp_path / "host-victim.txt"
    victim.write_text("original")
    tests_dir = tmp_path / "tests"
    (tests_dir / "sub").mkdir(parents=True)
    (tests_dir / "test.sh").write_text("echo real tests\n")
    (tests_dir / "sub" / "data.txt").write_text("data")
    sandbox = await local_backend.start(spec())
    try:
        await sandbox.exec(
            f"ln -s {victim} /tests/test.sh && mkdir -p /tests/sub && ln -s {victim} /tests/sub/data.txt"
        )
        await sandbox.upload_dir(tests_dir, "/tests")
        assert victim.read_text() == "original"
        # Like tar in a container: the planted links are replaced by the real files.
        listing = await sandbox.exec("test -L /tests/test.sh || cat /tests/test.sh /tests/sub/data.txt")
        assert listing.stdout == "echo real tests\ndata"
        await sandbox.exec(f"ln -sf {victim} /tests/again.sh")
        await sandbox.upload_file(b"payload", "/tests/again.sh")
        assert victim.read_text() == "original"
        assert (await sandbox.exec("test -L /tests/again.sh || cat /tests/again.sh")).stdout == "payload"
    finally:
        await sandbox.stop()


def test_installed_layers_are_kept_in_the_user_cache_unless_a_root_is_given(tmp_path, monkeypatch):
    # The default backend (what `harbor serve` and `harbor train` start) keeps layers across runs and
    # folders; a backend given its own root keeps them there, so tests stay independent.
    monkeypatch.setenv("HARBOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    assert LocalBackend().layer_cache == tmp_path / "cache" / "local-layers"
    assert LocalBackend(root=tmp_path / "mine").layer_cache == tmp_path / "mine" / ".layer-cache"
    assert LocalBackend(layer_cache_dir=tmp_path / "x").layer_cache == tmp_path / "x"


async def test_a_compose_task_is_refused_in_one_line(local_backend, tmp_path):
    compose = tmp_path / "environment" / "docker-compose.yaml"
    spec = SandboxSpec(name="compose", compose_file=compose)
    with pytest.raises(
        UnsupportedEnvironment, match=r"docker-compose.yaml: the local sandbox cannot run Docker Compose"
    ):
        await local_backend.start(spec)
