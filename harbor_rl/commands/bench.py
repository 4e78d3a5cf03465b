"""`harbor bench`: the benchmark suite (`python -m bench`), same flags, same BENCHMARKS.md.

The benchmarks live in the source checkout's `bench/` folder, beside `harbor_rl/`, not in the installed
package: this command finds that folder and runs the suite there in a child process (each benchmark
then runs in its own process, as `python -m bench` does).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import typer

import harbor_rl

CHECKOUT = Path(harbor_rl.__file__).resolve().parents[1]


def suite_command(
    quick: bool, only: list[str], with_peers: bool, output: Path | None, list_: bool, merge: bool = False
) -> list[str]:
    """The `python -m bench` command line for these options (a relative --output taken from here)."""
    cmd = [sys.executable, "-m", "bench"]
    cmd += ["--quick"] if quick else []
    for name in only:
        cmd += ["--only", name]
    cmd += ["--with-peers"] if with_peers else []
    cmd += ["--output", str(output.resolve())] if output is not None else []
    cmd += ["--merge"] if merge else []
    cmd += ["--list"] if list_ else []
    return cmd


def bench(
    quick: bool = typer.Option(False, "--quick", help="Each benchmark's small workload (what CI runs)."),
    only: list[str] = typer.Option([], "--only", metavar="NAME", help="Run only this benchmark. Repeatable."),
    with_peers: bool = typer.Option(
        False, "--with-peers", help="With --quick, include the benchmarks --quick leaves out (the peers)."
    ),
    output: Path | None = typer.Option(
        None, "--output", help="Where to write the report (default: BENCHMARKS.md in the checkout)."
    ),
    merge: bool = typer.Option(
        False, "--merge", help="Put only these benchmarks' sections into the existing report, the rest as it is."
    ),
    list_: bool = typer.Option(False, "--list", help="List the benchmarks and exit."),
) -> None:
    """Run the benchmark suite and write BENCHMARKS.md (the same as `python -m bench`)."""
    if not (CHECKOUT / "bench" / "__main__.py").is_file():
        typer.echo(
            f"harbor bench runs the suite in a source checkout, and {CHECKOUT / 'bench'} does not exist: "
            "clone the repository and `pip install -e .` there",
            err=True,
        )
        raise typer.Exit(2)
    cmd = suite_command(quick, only, with_peers, output, list_, merge)
    raise typer.Exit(subprocess.call(cmd, cwd=CHECKOUT))


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
