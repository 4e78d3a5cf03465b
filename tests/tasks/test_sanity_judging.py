"""How `harbor tasks check --run` judges an oracle or nop run: by the `reward` key, as Harbor does; every
metric only where there is none; each failure said in words."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from harbor_rl.cli import app
from tasks.sanity import sanity_failure


def test_the_reward_key_is_judged_and_extra_counts_are_not():
    # sales-summary's reward.json: the reward and the counts it came from.
    counts = {"reward": 1.0, "tests_passed": 4.0, "tests_total": 4.0}
    assert sanity_failure("oracle", counts, None) is None
    assert sanity_failure("nop", {"reward": 0.0, "tests_passed": 2.0, "tests_total": 4.0}, None) is None
    assert (
        sanity_failure("oracle", {"reward": 0.0, "tests_passed": 4.0}, None) == "oracle reward 0, expected 1"
    )
    assert sanity_failure("nop", {"reward": 1.0}, None) == "nop reward 1, expected 0"


def test_every_metric_is_judged_where_there_is_no_reward_key():
    assert sanity_failure("oracle", {"correctness": 1.0, "style": 1.0}, None) is None
    assert (
        sanity_failure("oracle", {"correctness": 1.0, "style": 0.5}, None) == "oracle style 0.5, expected 1"
    )
    assert sanity_failure("nop", {"a": 0.25, "b": 1.0}, None) == "nop a 0.25, b 1, expected 0"


def test_a_run_without_metrics_says_why():
    assert sanity_failure("oracle", {}, "verifier timed out after 60 s") == "verifier timed out after 60 s"
    assert sanity_failure("nop", {}, None) == "the verifier wrote no reward.json or reward.txt"
    # Scored right, yet the run failed (its sandbox would not stop, say): still not ok, and why.
    assert sanity_failure("oracle", {"reward": 1.0}, "sandbox did not stop") == "sandbox did not stop"


ORACLE_AWARE_TEST_SH = """\
#!/bin/bash
# The oracle leaves /app/done; the reward.json carries counts beside the reward, as sales-summary's does.
if [ -f /app/done ]; then r=1; p=4; else r=0; p=0; fi
echo "{\\"reward\\": $r, \\"tests_passed\\": $p, \\"tests_total\\": 4}" > /logs/verifier/reward.json
"""


def _check(path, *extra: str):
    runner = CliRunner(env={"COLUMNS": "250", "NO_COLOR": "1"})
    return runner.invoke(
        app,
        ["tasks", "check", str(path), "--run", "oracle,nop", "--sandbox", "local", *extra],
        terminal_width=250,
    )


@pytest.mark.timeout(120)
def test_check_run_exits_0_on_counts_beside_the_reward_and_1_with_words_when_wrong(make_task, tmp_path):
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed; the local backend needs it")
    make_task(
        "counts",
        files={"tests/test.sh": ORACLE_AWARE_TEST_SH, "solution/solve.sh": "#!/bin/bash\ntouch /app/done\n"},
    )
    good = _check(tmp_path / "tasks")
    assert good.exit_code == 0, good.output
    assert "not ok" not in good.output

    make_task("lazy-oracle", files={"tests/test.sh": ORACLE_AWARE_TEST_SH})  # its solve.sh does nothing
    bad = _check(tmp_path / "tasks")
    assert bad.exit_code == 1, bad.output
    rows = {line.split("│")[1].strip(): line for line in bad.output.splitlines() if line.count("│") > 3}
    assert "oracle reward 0, expected 1" in rows["lazy-oracle"]
    assert "expected" not in rows["counts"]
    assert bad.output.strip().splitlines()[-1] == "not ok: lazy-oracle"


@pytest.mark.timeout(120)
def test_sales_summary_whose_reward_json_counts_its_tests_checks_ok():
    """The built-in task whose reward.json carries `tests_passed: 4` beside `reward` (the issue's case)."""
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed; the local backend needs it")
    from tasks import BUILTIN_DIR

    result = _check(BUILTIN_DIR / "sales-summary")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "sales-summary" in line and "│" in line)
    assert "ok" in row and "expected" not in row
