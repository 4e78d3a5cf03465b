"""The embedded engine and the vLLM imitation answer vLLM's RL routes as each pinned vLLM release does,
judged by the releases' own code (tests/vllm/: the route module, the exception handlers, the worker's
bookkeeping and the weight-transfer dataclasses, run from the unzipped wheels).

Three callers drive them: the same sequence of RL calls against vLLM 0.28.0 and 0.33.0, the embedded
engine and the imitation (status codes compared call by call; ROUTE_TABLE is the table of docs/design.md
3.9), TRL 1.16's own `VLLMClient` (trl/experimental/async_grpo/vllm_client.py) and our `WeightSyncClient`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import warnings

import httpx
import pytest
import torch
from trl.experimental.async_grpo.vllm_client import VLLMClient

from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread
from engine.weight_client import GlooTransport, Plan, WeightSyncClient, _free_port
from engine.weight_transfer import InitInfo, UpdateInfo
from harbor_rl_vllm.wire import pack_plan
from tests.vllm.loader import load_release
from tests.vllm.server import VllmServer
from tests.vllm.wheels import RELEASES

INIT = {"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": 2}
EMPTY = {"names": [], "dtype_names": [], "shapes": []}

# (method, path, query, body), then the status each release's own route code answers, in this order
# (each call sees the state the ones before it left). "bad-json" sends `{nope` as the body.
ROUTE_TABLE = [
    (("GET", "/get_world_size", None, None), 200, 200),
    (("GET", "/get_world_size", {"include_dp": "false"}, None), 200, 200),
    (("POST", "/init_weight_transfer_engine", None, {}), 400, 400),
    (("POST", "/init_weight_transfer_engine", None, "bad-json"), 400, 400),
    (("POST", "/init_weight_transfer_engine", None, {"init_info": [1]}), 500, 400),
    (("POST", "/init_weight_transfer_engine", None, {"init_info": {**INIT, "bogus": 1}}), 500, 500),
    (("POST", "/init_weight_transfer_engine", None, {"init_info": {"master_address": "h", "rank_offset": 1,
                                                                   "world_size": 2}}), 500, 500),
    (("POST", "/update_weights", None, {}), 400, 400),
    (("POST", "/update_weights", None, {"update_info": EMPTY}), 500, 500),  # no update open
    (("POST", "/finish_weight_update", None, None), 500, 500),  # no update open
    (("POST", "/start_weight_update", None, {"is_checkpoint_format": True}), 200, 200),  # needs no group
    (("POST", "/start_weight_update", None, None), 500, 500),  # one is open already
    (("POST", "/update_weights", None, {"update_info": {**EMPTY, "packed": True}}), 500, 500),  # ends it
    (("POST", "/start_weight_update", None, None), 200, 200),
    (("POST", "/update_weights", None, {"update_info": {**EMPTY, "names": ["a"]}}), 500, 500),
    (("POST", "/start_weight_update", None, None), 200, 200),
    (("POST", "/update_weights", None, {"update_info": EMPTY}), 500, 500),  # no transfer group
    (("POST", "/finish_weight_update", None, {"weight_version": 3}), 400, 400),
    (("POST", "/finish_weight_update", None, {"weight_version": "3"}), 500, 500),  # the update failed
    (("POST", "/start_weight_update", None, None), 200, 200),
    (("POST", "/finish_weight_update", None, {"weight_version": "3"}), 200, 200),
    (("GET", "/weight_info", None, None), 200, 200),
    (("POST", "/update_weight_version", None, {}), 400, 400),
    (("POST", "/update_weight_version", None, {"new_version": "7"}), 200, 200),
    (("POST", "/pause", {"mode": "later"}, None), 400, 400),
    (("POST", "/pause", {"mode": "keep"}, None), 200, 200),
    (("GET", "/is_paused", None, None), 200, 200),
    (("POST", "/pause", {"mode": "abort"}, None), 200, 200),
    (("POST", "/resume", None, None), 200, 200),
    (("POST", "/resume", None, None), 200, 200),
    (("POST", "/reset_prefix_cache", None, None), 200, 200),
    (("GET", "/server_info", {"config_format": "json"}, None), 200, 200),
]  # fmt: skip
EMBEDDED_FOLLOWS = "0.33.0"
"""Where the releases differ (a non-object init_info: 0.28's engine refuses it, 0.33's route does),
the embedded engine answers as 0.33, the release of the default Jobs image."""


def run_table(url: str) -> list[tuple[int, object]]:
    """Every call of ROUTE_TABLE: (status, body), each on a fresh connection (vLLM closes its
    connection after a 500, see below)."""
    out = []
    with httpx.Client(base_url=url, timeout=10, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        for (method, path, query, body), *_ in ROUTE_TABLE:
            kwargs: dict = {"params": query}
            if body == "bad-json":
                kwargs |= {"content": b"{nope", "headers": {"content-type": "application/json"}}
            elif body is not None:
                kwargs["json"] = body
            response = http.request(method, path, **kwargs)
            out.append((response.status_code, response.json() if response.content else None))
    return out


@pytest.fixture(scope="module", params=RELEASES)
def vllm_routes(request):
    server = VllmServer(load_release(request.param))
    with server.serve():
        yield server


def test_the_table_is_what_each_releases_own_routes_answer(vllm_routes) -> None:
    column = 1 + RELEASES.index(vllm_routes.release.version)
    answers = run_table(vllm_routes.url)
    assert [status for status, _ in answers] == [row[column] for row in ROUTE_TABLE]
    assert answers[-2][1] == {"success": True}  # /reset_prefix_cache
    assert answers[20][1] == {"message": "Weight update finished"} and answers[21][1] == {
        "weight_version": "3"
    }


def _answer_then_closed(url: str, path: str) -> tuple[bytes, bool]:
    """POST `path` on one keep-alive connection: (the status line, whether the server then closed it)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
            data += sock.recv(65536)
        sock.settimeout(1.0)
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
    return data.split(b"\r\n", 1)[0], closed


def _length(data: bytes) -> int:
    head = data.partition(b"\r\n\r\n")[0].decode().lower()
    return next(
        (int(line.split(":")[1]) for line in head.split("\r\n") if line.startswith("content-length:")), 0
    )


def test_vllm_closes_the_connection_after_an_engine_failure(vllm_routes) -> None:
    """A failure inside vLLM's engine is a plain Exception, handled by the app's `Exception` handler,
    which Starlette runs in ServerErrorMiddleware: the 500 is sent, the exception re-raised, and uvicorn
    closes the connection. A pooled client that reuses it can lose the next call (WeightSyncClient
    opens a fresh connection per call). A refusal of vLLM's routes themselves keeps the connection."""
    assert _answer_then_closed(vllm_routes.url, "/finish_weight_update") == (
        b"HTTP/1.1 500 Internal Server Error",
        True,
    )
    assert _answer_then_closed(vllm_routes.url, "/update_weights") == (b"HTTP/1.1 400 Bad Request", False)


def test_the_embedded_engine_answers_the_table(fresh_engine) -> None:
    answers = run_table(fresh_engine.url)
    column = 1 + RELEASES.index(EMBEDDED_FOLLOWS)
    assert [status for status, _ in answers] == [row[column] for row in ROUTE_TABLE]
    assert answers[-2][1] == {"success": True}
    assert answers[-1][1]["vllm_config"]["model_config"]["dtype"] == "torch.float32"
    assert all(set(body) == {"error"} for status, body in answers if status >= 400)  # vLLM's ErrorResponse


@pytest.mark.parametrize("release", RELEASES)
def test_the_imitation_answers_the_table_per_release(release) -> None:
    settings = ImitationSettings(vllm_release=release.rpartition(".")[0])
    with serve_in_thread(create_imitation_app(settings)) as url:
        answers = run_table(url)
    column = 1 + RELEASES.index(release)
    assert [status for status, _ in answers] == [row[column] for row in ROUTE_TABLE]
    assert answers[21][1] == {"weight_version": "3"} and answers[-1][1]["vllm_config"]["model_config"][
        "dtype"
    ] == ("torch.bfloat16")


async def test_the_imitation_pauses_new_requests_as_each_release_does() -> None:
    """0.28 queues a request that arrives while paused in abort/wait mode until /resume; 0.33 refuses it
    with 503 (`_reject_add_while_paused`, vllm/v1/engine/core.py; RetryableRequestError, 503, in
    serve/exception_handling/error_response.py); `keep` queues it in both."""
    body = {"model": "imitation-model", "prompt": "x", "max_tokens": 2}
    for release, mode, expected in (("0.33", "abort", 503), ("0.33", "wait", 503), ("0.33", "keep", 200),
                                    ("0.28", "abort", 200), ("0.28", "keep", 200)):  # fmt: skip
        with serve_in_thread(create_imitation_app(ImitationSettings(vllm_release=release))) as url:
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                await http.post("/pause", params={"mode": mode})
                request = asyncio.create_task(http.post("/v1/completions", json=body))
                await asyncio.sleep(0.3)
                if expected == 200:
                    assert not request.done()  # held until /resume
                    await http.post("/resume")
                response = await request
                assert response.status_code == expected, (release, mode)
                if expected == 503:
                    assert response.json()["error"]["type"] == "ServiceUnavailableError"


# -- the wire's dataclasses and chunking, against vLLM's own --------------------------------------


@pytest.mark.parametrize("version", RELEASES)
def test_wire_models_have_vllms_fields_and_defaults(version) -> None:
    release = load_release(version)
    common = release.module("vllm.distributed.weight_transfer.nccl_common")
    engine = release.module("vllm.distributed.weight_transfer.nccl_engine")
    theirs = {f.name: f.default for f in dataclasses.fields(common.NCCLWeightTransferInitInfo)}
    theirs.pop("nccl_unique_id_b64", None)  # 0.33's torch-free rendezvous, which a gloo group cannot offer
    assert set(InitInfo.model_fields) == set(theirs)
    assert {k: InitInfo.model_fields[k].default for k in ("packed", "packed_buffer_size_bytes",
                                                          "packed_num_buffers")} == {
        k: theirs[k] for k in ("packed", "packed_buffer_size_bytes", "packed_num_buffers")
    }  # fmt: skip
    assert set(UpdateInfo.model_fields) == {
        f.name for f in dataclasses.fields(engine.NCCLWeightTransferUpdateInfo)
    }


@pytest.mark.parametrize("version", RELEASES)
def test_chunks_are_cut_where_vllms_pack_tensors_cuts_them(version) -> None:
    release = load_release(version)
    packed = release.module("vllm.distributed.weight_transfer.packed_tensor")
    generator = torch.Generator().manual_seed(0)
    for buffer in (1, 7, 8, 64, 1000):
        sizes = torch.randint(1, 40, (25,), generator=generator).tolist()
        dtypes = [("float32", "bfloat16", "int8")[i % 3] for i in range(len(sizes))]
        named = [
            (str(i), torch.zeros(n, dtype=getattr(torch, d)))
            for i, (n, d) in enumerate(zip(sizes, dtypes, strict=True))
        ]
        theirs, items = [], iter(named)
        with release.active(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # vLLM warns of tensors over the buffer: wanted here
            while (chunk := packed.pack_tensors(items, lambda item: item[1], buffer)) is not None:
                theirs.append([int(name) for name in chunk.names])
        assert pack_plan(dtypes, [[n] for n in sizes], buffer) == theirs


def test_a_0dim_tensor_is_planned_as_shape_1() -> None:
    plan = Plan.build([("s", torch.float32, ()), ("w", torch.float32, (2, 3))], torch.bfloat16)
    assert plan.update_info == {
        "names": ["s", "w"],
        "dtype_names": ["bfloat16", "bfloat16"],
        "shapes": [[1], [2, 3]],
    }


# -- TRL's own client and ours against the embedded engine ----------------------------------------


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
    plan = Plan.build([(n, t.dtype, tuple(t.shape)) for n, t in named], None)
    sender = threading.Thread(target=transport.send, args=(iter(named), plan))
    sender.start()
    trl.update_weights(plan.update_info, timeout=60)
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
        assert sync.engine_dtype == torch.float32  # read from /server_info, as TRL's get_dtype does
    assert httpx.get(f"{fresh_engine.url}/weight_info").json() == {"weight_version": "5"}


def test_a_client_on_auto_sends_over_the_backend_the_engine_names(fresh_engine) -> None:
    info = httpx.get(f"{fresh_engine.url}/server_info", params={"config_format": "json"}).json()
    assert info["vllm_config"]["weight_transfer_config"] == {"backend": "gloo"}
    named = list(fresh_engine.scheduler.model.named_parameters())
    with WeightSyncClient(fresh_engine.url, timeout_s=60) as sync:  # backend defaults to auto
        assert sync.transport is None  # nothing chosen before the engine is asked
        sync.push(named, version=1)
        assert sync.backend == "gloo"


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
