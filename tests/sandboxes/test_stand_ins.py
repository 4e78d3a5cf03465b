"""The stand-in base images (docker/stand-ins): build.sh pulls first and tags a stand-in only where the
pull fails, never over a real image; a stand-in has what its image has (no Debian pytest, pip with its
RECORD, bookworm's OpenSSL under a `*-bookworm` name); a task written for the public image scores as it
would there; and a result produced on a stand-in says so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest
from typer.testing import CliRunner

from evaluation.jobs import Job
from evaluation.runner import stand_in_images
from harbor_rl.cli import app
from sandboxes import SandboxSpec
from tasks import load_task

from .conftest import REPO, write_env

pytestmark = pytest.mark.docker
BUILD = REPO / "docker" / "stand-ins" / "build.sh"
LABEL = "harbor-rl.stand-in"
PIP_TASK = REPO / "tests" / "fixtures" / "stand_in_tasks" / "pip-installs-pytest"


def run_build(images_file=None, pull=None) -> str:
    env = dict(os.environ)
    if images_file is not None:
        env["HARBOR_STAND_IN_IMAGES"] = str(images_file)
    if pull is not None:
        env["HARBOR_STAND_IN_PULL"] = str(pull)
    done = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def said(output: str, name: str) -> str:
    """What build.sh said it did for `name`."""
    lines = [line for line in output.splitlines() if line.startswith(f"stand-ins: {name}: ")]
    assert len(lines) == 1, output
    return lines[0].removeprefix(f"stand-ins: {name}: ")


@pytest.fixture(scope="module")
def stand_ins(docker_client, base_image):
    """Every name of images.txt: pulled, present, or a stand-in (cached: about 2 s when built already)."""
    return run_build()


def is_stand_in(docker_client, name: str) -> bool:
    return bool(docker_client.images.get(name).labels.get(LABEL))


# A `docker pull` that talks to a registry of the test's own: a name with `unpullable` is not in it, one
# on `unreachable.test` cannot be reached, any other is "pulled" by tagging a local image under it.
FAKE_PULL = """#!/bin/bash
echo "$1" >> "$(dirname "$0")/pulls.log"
case "$1" in
  unreachable.test/*) echo 'Error response from daemon: Get "https://unreachable.test/v2/": dial tcp: lookup unreachable.test: no such host' >&2; exit 1 ;;
  *unpullable*) echo "Error response from daemon: manifest for $1 not found: manifest unknown" >&2; exit 1 ;;
esac
docker tag {image} "$1"
"""


def test_build_sh_pulls_first_and_tags_a_stand_in_only_where_the_pull_fails(
    docker_client, base_image, tmp_path
):
    tag = uuid.uuid4().hex[:8]
    real, pullable = f"harbor-rl-test/real-{tag}:1", f"harbor-rl-test/pullable-{tag}:1"
    unpullable, was_ours = f"harbor-rl-test/unpullable-{tag}:1", f"harbor-rl-test/was-stand-in-{tag}:1"
    offline = [f"unreachable.test/a-{tag}:1", f"unreachable.test/b-{tag}:1"]
    names = [real, pullable, unpullable, was_ours, *offline]
    subprocess.run(["docker", "tag", base_image, real], check=True)  # a real image: no label of ours
    pull = tmp_path / "pull.sh"
    pull.write_text(FAKE_PULL.replace("{image}", base_image))
    pull.chmod(0o755)
    images = tmp_path / "images.txt"
    images.write_text("# test list\n" + "".join(f"{name}  os  bookworm\n" for name in names))
    try:
        # A stand-in under a name the registry now has: the first run makes it, the second replaces it.
        images.write_text(f"{was_ours.replace('was-stand-in', 'unpullable')}  os  bookworm\n")
        subprocess.run(["docker", "tag", run_build(images, pull).split()[3], was_ours], check=True)
        assert is_stand_in(docker_client, was_ours)
        (tmp_path / "pulls.log").unlink()

        images.write_text("# test list\n" + "".join(f"{name}  os  bookworm\n" for name in names))
        out = run_build(images, pull)
        assert said(out, real) == "present"
        assert said(out, pullable) == "pulled" and said(out, was_ours) == "pulled"
        assert said(out, unpullable).startswith("stand-in harbor-rl/stand-in:os-bookworm-")
        assert "(pull failed: manifest for" in said(out, unpullable)
        for name in offline:
            assert "(pull failed: dial tcp: lookup unreachable.test: no such host)" in said(out, name)
        # Nothing of ours under a name that could be pulled, and never over a real image.
        base_id = docker_client.images.get(base_image).id
        for name in (real, pullable, was_ours):
            assert docker_client.images.get(name).id == base_id, name
        assert docker_client.images.get(unpullable).labels.get(LABEL) == "os-bookworm"
        # A present real image is not pulled; an unreachable registry is asked once per run.
        pulls = (tmp_path / "pulls.log").read_text().split()
        assert real not in pulls and sum(p.startswith("unreachable.test/") for p in pulls) == 1

        again = run_build(images, pull)
        assert said(again, unpullable) == said(out, unpullable), "a second run builds nothing new"
    finally:
        for name in names:
            subprocess.run(["docker", "rmi", name], capture_output=True)


def run_in(image: str, script: str) -> str:
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, "bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout + done.stderr


PROBE = """
cat /etc/debian_version
python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])'
python3 -c 'import pytest' 2>/dev/null && echo has-pytest
for c in git curl ps make pip python; do command -v $c >/dev/null && echo "has-$c"; done
ls /usr/lib/python3*/EXTERNALLY-MANAGED >/dev/null 2>&1 && echo has-pep668-marker
ls /usr/local/lib/python3*/*-packages/pip-*.dist-info/RECORD >/dev/null 2>&1 && echo pip-has-record
openssl req -x509 -newkey ed25519 -nodes -subj /CN=x -keyout /tmp/k -out /tmp/c -days 1 2>/dev/null
openssl x509 -noout -subject -in /tmp/c
"""


@pytest.mark.timeout(300)
def test_each_stand_in_has_what_its_image_has(docker_client, stand_ins):
    """What the public images ship (docker-library/python's Dockerfiles; ubuntu and debian have no Python
    packages, no git, curl or procps), checked on each name that is a stand-in here."""
    probed = {}
    for name in (
        "ubuntu:24.04",
        "ubuntu:22.04",
        "debian:bookworm",
        "python:3.11-slim",
        "python:3.12-slim",
        "python:3.13-slim-bookworm",
    ):
        if is_stand_in(docker_client, name):
            probed[name] = set(run_in(name, PROBE).split("\n"))
    if not probed:
        pytest.skip("every public image was pulled here: there is no stand-in to check")
    for name, found in probed.items():
        assert not found & {"has-pytest", "has-git", "has-curl", "has-ps", "has-make"}, (name, found)
        if name.startswith("python:"):
            assert {"has-pip", "has-python", "pip-has-record"} <= found, (name, found)
            assert "has-pep668-marker" not in found, name  # `pip install` works, as in python:*-slim
        else:
            assert not found & {"has-pip", "has-python"}, (name, found)
    if "ubuntu:22.04" in probed:
        assert "has-pep668-marker" not in probed["ubuntu:22.04"]  # jammy predates PEP 668
    if "ubuntu:24.04" in probed:
        assert "has-pep668-marker" in probed["ubuntu:24.04"]
    if "python:3.11-slim" in probed:
        assert "python3.11" in probed["python:3.11-slim"]
    if "python:3.12-slim" in probed:  # numpy 2.0 and pandas 2.2 pins have wheels for 3.12, not 3.13
        assert "python3.12" in probed["python:3.12-slim"], probed["python:3.12-slim"]
    if "python:3.13-slim-bookworm" in probed:  # bookworm's OpenSSL 3.0, which a task's solution may parse
        found = probed["python:3.13-slim-bookworm"]
        assert "subject=CN = x" in found and any(v.startswith("12.") for v in found), found
        assert "python3.13" in found, found  # `uvx -p 3.13` in terminal-bench's verifiers finds it


# What python:X.Y-slim's own CPython has (docker-library/python, 3.12/slim-trixie/Dockerfile): every
# module whose library the image keeps imports, sysconfig says /usr/local, and no Debian Python is left.
CPYTHON_PROBE = """
python3 -c 'import ssl, sqlite3, ctypes, lzma, bz2, zlib, readline, uuid, dbm, decimal, curses, hashlib
print(ssl.OPENSSL_VERSION.split()[0], sqlite3.sqlite_version_info >= (3, 0), ctypes.CDLL(None) is not None)'
python3 -c 'import sys, sysconfig; print(sys.version.split()[0], sys.prefix, sysconfig.get_paths()["purelib"],
    sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INCLUDEPY"))'
python3-config --prefix
ls /usr/bin/python3* /usr/lib/python3 2>&1 | head -1
grep -rlI pyenv /usr/local/bin /usr/local/lib/python{minor}/_sysconfigdata_* /usr/local/lib/pkgconfig || echo no-host-paths
ldd /usr/local/bin/python{minor} | grep -c '/usr/local/bin/../lib/libpython{minor}.so' || true
uv venv -q --python /usr/local/bin/python3 /tmp/venv && /tmp/venv/bin/python -c 'import sys; print("venv", sys.version.split()[0], sys.base_prefix)'
python3 -m venv /tmp/venv2 && /tmp/venv2/bin/python -m pip --version | cut -d' ' -f1
pip --version | cut -d' ' -f1,2
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("name", "minor", "suite"),
    [("python:3.12-slim", "3.12", "trixie"), ("python:3.13-slim-bookworm", "3.13", "bookworm")],
)
def test_a_cpython_stand_in_is_the_machines_own_build_laid_out_as_the_image_has_it(
    docker_client, stand_ins, name, minor, suite
):
    """A cpython-X.Y stand-in: the machine's own CPython X.Y build (no 3.12 source can be had here; 3.13's
    would take ten minutes to build), relocated under /usr/local with pip 25.3 from its wheel, in place of
    the suite's Debian Python (trixie's 3.13, bookworm's 3.11)."""
    if not is_stand_in(docker_client, name):
        pytest.skip(f"{name} was pulled here: there is no stand-in to check")
    kind = docker_client.images.get(name).labels[LABEL]
    if kind != f"cpython-{minor}-{suite}":
        pytest.skip(f"no CPython {minor} build on this machine: {name}'s stand-in is {kind}")
    out = run_in(name, CPYTHON_PROBE.replace("{minor}", minor)).splitlines()
    assert out[0] == "OpenSSL True True", out  # the suite's OpenSSL, through _ssl and _ctypes
    version, prefix, purelib, libdir, include = out[1].split()
    assert version.startswith(f"{minor}.") and prefix == "/usr/local", out
    assert purelib == f"/usr/local/lib/python{minor}/site-packages", out
    assert (libdir, include) == ("/usr/local/lib", f"/usr/local/include/python{minor}"), out
    assert out[2] == "/usr/local", out
    assert "No such file" in out[3], out  # Debian's Python went with its packages
    assert out[4] == "no-host-paths", out
    assert out[5] == "1", out  # found through its RUNPATH, $ORIGIN/../lib, as docker-library links it
    assert out[6] == f"venv {version} /usr/local", out
    assert out[7] == "pip", out  # ensurepip's own pip in a venv
    assert out[8] == "pip 25.3", out


def test_a_cpython_name_without_a_build_here_gets_debians_python_and_says_so(
    docker_client, base_image, tmp_path
):
    """No source pinned and no host build of 3.12: setup goes on, with the `python` kind and one line."""
    name = f"harbor-rl-test/unpullable-{uuid.uuid4().hex[:8]}:1"
    pull = tmp_path / "pull.sh"
    pull.write_text(FAKE_PULL.replace("{image}", base_image))
    pull.chmod(0o755)
    images = tmp_path / "images.txt"
    images.write_text(f"{name}  cpython-3.12  trixie\n")
    env = dict(os.environ, HARBOR_STAND_IN_IMAGES=str(images), HARBOR_STAND_IN_PULL=str(pull))
    env["HARBOR_STAND_IN_CPYTHON_BUILDS"] = str(tmp_path / "no-builds")
    try:
        done = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=900, env=env)
        assert done.returncode == 0, done.stderr
        assert said(done.stdout, name).startswith("stand-in harbor-rl/stand-in:python-trixie-"), done.stdout
        [line] = [line for line in done.stderr.splitlines() if "no CPython 3.12 here" in line]
        assert line == (
            f"stand-ins: {name}: no CPython 3.12 here (none pinned in build.sh, no build in "
            f"{tmp_path / 'no-builds'}/3.12.*): the python kind, with Debian's Python of trixie"
        )
        assert docker_client.images.get(name).labels.get(LABEL) == "python-trixie"
    finally:
        subprocess.run(["docker", "rmi", name], capture_output=True)


@pytest.mark.timeout(600)
def test_a_task_that_pip_installs_pytest_scores_1_on_the_stand_in_and_says_it_ran_on_one(
    docker_client, stand_ins, tmp_path
):
    """terminal-bench's headless-terminal shape through `harbor eval`: its verifier pip-installs pytest
    (Debian's would not uninstall) and checks bookworm's OpenSSL output; the oracle scores 1.0, and the
    trial's result.json, the eval table and `harbor tasks check` say the image was a stand-in."""
    stand_in = is_stand_in(docker_client, "python:3.13-slim-bookworm")
    jobs = tmp_path / "jobs"
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "--dataset",
            str(PIP_TASK),
            "--harness",
            "oracle",
            "--sandbox",
            "docker",
            "--output-dir",
            str(jobs),
            "--job-name",
            "stand-in",
        ],  # fmt: skip
        catch_exceptions=False,
        terminal_width=250,
    )
    assert result.exit_code == 0, result.output
    job = Job.open(jobs / "stand-in")
    [trial] = job.trials()
    assert trial.reward == 1.0, (trial.error, trial.rewards)
    doc = json.loads((job.trial_dir(trial.split, trial.task_id, trial.attempt) / "result.json").read_text())
    marks = doc["harbor_rl"]["stand_in_images"]
    checked = CliRunner().invoke(
        app, ["tasks", "check", str(PIP_TASK), "--sandbox", "docker"], terminal_width=250
    )
    assert checked.exit_code == 0, checked.output
    assert ("python:3.13-slim-bookworm: a stand-in here" in checked.output) == stand_in, checked.output
    if stand_in:
        assert [(m["name"], m["stand_in"]) for m in marks] == [
            ("python:3.13-slim-bookworm", "cpython-3.13-bookworm")
        ]
        assert "ran on stand-ins of python:3.13-slim-bookworm" in " ".join(result.output.split())
    else:
        assert marks == [] and "stand-in" not in result.output


def test_stand_ins_copied_from_or_under_a_separate_verifier_are_reported_too(docker_client, stand_ins, tmp_path):
    """A score depends on every image the trial's containers are built from: the math-modeling tasks copy uv in
    (`COPY --from=ghcr.io/astral-sh/uv:0.8.15`), and a separate verifier may build from tests/Dockerfile on
    another base. Here: PIP_TASK (FROM python:3.13-slim-bookworm) given such a verifier."""
    task = tmp_path / "pip-installs-pytest"
    shutil.copytree(PIP_TASK, task)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace("[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n'))
    (task / "tests" / "Dockerfile").write_text(
        "FROM python:3.12-slim\nCOPY --from=ghcr.io/astral-sh/uv:0.8.15 /uv /usr/local/bin/\nCOPY . /tests/\n"
    )
    names = ["python:3.13-slim-bookworm", "python:3.12-slim", "ghcr.io/astral-sh/uv:0.8.15"]
    if not all(is_stand_in(docker_client, name) for name in names):
        pytest.skip("some of these images were pulled here: no stand-in to report")
    assert [image.name for image in stand_in_images(load_task(task))] == names
    assert [image.name for image in stand_in_images(load_task(PIP_TASK))] == names[:1]  # no verifier image


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_an_ubuntu_task_installs_with_apt_and_pip_and_verifies_with_uvx(
    docker_backend, stand_ins, tmp_path
):
    """What Harbor's template task does on ubuntu:22.04: apt-get and pip at build time, `uvx --with pytest`
    in test.sh (the stand-in's uvx: astral.sh, where the template fetches it, is out of reach here)."""
    env_dir = write_env(
        tmp_path / "environment",
        "FROM ubuntu:22.04\nRUN apt-get update && apt-get install -y curl python3-pip\nRUN pip install flask\n"
        "WORKDIR /app\n",
    )
    sandbox = await docker_backend.start(
        SandboxSpec(name="stand-in", environment_dir=env_dir, network_mode="public")
    )
    try:
        assert (await sandbox.exec("python3 -c 'import flask; print(flask.__name__)'")).stdout == "flask\n"
        verify = await sandbox.exec("uvx --with pytest==8.4.1 pytest --version", timeout_s=240)
        assert verify.ok, verify.stderr
        assert "pytest 8.4.1" in verify.stdout + verify.stderr
    finally:
        await sandbox.stop()
