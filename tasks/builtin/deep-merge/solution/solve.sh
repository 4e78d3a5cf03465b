#!/bin/bash
set -euo pipefail
cat > /app/config_merge.py <<'PY'
"""Layered configuration: a base file plus environment overrides."""

import copy
import json


def deep_merge(base, override):
    result = copy.deepcopy(base)
    for key, value in override.items():
        current = result.get(key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and set(value) == {"$append"} and isinstance(current, list):
            result[key] = current + copy.deepcopy(value["$append"])
        elif isinstance(value, dict) and isinstance(current, dict):
            result[key] = deep_merge(current, value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def merge_files(*paths):
    merged = {}
    for path in paths:
        with open(path) as f:
            merged = deep_merge(merged, json.load(f))
    return merged
PY
