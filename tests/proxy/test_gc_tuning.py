"""The collector settings both capture servers run under (capture_proxy.gc_tuning): the standalone proxy
and `harbor serve`'s capture port freeze the start-up heap and collect young objects less often while they
serve, and give the process its own settings back when they stop, even when their lifetimes overlap."""

from __future__ import annotations

import gc

from capture_proxy.gc_tuning import GEN0_THRESHOLD, serving_gc
from tests.proxy.conftest import start_proxy
from tests.server.conftest import make_config, running_server


def test_overlapping_blocks_restore_the_settings_when_the_last_one_ends() -> None:
    before = gc.get_threshold()
    with serving_gc():
        assert gc.get_threshold()[0] == GEN0_THRESHOLD and gc.get_freeze_count() > 0
        with serving_gc():
            pass
        assert gc.get_threshold()[0] == GEN0_THRESHOLD  # the outer block still serves
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_the_standalone_proxy_serves_under_them(imitation, store) -> None:
    before = gc.get_threshold()
    _, server = start_proxy(imitation, store)
    with server:
        assert gc.get_threshold()[0] == GEN0_THRESHOLD
    assert gc.get_threshold() == before


def test_harbor_serve_serves_under_them(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    before = gc.get_threshold()
    with running_server(make_config(tmp_path)):
        assert gc.get_threshold()[0] == GEN0_THRESHOLD
    assert gc.get_threshold() == before
