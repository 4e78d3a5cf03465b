"""End to end in a real browser: rollouts captured through the proxy, the inspector mounted in a FastAPI
app (as `harbor serve --inspector` does), driven by headless Debian Chromium through Selenium.

Upstream of the proxy is `engine.imitation`, a faithful local imitation of vLLM's OpenAI server
(vLLM needs a GPU); the agent is the real `openai` client. The test saves docs/screenshots/list.png
and docs/screenshots/rollout.png, which the README shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI

from engine.imitation import decode_token
from inspector.app import mount_inspector
from inspector.db import open_readonly
from inspector.queries import load_rollout
from tests.inspector.conftest import (
    CHROMEDRIVER,
    CHROMIUM,
    add_text_session,
    load,
    served,
    tiny_tokenizer,
    wait_for,
)

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
        reason="needs Debian chromium and chromium-driver (scripts/setup.sh installs them)",
    ),
]


def _full_page_screenshot(driver, path: Path, selector: str) -> None:
    """Grow the window to the element's height, so the screenshot shows all of it."""
    height = driver.execute_script(
        "const e = document.querySelector(arguments[0]);"
        "return Math.ceil(e.getBoundingClientRect().bottom + window.scrollY) + 40;",
        selector,
    )
    driver.set_window_size(1400, min(max(1000, height), 6000))
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))


def test_list_then_rollout_page_shows_task_reward_and_mask_colours(real_rollouts, browser):
    from selenium.webdriver.common.by import By

    engine = open_readonly(real_rollouts.store_url)
    stored = load_rollout(engine, real_rollouts.agent)
    engine.dispose()
    first = stored.turns[0]
    prompt_len = len(first.prompt_token_ids)

    app = mount_inspector(FastAPI(), real_rollouts.store_url, "/inspect", decode=decode_token)
    with served(app, browser) as url:
        # The list: every rollout, newest first.
        load(
            browser,
            f"{url}/inspect/",
            lambda d: real_rollouts.agent in d.find_element(By.ID, "rollout-table").text,
        )
        table_text = browser.find_element(By.ID, "rollout-table").text
        for session_id in real_rollouts.ids:
            assert session_id in table_text
        assert "unscoreable" in table_text  # reward None is not shown as 0
        assert "3 rollout(s) match" in browser.find_element(By.ID, "list-info").text
        _full_page_screenshot(browser, SCREENSHOTS / "list.png", "#rollout-table")

        # Filter in the browser: reward >= 0.5 leaves the agent rollout only (its box is folded away
        # under "More filters" until opened).
        browser.find_element(By.CSS_SELECTOR, "#more-filters button").click()
        reward_min = wait_for(  # shown once the fold has opened
            browser,
            lambda d: (
                (
                    e := d.find_element(By.CSS_SELECTOR, "#f-reward-min textarea, #f-reward-min input")
                ).is_displayed()
                and e
            ),
        )
        reward_min.clear()
        reward_min.send_keys("0.5")
        browser.find_element(By.ID, "search-btn").click()
        wait_for(browser, lambda d: "1 rollout(s) match" in d.find_element(By.ID, "list-info").text)
        assert real_rollouts.failed not in browser.find_element(By.ID, "rollout-table").text

        # Open the rollout by clicking its row.
        cell = next(
            c
            for c in browser.find_elements(By.CSS_SELECTOR, "#rollout-table [role=gridcell]")
            if c.text.strip() == real_rollouts.agent
        )
        cell.click()
        view = wait_for(
            browser,
            lambda d: d.find_element(By.CSS_SELECTOR, f'.rollout[data-session-id="{real_rollouts.agent}"]'),
        )
        assert view.find_element(By.CSS_SELECTOR, ".summary .task-id").text == "builtin/hello-world"
        assert view.find_element(By.CSS_SELECTOR, ".summary .reward").text == "1"
        rewards = view.find_element(By.CSS_SELECTOR, "table.rewards").text
        assert "rewards/tests_passed" in rewards and "rewards/format" in rewards
        assert "4 passed" in view.find_element(By.CSS_SELECTOR, "pre.verifier").text

        # Mask colours of known tokens: turn 0's first prompt token is context, its first sampled
        # token is trained (green, strength from its logprob), with the logprob on hover.
        context = view.find_element(By.CSS_SELECTOR, '#turn-0 .tok[data-pos="0"]')
        assert context.get_attribute("data-token-id") == str(first.prompt_token_ids[0])
        assert "m0" in context.get_attribute("class").split()
        assert context.value_of_css_property("background-color") == "rgba(229, 231, 235, 1)"
        trained = view.find_element(By.CSS_SELECTOR, f'#turn-0 .tok[data-pos="{prompt_len}"]')
        assert trained.get_attribute("data-token-id") == str(first.completion_token_ids[0])
        assert trained.get_attribute("data-mask") == "1"
        assert "m1" in trained.get_attribute("class").split()
        colour = trained.value_of_css_property("background-color")
        assert colour.startswith("rgba(22, 163, 74, "), colour
        assert f"logprob {first.per_token_logps[0]:.4f}" in trained.get_attribute("title")
        # The retried call is discarded: drawn as such, and its sampled tokens are not trained.
        assert (
            view.find_element(By.CSS_SELECTOR, '.rollout-graph .gnode[data-node-id="t1"]').get_attribute(
                "data-role"
            )
            == "discarded"
        )
        assert (
            view.find_element(By.CSS_SELECTOR, '.rollout-graph .gnode[data-node-id="t4"]').get_attribute(
                "data-role"
            )
            == "auxiliary"
        )
        retried = view.find_element(
            By.CSS_SELECTOR, f'#turn-1 .tok[data-pos="{len(stored.turns[1].prompt_token_ids)}"]'
        )
        assert retried.get_attribute("data-mask") == "0"
        assert retried.value_of_css_property("background-color") == "rgba(209, 213, 219, 1)"
        _full_page_screenshot(browser, SCREENSHOTS / "rollout.png", ".rollout")


def test_deep_link_opens_a_rollout_and_runs_tab_plots_reward_over_policy_version(real_rollouts, browser):
    from selenium.webdriver.common.by import By

    app = mount_inspector(FastAPI(), real_rollouts.store_url, "/inspect")
    with served(app, browser) as url:
        browser.get(f"{url}/inspect/?rollout={real_rollouts.failed}")
        view = wait_for(
            browser,
            lambda d: d.find_element(By.CSS_SELECTOR, f'.rollout[data-session-id="{real_rollouts.failed}"]'),
        )
        assert view.find_element(By.CSS_SELECTOR, ".summary .reward").text == "unscoreable"
        assert view.find_element(By.CSS_SELECTOR, ".summary .task-id").text == "builtin/fizzbuzz"
        # One turn's token view on its own (what long rollouts use past the page's token budget).
        browser.find_element(By.ID, "turn-btn").click()
        single = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#turn-tokens #turn-tokens-0"))
        assert single.find_elements(By.CSS_SELECTOR, '.tok.m1[data-mask="1"]')

        next(
            b for b in browser.find_elements(By.CSS_SELECTOR, "button[role=tab]") if b.text == "Runs"
        ).click()
        table = wait_for(browser, lambda d: d.find_element(By.ID, "runs-table"))
        # Every run: policy version 3 (reward 1.0), version 4 (one 0.0, one unscoreable).
        wait_for(browser, lambda d: "policy_version" in table.text and "4" in table.text)
        wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#runs-plot canvas, #runs-plot svg"))


def test_harbor_serve_inspector_fills_the_table(browser, tmp_path, monkeypatch):
    """`harbor serve --inspector`: the inspector at /inspect/ of the real server lists the rollout
    the server just ran. Gradio's queue starts in the app's lifespan; without it the page renders
    but every event waits in the queue ("queue: 1/1") and the table stays empty."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By

    from harbor_server.client import HarborSessionFactory
    from tests.server.conftest import UNUSED_ENGINE, make_config, running_server

    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    config = make_config(tmp_path, inspector=True)
    with running_server(config) as server:
        with HarborSessionFactory(
            server.url,
            split="builtin",
            harness="oracle",
            sandbox="local",
            llm_url=UNUSED_ENGINE,
            model="tiny",
        ) as factory:
            session = factory.create(0, episode_id="inspect-me")
            assert session.wait_for_completion(timeout_s=120).status == "completed"
            rollout_id = session.rollout_id
        # A Docker container or network made or removed meanwhile (this server's start-up sweep, other
        # runs on the engine) changes the interfaces, and Chromium drops the page's loads
        # (ERR_NETWORK_CHANGED): load it again then. Without the queue no load ever fills the table.
        for attempt in range(3):
            browser.get(f"{server.url}/inspect/")
            try:
                wait_for(browser, lambda d: rollout_id in d.find_element(By.ID, "rollout-table").text)
                break
            except TimeoutException:
                if attempt == 2:
                    raise
        assert "1 rollout(s) match" in browser.find_element(By.ID, "list-info").text
        assert "oracle" in browser.find_element(By.ID, "rollout-table").text


ANCHOR_IN_VIEW = """
const box = document.querySelector(arguments[0]);
const first = box && box.querySelector('.tok.m1');
if (!first) return null;
const b = box.getBoundingClientRect(), r = first.getBoundingClientRect();
return {overflows: box.scrollHeight > 2 * box.clientHeight, visible: r.top >= b.top && r.bottom <= b.bottom,
        text: first.textContent};
"""


def test_token_views_open_at_the_first_trained_token_with_the_models_token_text(
    browser, synthetic_store, tiny_cache, monkeypatch
):
    """A long context fills a turn's token box; the box opens scrolled to the first trained token. The
    rollout's model is `tiny`, and its tokenizer is found without --tokenizer."""
    from selenium.webdriver.common.by import By

    monkeypatch.setenv("HARBOR_CACHE_DIR", str(tiny_cache))
    tok = tiny_tokenizer(tiny_cache)
    prompt = tok.encode("".join(f"context line {i}: the task so far\n" for i in range(200))).ids
    completion = tok.encode("answer = 42").ids
    add_text_session(synthetic_store, "long-context", model="tiny", prompt=prompt, completion=completion)
    first_text = tok.decode([completion[0]], skip_special_tokens=False)

    app = mount_inspector(FastAPI(), synthetic_store.url, "/inspect")
    with served(app, browser) as url:
        browser.get(f"{url}/inspect/?rollout=long-context")
        wait_for(
            browser, lambda d: d.find_element(By.CSS_SELECTOR, '.rollout[data-session-id="long-context"]')
        )
        state = wait_for(
            browser,
            lambda d: (s := d.execute_script(ANCHOR_IN_VIEW, "#turn-0 .tokens")) and s["visible"] and s,
        )
        assert state["overflows"], "the context must fill the box for this test to mean anything"
        assert state["text"] == first_text
        note = browser.find_element(By.CSS_SELECTOR, "#rollout-view .token-text").text
        assert note.startswith("token text from the tiny model's tokenizer")

        # One turn's tokens on their own open at the same place.
        browser.find_element(By.ID, "turn-btn").click()
        wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#turn-tokens #turn-tokens-0"))
        wait_for(
            browser,
            lambda d: (s := d.execute_script(ANCHOR_IN_VIEW, "#turn-tokens-0 .tokens")) and s["visible"],
        )
