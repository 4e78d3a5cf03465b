"""Run the benchmark suite and write BENCHMARKS.md.

    python -m bench [--quick] [--only NAME]... [--output BENCHMARKS.md] [--merge] [--list]

Each benchmark runs in its own process (through `bench._capture`, which records its rich tables),
one after the other so they do not disturb each other; single-threaded ones are pinned to one core
(see `Benchmark.core`), the proxy benchmarks pin their own servers. A benchmark that fails or runs
past its time limit is reported in its section; the others still run. The report holds the date,
the machine, package versions, the exact command and every table each benchmark printed (ratios
against its baseline measured in the same run), with PNG plots under `<output folder>/bench/plots/`.
`--quick` leaves out benchmarks marked `in_quick=False` (the peers, which install venvs) unless named
with `--only` or asked for with `--with-peers`. `--merge` writes only the benchmarks run into an
existing report, each in place of its own section, so one benchmark's new run does not rewrite the rest.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import ROOT, Benchmark, BenchResult, Plot, discover, has_gpu

PACKAGES = ("harbor-rl", "torch", "transformers", "fastapi", "starlette", "uvicorn", "httpx", "pydantic",
            "sqlalchemy", "psycopg", "orjson", "numpy", "openai", "rich", "matplotlib")  # fmt: skip


# -- where and with what it ran -------------------------------------------------------------------


def machine() -> dict[str, str]:
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M)
        cpu = found.group(1).strip() if found else cpu
    mem = "unknown"
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        found = re.search(r"^MemTotal:\s*(\d+) kB", meminfo.read_text(), re.M)
        mem = f"{int(found.group(1)) / 2**20:.1f} GiB" if found else mem
    load = os.getloadavg()
    return {
        "CPU": cpu,
        "cores": f"{os.cpu_count()} ({len(os.sched_getaffinity(0))} usable by this run)",
        "memory": mem,
        "OS": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "Python": platform.python_version(),
        "load average at start": f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1 / 5 / 15 min)",
    }


def versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


# -- running one benchmark ------------------------------------------------------------------------


def _pin_last_core() -> None:
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})


def run_one(bench: Benchmark, quick: bool, scratch: Path) -> BenchResult:
    cpu_only = bench.needs_gpu and not quick and not has_gpu()
    args = ["--quick"] if quick or cpu_only else []
    out = scratch / f"{bench.name}.json"
    cmd = [sys.executable, "-m", "bench._capture", str(out), str(bench.script), *args]
    shown = f"python bench/{bench.name}.py {' '.join(args)}".strip()
    pin = bench.core == "one" and len(os.sched_getaffinity(0)) > 1
    timeout = bench.timeout_s[0 if quick else 1]
    print(f"\n=== {bench.name}: {shown}{' (pinned to one core)' if pin else ''}", flush=True)
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    }
    t0 = time.monotonic()
    # A session of its own, so a timeout ends the servers it started along with it.
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, start_new_session=True, preexec_fn=_pin_last_core if pin else None
    )
    try:
        code: int | None = proc.wait(timeout=timeout)
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        raise
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        code = None
    result = BenchResult(bench.name, shown, time.monotonic() - t0, code)
    if cpu_only:
        result.notes.append(
            "no GPU on this machine: its --quick CPU sanity check ran instead of the full run"
        )
    if out.exists():
        record = json.loads(out.read_text())
        result.tables, result.error = record["tables"], record["error"]
        result.notes.extend(record["notes"])
    if code is None:
        result.error = f"cut at its {timeout} s time limit"
    elif code != 0 and not result.error:
        result.error = f"exited with status {code}" + ("" if result.tables else " before printing a table")
    return result


STYLES = ("-", "--", ":", "-.")

# -- plots ----------------------------------------------------------------------------------------


def _number(cell: str) -> float | None:
    found = re.search(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", cell.replace(",", ""))
    return float(found.group()) if found else None


def draw(plot: Plot, result: BenchResult, folder: Path) -> Path | None:
    """Draw one plot from the result's tables; None when its table or columns are not there."""
    table = next((t for t in result.tables if plot.table in t["title"]), None)
    if table is None:
        return None
    cols = table["columns"]
    needed = [plot.x, *plot.ys, *plot.group, *plot.panels]
    if any(c not in cols for c in needed):
        return None
    at = {c: cols.index(c) for c in needed}
    panels: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for row in table["rows"]:
        x = _number(row[at[plot.x]])
        if x is None:
            continue
        panel = ", ".join(f"{c}: {row[at[c]]}" for c in plot.panels)
        group = " ".join(row[at[c]] for c in plot.group)
        for y_col in plot.ys:
            y = _number(row[at[y_col]])
            if y is None or (plot.logy and y <= 0):
                continue
            panels.setdefault(panel, {}).setdefault((group, y_col), []).append((x, y))
    if not panels:
        return None

    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.4), squeeze=False, sharey=True)
    for ax, (panel, lines) in zip(axes[0], sorted(panels.items()), strict=True):
        groups = sorted({g for g, _ in lines}, key=lambda g: [k for k, _ in lines].index(g))
        for (group, y_col), points in lines.items():
            xs, ys = zip(*sorted(points), strict=True)
            # one colour per group (target), one line style per column (p50 solid, p99 dashed)
            style = STYLES[plot.ys.index(y_col) % len(STYLES)] if group else "-"
            colour = f"C{groups.index(group) if group else plot.ys.index(y_col)}"
            label = f"{group} {y_col}" if group and len(plot.ys) > 1 else (group or y_col)
            ax.plot(xs, ys, marker="o", linestyle=style, color=colour, label=label)
        ax.set_xlabel(plot.x)
        ax.set_title(panel or plot.title, fontsize=10)
        if plot.logx:
            ax.set_xscale("log", base=2)
            ticks = sorted({x for points in lines.values() for x, _ in points})
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        if plot.logy:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel(plot.ylabel)
    if any(panels):  # named panels carry their own titles; the plot's goes above them
        fig.suptitle(plot.title)
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / plot.filename
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- the report -----------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip() or " "


def markdown_table(table: dict) -> str:
    right = [
        all(_number(r[i]) is not None or not r[i].strip() for r in table["rows"])
        for i in range(len(table["columns"]))
    ]
    lines = [
        "| " + " | ".join(_cell(c) for c in table["columns"]) + " |",
        "|" + "|".join("---:" if r else "---" for r in right) + "|",
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table["rows"]]
    return "\n".join(lines)


def status(result: BenchResult) -> str:
    if result.exit_code is None:
        return "timed out"
    if result.exit_code == 0:
        return "ok"
    return "targets missed" if result.tables else "failed"


def render(results: list[BenchResult], benches: dict[str, Benchmark], command: str, quick: bool,
           started: dt.datetime, info: dict[str, str], pkgs: dict[str, str]) -> str:  # fmt: skip
    out = [
        "# Benchmarks",
        "",
        f"Generated by `{command}` on {started:%Y-%m-%d %H:%M} UTC"
        + (
            " (**quick mode**: small workloads that check the benchmarks run; numbers are indicative only)."
            if quick
            else "."
        ),
        "Absolute times on a shared machine are noise; each table's ratios compare against a baseline measured "
        "in the same run, on the same machine, minutes apart at most. Each benchmark also runs alone as "
        "`python bench/<name>.py [--quick]`; the peers live in venvs of their own (see bench/peers.py).",
        "",
        "## Machine",
        "",
        *(f"- {k}: {v}" for k, v in info.items()),
        "",
        "## Versions",
        "",
        ", ".join(f"{k} {v}" for k, v in pkgs.items()) + ".",
        "",
        "## Summary",
        "",
        "| benchmark | what it measures | status | seconds |",
        "|---|---|---|---:|",
    ]
    for r in results:
        summary = benches[r.name].summary
        out.append(f"| [{r.name}](#{r.name}) | {_cell(summary)} | {status(r)} | {r.seconds:.0f} |")
    out.append(f"| total | | | {sum(r.seconds for r in results):.0f} |")
    for r in results:
        out += ["", *section(r, benches[r.name])]
    return "\n".join(out).rstrip() + "\n"


def section(r: BenchResult, bench: Benchmark, ran: str = "") -> list[str]:
    """One benchmark's `## NAME` section; `ran` says when and how, for a section merged into a report
    of another run."""
    out = [f"## {r.name}", "", f"`{r.command}` ({status(r)}, {r.seconds:.0f} s). {ran}{bench.summary}", ""]
    if r.error:
        out += [f"> {_cell(r.error)}", ""]
    for table in r.tables:
        if table["title"]:
            out += [f"**{_cell(table['title'])}**", ""]
        out += [markdown_table(table), ""]
    if r.notes:
        out += [*(f"- {_cell(n)}" for n in r.notes if n.strip()), ""]
    for path, caption in r.plots:
        out += [f"![{caption}]({path})", ""]
    return out


def merge(report: str, results: list[BenchResult], benches: dict[str, Benchmark], command: str,
          started: dt.datetime, info: dict[str, str]) -> str:  # fmt: skip
    """`report` with each result's generated section replaced, from its `## NAME` heading to the next
    `##` or `###` heading (so the hand-written `### ...` notes under it stay), or added at the end.
    The report's header, summary and other sections describe another run and are left as they are."""
    ran = (f"Run apart from the suite above, as `{command}` on {started:%Y-%m-%d %H:%M} UTC, same machine, "
           f"load average at start {info['load average at start']}. ")  # fmt: skip
    for r in results:
        new = "\n".join(section(r, benches[r.name], ran)).rstrip() + "\n\n"
        found = re.search(rf"^## {re.escape(r.name)}\n.*?(?=^##+ |\Z)", report, re.M | re.S)
        if found:
            report = report[: found.start()] + new + report[found.end() :]
        else:
            report = report.rstrip() + "\n\n" + new
    return report.rstrip() + "\n"


def main() -> None:
    benches = {b.name: b for b in discover()}
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's small workload (CI)")
    parser.add_argument(
        "--only", action="append", metavar="NAME", help=f"run only these ({', '.join(benches)})"
    )
    parser.add_argument(
        "--output", type=Path, default=ROOT / "BENCHMARKS.md", help="where to write the report"
    )
    parser.add_argument(
        "--with-peers", action="store_true", help="with --quick, include the benchmarks --quick leaves out"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="put only these benchmarks' sections into the existing --output, leaving the rest of it as it is",
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args()
    if args.list:
        for b in benches.values():
            print(f"{b.name:20} {'' if b.in_quick else '(not in --quick) '}{b.summary}")
        return
    unknown = [n for n in args.only or () if n not in benches]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(benches)}")
    chosen = [
        b
        for b in benches.values()
        if (b.name in args.only if args.only else (b.in_quick or not args.quick or args.with_peers))
    ]

    command = shlex.join(["python", "-m", "bench", *sys.argv[1:]])
    started = dt.datetime.now(dt.UTC)
    info, pkgs = machine(), versions()
    output = args.output.resolve()
    plots_dir = output.parent / "bench" / "plots"
    results = []
    with tempfile.TemporaryDirectory(prefix="harbor-bench-suite-") as scratch:
        for bench in chosen:
            result = run_one(bench, args.quick, Path(scratch))
            for plot in bench.plots:
                path = draw(plot, result, plots_dir)
                if path is not None:
                    result.plots.append((path.relative_to(output.parent).as_posix(), plot.title))
            results.append(result)
            print(f"=== {bench.name}: {status(result)} in {result.seconds:.0f} s", flush=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    if args.merge and output.exists():
        output.write_text(merge(output.read_text(), results, benches, command, started, info))
    else:
        output.write_text(render(results, benches, command, args.quick, started, info, pkgs))
    print(f"\nwrote {output}")
    for r in results:
        print(f"  {r.name:20} {status(r):15} {r.seconds:6.0f} s")
    sys.exit(0 if all(r.exit_code is not None and r.tables for r in results) else 1)


if __name__ == "__main__":
    main()
