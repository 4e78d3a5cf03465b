import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from inventory import Inventory, OutOfStock

# The visible suite must be the one the task shipped with (no edits, no deletions, no skips).
EXPECTED = (Path(__file__).parent / "test_inventory_copy.py").read_bytes()


def test_visible_tests_untouched():
    visible = Path("/app/tests/test_inventory.py")
    assert visible.exists(), "the visible test file was removed"
    assert hashlib.sha256(visible.read_bytes()).digest() == hashlib.sha256(EXPECTED).digest()
    assert not any(p.name == "conftest.py" for p in Path("/app").rglob("conftest.py"))


def test_visible_suite_passes():
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "/app/tests"], cwd="/app", capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:]


def test_remove_unknown_sku_raises_out_of_stock():
    with pytest.raises(OutOfStock):
        Inventory().remove("ghost", 1)


def test_many_operations():
    inv = Inventory()
    for i in range(10):
        inv.add(f"sku{i % 3}", i + 1)
    inv.remove("sku0", 5)
    assert inv.count("sku0") == 1 + 4 + 7 + 10 - 5
    assert inv.total() == sum(range(1, 11)) - 5
