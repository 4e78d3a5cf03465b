#!/bin/bash
set -euo pipefail
cat > /app/inventory.py <<'PY'
"""A tiny stock ledger."""


class OutOfStock(Exception):
    pass


class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, sku, qty):
        if qty <= 0:
            raise ValueError("quantity must be positive")
        self.items[sku] = self.items.get(sku, 0) + qty

    def remove(self, sku, qty):
        have = self.items.get(sku, 0)
        if qty > have:
            raise OutOfStock(f"{sku}: have {have}, asked {qty}")
        if qty == have:
            del self.items[sku]
        else:
            self.items[sku] = have - qty

    def count(self, sku):
        return self.items.get(sku, 0)

    def total(self):
        return sum(self.items.values())
PY
