"""Create the task's shop database (deterministic rows)."""

import random
import sqlite3
import sys

SCHEMA = """
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id), placed_at TEXT NOT NULL);
CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(id), sku TEXT NOT NULL, quantity INTEGER NOT NULL, unit_price REAL NOT NULL);
"""


def build(path, seed):
    rng = random.Random(seed)
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    countries = ["DE", "FR", "JP", "BR", "NZ"]
    for cid in range(1, 21):
        db.execute("INSERT INTO customers VALUES (?, ?, ?)", (cid, f"customer{cid}", rng.choice(countries)))
    for oid in range(1, 61):
        cid = rng.randint(1, 20)
        db.execute("INSERT INTO orders VALUES (?, ?, ?)", (oid, cid, f"2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}"))
        for _ in range(rng.randint(1, 4)):
            db.execute("INSERT INTO order_items VALUES (?, ?, ?, ?)", (oid, rng.choice("ABCDE"), rng.randint(1, 5), rng.choice([1.25, 9.99, 20.0])))
    db.commit()
    db.close()


if __name__ == "__main__":
    build(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
