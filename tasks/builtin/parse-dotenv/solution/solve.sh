#!/bin/bash
set -euo pipefail
cat > /app/dotenv.py <<'PY'
"""A small .env parser."""

import re

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}


def _unescape(body):
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body) and body[i + 1] in _ESCAPES:
            out.append(_ESCAPES[body[i + 1]])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _value(raw):
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] == "'":
        return raw[1:-1]
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        return _unescape(raw[1:-1])
    if raw.startswith("#"):
        return ""
    return raw.split(" #", 1)[0].strip()


def parse(text):
    result = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("export "):
            stripped = stripped[len("export "):]
        key, sep, raw = stripped.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise ValueError(f"line {number}: expected KEY=VALUE, got {line!r}")
        result[key] = _value(raw)
    return result
PY
