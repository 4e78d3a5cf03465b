"""The harness registry that `harbor serve` resolves names with."""

from __future__ import annotations

import pytest

import harnesses
from harnesses import HARNESS_NAMES, Harness, UnknownHarness, get_harness, harness_names, register_harness
from harnesses.nop import NopHarness


def test_built_in_harnesses_follow_the_protocol() -> None:
    assert set(HARNESS_NAMES) == {
        "nop", "oracle", "mini-swe-agent", "opencode", "claude-code", "codex", "qwen-code", "env-factory",
    }  # fmt: skip
    for name in HARNESS_NAMES:
        harness = get_harness(name)
        assert isinstance(harness, Harness)
        assert harness.name == name


def test_each_call_gives_a_fresh_instance() -> None:
    assert get_harness("nop") is not get_harness("nop")


def test_an_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownHarness) as caught:
        get_harness("no-such-agent")
    message = str(caught.value)
    assert "'no-such-agent'" in message
    for name in HARNESS_NAMES:
        assert name in message
    assert isinstance(caught.value, KeyError)  # callers that map KeyError to 404 keep working


def test_registered_harnesses_are_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harnesses, "_REGISTRY", dict(harnesses._REGISTRY))
    register_harness("scripted", NopHarness)
    assert "scripted" in harness_names()
    assert isinstance(get_harness("scripted"), NopHarness)


def test_agents_that_install_nothing_add_no_layer() -> None:
    assert get_harness("nop").image_layer() is None
    assert get_harness("oracle").image_layer() is None
