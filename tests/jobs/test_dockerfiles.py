"""The container images, checked statically: Docker Hub is not reachable here, so the online images
(server, trainer, sandbox-python) cannot be built; their Dockerfiles are parsed and checked against what
the code expects (base image, entrypoint, ports = `harbor serve`'s defaults, the sandbox contents of the
offline recipe, no credential baked in)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harbor_rl.jobs.config import RunConfig
from harbor_server.config import ServeConfig

DOCKER = Path(__file__).resolve().parents[2] / "docker"
ONLINE = ["server", "trainer", "sandbox-python"]
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|API_KEY|ACCESS_KEY|PRIVATE_KEY)", re.I)
SECRET_VALUE = re.compile(r"\b(hf_[A-Za-z0-9]{20,}|e2b_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9]{20,})\b")


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of docker/NAME/Dockerfile, continuation lines joined, comments dropped."""
    text = (DOCKER / name / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    result = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def values(name: str, keyword: str) -> list[str]:
    return [rest for k, rest in instructions(name) if k == keyword]


def exposed(name: str) -> set[int]:
    return {int(port) for rest in values(name, "EXPOSE") for port in rest.split()}


def env_names(name: str) -> set[str]:
    names = set()
    for rest in values(name, "ENV") + values(name, "ARG"):
        names |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", rest)) or {rest.split()[0].split("=")[0]}
    return names


def test_server_image_runs_harbor_serve_on_its_default_ports() -> None:
    assert values("server", "FROM") == ["python:3.11-slim-bookworm"]
    assert json.loads(values("server", "ENTRYPOINT")[0]) == ["harbor", "serve"]
    cmd = json.loads(values("server", "CMD")[0])
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"  # 127.0.0.1 inside a container reaches nobody
    assert cmd[cmd.index("--capture-host") + 1] == "0.0.0.0"  # nor does the capture port's default
    defaults = ServeConfig.model_fields
    assert exposed("server") == {defaults["port"].default, defaults["capture_port"].default}
    assert any('pip install "/src[e2b]"' in run for run in values("server", "RUN"))
    assert values("server", "USER") == ["harbor"]


def test_trainer_image_installs_the_gpu_extra_on_cuda_and_lets_the_job_give_the_command() -> None:
    (base,) = values("trainer", "FROM")
    assert base.startswith("nvidia/cuda:") and "devel" in base
    assert any('pip install "/src[gpu,e2b]"' in run for run in values("trainer", "RUN"))
    assert values("trainer", "ENTRYPOINT") == []  # a job's command would be appended to one
    assert json.loads(values("trainer", "CMD")[0])[:3] == ["harbor", "jobs", "run-on-host"]
    run = RunConfig.model_fields
    assert {run["port"].default, run["capture_port"].default} <= exposed("trainer")
    assert run["capture_port"].default == ServeConfig.model_fields["capture_port"].default
    assert run["port"].default == ServeConfig.model_fields["port"].default


def test_sandbox_python_matches_the_offline_sandbox_base() -> None:
    (base,) = values("sandbox-python", "FROM")
    assert base.startswith("python:3.11-slim")
    (packages,) = re.findall(r'PACKAGES="([^"]+)"', (DOCKER / "sandbox-base" / "build.sh").read_text())
    installed = " ".join(values("sandbox-python", "RUN"))
    in_python_slim = {"bash", "coreutils", "findutils", "grep", "sed", "tar", "gzip"}
    for package in packages.split(","):
        if package.startswith("python3"):
            continue  # the image's own Python (with pip and venv); pytest is installed below
        assert package in in_python_slim or re.search(rf"\b{re.escape(package)}\b", installed), package
    assert "pip install --no-cache-dir pytest" in installed and "mkdir -p /app /logs /tests" in installed
    assert "LANG=C.UTF-8" in values("sandbox-python", "ENV")
    assert values("sandbox-python", "WORKDIR") == ["/app"]


@pytest.mark.parametrize("name", ONLINE)
def test_no_credential_is_baked_into_an_image(name) -> None:
    assert not {n for n in env_names(name) if SECRET_NAME.search(n)}
    text = (DOCKER / name / "Dockerfile").read_text()
    assert not SECRET_VALUE.search(text)
    assert "--secret" not in text and "HF_TOKEN=" not in text and "E2B_API_KEY=" not in text
    ignore = DOCKER / name / "Dockerfile.dockerignore"
    if values(name, "COPY"):  # built from the repository root: keep .env, .git and stores out of the context
        entries = ignore.read_text().split()
        assert {"**/.env", ".git", "runs", "**/*.db"} <= set(entries)


@pytest.mark.parametrize("name", [*ONLINE, "sandbox-base"])
def test_every_image_has_a_readme_listed_in_the_index(name) -> None:
    assert (DOCKER / name / "README.md").read_text().strip()
    assert f"`{name}/`" in (DOCKER / "README.md").read_text()
