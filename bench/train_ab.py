"""`harbor train`'s wall time and gain: this tree against an earlier commit, runs interleaved on one machine.

    python bench/train_ab.py [--baseline REF|none] [--runs N] [--seeds S ...] [--quick] [-- TRAIN ARGS...]

Each run is the whole command (`python -m harbor_rl train ARGS`, imports and exit included), timed from
outside. The baseline runs from a git worktree of REF (default: the commit before issue 35's speed work),
so both sides use this machine's installed packages and its caches; a pair's order alternates, so a
machine that slows down over time falls on both sides alike. Reported per run: wall seconds, the
evaluation before and after GRPO and whether the gain exceeds 2 standard errors (what `harbor train`
prints); then the ratio of the mean wall times and each pair's ratio. `--baseline none` times this tree
alone (e.g. the coding path over seeds: `--baseline none --seeds 1 2 3 4 5 -- --harness mini-swe-agent`).
`--quick` is a smoke run for CI: one run of a few steps of this tree alone (a ratio needs full runs).

Each run's CPU time is also split by part (bench/_cpu.py's CPUByPart over the run's process tree):
the trainer (the `harbor train` process: warm-up, GRPO, evaluation bookkeeping), the engine, the server
(with its capture proxy), the agents (every process of an installed harness under /opt/harbor-rl, with
the commands it runs), the verifiers (a task's /tests and what they start) and the rest (sandbox
set-up: bubblewrap, socat, shells). Local sandboxes only: a container's processes are not in the tree.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench._cpu import CPUByPart  # noqa: E402

BASELINE = "cbea7b4"
"""main before issue 35's work on `harbor train`'s speed (2026-12-05)."""
QUICK_ARGS = ["--set", "max_steps=2", "--set", "eval_episodes=8", "--set", "base_eval_episodes=4",
              "--set", "sft_steps=4", "--set", "demo_episodes=4"]  # fmt: skip
GAIN = re.compile(r"GRPO gain ([+-][\d.]+) ± ([\d.]+) s\.e\.; exceeds 2 s\.e\. \(([\d.]+)\)\? (yes|no)")
EVAL_ROW = re.compile(
    r"│\s+(after SFT|before GRPO|after GRPO)\s+│\s+(\d+)\s+│\s+(\d+)\s+│\s+([\d.]+)\s+│\s+([\d.]+)\s+│"
)

console = Console(width=150)


@dataclass
class Run:
    side: str
    index: int
    seconds: float
    exit_code: int
    before: str = "-"
    after: str = "-"
    gain: str = "-"
    significant: str = "-"
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds by part (PARTS), sampled."""


PARTS = ("trainer", "engine", "server", "agents", "verifiers", "sandboxes, other")


def part_of(root: int):
    """CPUByPart classifier for a `harbor train` tree rooted at `root`."""

    def classify(pid: int, cmdline: str, parent: str | None) -> str:
        if pid == root:
            return "trainer"
        if parent in ("agents", "verifiers"):
            return parent
        if "/opt/harbor-rl/" in cmdline:  # every installed harness lives there (harnesses/)
            return "agents"
        if "/tests/" in cmdline:
            return "verifiers"
        if "harbor_rl engine" in cmdline:
            return "engine"
        if "harbor_rl serve" in cmdline:
            return "server"
        return "sandboxes, other"

    return classify


@contextlib.contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """A detached worktree of `ref`, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="harbor-train-ab-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), ref],
                   check=True, capture_output=True)  # fmt: skip
    try:
        yield folder
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)], capture_output=True
        )
        shutil.rmtree(folder, ignore_errors=True)


def run_once(side: str, index: int, tree: Path, args: list[str], scratch: Path) -> Run:
    """`harbor train ARGS` from `tree` (its own packages first on the path, as `python -m` puts the
    working folder there), output in a folder of its own."""
    out = scratch / f"{side}-{index}"
    command = [sys.executable, "-m", "harbor_rl", "train", *args, "--output-dir", str(out)]
    started = time.monotonic()
    log = scratch / f"{side}-{index}.log".replace(" ", "-")
    with log.open("w+") as output:
        proc = subprocess.Popen(command, cwd=tree, stdout=output, stderr=subprocess.STDOUT, text=True)
        with CPUByPart(proc.pid, part_of(proc.pid)) as sampler:
            code = proc.wait()
        output.seek(0)
        text = output.read()
    run = Run(side, index, time.monotonic() - started, code)
    run.cpu_s = sampler.parts()
    rows = {m.group(1): f"{m.group(4)} ± {m.group(5)}" for m in EVAL_ROW.finditer(text)}
    run.before = rows.get("after SFT") or rows.get("before GRPO") or "-"
    run.after = rows.get("after GRPO", "-")
    if found := GAIN.search(text):
        run.gain, run.significant = f"{found.group(1)} ± {found.group(2)}", found.group(4)
    console.log(
        f"{side} {index}: {run.seconds:.1f} s, exit {run.exit_code}, gain {run.gain} ({run.significant})"
    )
    if code != 0:
        console.print(text[-2000:])
    return run


def report(runs: list[Run], ref: str | None, args: list[str]) -> None:
    table = Table(title=f"harbor train {' '.join(args)}: wall time and gain, one run a row")
    for col in ("side", "run", "wall s", "before GRPO", "after GRPO", "gain", "> 2 s.e."):
        table.add_column(col, justify="right")
    for run in runs:
        table.add_row(run.side, str(run.index), f"{run.seconds:.1f}", run.before, run.after, run.gain,
                      run.significant)  # fmt: skip
    console.print(table)
    console.print(cpu_table(runs))
    this = [r.seconds for r in runs if r.side == "this tree"]
    base = [r.seconds for r in runs if r.side != "this tree"]
    significant = sum(r.significant == "yes" for r in runs if r.side == "this tree")
    console.print(f"- this tree: {statistics.fmean(this):.1f} s mean over {len(this)} runs; gain above 2 s.e. "
                  f"in {significant} of {len(this)}")  # fmt: skip
    if base:
        pairs = [b / a for a, b in zip(base, this, strict=False)]
        console.print(f"- {ref}: {statistics.fmean(base):.1f} s mean; this tree / {ref}: "
                      f"{statistics.fmean(this) / statistics.fmean(base):.2f}x (pairs {min(pairs):.2f}x to {max(pairs):.2f}x)")  # fmt: skip


def cpu_table(runs: list[Run]) -> Table:
    table = Table(title="Where the CPU went: seconds by part (sampled every 0.25 s; the share of the run's)")
    for col in ("side", "run", *PARTS, "CPU s", "cores busy"):
        table.add_column(col, justify="right")
    for run in runs:
        sampled = sum(run.cpu_s.values())
        cells = [f"{run.cpu_s.get(p, 0.0):.0f} ({run.cpu_s.get(p, 0.0) / sampled:.0%})" if sampled else "-"
                 for p in PARTS]  # fmt: skip
        table.add_row(run.side, str(run.index), *cells, f"{sampled:.0f}", f"{sampled / run.seconds:.2f}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline", default=BASELINE, help=f"git ref to compare with, or none (default {BASELINE})"
    )
    parser.add_argument("--runs", type=int, default=5, help="runs of each side (default 5)")
    parser.add_argument("--seeds", type=int, nargs="*", default=None, help="one seed per run (--set seed=S)")
    parser.add_argument("--quick", action="store_true", help="one run of a few steps, this tree alone")
    parser.add_argument("train_args", nargs="*", help="arguments for harbor train (after --)")
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    train_args = [*args.train_args, *(QUICK_ARGS if args.quick else [])]
    if args.seeds is not None and len(args.seeds) != runs:
        parser.error(f"--seeds needs one seed per run ({runs})")
    ref = None if args.baseline == "none" or args.quick else args.baseline
    with (
        tempfile.TemporaryDirectory(prefix="harbor-train-ab-runs-") as scratch,
        contextlib.ExitStack() as stack,
    ):
        base_tree = stack.enter_context(checkout(ref)) if ref else None
        results: list[Run] = []
        for i in range(runs):
            seeded = [*train_args, "--set", f"seed={args.seeds[i]}"] if args.seeds else train_args
            sides = [("this tree", ROOT)] + ([(ref, base_tree)] if base_tree else [])
            for side, tree in sides if i % 2 else reversed(sides):
                results.append(run_once(side, i + 1, tree, seeded, Path(scratch)))
    report(results, ref, train_args)
    if any(r.exit_code != 0 for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
