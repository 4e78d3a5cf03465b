"""The benchmark suite still runs: `python -m bench --quick` on its cheapest benchmark, for real (a
subprocess, the real trace store), writing BENCHMARKS.md to a temp folder; and a plot drawn from
trainer_step's own packing table and linked from its section. No timing is asserted; what is checked is
the report's shape and that the numbers made it into it. Every benchmark's whole quick run is CI's
(.ci/run runs `python -m bench --quick` after the tests; a benchmark that fails fails CI)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_quick_suite_writes_a_report(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    output = tmp_path / "BENCHMARKS.md"
    # trainer_step left CI's test run (41 s on 2 cores): .ci/run's `python -m bench --quick` runs it.
    cmd = [sys.executable, "-m", "bench", "--quick", "--only", "store_ingest", "--output", str(output)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    report = output.read_text()
    assert "python -m bench --quick --only store_ingest" in report
    assert re.search(r"^- CPU: .+$", report, re.M) and re.search(r"^- memory: [\d.]+ GiB$", report, re.M)
    assert re.search(r"harbor-rl \d+\.\d+", report)
    assert "## store_ingest" in report
    assert re.search(r"^\| \[store_ingest\]\(#store_ingest\) \| .* \| ok \| \d+ \|$", report, re.M)
    # the ingest table, with its JSONL baseline at 1.00x and SQLite measured against it
    assert re.search(r"^\| JSONL \| [\d,]+ \| 1\.00x \|", report, re.M)
    assert re.search(r"^\| SQLite \(WAL\) \| [\d,]+ \| [\d.]+x \|", report, re.M)


def test_trainer_steps_packing_table_gives_its_plot_and_the_section_links_it(tmp_path: Path) -> None:
    """trainer_step's packing table (its own code, seconds without the timed steps), as `bench._capture`
    records it, drawn by the suite's `draw` with the benchmark's declared plot, linked as `main` links it."""
    pytest.importorskip("matplotlib")
    from bench import KNOWN, BenchResult
    from bench.__main__ import draw, section
    from bench._capture import table_data
    from bench.trainer_step import packing_table

    bench = next(b for b in KNOWN if b.name == "trainer_step")
    assert bench.in_quick  # so .ci/run's quick suite runs the whole benchmark
    result = BenchResult(bench.name, "python bench/trainer_step.py --quick", 1.0, 0)
    result.tables.append(table_data(packing_table([5, 20])))
    (plot,) = bench.plots
    path = draw(plot, result, tmp_path / "bench" / "plots")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result.plots.append((path.relative_to(tmp_path).as_posix(), plot.title))
    text = "\n".join(section(result, bench))
    assert re.search(r"^\| 20 \| extensions \| \d+ \| \d+ \| \d+ \| [\d.]+ \|", text, re.M)
    assert "](bench/plots/trainer_step_packing.png)" in text


def test_a_failing_benchmark_is_reported_not_fatal(tmp_path: Path) -> None:
    """`bench._capture` records the tables printed before a crash, and the exit status and error."""
    script = tmp_path / "crashes.py"
    script.write_text(
        "from rich.console import Console\nfrom rich.table import Table\n"
        "t = Table(title='half done')\nt.add_column('x')\nt.add_row('[green]1[/]')\n"
        "Console().print(t)\nraise ValueError('disk full')\n"
    )
    out = tmp_path / "record.json"
    done = subprocess.run([sys.executable, "-m", "bench._capture", str(out), str(script)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1
    record = json.loads(out.read_text())
    assert record["tables"] == [{"title": "half done", "columns": ["x"], "rows": [["1"]]}]
    assert record["exit_code"] == 1 and "ValueError: disk full" in record["error"]


def test_harbor_bench_runs_the_same_suite_with_the_same_flags() -> None:
    """`harbor bench` forwards its flags to `python -m bench`: the list, and its error for a bad name."""
    harbor = [sys.executable, "-c", "from harbor_rl.cli import app; app()", "bench"]
    listed = subprocess.run([*harbor, "--list"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    names = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    assert "e2e_rollouts" in names and "store_ingest" in names
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py") if not p.stem.startswith("_")} - {"peers"}
    assert set(names) == scripts  # every bench/<name>.py is in the suite
    bad = subprocess.run([*harbor, "--quick", "--only", "no_such_bench"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "unknown benchmark(s) no_such_bench" in bad.stderr
