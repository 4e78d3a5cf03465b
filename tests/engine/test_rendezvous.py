"""The weight-transfer rendezvous address: configurable, the host's routable address by default (as
vLLM's `get_ip()`, which TRL uses), loopback for an engine on loopback, and a clear error naming the
address and the setting when the group cannot form there."""

from __future__ import annotations

import ipaddress

import pytest
import torch

from engine.errors import WeightSyncError
from engine.weight_client import WeightSyncClient, rendezvous_address, routable_address
from tests.engine.conftest import engine_app, serve
from trainer.config import AsyncGRPOConfig
from trainer.grpo import HarnessAsyncGRPOTrainer


def test_vllm_host_ip_wins_like_in_vllm(monkeypatch) -> None:
    monkeypatch.setenv("VLLM_HOST_IP", "10.9.8.7")
    assert routable_address() == "10.9.8.7"


def test_without_vllm_host_ip_it_is_an_address_of_this_host(monkeypatch) -> None:
    monkeypatch.delenv("VLLM_HOST_IP", raising=False)
    ipaddress.ip_address(routable_address())  # a real address (127.0.0.1, with a warning, if no route)


@pytest.mark.parametrize(
    ("url", "configured", "expected"),
    [("http://127.0.0.1:8000", None, "127.0.0.1"), ("http://localhost:8000/v1", None, "127.0.0.1"),
     ("http://[::1]:8000", None, "127.0.0.1"), ("http://10.1.2.3:8000", None, "10.9.8.7"),
     ("http://vllm.internal:8000", None, "10.9.8.7"), ("http://127.0.0.1:8000", "172.17.0.1", "172.17.0.1")],
)  # fmt: skip
def test_the_rendezvous_follows_where_the_engine_is(monkeypatch, url, configured, expected) -> None:
    monkeypatch.setenv("VLLM_HOST_IP", "10.9.8.7")  # stands for this host's routable address
    assert rendezvous_address(url, configured) == expected


def test_the_trainer_passes_its_configured_address() -> None:
    args = AsyncGRPOConfig(vllm_server_base_url="http://10.1.2.3:8000", weight_sync_backend="gloo",
                           weight_sync_master_address="10.0.0.5", report_to="none", num_generations=2,
                           per_device_train_batch_size=2)  # fmt: skip
    trainer = HarnessAsyncGRPOTrainer(
        torch.nn.Linear(2, 2), lambda **_: None, args, train_dataset=[{"prompt": "x"}]
    )
    assert trainer.weight_sync.master_address == "10.0.0.5"


def test_an_address_of_no_host_is_a_clear_error(tiny_dir) -> None:
    # 192.0.2.1 is TEST-NET-1: no host has it, so the trainer cannot even listen there.
    with (
        serve(engine_app(tiny_dir, weight_transfer_timeout_s=3)) as url,
        WeightSyncClient(url, backend="gloo", master_address="192.0.2.1", timeout_s=3) as sync,
        pytest.raises(
            WeightSyncError, match=r"at 192\.0\.2\.1 .*address of this host.*weight_sync_master_address"
        ),
    ):
        sync.init_transfer()
