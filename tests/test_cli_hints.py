"""Each hint a command prints names flags that the command it names really has (a hint to pass
`--expose` to `harbor eval`, which had no such flag, sent users nowhere), and `harbor --version`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import version

import pytest
from typer.testing import CliRunner

from harbor_rl.cli import app

runner = CliRunner(env={"COLUMNS": "250", "NO_COLOR": "1"})
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def help_flags(command: str) -> set[str]:
    """The flags `harbor COMMAND --help` lists."""
    result = runner.invoke(app, [*command.split(), "--help"])
    assert result.exit_code == 0, result.output
    return set(FLAG.findall(result.output))


@pytest.mark.parametrize(
    ("args", "named"),
    [
        # E2B needs a public URL of the capture port; eval's in-process server opens one with eval's own flags.
        (["eval", "--harness", "oracle", "--sandbox", "e2b"], {"eval": ["--expose", "--public-url"]}),
        (["eval", "--harness", "oracle", "--expose", "nope"], {"eval": ["--expose"]}),
        (["eval"], {"eval": ["--harness", "--compare"]}),
        (["eval", "--harness", "opencode"], {"eval": ["--llm-url", "--model"]}),
        # collect's and train's in-process servers open no tunnel: a running `harbor serve` does.
        (
            ["collect", "--sandbox", "e2b", "-n", "1"],
            {"collect": ["--base-url"], "serve": ["--sandbox", "--expose", "--public-url"]},
        ),
        (
            ["train", "--sandbox", "e2b"],
            {"train": ["--server-url", "--llm-url"], "serve": ["--sandbox", "--expose", "--public-url"]},
        ),
        (["collect", "--provider", "openai"], {"collect": ["--provider", "--llm-url", "--model"]}),
        (["train", "--set", "no-equals-sign"], {"train": ["--set"]}),
    ],
)
def test_each_hint_names_flags_its_command_has(tmp_path, args, named):
    result = runner.invoke(app, [*args, "--output-dir", str(tmp_path / "out")])
    assert result.exit_code in (1, 2), result.output
    assert "Traceback" not in result.output
    text = " ".join(result.output.replace("│", " ").split())  # typer's box, unwrapped
    known = help_flags("")  # --debug and the registry flags work with every command
    for command, flags in named.items():
        has = help_flags(command)
        known |= has
        for flag in flags:
            assert flag in text, f"the hint should name {flag}: {text}"
            assert flag in has, f"harbor {command} has no {flag}"
    # No flag in the message that none of the commands it names has.
    assert set(FLAG.findall(text)) <= known, text


def test_version_flag_and_attribute():
    import harbor_rl

    assert harbor_rl.__version__ == version("harbor-rl")
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output == f"harbor-rl {version('harbor-rl')}\n"
    assert "--version" in help_flags("")
    # As a user runs it: a real process, eager, before any command is asked for.
    done = subprocess.run(
        [sys.executable, "-m", "harbor_rl", "--version", "train"], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout) == (0, f"harbor-rl {harbor_rl.__version__}\n"), done.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train", "--bogus"], "harbor train: No such option: --bogus; see harbor train --help"),
        (["bogus"], "harbor: No such command 'bogus'; see harbor --help"),
        (
            ["tasks", "check", "--bogus"],
            "harbor tasks check: No such option: --bogus; see harbor tasks check --help",
        ),
        (["eval", "--registry-path"], "harbor eval: --registry-path needs a value; see harbor eval --help"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_command_and_its_help(args, expected):
    """Typer's framed error box (a dozen lines at 80 columns) becomes one line, exit 2, no traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "harbor_rl", *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and done.stderr.splitlines() == [expected]
