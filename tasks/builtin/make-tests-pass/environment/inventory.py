"""A tiny stock ledger."""


class OutOfStock(Exception):
    pass


class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, sku, qty):
        self.items[sku] = qty

    def remove(self, sku, qty):
        self.items[sku] = self.items[sku] - qty

    def count(self, sku):
        return self.items[sku]

    def total(self):
        return len(self.items)
