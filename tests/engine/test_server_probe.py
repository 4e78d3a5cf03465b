"""harbor_server's start-up engine probe accepts the embedded engine: token ids, processed logprobs."""

from __future__ import annotations

import pytest

try:
    from harbor_server.engine_check import probe_engine
except ImportError as exc:  # built by another issue
    pytest.skip(f"harbor_server.engine_check is not importable yet: {exc}", allow_module_level=True)


async def test_probe_finds_token_ids_and_processed_logprobs(engine):
    status = await probe_engine(engine.v1, "tiny")
    assert status.errors == [] and status.warnings == []
    assert status.models == ["tiny"]
    assert status.token_ids and status.logprobs and status.processed_logprobs
