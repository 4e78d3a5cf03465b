"""ROUTE_TABLE (tests/engine/test_vllm_conformance.py, docs/design.md 3.9) against the live vLLM: the
status each of vLLM's RL routes answers, call after call, as `harbor engine --backend vllm` serves them
(dev mode, the project's gloo weight-transfer backend configured, no transfer group formed). The table was
read from vLLM's route code in the unzipped 0.28 and 0.33 wheels; the live 0.32 server answers as 0.33 does
where the two differ (a non-object `init_info` is refused by the route's pydantic model, 400). The imitation,
which the fast tests use, must answer every row with the same status and error type."""

from __future__ import annotations

import httpx
import pytest

from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread
from tests.engine.test_vllm_conformance import ROUTE_TABLE, run_table
from tests.vllm.wheels import RELEASES

pytestmark = pytest.mark.timeout(900)  # the module's first test may wait for vLLM's start
LIVE_FOLLOWS = "0.33.0"
PROBE = {"model": "tiny", "prompt": "def f(", "max_tokens": 4, "seed": 5, "logprobs": 0, "temperature": 0.9}
"""A seeded call made before and after the table: its ids and logprobs must not change."""


def _sample(vllm) -> tuple[list[int], list[float]]:
    reply = httpx.post(f"{vllm.v1}/completions", json=PROBE, timeout=120)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def _kind(body) -> str | None:
    return body["error"]["type"] if isinstance(body, dict) and "error" in body else None


def test_the_live_vllm_answers_the_route_table(vllm):
    before = _sample(vllm)
    version = httpx.get(f"{vllm.url}/weight_info").json()["weight_version"]
    try:
        answers = run_table(vllm.url)
    finally:  # the folder shares this server: leave it running, tagged as it was
        httpx.post(f"{vllm.url}/resume")
        httpx.post(f"{vllm.url}/update_weight_version", json={"new_version": version})
    column = 1 + RELEASES.index(LIVE_FOLLOWS)
    assert [status for status, _ in answers] == [row[column] for row in ROUTE_TABLE]
    assert all(set(body) == {"error"} for status, body in answers if status >= 400)  # vLLM's ErrorResponse
    assert answers[20][1] == {"message": "Weight update finished"}
    assert answers[21][1] == {"weight_version": "3"} and answers[-2][1] == {"success": True}
    assert answers[-1][1]["vllm_config"]["weight_transfer_config"]["backend"] == "gloo"
    # An update opened and finished with no tensors sent leaves the served weights as they were.
    assert _sample(vllm) == before
    assert httpx.get(f"{vllm.url}/is_paused").json() == {"is_paused": False}

    with serve_in_thread(create_imitation_app(ImitationSettings(vllm_release="0.33"))) as url:
        imitated = run_table(url)
    assert [(s, _kind(b)) for s, b in imitated] == [(s, _kind(b)) for s, b in answers]
