#!/bin/bash
# The verifier: runs after the agent stopped, with tests/ uploaded to /tests (never visible before).
# Only /logs/verifier/reward.txt (one number) or reward.json counts; the exit status does not.
mkdir -p /logs/verifier
cd /app
export PYTHONDONTWRITEBYTECODE=1
# pytest's own plugins only: whatever else the interpreter has (hypothesis, schemathesis, ...) would
# load on every run (about 3 CPU-s with a developer's Python) and could change the result.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
python3 -m pytest -q -p no:cacheprovider /tests/test_task.py 2>&1 | tee /logs/verifier/pytest.txt
if [ "${PIPESTATUS[0]}" -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
