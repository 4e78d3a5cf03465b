"""One source of truth for task.toml's defaults: the pydantic models in tasks/models.py. The table in
tasks/README.md and the `harbor tasks init` template must state the same values."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tasks import TaskFormatError, load_task
from tasks.loader import RUN_DEFAULTS
from tasks.models import TaskConfig

TASKS_DIR = Path(__file__).resolve().parents[2] / "tasks"
SECTIONS = ("verifier", "agent", "environment", "solution")


def model_default(section: str, key: str):
    field = TaskConfig.model_fields[section].annotation.model_fields[key]
    return field.get_default(call_default_factory=True)


def _same(documented: str, default) -> bool:
    """A README cell (`600`, `2048`, `/app`, `` `no-network` ``, `{}`, `none`) against the model's default."""
    text = documented.strip().strip("`").strip('"')
    if default is None:
        return text == "none"
    if isinstance(default, dict | list):
        return text == ("{}" if isinstance(default, dict) else "[]") and not default
    if isinstance(default, int | float) and not isinstance(default, bool):
        return float(text) == float(default)
    return text == str(default)


def readme_rows() -> list[tuple[str, list[str], list[str]]]:
    """(section, keys, defaults) of each `[section] key, key | default, default |` row of the table."""
    rows = []
    for line in (TASKS_DIR / "README.md").read_text().splitlines():
        match = re.match(r"^\| `\[(\w+)\] ([^`]+)`(?:, `([^`]+)`)*[^|]* \| ([^|]+) \|", line)
        if not match or match.group(1) not in SECTIONS:
            continue
        keys = re.findall(r"`(?:\[\w+\] )?([a-z_]+)`", line.split("|")[1])
        values = [v.strip() for v in match.group(4).split(",")]
        rows.append((match.group(1), keys, values))
    return rows


def test_the_readme_table_states_the_models_defaults():
    rows = readme_rows()
    checked = set()
    for section, keys, values in rows:
        if len(values) != len(keys):  # e.g. `name`, `description` | folder name
            values = values * len(keys) if len(values) == 1 else values
        for key, value in zip(keys, values, strict=True):
            assert _same(value, model_default(section, key)), (
                f"tasks/README.md says [{section}] {key} defaults to {value}; "
                f"tasks/models.py says {model_default(section, key)!r}"
            )
            checked.add((section, key))
    # The limits a task author most often needs are all in the table.
    for needed in [("verifier", "timeout_sec"), ("agent", "timeout_sec"), ("environment", "build_timeout_sec"),
                   ("environment", "memory_mb"), ("environment", "storage_mb"), ("environment", "cpus"),
                   ("environment", "pids_limit")]:  # fmt: skip
        assert needed in checked, f"tasks/README.md does not list [{needed[0]}] {needed[1]}"


def test_the_readme_table_states_what_a_run_uses_when_harbor_leaves_it_unset():
    stated = {}
    for line in (TASKS_DIR / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        match = re.match(r"^`\[(\w+)\] ", cells[0]) if len(cells) == 4 else None
        if match and cells[2] and "," in cells[1] + cells[2] or (match and cells[2][:1].isdigit()):
            keys = re.findall(r"`(?:\[\w+\] )?([a-z_]+)`", cells[0])
            for key, value in zip(keys, [v.strip() for v in cells[2].split(",")], strict=False):
                stated[(match.group(1), key)] = value
    for (section, key), value in RUN_DEFAULTS.items():
        assert (section, key) in stated, f"tasks/README.md does not say what a run uses for [{section}] {key}"
        assert float(stated[(section, key)]) == float(value), (section, key, stated[(section, key)], value)


def test_the_template_shows_the_models_defaults():
    raw = tomllib.loads((TASKS_DIR / "template" / "task.toml").read_text())
    shown = [(section, key, value) for section in SECTIONS for key, value in raw.get(section, {}).items()]
    assert len(shown) >= 8
    for section, key, value in shown:
        # Harbor's default, or what a run uses where Harbor leaves the value unset.
        default = model_default(section, key)
        expected = RUN_DEFAULTS.get((section, key), default) if default is None else default
        if key == "workdir":
            expected = "/app"  # the template's Dockerfile says WORKDIR /app
        assert value == expected, (
            f"tasks/template/task.toml shows [{section}] {key} = {value!r}, but the default is {expected!r}"
        )
    assert "Harbor's defaults" in (TASKS_DIR / "template" / "task.toml").read_text()


def test_a_wrong_type_names_the_file_and_the_key(make_task):
    root = make_task(files={"task.toml": '[environment]\nmemory_mb = "lots"\n'})
    with pytest.raises(TaskFormatError) as info:
        load_task(root)
    assert (
        str(info.value) == f'{root / "task.toml"}: [environment] memory_mb: expected an integer, got "lots"'
    )
    assert info.value.key == "environment.memory_mb"
