#!/bin/bash
# Run the hidden tests against /app; reward 1 when every test passes, else 0.
# The exit status is not the reward: only /logs/verifier/reward.txt is.
mkdir -p /logs/verifier
cd /app
export PYTHONDONTWRITEBYTECODE=1
# pytest's own plugins only: whatever else the interpreter has (hypothesis, schemathesis, ...) would
# load on every run (about 3 CPU-s with a developer's Python) and could change the result.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
python3 -m pytest -q -p no:cacheprovider /tests/test_inventory_hidden.py 2>&1 | tee /logs/verifier/pytest.txt
if [ "${PIPESTATUS[0]}" -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
