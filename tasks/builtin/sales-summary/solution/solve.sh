#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import csv
import json
from collections import Counter, defaultdict

revenue, units, months = defaultdict(float), Counter(), set()
with open("/app/data/sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        try:
            n, price = int(row["units"]), float(row["unit_price"])
        except ValueError:
            continue
        revenue[row["region"]] += n * price
        units[row["product"]] += n
        months.add(row["date"][:7])
summary = {
    "total_revenue": round(sum(revenue.values()), 2),
    "revenue_by_region": {k: round(v, 2) for k, v in sorted(revenue.items())},
    "top_product": sorted(units.items(), key=lambda kv: (-kv[1], kv[0]))[0][0],
    "months": sorted(months),
}
with open("/app/summary.json", "w") as f:
    json.dump(summary, f, indent=2)
PY
