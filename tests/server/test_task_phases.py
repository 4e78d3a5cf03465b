"""How a rollout runs a task's phases, as Harbor runs a trial: [[steps]] (workdir, setup.sh, per-step
tests and rewards, min_reward, the reward strategy), multi-metric rewards, healthchecks, artifacts,
[agent] user and `${VAR}` env. Through a real `harbor serve` with the oracle harness on the `local`
sandbox (bubblewrap), each task written here to exercise one rule (the public cookbook recipes that
need Docker run in tests/server/test_public_tasks_docker.py)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import httpx
import pytest

from harbor_server.client import HarborSessionFactory
from tests.server.conftest import UNUSED_ENGINE, make_config, running_server

pytestmark = pytest.mark.timeout(300)

DOCKERFILE = "FROM harbor-rl/sandbox-base:bookworm\nWORKDIR /app\n"
REWARD_1 = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"


def write_task(root: Path, name: str, files: dict[str, str]) -> Path:
    folder = root / name
    defaults = {"environment/Dockerfile": DOCKERFILE, "instruction.md": f"Do {name}.\n"}
    for rel, text in (defaults | files).items():
        if text is None:
            continue
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        if rel.endswith(".sh"):
            path.chmod(0o755)
    return folder


def run_oracle(tmp_path: Path, tasks: Path, task_id: str, *, with_trace: bool = False, **serve):
    """One oracle rollout of `task_id` through a server on `tasks`; its RolloutResult (and its trace)."""
    config = make_config(tmp_path, datasets=[str(tasks)], **serve)
    with running_server(config) as server, HarborSessionFactory(
        server.url, split=tasks.name, harness="oracle", sandbox="local", llm_url=UNUSED_ENGINE, model="tiny",
        purpose="eval",
    ) as factory:  # fmt: skip
        session = factory.create({"task_id": task_id}, seed=0, episode_id=task_id)
        result = session.wait_for_completion()
        trace = session.fetch_training_trace() if with_trace else None
        session.close()
        return (result, trace) if with_trace else result


@pytest.fixture
def tasks(tmp_path, sandbox_root) -> Path:
    return tmp_path / "tasks"


STEPS_TOML = """\
[task]
name = "test/steps"

[[steps]]
name = "scaffold"
min_reward = 1.0

[[steps]]
name = "implement"

[steps.verifier.env]
EXPECTED = "Hello, Harbor!"

[[steps]]
name = "document"
"""


def _steps_task(tasks: Path, toml: str = STEPS_TOML, name: str = "steps") -> Path:
    return write_task(
        tasks,
        name,
        {
            "task.toml": toml,
            "tests/helpers.sh": "pass() { echo 1 > /logs/verifier/reward.txt; exit 0; }\n"
            "fail() { echo 0 > /logs/verifier/reward.txt; exit 0; }\n",
            "steps/scaffold/instruction.md": "Create greet.sh.\n",
            "steps/scaffold/solution/solve.sh": "#!/bin/bash\nprintf '#!/bin/bash\\necho hello\\n' > greet.sh\n"
            "chmod +x greet.sh\n",
            "steps/scaffold/tests/test.sh": "#!/bin/bash\nsource /tests/helpers.sh\n[ -x /app/greet.sh ] && pass; fail\n",
            "steps/implement/instruction.md": "Greet the name in config.txt.\n",
            "steps/implement/workdir/config.txt": "Harbor  \n",
            "steps/implement/workdir/setup.sh": "#!/bin/bash\nset -e\nprintf '%s\\n' \"$(tr -d '[:space:]' < config.txt)\""
            " > config.txt\ntouch /logs/artifacts/setup-ran\n",
            "steps/implement/solution/solve.sh": "#!/bin/bash\nprintf '#!/bin/bash\\necho \"Hello, $(cat /app/config.txt)!\"\\n'"
            " > /app/greet.sh\n",
            "steps/implement/tests/test.sh": "#!/bin/bash\nsource /tests/helpers.sh\n"
            '[ "$(/app/greet.sh)" = "$EXPECTED" ] && pass; fail\n',
            "steps/document/instruction.md": "Write README.md.\n",
            "steps/document/solution/solve.sh": "#!/bin/bash\necho '# greet' > /app/README.md\n",
            "steps/document/tests/test.sh": "#!/bin/bash\nsource /tests/helpers.sh\n"
            'python3 -c "import json; json.dump({\\"reward\\": 1, \\"style\\": 0.5}, open(\\"/logs/verifier/reward.json\\", \\"w\\"))"\n',
        },
    )


def test_steps_run_in_order_in_one_sandbox_with_their_own_tests(tmp_path, tasks):
    _steps_task(tasks)
    result, trace = run_oracle(tmp_path, tasks, "steps", with_trace=True)
    assert result.status == "completed", result.error
    # One rollout, one trace: every step's reward is recorded on it.
    recorded = trace.metadata["rollout"]["steps"]
    assert [(s["name"], s["reward"]) for s in recorded] == [
        ("scaffold", 1.0),
        ("implement", 1.0),
        ("document", 1.0),
    ]
    assert [s.name for s in result.steps] == ["scaffold", "implement", "document"]
    assert [s.reward for s in result.steps] == [1.0, 1.0, 1.0]
    assert result.steps[2].rewards == {"reward": 1.0, "style": 0.5}
    # Harbor's default strategy: each key's mean over the verified steps, a missing key counting 0.
    assert result.rewards == {"reward": 1.0, "style": 0.5 / 3}
    assert result.env_reward == 1.0
    # setup.sh ran from the working directory after the step's workdir/ was uploaded.
    assert result.artifacts_dir is not None
    assert (
        Path(result.artifacts_dir) / "steps" / "implement" / "artifacts" / "logs" / "artifacts" / "setup-ran"
    ).is_file()


def test_a_step_below_its_min_reward_stops_the_rest(tmp_path, tasks):
    folder = _steps_task(tasks)
    (folder / "steps/scaffold/solution/solve.sh").write_text("#!/bin/bash\ntrue\n")
    result = run_oracle(tmp_path, tasks, "steps")
    assert [s.name for s in result.steps] == ["scaffold"]  # the later steps never ran
    assert result.steps[0].reward == 0.0 and result.rewards == {"reward": 0.0} and result.env_reward == 0.0


def test_final_strategy_takes_the_last_steps_rewards(tmp_path, tasks):
    _steps_task(tasks, STEPS_TOML.replace("[task]", 'multi_step_reward_strategy = "final"\n[task]'))
    result = run_oracle(tmp_path, tasks, "steps")
    assert result.rewards == {"reward": 1.0, "style": 0.5}


def test_a_failing_setup_script_fails_its_step_and_the_rollout(tmp_path, tasks):
    folder = _steps_task(tasks)
    (folder / "steps/implement/workdir/setup.sh").write_text("#!/bin/bash\necho broken >&2\nexit 3\n")
    result = run_oracle(tmp_path, tasks, "steps")
    assert result.status == "failed" and result.env_reward is None
    assert [s.name for s in result.steps] == ["scaffold", "implement"]
    assert "setup.sh exited with 3" in result.error and "broken" in result.error


def test_a_multi_metric_reward_json_is_scored_and_reward_key_picks_one(tmp_path, tasks):
    write_task(tasks, "multi", {
        "task.toml": '[task]\nname = "test/multi"\n',
        "solution/solve.sh": "#!/bin/bash\ntrue\n",
        "tests/test.sh": "#!/bin/bash\necho '{\"correctness\": 1, \"performance\": 0.25}' > /logs/verifier/reward.json\n",
    })  # fmt: skip
    result = run_oracle(tmp_path, tasks, "multi")
    assert result.status == "completed" and result.error is None
    assert result.rewards == {"correctness": 1.0, "performance": 0.25}
    assert result.env_reward is None and result.scored  # scored, not one number: never a silent 0


def test_reward_key_chooses_the_metric_that_trains(tmp_path, tasks):
    write_task(tasks, "multi", {
        "task.toml": '[task]\nname = "test/multi"\n[verifier]\nreward_key = "performance"\n',
        "solution/solve.sh": "#!/bin/bash\ntrue\n",
        "tests/test.sh": "#!/bin/bash\necho '{\"correctness\": 1, \"performance\": 0.25}' > /logs/verifier/reward.json\n",
    })  # fmt: skip
    result = run_oracle(tmp_path, tasks, "multi")
    assert result.env_reward == 0.25 and result.rewards == {"correctness": 1.0, "performance": 0.25}


def test_a_failing_healthcheck_fails_the_rollout_before_the_agent(tmp_path, tasks):
    write_task(tasks, "sick", {
        "task.toml": '[task]\nname = "test/sick"\n[environment.healthcheck]\ncommand = "test -f /app/ready"\n'
        "interval_sec = 0.1\nretries = 2\n",
        "solution/solve.sh": "#!/bin/bash\ntouch /app/solved\n",
        "tests/test.sh": REWARD_1,
    })  # fmt: skip
    result = run_oracle(tmp_path, tasks, "sick")
    assert result.status == "failed" and result.env_reward is None
    assert "healthcheck `test -f /app/ready` failed 2 times in a row" in result.error


def test_artifacts_are_collected_with_harbors_manifest(tmp_path, tasks):
    write_task(tasks, "arts", {
        "task.toml": 'artifacts = ["/app/out.txt", { source = "/app/logs", destination = "run-logs", exclude = ["*.tmp"] }, "/app/missing"]\n'
        '[task]\nname = "test/arts"\n',
        "solution/solve.sh": "#!/bin/bash\necho done > out.txt\nmkdir -p logs\necho a > logs/a.log\necho b > logs/b.tmp\n",
        "tests/test.sh": REWARD_1,
    })  # fmt: skip
    result = run_oracle(tmp_path, tasks, "arts")
    root = Path(result.artifacts_dir) / "artifacts"
    assert (root / "app" / "out.txt").read_text() == "done\n"
    assert (root / "run-logs" / "a.log").is_file() and not (root / "run-logs" / "b.tmp").exists()
    manifest = {e["source"]: e for e in json.loads((root / "manifest.json").read_text())}
    assert manifest["/logs/artifacts"]["type"] == "directory"  # the convention folder, always first
    assert (
        manifest["/app/out.txt"]["status"] == "ok"
        and manifest["/app/logs"]["destination"] == "artifacts/run-logs"
    )
    assert manifest["/app/missing"]["status"] == "failed"  # never fails the run
    assert result.status == "completed" and result.env_reward == 1.0


def test_env_templates_reach_the_sandbox_and_a_missing_one_fails_the_rollout(
    tmp_path, tasks, monkeypatch, caplog
):
    write_task(tasks, "env", {
        "task.toml": '[task]\nname = "test/env"\n[environment.env]\nGREETING = "${HRL_TEST_GREETING}"\n'
        'FALLBACK = "${HRL_TEST_UNSET:-plan-b}"\n',
        "solution/solve.sh": "#!/bin/bash\necho \"$GREETING $FALLBACK\" > /app/seen\n",
        "tests/test.sh": "#!/bin/bash\n[ \"$(cat /app/seen)\" = 'hi plan-b' ] && echo 1 > /logs/verifier/reward.txt"
        " || echo 0 > /logs/verifier/reward.txt\n",
    })  # fmt: skip
    monkeypatch.delenv("HRL_TEST_UNSET", raising=False)
    monkeypatch.setenv("HRL_TEST_GREETING", "hi")
    caplog.set_level("DEBUG")
    first = run_oracle(tmp_path, tasks, "env")
    assert first.env_reward == 1.0
    assert "plan-b" not in caplog.text and "plan-b" not in first.model_dump_json()  # values never logged
    monkeypatch.delenv("HRL_TEST_GREETING")
    result = run_oracle(tmp_path, tasks, "env")
    assert result.status == "failed" and "HRL_TEST_GREETING is not set" in result.error


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user in the sandbox")
def test_the_oracle_runs_as_the_tasks_agent_user(tmp_path, tasks):
    write_task(tasks, "user", {
        "task.toml": '[task]\nname = "test/user"\n[agent]\nuser = "nobody"\n',
        "solution/solve.sh": "#!/bin/bash\nid -un > /tmp/who\n",
        "tests/test.sh": "#!/bin/bash\n[ \"$(cat /tmp/who)\" = nobody ] && echo 1 > /logs/verifier/reward.txt"
        " || echo 0 > /logs/verifier/reward.txt\n",
    })  # fmt: skip
    assert run_oracle(tmp_path, tasks, "user").env_reward == 1.0


def test_one_bad_task_never_blocks_the_rest_of_the_dataset(tmp_path, tasks):
    write_task(tasks, "good", {"task.toml": '[task]\nname = "test/good"\n', "solution/solve.sh": "#!/bin/bash\ntrue\n",
                               "tests/test.sh": REWARD_1})  # fmt: skip
    write_task(tasks, "bad", {"task.toml": '[environment]\ncpus = "lots"\n', "tests/test.sh": REWARD_1})
    config = make_config(tmp_path, datasets=[str(tasks)])
    with running_server(config) as server:
        info = httpx.get(f"{server.url}/info").json()
        [dataset] = info["datasets"]
        assert dataset["num_tasks"] == 1 and "cpus" in dataset["refused"]["bad"]
    assert run_oracle(tmp_path, tasks, "good").env_reward == 1.0
    from harbor_server import HarborServerError
    from tasks import DatasetError

    strict = make_config(tmp_path, datasets=[str(tasks)], strict=True)
    with (
        pytest.raises((DatasetError, HarborServerError, RuntimeError), match="'bad' is refused"),
        running_server(strict),
    ):
        pass


def test_training_refuses_at_start_up_a_dataset_whose_tasks_never_report_its_reward_key(tmp_path, tasks):
    write_task(tasks, "multi", {
        "task.toml": '[task]\nname = "test/multi"\n',
        "tests/test.sh": "#!/bin/bash\necho '{\"correctness\": 1, \"performance\": 0}' > /logs/verifier/reward.json\n",
    })  # fmt: skip
    with running_server(make_config(tmp_path, datasets=[str(tasks)])) as server:

        def factory(**kw):
            return HarborSessionFactory(server.url, split="tasks", harness="nop", sandbox="local",
                                        llm_url=UNUSED_ENGINE, model="tiny", **kw)  # fmt: skip

        from harbor_server import BadRolloutRequest

        with factory() as train, pytest.raises(BadRolloutRequest) as info:
            list(train.prompt_rows())  # what a trainer reads first, before any rollout
        assert "reward_key 'reward'" in str(info.value) and "multi (correctness, performance)" in str(
            info.value
        )
        with factory(reward_key="correctness") as train:
            assert [row["task_id"] for row in train.prompt_rows()] == ["multi"]
        with factory(purpose="eval") as evaluate:  # an evaluation reports every metric
            assert len(list(evaluate.prompt_rows())) == 1


# Whether the phase has the internet: a default route (a public local sandbox's slirp4netns), or only
# loopback (the capture port). The host's own listeners are out of reach either way (test_host_probe.py).
PROBE = """from pathlib import Path
routes = Path("/proc/net/route").read_text().splitlines()[1:]
print("reached" if any(line.split()[1] == "00000000" for line in routes) else "blocked")
"""


@pytest.mark.parametrize(("purpose", "expected"), [("train", "blocked"), ("eval", "reached")])
def test_training_denies_the_agent_phase_the_network_the_task_declares(tmp_path, tasks, purpose, expected):
    """A public task: its agent has the internet in an evaluation (as Harbor gives it), and not in training
    (the agent phase gets only the capture port), while its verifier keeps the network."""
    check = f'[ "$(cat /app/agent-saw)" = {expected} ] && [ "$(cat /app/verifier-saw)" = reached ]'
    write_task(tasks, "net", {
        "task.toml": '[task]\nname = "test/net"\n[environment]\nnetwork_mode = "public"\n',
        "solution/probe.py": PROBE,
        "solution/solve.sh": "#!/bin/bash\npython3 /solution/probe.py > /app/agent-saw\n",
        "tests/probe.py": PROBE,
        "tests/test.sh": f"#!/bin/bash\npython3 /tests/probe.py > /app/verifier-saw\n"
        f"{check} && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n",
    })  # fmt: skip
    config = make_config(tmp_path, datasets=[str(tasks)])
    with running_server(config) as server, HarborSessionFactory(
        server.url, split="tasks", harness="oracle", sandbox="local", llm_url=UNUSED_ENGINE, model="tiny",
        purpose=purpose,
    ) as factory:  # fmt: skip
        session = factory.create("net", seed=0, episode_id=purpose)
        result = session.wait_for_completion()
        session.close()
    assert result.env_reward == 1.0, result
