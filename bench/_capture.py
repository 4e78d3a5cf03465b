"""Run one benchmark script as `__main__`, recording every rich Table and line it prints.

    python -m bench._capture OUT.json bench/<name>.py [args...]

The benchmarks stay plain scripts (`python bench/<name>.py` prints its tables as before); the suite
runs each through this wrapper in its own process, which hooks `rich.console.Console.print` so the
tables arrive as data (title, headers, cell text) rather than as terminal art to parse. Everything is
still printed. The JSON is written even when the script fails, with its exit status and error.
"""

from __future__ import annotations

import json
import runpy
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text


def _plain(cell: Any) -> str:
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        try:
            return Text.from_markup(cell).plain
        except Exception:  # not valid markup (a literal "[" in a value): keep it as it is
            return cell
    return str(cell)


def table_data(table: Table) -> dict:
    """A rich Table as {title, columns, rows} of plain strings."""
    columns = [_plain(c.header) for c in table.columns]
    cells = [[_plain(cell) for cell in c._cells] for c in table.columns]
    rows = [list(r) for r in zip(*cells, strict=False)] if cells else []
    return {"title": _plain(table.title or ""), "columns": columns, "rows": rows}


def main() -> None:
    out, script, *args = sys.argv[1:]
    record: dict[str, Any] = {"tables": [], "notes": [], "exit_code": 0, "error": None}
    original = Console.print

    def recording_print(self: Console, *objects: Any, **kwargs: Any) -> None:
        for obj in objects:
            if isinstance(obj, Table):
                record["tables"].append(table_data(obj))
            elif isinstance(obj, str | Text) and record["tables"]:
                # lines after the first table are verdicts and footnotes; earlier ones are progress
                record["notes"].append(_plain(obj))
        original(self, *objects, **kwargs)

    Console.print = recording_print  # type: ignore[method-assign]
    # The suite stops a benchmark past its time limit with SIGTERM: unwind (the script's own cleanup
    # stops its servers) and still write what was recorded.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        record["exit_code"] = code if isinstance(code, int) else (0 if code is None else 1)
        if isinstance(code, str):
            record["error"] = code
    except BaseException as exc:  # the suite reports it in the benchmark's section and goes on
        record["exit_code"] = 1
        record["error"] = "".join(traceback.format_exception_only(exc)).strip()
        traceback.print_exc()
    finally:
        Path(out).write_text(json.dumps(record))
    sys.exit(record["exit_code"])


if __name__ == "__main__":
    main()
