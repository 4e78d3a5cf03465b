"""What a seed may change of its guide's code, and how a seed runs.

A seed (`tests/seeds/<name>.py`) is a code block of a guide as it runs here; `guide/<name>.py` is the block
verbatim. `changes(guide, ours)` lists the lines that differ, and each must be allowed by a rule: a
function `(guide line, our line) -> bool` (None on the side that has no line). BASE_RULES hold for every
seed; a seed whose guide needs one more offline change passes its own rule, named for what it changes.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
Rule = Callable[[str | None, str | None], bool]

SHORT_SETTINGS = (
    r"\s*max_steps=\d+, num_generations=\d+, per_device_train_batch_size=\d+, max_completion_length=\d+,"
)
"""The one line a seed may add: a short run for CI."""


def import_line(guide: str | None, ours: str | None) -> bool:
    """`from trl import ...` becomes `from harbor_rl import ...`."""
    return bool(guide and guide.startswith("from trl import")) and ours == guide.replace(
        "trl", "harbor_rl", 1
    )


def hub_model(guide: str | None, ours: str | None) -> bool:
    """The Hub model becomes the offline tiny one."""
    return bool(guide and re.fullmatch(r'\s*model="[^"]+",', guide)) and ours == re.sub(
        r'"[^"]+"', '"tiny"', guide
    )


def fewer_rows(guide: str | None, ours: str | None) -> bool:
    """Fewer dataset rows (`[...] * N`)."""
    size = r"\] \* \d+\}?\)?"
    return bool(guide and ours and re.search(size, guide)) and re.sub(size, "", guide) == re.sub(
        size, "", ours
    )


def short_settings(guide: str | None, ours: str | None) -> bool:
    return guide is None and ours is not None and re.fullmatch(SHORT_SETTINGS, ours) is not None


BASE_RULES: tuple[Rule, ...] = (import_line, hub_model, fewer_rows, short_settings)


ELISION = re.compile(r'\s*(\.\.\.|""".* \.\.\.""")')
"""A line where the guide leaves code out: a `...` body, or a docstring cut short with `...`."""


def changes(guide: str, ours: str, fill_elisions: bool = False) -> list[tuple[str | None, str | None]]:
    """(guide line, our line) for each line that differs (None on the side that has none). With
    `fill_elisions`, lines that replace a run of the guide's elided lines (ELISION) are not changes: a
    seed may fill what the guide leaves out, but keeps every line the guide writes."""
    out: list[tuple[str | None, str | None]] = []
    matcher = difflib.SequenceMatcher(a=guide.splitlines(), b=ours.splitlines(), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        a, b = matcher.a[i1:i2], matcher.b[j1:j2]
        if fill_elisions and a and all(ELISION.fullmatch(line) for line in a):
            continue
        out += [
            (a[k] if k < len(a) else None, b[k] if k < len(b) else None) for k in range(max(len(a), len(b)))
        ]
    return out


def allowed(guide_line: str | None, our_line: str | None, extra: Sequence[Rule] = ()) -> bool:
    return any(rule(guide_line, our_line) for rule in (*BASE_RULES, *extra))


def refused_changes(
    name: str, extra: Sequence[Rule] = (), fill_elisions: bool = False
) -> list[tuple[str | None, str | None]]:
    """The changes of seed `name` from its guide block that no rule allows (empty: the seed is faithful),
    and a `(None, "preamble binds X")` for each name its preamble defines that the block does not use."""
    guide = (HERE / "guide" / f"{name}.py").read_text()
    preamble, ours = split_seed((HERE / f"{name}.py").read_text())
    differing = changes(guide, ours, fill_elisions=fill_elisions)
    refused = [pair for pair in differing if not allowed(*pair, extra=extra)]
    strays = preamble_strays(preamble, ours) if preamble else set()
    return refused + [(None, f"preamble binds {name}") for name in sorted(strays)]


def run_seed(name: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run seed `name` as a user would (`python <name>.py` in `cwd`), the offline stand-ins importable."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE / "offline")]), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, str(HERE / f"{name}.py")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


BLOCK_MARKER = "# -- the guide's block --"
"""In a seed whose block uses names the guide defines elsewhere (`vllm_url`, `dataset`, `my_reward`), the
lines above this marker define them; the block is what follows it."""


def split_seed(text: str) -> tuple[str, str]:
    """(preamble, block) of a seed's text; the preamble is empty when the seed has no marker."""
    head, marker, block = text.partition(BLOCK_MARKER + "\n")
    return (head, block) if marker else ("", text)


def free_names(block: str) -> set[str]:
    """Module-level names `block` reads but neither binds nor gets from builtins."""
    import ast
    import builtins
    import symtable

    table = symtable.symtable(block, "<guide block>", "exec")
    read: set[str] = set()
    for node in ast.walk(ast.parse(block)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            read.add(node.id)
    bound = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    return {n for n in read - bound if not hasattr(builtins, n)}


def preamble_strays(preamble: str, block: str) -> set[str]:
    """Names the preamble binds (imports and its own `_private` helpers aside) that the block does not need:
    empty when the preamble only gives the block what the guide defines elsewhere."""
    import ast

    bound: set[str] = set()
    for node in ast.parse(preamble).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return {n for n in bound - free_names(block) if not n.startswith("_")}


def seed_functions(name: str) -> dict[str, Any]:
    """The functions seed `name`'s block defines, without running the rest of it (a training, say)."""
    import ast

    _, block = split_seed((HERE / f"{name}.py").read_text())
    tree = ast.parse(block)
    tree.body = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    namespace: dict[str, Any] = {}
    exec(compile(tree, f"{name}.py", "exec"), namespace)
    return namespace


def wait_for(url: str, process: subprocess.Popen, timeout_s: float, log: Path | None = None) -> None:
    """Until `url` answers 200; fails when `process` exits first (with `log`'s tail) or time runs out."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process.poll() is not None:
            tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
            raise AssertionError(
                f"{' '.join(map(str, process.args))} exited with {process.returncode}\n{tail}"
            )
        assert time.monotonic() < deadline, f"{url} did not answer in {timeout_s:.0f} s"
        time.sleep(0.3)


@contextlib.contextmanager
def running(
    argv: list[str], env: dict[str, str], log: Path, health: str, cwd: Path | None = None
) -> Iterator[subprocess.Popen]:
    """A guide's command as a subprocess (its output in `log`) until it answers `health`; stopped with
    SIGINT (Ctrl-C, as a user stops it), then waited for: it must stop within 60 s."""
    with log.open("w") as out:
        process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(health, process, timeout_s=120, log=log)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise AssertionError(f"{argv[:3]} did not stop on SIGINT within 60 s") from None
