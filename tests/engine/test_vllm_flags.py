"""`harbor engine` takes `vllm serve`'s command line: what the embedded engine cannot honour is one line.
The guide's own line (TRL's OpenEnv guide, the Harbor black-box path) serving here is a seed test:
tests/seeds/test_harbor_guide.py."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from harbor_rl.cli import app


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--logprobs-mode", "raw_logprobs"], "--logprobs-mode raw_logprobs: the embedded engine reports processed_logprobs only"),
        (["--logprobs-mode", "nope"], "--logprobs-mode 'nope': expected one of raw_logprobs"),
        (["--tool-call-parser", "mistral"], "--tool-call-parser mistral: the embedded engine parses hermes tool calls only"),
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size 2: the embedded engine runs on one device"),
        (["--weight-transfer-config", '{"backend":"ipc"}'], "backend 'ipc': the embedded engine receives over gloo"),
        (["--weight-transfer-config", "nccl"], "--weight-transfer-config is not JSON"),
        (["--dtype", "int8"], "--dtype 'int8': expected one of auto, float32"),
        (["--enforce-eager"], "--enforce-eager: not an option of harbor engine"),
        (["other-model"], "the model is given twice: 'other-model' and --model"),
    ],
)  # fmt: skip
def test_what_the_embedded_engine_cannot_honour_is_one_line(args, words) -> None:
    extra = ["--model", "tiny2"] if args == ["other-model"] else []
    result = CliRunner(env={"COLUMNS": "250", "NO_COLOR": "1"}).invoke(app, ["engine", *args, *extra])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("harbor engine: ") and words in lines[0], result.output
