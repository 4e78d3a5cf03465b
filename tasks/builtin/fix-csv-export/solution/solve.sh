#!/bin/bash
set -euo pipefail
cat > /app/export.py <<'PY'
"""Export report rows to CSV for the finance team."""

import csv
import io


def to_csv(rows, columns):
    """CSV text with a header line, one line per row, in `columns` order."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow("" if row.get(c) is None else str(row[c]) for c in columns)
    return out.getvalue()
PY
