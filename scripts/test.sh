#!/usr/bin/env bash
# The test command: set up what the tests use (scripts/setup.sh), then run the whole suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/proxy -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HARBOR_TEST_POSTGRES_URL="${HARBOR_TEST_POSTGRES_URL:-postgresql+psycopg://harbor:harbor@127.0.0.1:5432/harbor_test}"
python3 -m pytest -q -ra --durations=30 "$@"
