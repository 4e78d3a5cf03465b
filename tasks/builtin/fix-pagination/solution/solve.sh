#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
from pathlib import Path
p = Path("pagination.py")
s = p.read_text()
s = s.replace("start = page * per_page - per_page + 1", "start = (page - 1) * per_page")
s = s.replace("return total // per_page", "return -(-total // per_page)")
p.write_text(s)
PY
