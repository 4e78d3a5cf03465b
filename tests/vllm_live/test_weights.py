"""Weight pushes to the live vLLM (CPU build, tiny model) through the project's plugin (harbor_rl_vllm: gloo
weight transfer, registered at vLLM's `register_weight_transfer_engine` point), driven by the trainer's
unchanged `WeightSyncClient` over vLLM's own routes, pause/resume and layerwise reload.

After each push the logprobs vLLM serves must equal a transformers forward of the pushed weights within
1e-5 (the tiny model ties its LM head to its embedding, which vLLM's reload reports as "ParallelLMHead:
Failed to load weights"), and the failure cases of docs/reliability.md that a live server can be driven
into end as they do against vLLM's unzipped code: a load failure at a named tensor and a trainer that dies
mid-push leave vLLM alive and untagged, and the next run's push restores it.

This module runs last in the folder (the package's vLLM is shared) and leaves vLLM on the weights it
started with."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.errors import WeightSyncError
from engine.weight_client import WeightSyncClient
from trainer.weights import pushed_weights

pytestmark = pytest.mark.timeout(900)  # the first test may wait for vLLM's start
PROMPT = list(range(10, 42))
TOLERANCE = 1e-5


def served(vllm, seed: int = 7) -> tuple[list[int], list[float]]:
    """12 tokens vLLM samples at T=1 after PROMPT (token ids in, token ids and their logprobs out)."""
    body = {"model": vllm.served_model_name, "prompt": PROMPT, "max_tokens": 12, "temperature": 1.0,
            "seed": seed, "logprobs": 0, "return_token_ids": True}  # fmt: skip
    reply = httpx.post(f"{vllm.v1}/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def rescored(model: torch.nn.Module, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + ids])).logits[0]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return [logprobs[len(PROMPT) - 1 + i, token].item() for i, token in enumerate(ids)]


def gap(vllm, model: torch.nn.Module, seed: int = 7) -> float:
    """Largest difference between what vLLM serves and what `model` gives the same ids."""
    ids, logprobs = served(vllm, seed)
    return max(abs(a - b) for a, b in zip(logprobs, rescored(model, ids), strict=True))


def weight_version(vllm) -> str:
    return httpx.get(f"{vllm.url}/weight_info", timeout=10).json()["weight_version"]


@pytest.fixture(scope="module")
def model(vllm):
    """The trainer's copy of the served weights; vLLM is given them back at the end of the module."""
    model = AutoModelForCausalLM.from_pretrained(vllm.model_path, dtype=torch.float32).eval()
    original = {name: p.detach().clone() for name, p in model.named_parameters()}
    yield model
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(original[name])
    with WeightSyncClient(vllm.url) as sync:
        sync.push(pushed_weights(model), version=0)
    assert gap(vllm, model) < TOLERANCE


def perturb(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)


def test_served_logprobs_follow_each_push(vllm, model):
    assert gap(vllm, model) < TOLERANCE  # the engine starts on the checkpoint's weights
    before = served(vllm)
    perturb(model, seed=1)  # every parameter, the tied embedding too
    with WeightSyncClient(vllm.url, packed_buffer_size_bytes=1 << 20) as sync:  # several packed chunks
        started = time.monotonic()
        sync.push(pushed_weights(model), version=1)
        first = time.monotonic() - started
        assert sync.backend == "gloo"  # read from vLLM's /server_info, as against any vLLM
        assert sync.engine_dtype == torch.float32
        assert weight_version(vllm) == "1"
        assert served(vllm) != before
        assert gap(vllm, model) < TOLERANCE
        perturb(model, seed=2)
        sync.push(pushed_weights(model), version=2)  # the same group, a second time
        assert weight_version(vllm) == "2"
        assert gap(vllm, model) < TOLERANCE
    print(f"first push over gloo to vLLM: {first:.2f} s")


def test_a_load_failure_at_a_named_tensor_leaves_vllm_untagged_and_the_next_push_restores_it(vllm, model):
    tag = weight_version(vllm)
    named = [(name, p.detach()) for name, p in pushed_weights(model)]
    bad = [*named[:-1], ("model.layers.0.mlp.no_such_proj.weight", named[-1][1])]
    with WeightSyncClient(vllm.url) as sync, pytest.raises(WeightSyncError) as failure:
        sync.push(bad, version=99)
    assert failure.value.step == "POST /update_weights" and failure.value.paused
    assert "no_such_proj" in str(failure.value)  # vLLM's own message, passed on
    assert weight_version(vllm) == tag  # vLLM tags only an update whose finish went through
    # vLLM refuses to finish the failed update (its worker closed it: vllm/v1/worker/gpu_worker.py).
    refused = httpx.post(f"{vllm.url}/finish_weight_update", json={"weight_version": "99"}, timeout=30)
    assert refused.status_code == 500
    # What `harbor train --resume` does next: a new client pushes whole weights and resumes vLLM.
    with WeightSyncClient(vllm.url) as sync:
        sync.push(pushed_weights(model), version=3)
    assert weight_version(vllm) == "3"
    assert gap(vllm, model) < TOLERANCE


DYING_TRAINER = textwrap.dedent(
    """
    import os, sys, torch
    from transformers import AutoModelForCausalLM
    from engine.weight_client import WeightSyncClient
    from trainer.weights import pushed_weights

    model = AutoModelForCausalLM.from_pretrained(sys.argv[2], dtype=torch.float32)
    stream = pushed_weights(model)

    class Dying:  # the trainer's stream; its process dies with a few chunks on the wire (OOM killer, node lost)

        def metadata(self):
            return stream.metadata()

        def __iter__(self):
            for i, item in enumerate(stream):
                if i == 20:
                    print("dying mid-push", file=sys.stderr, flush=True)
                    os._exit(9)
                yield item

    WeightSyncClient(sys.argv[1], packed_buffer_size_bytes=1 << 16).push(Dying(), version=98)
    """
)


def test_a_trainer_dying_mid_push_leaves_vllm_serving_and_a_new_trainer_restores_it(vllm, model, tmp_path):
    tag = weight_version(vllm)
    script = tmp_path / "dying_trainer.py"
    script.write_text(DYING_TRAINER)
    env = os.environ | {"PYTHONPATH": os.getcwd()}
    died = subprocess.run([sys.executable, str(script), vllm.url, str(vllm.model_path)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert died.returncode == 9 and "dying mid-push" in died.stderr, died.stderr[-2000:]
    # vLLM's worker was left in a gloo receive whose peer is gone: it fails the update, not the server.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if httpx.post(f"{vllm.url}/finish_weight_update", json={}, timeout=30).status_code == 500:
            break  # no update open any more: the receive has ended
        time.sleep(1)
    assert httpx.get(f"{vllm.url}/health", timeout=10).status_code == 200
    assert weight_version(vllm) == tag
    with WeightSyncClient(vllm.url) as sync:  # the restarted trainer: a new group, whole weights
        sync.push(pushed_weights(model), version=4)
    assert weight_version(vllm) == "4"
    assert gap(vllm, model) < TOLERANCE
