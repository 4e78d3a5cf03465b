"""Load one task folder in Harbor's layout into a typed, validated `Task`.

    instruction.md          what the agent is asked to do (required, non-empty)
    task.toml               typed config, see `tasks.models` (required)
    environment/Dockerfile  the sandbox image (required unless [environment] docker_image is set)
    tests/test.sh           the verifier entry point (required) + its test files
    solution/solve.sh       the oracle (optional)

Every problem becomes a `TaskFormatError` naming the file, the key and what is wrong. Paths may not
escape the task folder: a symlink that points outside it, or a Dockerfile `COPY`/`ADD` whose source
leaves `environment/`, is refused, because the folder is what gets hashed, copied and shipped.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import ValidationError

from sandboxes.base import SandboxSpec
from tasks.errors import TaskFormatError
from tasks.models import TaskConfig

TASK_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
"""What a task id looks like: a folder name, a row's `task_id`, a registry task's name."""
# Slack on top of the agent and verifier timeouts for setup, uploads and teardown.
_SANDBOX_SLACK_S = 300.0


@dataclass(frozen=True)
class TaskPaths:
    root: Path
    instruction: Path
    config: Path
    environment_dir: Path
    dockerfile: Path
    tests_dir: Path
    test_script: Path
    solution_dir: Path
    solve_script: Path

    @classmethod
    def of(cls, root: Path) -> TaskPaths:
        return cls(
            root=root,
            instruction=root / "instruction.md",
            config=root / "task.toml",
            environment_dir=root / "environment",
            dockerfile=root / "environment" / "Dockerfile",
            tests_dir=root / "tests",
            test_script=root / "tests" / "test.sh",
            solution_dir=root / "solution",
            solve_script=root / "solution" / "solve.sh",
        )

    @property
    def has_solution(self) -> bool:
        return self.solve_script.is_file()


@dataclass(frozen=True)
class Task:
    """A validated task. `id` is stable: the folder name, or the id its dataset row gives."""

    id: str
    name: str
    paths: TaskPaths
    instruction: str
    config: TaskConfig

    def with_id(self, task_id: str) -> Task:
        return replace(self, id=task_id)

    def with_reward_key(self, reward_key: str) -> Task:
        """This task scored by another key of its reward.json (a rollout's own choice of signal)."""
        verifier = self.config.verifier.model_copy(update={"reward_key": reward_key})
        return replace(self, config=self.config.model_copy(update={"verifier": verifier}))

    def sandbox_spec(self, name: str, proxy_port: int | None = None) -> SandboxSpec:
        """What a backend needs to start this task's sandbox for the rollout called `name`."""
        env = self.config.environment
        uses_image = env.docker_image is not None
        return SandboxSpec(
            name=name,
            environment_dir=None if uses_image else self.paths.environment_dir,
            docker_image=env.docker_image,
            workdir=env.workdir,
            cpus=env.cpus,
            memory_mb=env.memory_mb,
            storage_mb=env.storage_mb,
            pids_limit=env.pids_limit,
            network_mode=env.network_mode,
            allowed_hosts=list(env.allowed_hosts),
            proxy_port=proxy_port,
            env=dict(env.env),
            build_timeout_s=env.build_timeout_sec,
            timeout_s=self.config.agent.timeout_sec + self.config.verifier.timeout_sec + _SANDBOX_SLACK_S,
        )

    def digest(self) -> str:
        """sha256 over every file's relative path and bytes: changes exactly when the task does."""
        sha = hashlib.sha256()
        for file in sorted(p for p in self.paths.root.rglob("*") if p.is_file()):
            rel = file.relative_to(self.paths.root).as_posix()
            if "__pycache__" in rel:
                continue
            sha.update(rel.encode() + b"\0" + file.read_bytes() + b"\0")
        return sha.hexdigest()


def load_task(path: str | Path, task_id: str | None = None) -> Task:
    """Read and validate the task folder at `path`; raises TaskFormatError naming what is wrong."""
    root = Path(path).absolute()
    if not root.is_dir():
        raise TaskFormatError(root, "is not a task folder (expected a directory with task.toml)")
    paths = TaskPaths.of(root)
    _check_no_escaping_links(root)
    config = _read_config(paths.config)
    instruction = _read_instruction(paths.instruction)
    if not paths.test_script.is_file():
        raise TaskFormatError(paths.test_script, "missing: every task needs tests/test.sh (the verifier)")
    if config.environment.docker_image is None:
        if not paths.dockerfile.is_file():
            raise TaskFormatError(
                paths.dockerfile, "missing: add environment/Dockerfile or set docker_image", "environment"
            )
        check_dockerfile(paths.dockerfile, paths.environment_dir)
    return Task(
        id=task_id or root.name,
        name=config.task.name or root.name,
        paths=paths,
        instruction=instruction,
        config=config,
    )


def _read_config(file: Path) -> TaskConfig:
    if not file.is_file():
        raise TaskFormatError(file, "missing: every task needs a task.toml")
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise TaskFormatError(file, f"not UTF-8 text ({exc.reason})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise TaskFormatError(file, f"invalid TOML: {exc}") from exc
    try:
        return TaskConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or None
        problem = _plain_problem(first)
        if exc.error_count() > 1:
            problem += f"; and {exc.error_count() - 1} more problem(s)"
        raise TaskFormatError(file, problem, key, shown_key=toml_key(first["loc"])) from exc


_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "string_type": "a string",
    "bool_type": "true or false", "bool_parsing": "true or false", "list_type": "a list",
    "dict_type": "a table (dictionary)", "model_type": "a table (dictionary)",
}  # fmt: skip
"""pydantic's type errors in a task author's words."""


def _plain_problem(error: dict) -> str:
    """`expected an integer, got "lots"` for a wrong type; pydantic's own words for other problems."""
    expected = _EXPECTED.get(error.get("type", ""))
    value = error.get("input")
    shown = json.dumps(value) if isinstance(value, str | int | float | bool | list) else None
    if expected is not None:
        return f"expected {expected}" + (f", got {shown}" if shown is not None else "")
    problem = str(error["msg"]).removeprefix("Value error, ")
    if shown is not None and not isinstance(value, dict):
        problem += f" (got {shown})"
    return problem


def toml_key(loc: tuple) -> str | None:
    """A key as task.toml writes it: `[environment] memory_mb`, `[environment] env.PORT`, `schema_version`."""
    parts = [str(p) for p in loc]
    if not parts:
        return None
    if parts[0] in TaskConfig.model_fields and parts[0] not in ("schema_version",):
        return f"[{parts[0]}]" + (f" {'.'.join(parts[1:])}" if len(parts) > 1 else "")
    return ".".join(parts)


def _read_instruction(file: Path) -> str:
    if not file.is_file():
        raise TaskFormatError(file, "missing: every task needs instruction.md (what the agent is asked)")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskFormatError(file, f"not UTF-8 text ({exc.reason})") from exc
    if not text.strip():
        raise TaskFormatError(file, "is empty: the instruction must say what the agent should do")
    return text


def _check_no_escaping_links(root: Path) -> None:
    resolved_root = root.resolve()
    for item in root.rglob("*"):
        if item.is_symlink() and not item.resolve().is_relative_to(resolved_root):
            raise TaskFormatError(
                item, f"symlink points outside the task folder (to {item.resolve()}); copy the file in"
            )


def dockerfile_instructions(dockerfile: Path) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments) with continuations joined and comments dropped."""
    instructions: list[tuple[int, str, str]] = []
    pending, start = "", 0
    for number, line in enumerate(dockerfile.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        if full:
            word, _, args = full.partition(" ")
            instructions.append((start, word.upper(), args.strip()))
    if pending.strip():
        word, _, args = pending.strip().partition(" ")
        instructions.append((start, word.upper(), args.strip()))
    return instructions


def copy_sources(args: str) -> list[str] | None:
    """Sources of a COPY/ADD, or None when it copies from another build stage (`--from=`)."""
    try:
        parts = json.loads(args) if args.startswith("[") else shlex.split(args)
    except (json.JSONDecodeError, ValueError):
        parts = args.split()
    if any(p.startswith("--from") for p in parts):
        return None
    plain = [p for p in parts if not p.startswith("--")]
    return plain[:-1]


def check_dockerfile(dockerfile: Path, context: Path) -> None:
    """Refuse COPY/ADD sources that leave the build context (`environment/`) or do not exist."""
    context = context.resolve()
    for line, word, args in dockerfile_instructions(dockerfile):
        if word not in ("COPY", "ADD"):
            continue
        sources = copy_sources(args)
        if sources is None:
            continue
        if not sources:
            raise TaskFormatError(dockerfile, f"line {line}: {word} needs a source and a destination", word)
        for source in sources:
            if word == "ADD" and "://" in source:
                continue
            target = (context / source.lstrip("/")).resolve()
            if ".." in Path(source).parts or not target.is_relative_to(context):
                raise TaskFormatError(
                    dockerfile, f"line {line}: {word} source {source!r} escapes the build context", word
                )
            if not any(ch in source for ch in "*?[") and not target.exists():
                raise TaskFormatError(
                    dockerfile, f"line {line}: {word} source {source!r} does not exist in environment/", word
                )
