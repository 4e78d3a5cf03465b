"""harbor serve's engine probe against a vLLM started with --logprobs-mode raw_logprobs (a server of its
own): the verdict is "raw", with the flag to fix it, where the low-temperature probe could not tell."""

from __future__ import annotations

import pytest

from harbor_server.engine_check import probe_engine
from tests.vllm_live.conftest import live_vllm

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def raw_vllm(tiny_path, tmp_path_factory):
    with live_vllm(tiny_path, "tiny", tmp_path_factory.mktemp("vllm-raw"), "raw_logprobs") as server:
        yield server


async def test_the_engine_probe_finds_raw_logprobs(raw_vllm):
    status = await probe_engine(raw_vllm.v1, "tiny", timeout_s=120)
    assert status.ok and status.token_ids and status.logprobs  # it serves, but cannot train right
    assert status.processed_logprobs is False
    assert len(status.warnings) == 1 and "reports raw logprobs" in status.warnings[0]
    assert "--logprobs-mode processed_logprobs" in status.warnings[0]
