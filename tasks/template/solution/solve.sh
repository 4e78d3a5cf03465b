#!/bin/bash
# The oracle: a reference solution. `harbor tasks check PATH --run oracle,nop` checks that it scores
# 1.0 and that doing nothing scores 0.0.
set -euo pipefail
cat > /app/greeting.py <<'PY'
def greet(name):
    return f"Hello, {name}!"
PY
