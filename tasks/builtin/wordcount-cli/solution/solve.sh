#!/bin/bash
set -euo pipefail
cat > /app/wordfreq.py <<'PY'
"""Count word frequencies in files."""

import argparse
import re
import sys
from collections import Counter

WORD = re.compile(r"[A-Za-z0-9']+")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--top", type=int, default=None)
    parser.add_argument("--ignore-case", action="store_true")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    counts = Counter()
    for name in args.files:
        try:
            text = sys.stdin.read() if name == "-" else open(name, encoding="utf-8").read()
        except OSError as exc:
            print(f"wordfreq: {name}: {exc.strerror}", file=sys.stderr)
            return 2
        words = WORD.findall(text)
        counts.update(w.lower() for w in words) if args.ignore_case else counts.update(words)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    for word, count in ranked[: args.top]:
        print(f"{count}\t{word}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
PY
