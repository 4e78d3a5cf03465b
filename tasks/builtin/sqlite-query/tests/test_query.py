import sqlite3
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from make_db import build  # noqa: E402

QUERY = Path("/app/query.sql")


def reference(db):
    rows = db.execute(
        """SELECT c.country, o.id, i.quantity * i.unit_price FROM customers c
           JOIN orders o ON o.customer_id = c.id JOIN order_items i ON i.order_id = o.id"""
    ).fetchall()
    by_country = {}
    for country, oid, amount in rows:
        orders, revenue = by_country.get(country, (set(), 0.0))
        orders.add(oid)
        by_country[country] = (orders, revenue + amount)
    result = [(c, len(o), round(r, 2)) for c, (o, r) in by_country.items()]
    return sorted(result, key=lambda t: (-t[2], t[0]))


def run(db):
    cursor = db.execute(QUERY.read_text())
    assert [d[0] for d in cursor.description] == ["country", "orders", "revenue"]
    return [tuple(r) for r in cursor.fetchall()]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_query_matches_reference(tmp_path, seed):
    path = tmp_path / f"shop{seed}.db"
    build(str(path), seed)
    db = sqlite3.connect(path)
    db.execute("INSERT INTO customers VALUES (999, 'lonely', 'XX')")  # a country without orders
    got, want = run(db), reference(db)
    assert [(c, n) for c, n, _ in got] == [(c, n) for c, n, _ in want]
    assert [r for *_, r in got] == pytest.approx([r for *_, r in want], abs=0.006)


def test_shop_db_untouched(tmp_path):
    build(str(tmp_path / "fresh.db"), 1)
    fresh = sqlite3.connect(tmp_path / "fresh.db")
    shop = sqlite3.connect("/app/shop.db")
    for table in ("customers", "orders", "order_items"):
        assert shop.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall() == fresh.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
