"""The benchmark suite still runs: `python -m bench --quick` on its two cheapest benchmarks, for real
(subprocesses, the real trace store and tiny model), writing BENCHMARKS.md and a plot to a temp folder.
No timing is asserted; what is checked is the report's shape and that the numbers made it into it."""

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
    cmd = [sys.executable, "-m", "bench", "--quick", "--only", "store_ingest", "--only", "trainer_step",
           "--output", str(output)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    report = output.read_text()
    assert "python -m bench --quick --only store_ingest --only trainer_step" in report
    assert re.search(r"^- CPU: .+$", report, re.M) and re.search(r"^- memory: [\d.]+ GiB$", report, re.M)
    assert re.search(r"harbor-rl \d+\.\d+", report)
    for name in ("store_ingest", "trainer_step"):
        assert f"## {name}" in report
        assert re.search(rf"^\| \[{name}\]\(#{name}\) \| .* \| ok \| \d+ \|$", report, re.M)
    # the ingest table, with its JSONL baseline at 1.00x and SQLite measured against it
    assert re.search(r"^\| JSONL \| [\d,]+ \| 1\.00x \|", report, re.M)
    assert re.search(r"^\| SQLite \(WAL\) \| [\d,]+ \| [\d.]+x \|", report, re.M)
    # the packing table, and its plot written and linked
    assert re.search(r"^\| 20 \| extensions \| \d+ \| \d+ \| \d+ \| [\d.]+ \|", report, re.M)
    plot = tmp_path / "bench" / "plots" / "trainer_step_packing.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "](bench/plots/trainer_step_packing.png)" in report


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
