#!/bin/bash
# Run the hidden tests; the reward is the fraction of tests that pass (partial credit).
mkdir -p /logs/verifier
cd /app
export PYTHONDONTWRITEBYTECODE=1
# pytest's own plugins only: whatever else the interpreter has (hypothesis, schemathesis, ...) would
# load on every run (about 3 CPU-s with a developer's Python) and could change the result.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
python3 -m pytest -q -p no:cacheprovider --junitxml=/logs/verifier/junit.xml /tests/test_greet.py 2>&1 | tee /logs/verifier/pytest.txt
python3 - <<'PY'
import xml.etree.ElementTree as ET
try:
    root = ET.parse("/logs/verifier/junit.xml").getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = sum(int(s.get("tests", 0)) for s in suites)
    bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) + int(s.get("skipped", 0)) for s in suites)
    reward = (total - bad) / total if total else 0.0
except (OSError, ET.ParseError):
    reward = 0.0
with open("/logs/verifier/reward.txt", "w") as f:
    f.write(f"{max(reward, 0.0):.4f}\n")
PY
