"""Weight sync from a SEPARATE trainer process through vLLM's weight-transfer endpoints (gloo).

The trainer side is `engine.weight_client.WeightSyncClient`, the same code that talks to vLLM over NCCL.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch

from tests.engine.push_weights import perturbed

REPO = Path(__file__).resolve().parents[2]
PROMPT = [11, 12, 13, 14, 15, 16]


def push(model_dir: Path, url: str, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "tests.engine.push_weights", str(model_dir), url, mode],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def greedy(url: str) -> tuple[list[int], list[float], str]:
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 0,
              "return_token_ids": True, "ignore_eos": True},
    )  # fmt: skip
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"], r.headers["x-policy-version"]


def expected_greedy(model: torch.nn.Module, n: int = 8) -> list[int]:
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(PROMPT) :]


def state(url: str) -> tuple[str, bool]:
    version = httpx.get(f"{url}/weight_info").json()["weight_version"]
    return version, httpx.get(f"{url}/is_paused").json()["is_paused"]


def test_push_changes_outputs_and_tags_the_trainers_version(fresh_engine, tiny_dir, reference):
    before, _, version = greedy(fresh_engine.url)
    # vLLM's tag before any trainer named one (vllm/v1/engine/core.py).
    assert version == "default" and state(fresh_engine.url) == ("default", False)
    assert before == expected_greedy(reference[0])
    assert httpx.get(f"{fresh_engine.url}/get_world_size").json() == {"world_size": 1}

    assert push(tiny_dir, fresh_engine.url, "good") == {"versions": [1]}

    after, logprobs, version = greedy(fresh_engine.url)
    new_model = perturbed(str(tiny_dir))
    assert version == "1" and state(fresh_engine.url) == ("1", False)
    assert after != before and after == expected_greedy(new_model)
    # Served logprobs now come from the new weights (greedy: log-softmax of the raw logits).
    with torch.no_grad():
        logits = new_model(torch.tensor([PROMPT + after])).logits[0, len(PROMPT) - 1 : -1]
    expected = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(after)[:, None]).squeeze(1)
    assert logprobs == pytest.approx(expected.tolist(), abs=1e-5)


def test_two_packed_pushes_in_one_group(fresh_engine, tiny_dir):
    assert push(tiny_dir, fresh_engine.url, "twice") == {"versions": [1, 2]}
    after, _, version = greedy(fresh_engine.url)
    assert version == "2" and after == expected_greedy(perturbed(str(tiny_dir), step=2))


@pytest.mark.parametrize("mode", ["plain", "small-chunks"])
def test_plain_and_many_chunk_pushes_arrive_whole(fresh_engine, tiny_dir, mode):
    assert push(tiny_dir, fresh_engine.url, mode) == {"versions": [1]}
    assert greedy(fresh_engine.url)[0] == expected_greedy(perturbed(str(tiny_dir)))


def test_failed_update_leaves_the_engine_paused_on_its_old_weights(fresh_engine, tiny_dir):
    """As against vLLM, a failed update stops the run with the engine paused (docs/design.md 3.9); the
    embedded engine, which applies an update only whole, still holds its old weights and tag."""
    before, before_logprobs, _ = greedy(fresh_engine.url)
    outcome = push(tiny_dir, fresh_engine.url, "bad-shape")
    assert "has shape" in outcome["error"] and "left PAUSED" in outcome["error"]
    assert (outcome["step"], outcome["paused"]) == ("POST /update_weights", True)
    assert state(fresh_engine.url) == ("default", True)
    assert httpx.post(f"{fresh_engine.url}/resume").json() == {"status": "resumed"}
    after, after_logprobs, version = greedy(fresh_engine.url)
    assert (after, after_logprobs, version) == (before, before_logprobs, "default")


def test_trainer_dying_mid_update_leaves_old_weights_and_resumes(fresh_engine, tiny_dir):
    before, before_logprobs, _ = greedy(fresh_engine.url)
    assert "died_after" in push(tiny_dir, fresh_engine.url, "die")
    deadline = time.monotonic() + 60
    while state(fresh_engine.url)[1] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state(fresh_engine.url) == ("default", False)
    assert greedy(fresh_engine.url) == (before, before_logprobs, "default")
    r = httpx.post(f"{fresh_engine.url}/finish_weight_update")  # what a surviving trainer would send
    assert r.status_code == 500 and "still serving weight version 'default'" in r.json()["error"]["message"]


def test_endpoints_out_of_order_answer_as_vllm(fresh_engine):
    # vLLM's worker opens an update without a group; the update then fails inside the engine (500).
    r = httpx.post(f"{fresh_engine.url}/start_weight_update", json={"is_checkpoint_format": True})
    assert r.status_code == 200
    r = httpx.post(f"{fresh_engine.url}/update_weights", json={"update_info": {"names": [], "dtype_names": [],
                                                                               "shapes": []}})  # fmt: skip
    assert r.status_code == 500 and "init_weight_transfer_engine" in r.json()["error"]["message"]
    r = httpx.post(f"{fresh_engine.url}/init_weight_transfer_engine", json={})
    assert r.status_code == 400 and "init_info" in r.json()["error"]["message"]


async def test_pause_keep_holds_requests_until_resume(fresh_engine):
    url = fresh_engine.url
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        assert (await http.post("/pause", params={"mode": "keep"})).json() == {"status": "paused"}
        assert (await http.get("/is_paused")).json() == {"is_paused": True}
        request = asyncio.create_task(
            http.post(
                "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 4, "ignore_eos": True}
            )
        )
        await asyncio.sleep(0.5)
        assert not request.done()
        assert (await http.post("/resume")).json() == {"status": "resumed"}
        response = await request
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4


async def test_pause_abort_ends_in_flight_requests(fresh_engine):
    async with openai.AsyncOpenAI(base_url=f"{fresh_engine.url}/v1", api_key="x", max_retries=0) as client:
        stream = await client.completions.create(
            model="tiny", prompt="x", max_tokens=400, stream=True, extra_body={"ignore_eos": True}
        )
        first = await stream.__anext__()
        assert first.choices[0].finish_reason is None
        async with httpx.AsyncClient(base_url=fresh_engine.url) as http:
            await http.post("/pause", params={"mode": "abort"})
            reasons = [chunk.choices[0].finish_reason async for chunk in stream if chunk.choices]
            assert reasons[-1] == "abort" and len(reasons) < 399
            await http.post("/resume")
        done = await client.completions.create(model="tiny", prompt="x", max_tokens=2)
        assert done.usage.completion_tokens >= 1


async def test_pause_wait_lets_running_requests_finish(fresh_engine):
    async with httpx.AsyncClient(base_url=fresh_engine.url, timeout=60) as http:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 40, "ignore_eos": True}
        running = asyncio.create_task(http.post("/v1/completions", json=body))
        while not fresh_engine.scheduler.stats["tokens"]:
            await asyncio.sleep(0.01)
        assert (await http.post("/pause", params={"mode": "wait"})).json() == {"status": "paused"}
        # pause(wait) returned only once the engine had finished the request; its response may still
        # be on the way to this client, so the check is on the engine's side.
        assert fresh_engine.scheduler.num_running == 0
        response = (await running).json()
        assert response["choices"][0]["finish_reason"] == "length"
        assert response["usage"]["completion_tokens"] == 40
        assert (await http.get("/is_paused")).json() == {"is_paused": True}
        await http.post("/resume")
