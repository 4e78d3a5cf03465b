"""Loading task folders: typed config, legacy keys, unknown keys, and one error case per malformation."""

from __future__ import annotations

import os

import pytest

from tasks import TaskFormatError, load_task
from tasks.models import TaskConfig, parse_size_mb


def test_valid_task_loads_with_typed_config(make_task):
    root = make_task()
    task = load_task(root)
    assert task.id == "tiny" and task.name == "test/tiny"
    assert task.instruction == "Do the tiny thing.\n"
    assert task.config.verifier.timeout_sec == 60.0
    assert task.config.environment.memory_mb == 512
    assert task.config.environment.network_mode == "public"  # Harbor's default
    assert task.workdir == "/app"  # the Dockerfile's WORKDIR
    assert task.paths.test_script == root / "tests" / "test.sh"
    assert task.paths.has_solution


def test_defaults_are_harbors():
    config = TaskConfig.model_validate({})
    assert config.schema_version == "1.4"
    assert config.verifier.timeout_sec == 600.0
    assert config.environment.network_mode == "public"
    # Left to the run, as Harbor leaves them to the backend.
    assert config.environment.workdir is None and config.environment.cpus is None
    assert config.environment.memory_mb is None and config.agent.timeout_sec is None
    assert config.verifier.reward_key is None


def test_sandbox_spec_carries_the_environment(make_task):
    toml = """\
    schema_version = "1.2"
    [agent]
    timeout_sec = 100
    [verifier]
    timeout_sec = 50
    [environment]
    cpus = 2
    memory_mb = 1024
    network_mode = "allowlist"
    allowed_hosts = ["pypi.org"]
    env = { MODE = "test" }
    workdir = "/work"
    """
    task = load_task(make_task(files={"task.toml": toml}))
    spec = task.sandbox_spec("rollout-7", proxy_port=8300)
    assert spec.name == "rollout-7" and spec.proxy_port == 8300
    assert spec.environment_dir == task.paths.environment_dir
    assert (spec.cpus, spec.memory_mb, spec.workdir) == (2.0, 1024, "/work")
    assert spec.network_mode == "allowlist" and spec.allowed_hosts == ["pypi.org"]
    assert spec.env == {"MODE": "test"}
    assert spec.timeout_s >= 150  # covers the agent and the verifier


def test_prebuilt_image_needs_no_dockerfile(make_task):
    root = make_task(
        files={"task.toml": '[environment]\ndocker_image = "python:3.11"\n', "environment/Dockerfile": None}
    )
    spec = load_task(root).sandbox_spec("r")
    assert spec.docker_image == "python:3.11" and spec.environment_dir is None


def test_legacy_harbor_keys_are_mapped(make_task):
    toml = """\
    version = "1.0"
    [environment]
    memory = "4G"
    storage = "512M"
    allow_internet = true
    """
    config = load_task(make_task(files={"task.toml": toml})).config
    assert config.schema_version == "1.0"
    assert config.environment.memory_mb == 4096
    assert config.environment.storage_mb == 512
    assert config.environment.network_mode == "public"


@pytest.mark.parametrize(("size", "mb"), [("2G", 2048), ("1.5G", 1536), ("256m", 256), ("2048K", 2)])
def test_legacy_sizes(size, mb):
    assert parse_size_mb(size) == mb


@pytest.mark.parametrize("size", ["256MiB", "1T", "4GB", "lots", ""])
def test_legacy_sizes_harbor_cannot_read_are_refused(size):
    with pytest.raises(ValueError, match="K, M or G"):
        parse_size_mb(size)


def test_numbers_in_strings_are_read_as_harbor_reads_them(make_task):
    toml = '[verifier]\ntimeout_sec = "600"\n[environment]\ncpus = 2.0\n'
    config = load_task(make_task(files={"task.toml": toml})).config
    assert config.verifier.timeout_sec == 600.0 and config.environment.cpus == 2
    assert isinstance(config.environment.cpus, int)


def test_unknown_keys_are_kept_and_listed(make_task):
    toml = """\
    custom_top = 1
    [environment]
    gpu_count = 1
    [verifier]
    flaky = true
    [my_extension]
    x = "y"
    """
    config = load_task(make_task(files={"task.toml": toml})).config
    assert config.unknown_keys() == ["custom_top", "environment.gpu_count", "my_extension", "verifier.flaky"]
    assert config.model_extra["my_extension"] == {"x": "y"}
    assert config.environment.model_extra["gpu_count"] == 1


def test_task_name_from_toml_and_stable_digest(make_task):
    root = make_task(files={"task.toml": '[task]\nname = "my-org/pretty-name"\n'})
    first, second = load_task(root), load_task(root)
    assert first.name == "my-org/pretty-name" and first.id == "tiny"
    before = first.digest()
    assert before == second.digest()
    (root / "tests" / "test.sh").write_text("#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n")
    assert load_task(root).digest() != before


# --- malformed tasks: each names the file, the key where there is one, and the problem ------------


def _error(root) -> TaskFormatError:
    with pytest.raises(TaskFormatError) as info:
        load_task(root)
    return info.value


def test_not_a_folder(tmp_path):
    err = _error(tmp_path / "nope")
    assert err.file.endswith("nope") and "not a task folder" in err.problem


def test_missing_instruction(make_task):
    err = _error(make_task(files={"instruction.md": None}))
    assert err.file.endswith("instruction.md") and "missing" in err.problem


def test_empty_instruction(make_task):
    err = _error(make_task(files={"instruction.md": "  \n\n"}))
    assert err.file.endswith("instruction.md") and "empty" in err.problem


def test_missing_task_toml(make_task):
    err = _error(make_task(files={"task.toml": None}))
    assert err.file.endswith("task.toml") and "missing" in err.problem


def test_bad_toml_names_the_line(make_task):
    err = _error(make_task(files={"task.toml": "[verifier]\ntimeout_sec = = 3\n"}))
    assert err.file.endswith("task.toml")
    assert "invalid TOML" in err.problem and "line 2" in err.problem


@pytest.mark.parametrize(
    ("toml", "key", "words"),
    [
        ('[environment]\ncpus = "two"\n', "environment.cpus", "number"),
        ('[verifier]\ntimeout_sec = "soon"\n', "verifier.timeout_sec", "number"),
        ('[task]\nname = "Pretty Name"\n', "task.name", "'org/name'"),
        ("[environment]\nmemory_mb = 1.5\n", "environment.memory_mb", "integer"),
        ("[environment]\nenv = { PORT = 8080 }\n", "environment.env.PORT", "string"),
        ('[environment]\nnetwork_mode = "intranet"\n', "environment.network_mode", "public"),
        ('[environment]\nallowed_hosts = ["pypi.org"]\n', "environment", "only valid when"),
        ('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["https://pypi.org"]\n', "environment.allowed_hosts", "not URLs"),
        ('[environment]\nworkdir = "app"\n', "environment.workdir", "absolute"),
        ('[environment]\nmemory = "lots"\n', "environment", "size"),
        ('[environment]\nallow_internet = "maybe"\n', "environment.allow_internet", "true or false"),
        ('[[steps]]\nname = "a/b"\n', "steps.0.name", "portable folder name"),
        ('schema_version = "2.0"\n', "schema_version", "not supported"),
        ('verifier = "fast"\n', "verifier", "dictionary"),
    ],
)
def test_wrong_types_name_the_key(make_task, toml, key, words):
    err = _error(make_task(files={"task.toml": toml}))
    assert err.file.endswith("task.toml")
    assert err.key == key
    assert words in err.problem


def test_missing_test_script(make_task):
    err = _error(make_task(files={"tests/test.sh": None}))
    assert err.file.endswith("tests/test.sh") and "missing" in err.problem


def test_missing_dockerfile_loads_as_in_harbor_but_cannot_run(make_task):
    from tasks.support import refusals

    task = load_task(make_task(files={"environment/Dockerfile": None}))
    assert any("environment/Dockerfile: missing" in r and "docker_image" in r for r in refusals(task, "docker"))


def test_symlink_out_of_the_task_folder(make_task, tmp_path):
    root = make_task()
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    os.symlink(secret, root / "environment" / "data.txt")
    err = _error(root)
    assert err.file.endswith("environment/data.txt") and "outside the task folder" in err.problem


def test_symlink_inside_the_task_folder_is_fine(make_task):
    root = make_task()
    os.symlink("start.txt", root / "environment" / "alias.txt")
    assert load_task(root).id == "tiny"


@pytest.mark.parametrize(
    "line",
    [
        "COPY ../tests /app/tests",
        "ADD ../../etc/passwd /app/",
        'COPY ["../instruction.md", "/app/"]',
        "COPY --chown=1:1 ../solution /s",
    ],
)
def test_dockerfile_copy_escaping_the_context(make_task, line):
    root = make_task(files={"environment/Dockerfile": f"FROM harbor-rl/sandbox-base:bookworm\n{line}\n"})
    err = _error(root)
    assert err.file.endswith("environment/Dockerfile")
    assert (
        err.key in ("COPY", "ADD") and "escapes the build context" in err.problem and "line 2" in err.problem
    )


def test_dockerfile_copy_of_a_missing_file(make_task):
    root = make_task(
        files={
            "environment/Dockerfile": "FROM harbor-rl/sandbox-base:bookworm\nCOPY \\\n  nothere.py /app/\n"
        }
    )
    err = _error(root)
    assert err.key == "COPY" and "does not exist" in err.problem


def test_dockerfile_copy_from_a_stage_is_not_a_path(make_task):
    dockerfile = "FROM harbor-rl/sandbox-base:bookworm AS a\nFROM harbor-rl/sandbox-base:bookworm\nCOPY --from=a /etc/hostname /x\n"
    assert load_task(make_task(files={"environment/Dockerfile": dockerfile})).id == "tiny"
