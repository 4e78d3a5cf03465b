"""The list page's first screen in a real browser (headless Debian Chromium, a 1400x900 viewport): 20
rows and more in view under the folded filters, a purpose column and filter, a run for every rollout,
and no number printed to 16 digits, in the list or in the Runs table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi import FastAPI

from inspector.app import mount_inspector
from tests.inspector.conftest import CHROMEDRIVER, CHROMIUM, T0, add_session, load, served, wait_for

pytestmark = pytest.mark.skipif(
    not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
    reason="needs Debian chromium and chromium-driver (scripts/setup.sh installs them)",
)

VIEWPORT = (1400, 900)
LONG_DECIMALS = re.compile(r"\d\.\d{5,}")
"""A number shown with more than 4 decimals."""

VISIBLE_ROWS = """
// The list's data rows a user sees: inside the viewport and not covered (the table scrolls inside its
// own box, and Gradio draws only the rows near the view), with each row's cells.
const rows = [...document.querySelectorAll('#rollout-table [role=row]')]
  .filter((r) => r.querySelector('[role=gridcell]'));
return rows.filter((r) => {
  const b = r.getBoundingClientRect();
  if (b.height <= 0 || b.top < 0 || b.bottom > window.innerHeight) return false;
  const hit = document.elementFromPoint(b.left + 20, b.top + b.height / 2);
  return hit && r.contains(hit);
}).map((r) => [...r.querySelectorAll('[role=gridcell]')].map((c) => c.innerText.trim()));
"""


def show_list(driver, url: str) -> None:
    """Open the list at exactly 1400x900 CSS pixels and wait until it is filled."""
    from selenium.webdriver.common.by import By

    width, height = VIEWPORT
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    load(driver, url, lambda d: "match" in d.find_element(By.ID, "list-info").text)
    wait_for(driver, lambda d: len(d.execute_script(VISIBLE_ROWS)) > 0)


def save_list_screenshot(store_url: str, path: Path) -> None:
    """A screenshot of the list's first screen on the store at `store_url` (what docs/images shows)."""
    from tests.inspector.conftest import chromium

    with chromium() as driver, served(mount_inspector(FastAPI(), store_url, "/inspect"), driver) as url:
        show_list(driver, f"{url}/inspect/")
        path.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(path))


def mixed_store(store) -> dict[str, int]:
    """40 rollouts as `harbor train`, `harbor eval` and `harbor collect` store them: train rollouts
    name their run; eval rollouts of an older store name only their eval job; one has a reward that
    prints to 16 digits. Returns the count per purpose."""
    counts = {"train": 0, "eval": 0, "collect": 0}
    for i in range(40):
        kind = ("train", "train", "eval", "collect")[i % 4]
        counts[kind] += 1
        inner = {"train": {"run": "train-embedded"}, "eval": {"eval_job": "job-1", "attempt": 0}}.get(
            kind, {"collect": "/data/demos", "run": "demos"}
        )
        add_session(
            store,
            f"r{i:02d}",
            created_at=T0 + i,
            turns=2,
            policy_version=i // 4,
            metadata={"rollout": {"split": "env-tasks", "metadata": inner}},
            purpose="train" if kind == "train" else "eval",
            status="completed",
            task_id="echo-hello-world",
            harness="env-factory",
            reward=0.0008229959187443814 if i == 39 else (i % 7) / 7,
            finished_at=T0 + i + 1.234567,
        )
    return counts


def test_first_screen_shows_20_rows_with_purpose_run_and_short_numbers(synthetic_store, browser, tmp_path):
    from selenium.webdriver.common.by import By

    counts = mixed_store(synthetic_store)
    app = mount_inspector(FastAPI(), synthetic_store.url, "/inspect")
    with served(app, browser) as url:
        show_list(browser, f"{url}/inspect/")
        browser.save_screenshot(str(tmp_path / "list.png"))
        rows = browser.execute_script(VISIBLE_ROWS)
        assert len(rows) >= 20, f"only {len(rows)} rows in the first screen"
        header = [h.text.strip() for h in browser.find_elements(By.CSS_SELECTOR, "#rollout-table th")]
        purpose, run, reward = (header.index(name) for name in ("purpose", "run", "reward"))
        by_id = {row[0]: row for row in rows}
        assert by_id["r39"][reward] == "0.0008"  # 0.0008229959187443814, rounded
        assert {row[purpose] for row in rows} == {"train", "eval", "collect"}
        # Every rollout names its run: its own, or (an older eval rollout) its eval job.
        assert {row[0]: row[run] for row in rows if row[0] in ("r38", "r37", "r36")} == {
            "r38": "job-1",
            "r37": "train-embedded",
            "r36": "train-embedded",
        }
        assert not [cell for row in rows for cell in row if LONG_DECIMALS.search(cell)]

        # The purpose filter, from its dropdown.
        browser.find_element(By.CSS_SELECTOR, "#f-purpose input").click()
        option = wait_for(
            browser,
            lambda d: next(
                (o for o in d.find_elements(By.CSS_SELECTOR, "li[role=option]") if o.text == "eval"), None
            ),
        )
        option.click()
        expected = f"{counts['eval']} rollout(s) match"
        wait_for(browser, lambda d: expected in d.find_element(By.ID, "list-info").text)
        wait_for(browser, lambda d: {r[purpose] for r in d.execute_script(VISIBLE_ROWS)} == {"eval"})

        # The Runs table: means rounded, not 0.0008229959187443814.
        next(
            b for b in browser.find_elements(By.CSS_SELECTOR, "button[role=tab]") if b.text == "Runs"
        ).click()
        table = wait_for(browser, lambda d: d.find_element(By.ID, "runs-table"))
        wait_for(browser, lambda d: "0.0008" in table.text)
        assert not LONG_DECIMALS.search(table.text), table.text
