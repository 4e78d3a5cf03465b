#!/usr/bin/env bash
# The GPU check (issue 17): a few GRPO steps of the real `harbor train` path with the trainer and the
# embedded engine on CUDA, for the tiny model and a ~0.4B random-init one, packed and padded; asserts
# the parameters are on the GPU and prints step time, tokens/s, peak memory and weight-push time.
# Needs torch with CUDA, no vLLM, no network; about 3-6 minutes on one H200.
#   bench/gpu_check.sh          # on a GPU machine
#   bench/gpu_check.sh --dry    # on CPU: the tiny model, one step (what CI runs, so it cannot rot)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:-$PWD}"
exec python -m bench.gpu_check "$@"
