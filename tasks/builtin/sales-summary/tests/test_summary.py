import csv
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

# The tests recompute the answer from their own copy of the data, so editing the CSV does not help.
DATA = Path(__file__).parent / "sales.csv"


def expected():
    revenue = defaultdict(float)
    units = Counter()
    months = set()
    for row in csv.DictReader(DATA.open()):
        try:
            n, price = int(row["units"]), float(row["unit_price"])
        except ValueError:
            continue
        revenue[row["region"]] += n * price
        units[row["product"]] += n
        months.add(row["date"][:7])
    top = sorted(units.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    return {
        "total_revenue": round(sum(revenue.values()), 2),
        "revenue_by_region": {k: round(v, 2) for k, v in revenue.items()},
        "top_product": top,
        "months": sorted(months),
    }


@pytest.fixture(scope="module")
def summary():
    return json.loads(Path("/app/summary.json").read_text())


def test_data_untouched():
    assert Path("/app/data/sales.csv").read_bytes() == DATA.read_bytes()


def test_total(summary):
    assert summary["total_revenue"] == pytest.approx(expected()["total_revenue"], abs=0.006)


def test_by_region(summary):
    want = expected()["revenue_by_region"]
    assert set(summary["revenue_by_region"]) == set(want)
    for region, value in want.items():
        assert summary["revenue_by_region"][region] == pytest.approx(value, abs=0.006)


def test_top_product_and_months(summary):
    assert summary["top_product"] == expected()["top_product"]
    assert summary["months"] == expected()["months"]
