"""Export report rows to CSV for the finance team."""


def to_csv(rows, columns):
    """CSV text with a header line, one line per row, in `columns` order."""
    lines = [",".join(columns)]
    for row in rows:
        lines.append(",".join(str(row[c]) for c in columns))
    return "\n".join(lines) + "\n"
