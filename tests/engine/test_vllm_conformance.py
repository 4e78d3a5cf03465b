"""The embedded engine answers every vLLM route the trainer uses as vLLM 0.28.0-0.33.0 does.

Two callers drive it: TRL 1.16's own `VLLMClient` (trl/experimental/async_grpo/vllm_client.py, the
client TRL's async GRPO trainer talks to vLLM with) and our `WeightSyncClient`. The request models are
vLLM's, copied here field by field with the file they come from, so a drift on either side shows.
"""

from __future__ import annotations

import threading

import httpx
import pytest
import torch
from trl.experimental.async_grpo.vllm_client import VLLMClient

from engine.weight_client import GlooTransport, WeightSyncClient, _free_port
from engine.weight_transfer import InitInfo, UpdateInfo, pack_plan

# vllm/distributed/weight_transfer/nccl_common.py (0.28.0 and 0.33.0): NCCLWeightTransferInitInfo, less
# 0.33's `nccl_unique_id_b64` (the torch-free rendezvous, which a gloo group cannot offer).
VLLM_INIT_INFO_FIELDS = {"master_address", "master_port", "rank_offset", "world_size", "packed",
                         "packed_buffer_size_bytes", "packed_num_buffers"}  # fmt: skip
# vllm/distributed/weight_transfer/nccl_engine.py: NCCLWeightTransferUpdateInfo.
VLLM_UPDATE_INFO_FIELDS = {"names", "dtype_names", "shapes"}
# vllm/distributed/weight_transfer/packed_tensor.py: DEFAULT_PACKED_BUFFER_SIZE_BYTES, _NUM_BUFFERS.
VLLM_PACKED_DEFAULTS = {"packed": False, "packed_buffer_size_bytes": 1024**3, "packed_num_buffers": 2}


def test_wire_models_have_vllms_fields_and_defaults() -> None:
    assert set(InitInfo.model_fields) == VLLM_INIT_INFO_FIELDS
    assert set(UpdateInfo.model_fields) == VLLM_UPDATE_INFO_FIELDS
    assert {k: InitInfo.model_fields[k].default for k in VLLM_PACKED_DEFAULTS} == VLLM_PACKED_DEFAULTS


def test_chunks_are_cut_where_vllms_pack_tensors_cuts_them() -> None:
    # pack_tensors adds a tensor, then closes the chunk once the running size EXCEEDS the buffer.
    four_bytes = ["float32"] * 3, [[1]] * 3
    assert pack_plan(*four_bytes, buffer_size_bytes=8) == [[0, 1, 2]]  # 4, 8 (not over), 12: close
    assert pack_plan(*four_bytes, buffer_size_bytes=7) == [[0, 1], [2]]
    assert pack_plan(["float32", "bfloat16"], [[4], [100]], buffer_size_bytes=1) == [[0], [1]]


@pytest.fixture
def accelerate_state():
    """TRL logs through accelerate's logger, which needs a state; dropped again after the test."""
    from accelerate import PartialState

    PartialState(cpu=True)
    yield
    PartialState._reset_state()


def test_trls_client_drives_a_whole_sync(fresh_engine, accelerate_state) -> None:
    """TRL's calls, in TRL's order, with TRL's payloads (WeightTransferClient for vLLM >= 0.28)."""
    trl = VLLMClient(fresh_engine.url, server_timeout=30)
    trl.wait_for_server_ready(poll_interval_s=0.1)
    assert trl.get_world_size() == 1
    assert trl.get_dtype() == "torch.float32"
    assert trl.get_max_model_len() > 0

    model = fresh_engine.scheduler.model
    named = [(n, p.detach().clone() + 0.01) for n, p in model.named_parameters()]
    port = _free_port("127.0.0.1")
    init_info = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
                 "packed": True}  # fmt: skip
    transport = GlooTransport(timeout_s=60)
    joiner = threading.Thread(target=transport.join, args=(init_info,))
    joiner.start()
    trl.init_weight_transfer_engine(init_info, timeout=60)
    joiner.join(60)

    trl.pause(timeout=30)
    assert httpx.get(f"{fresh_engine.url}/is_paused").json() == {"is_paused": True}
    trl.start_weight_update(timeout=30)
    update_info = {"names": [n for n, _ in named], "dtype_names": ["float32"] * len(named),
                   "shapes": [list(t.shape) for _, t in named]}  # fmt: skip
    sender = threading.Thread(target=transport.send, args=(named, update_info))
    sender.start()
    trl.update_weights(update_info, timeout=60)
    sender.join(60)
    trl.finish_weight_update(timeout=60)  # TRL names no version: vLLM keeps its tag
    trl.resume(timeout=30)

    assert httpx.get(f"{fresh_engine.url}/weight_info").json() == {"weight_version": "default"}
    assert httpx.get(f"{fresh_engine.url}/is_paused").json() == {"is_paused": False}
    state = model.state_dict()
    assert all(torch.equal(state[n], t) for n, t in named)


def test_our_client_tags_the_version_as_a_string(fresh_engine) -> None:
    named = list(fresh_engine.scheduler.model.named_parameters())
    with WeightSyncClient(fresh_engine.url, backend="gloo", timeout_s=60) as sync:
        assert sync.master_address == "127.0.0.1"  # loopback engine: loopback rendezvous
        assert sync.push(named, version=5) == 5 and sync.version == 5
    assert httpx.get(f"{fresh_engine.url}/weight_info").json() == {"weight_version": "5"}


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        # vLLM < 0.28 carried `packed` per update; 0.28+ refuses it there (dataclass(**update_info)).
        ("/update_weights", {"update_info": {"names": [], "dtype_names": [], "shapes": [], "packed": True}},
         400, "packed"),
        ("/init_weight_transfer_engine", {"init_info": {"master_address": "h", "rank_offset": 1,
                                                        "world_size": 2}}, 400, "master_port"),
        ("/init_weight_transfer_engine", {"init_info": {"master_address": "h", "master_port": 1, "rank_offset": 1,
                                                        "world_size": 2, "bogus": 1}}, 400, "bogus"),
        ("/init_weight_transfer_engine", {}, 400, "Missing 'init_info'"),
        ("/update_weights", {}, 400, "Missing 'update_info'"),
        # `weight_version: str | None` (Body(embed=True)): a JSON number is not a string.
        ("/finish_weight_update", {"weight_version": 3}, 400, "valid string"),
        ("/update_weight_version", {}, 400, "new_version"),
    ],
)  # fmt: skip
def test_malformed_bodies_are_refused_like_vllm(engine, path, body, status, needle) -> None:
    r = httpx.post(f"{engine.url}{path}", json=body)
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text


def test_version_routes_and_pause_answers_match_vllm(fresh_engine) -> None:
    url = fresh_engine.url
    assert httpx.get(f"{url}/weight_info").json() == {"weight_version": "default"}
    r = httpx.post(f"{url}/update_weight_version", json={"new_version": "7"})
    assert r.json() == {"success": True, "new_version": "7"}
    assert httpx.get(f"{url}/weight_info").json() == {"weight_version": "7"}
    assert httpx.get(f"{url}/get_world_size", params={"include_dp": "false"}).json() == {"world_size": 1}
    for mode in ("abort", "wait", "keep"):
        r = httpx.post(f"{url}/pause", params={"mode": mode, "clear_cache": "false"})
        assert r.json() == {"status": "paused"}
        assert httpx.post(f"{url}/resume").json() == {"status": "resumed"}
    assert httpx.post(f"{url}/pause", params={"mode": "later"}).status_code == 400
    assert httpx.get(f"{url}/is_paused").json() == {"is_paused": False}


def test_the_imitation_answers_the_control_routes_as_vllm_does() -> None:
    from engine.imitation import create_imitation_app
    from engine.in_process import serve_in_thread

    with serve_in_thread(create_imitation_app()) as url, httpx.Client(base_url=url) as http:
        assert http.get("/weight_info").json() == {"weight_version": "default"}
        assert http.get("/get_world_size").json() == {"world_size": 1}
        assert http.post("/finish_weight_update", json={"weight_version": 3}).status_code == 400
        assert http.post("/finish_weight_update", json={"weight_version": "3"}).json() == {
            "message": "Weight update finished"
        }
        assert http.get("/weight_info").json() == {"weight_version": "3"}
        assert http.post("/finish_weight_update").status_code == 200  # no tag: vLLM keeps its own
        assert http.get("/weight_info").json() == {"weight_version": "3"}
        assert http.post("/update_weight_version", json={"new_version": "4"}).json() == {
            "success": True, "new_version": "4"
        }  # fmt: skip
        assert http.post("/pause", params={"mode": "keep"}).json() == {"status": "paused"}
        assert http.get("/is_paused").json() == {"is_paused": True}
        assert http.post("/resume").json() == {"status": "resumed"}
        assert http.post("/pause", params={"mode": "later"}).status_code == 400
        assert http.post("/init_weight_transfer_engine", json={"init_info": {}}).status_code == 501
