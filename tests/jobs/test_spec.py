"""The job spec `harbor jobs launch` builds: secrets only through the Hub's `secrets`, validated config
(flavour, timeout, credentials as env, trainer keys the launcher owns), YAML with flags over it."""

from __future__ import annotations

import json

import pytest

from harbor_rl.commands.jobs import merge_settings
from harbor_rl.jobs import JobConfigError, MissingSecretError, build_job_spec, load_launch_config
from harbor_rl.jobs.plan import build_plan, model_location
from tests.jobs.conftest import E2B_VALUE, HF_VALUE

IMAGE = "myorg/harbor-rl-trainer:0.1.0"


def no_saved_token() -> None:
    return None


def config(**overrides):
    return load_launch_config(
        {"image": IMAGE, "model": "Qwen/Qwen3-1.7B", "run_name": "harbor-demo", **overrides}
    )


def test_secrets_go_only_to_the_hub_secrets_even_when_set_in_the_environment(secrets_env) -> None:
    import os

    cfg = config(volume="myorg/runs", env={"WANDB_PROJECT": "grpo"}, secrets=["WANDB_API_KEY"])
    environ = dict(os.environ) | {"WANDB_API_KEY": "wandb_value_abcdefgh"}
    spec, missing = build_job_spec(cfg, environ, saved_token=no_saved_token)

    assert missing == []
    kwargs = spec.run_job_kwargs()
    assert kwargs["secrets"] == {
        "HF_TOKEN": HF_VALUE,
        "E2B_API_KEY": E2B_VALUE,
        "WANDB_API_KEY": "wandb_value_abcdefgh",
    }
    visible = json.dumps({k: v for k, v in kwargs.items() if k not in ("secrets", "volumes")}) + repr(spec)
    for value in (HF_VALUE, E2B_VALUE, "wandb_value_abcdefgh"):
        assert value not in visible
    assert not {"HF_TOKEN", "E2B_API_KEY", "WANDB_API_KEY"} & set(kwargs["env"])
    assert kwargs["env"] == {"PYTHONUNBUFFERED": "1", "WANDB_PROJECT": "grpo"}
    # The job's own processes: nothing secret on their command lines either.
    run = cfg.run_config()
    for process in build_plan(run, model_path=model_location(run)[0], public_url="https://x--8300.hf.jobs"):
        assert HF_VALUE not in process.shell() and E2B_VALUE not in process.shell()
    assert kwargs["flavor"] == "h200x2" and kwargs["timeout"] == "2h" and kwargs["image"] == IMAGE
    assert kwargs["expose_public"] == [8300] and kwargs["labels"] == {"harbor-run": "harbor-demo"}
    assert [(v.type, v.source, v.mount_path) for v in kwargs["volumes"]] == [
        ("bucket", "myorg/runs", "/data")
    ]


def test_the_job_command_carries_the_run_config_and_no_secret(secrets_env) -> None:
    spec, _ = build_job_spec(
        config(), {"HF_TOKEN": HF_VALUE, "E2B_API_KEY": E2B_VALUE}, saved_token=no_saved_token
    )
    assert spec.command[:4] == ["harbor", "jobs", "run-on-host", "--config-json"]
    carried = json.loads(spec.command[4])
    assert carried["model"] == "Qwen/Qwen3-1.7B" and carried["num_gpus"] == 2 and carried["sandbox"] == "e2b"
    assert not {"image", "flavor", "secrets", "timeout"} & set(carried)


@pytest.mark.parametrize("name", ["HF_TOKEN", "E2B_API_KEY", "OPENAI_API_KEY", "GITHUB_TOKEN", "DB_PASSWORD"])
def test_credentials_as_plain_env_are_refused(name) -> None:
    with pytest.raises(JobConfigError, match=f"env: {name} looks like a credential: pass it with --secret"):
        config(env={name: "x"})


def test_missing_e2b_key_is_refused_when_e2b_sandboxes_are_requested() -> None:
    with pytest.raises(
        MissingSecretError, match="E2B_API_KEY not set in your environment \\(E2B sandboxes need it\\)"
    ):
        build_job_spec(config(), {"HF_TOKEN": HF_VALUE}, saved_token=no_saved_token)
    spec, _ = build_job_spec(config(sandbox="local"), {"HF_TOKEN": HF_VALUE}, saved_token=no_saved_token)
    assert set(spec.secrets) == {"HF_TOKEN"}
    # HF_TOKEN may come from `hf auth login` instead of the environment.
    spec, _ = build_job_spec(config(sandbox="local"), {}, saved_token=lambda: "hf_saved_login_token_00")
    assert spec.run_job_kwargs()["secrets"] == {"HF_TOKEN": "hf_saved_login_token_00"}


def test_a_dry_run_lists_missing_secrets_instead_of_failing() -> None:
    spec, missing = build_job_spec(config(), {}, saved_token=no_saved_token, require_secrets=False)
    assert missing == ["HF_TOKEN", "E2B_API_KEY"] and spec.secrets == {}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"flavor": "h300x9"}, "flavor: unknown flavour 'h300x9'; flavours with 2\\+ GPUs: .*h200x2"),
        ({"flavor": "h200"}, "flavour 'h200' has 1 GPU\\(s\\); the launcher needs 2\\+ .*e.g. h200x2"),
        ({"flavor": "cpu-basic"}, "flavour 'cpu-basic' has 0 GPU"),
        ({"timeout": "6 hours"}, "timeout: timeout '6 hours': give seconds or a number with s, m, h or d"),
        ({"secrets": ["WANDB_API_KEY=abc"]}, "secrets take NAMES"),
        ({"volume": "just-a-name"}, "volume: volume 'just-a-name': give a bucket as namespace/name"),
        ({"trainer": {"model": "other"}}, "trainer.model is set by the launcher from 'model'"),
        ({"run_name": "Has Spaces"}, "run_name: 'Has Spaces': use lower-case letters"),
        ({"model": "tiny"}, "model 'tiny' is built by the embedded engine"),
        ({"dataset": ["builtin", "hf:a/b"]}, "2 datasets .*: give `split`"),
        ({"sandbox": "k8s"}, "sandbox: Input should be 'e2b', 'docker' or 'local'"),
        ({"max_concurrent_envs": 8, "trainer": {"max_concurrent_rollouts": 8}}, "must be at least .* = 9"),
    ],
)
def test_invalid_settings_get_errors_that_name_them(overrides, message) -> None:
    with pytest.raises(JobConfigError, match=message):
        config(**overrides)


def test_embedded_engine_runs_on_a_cpu_flavour_and_the_split_follows_the_dataset() -> None:
    cfg = config(
        flavor="cpu-upgrade", model="tiny", engine={"kind": "embedded"}, dataset=["hf:org/tasks@dev"]
    )
    assert cfg.split == "dev" and cfg.num_gpus == 1
    assert config(dataset=["/data/tasks/swe-smith/"]).split == "swe-smith"
    assert config(dataset=["hf:org/tasks"]).split == "train"
    # a Harbor registry dataset is served under its whole NAME@VERSION, owner included
    assert config(dataset=["org/bench@1.0"]).split == "org/bench@1.0"
    assert config(dataset=["env-tasks"]).split == "env-tasks"


def test_yaml_settings_with_flags_over_them(tmp_path) -> None:
    import yaml

    from_file = yaml.safe_load(
        "image: myorg/img:1\nflavor: h200x4\nmodel: Qwen/Qwen3-4B\ntimeout: 1h\n"
        "trainer: {max_steps: 5, learning_rate: 1.0e-6}\nenv: {A: '1'}\nengine: {max_model_len: 8192}\n"
    )
    data = merge_settings(
        from_file, {"flavor": "h200x2", "model": None, "dataset": [], "timeout": "3h"},
        {"max_steps": 7}, {"B": "2"}, None, ["--enforce-eager"],
    )  # fmt: skip
    cfg = load_launch_config(data)
    assert (cfg.flavor, cfg.model, cfg.timeout, cfg.image) == ("h200x2", "Qwen/Qwen3-4B", "3h", "myorg/img:1")
    assert cfg.trainer == {"max_steps": 7, "learning_rate": 1e-6}
    assert cfg.env == {"A": "1", "B": "2"} and cfg.dataset == ["builtin"]
    assert cfg.engine.max_model_len == 8192 and cfg.engine.extra_args == ["--enforce-eager"]
