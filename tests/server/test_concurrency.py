"""32 concurrent rollouts on one real server: none lost, none mixed up, /health answering throughout.

The engine is `engine.imitation`'s imitation of vLLM's HTTP server (vLLM itself needs a GPU);
every rollout's harness calls it from inside its own `local` sandbox through the capture port with
its own session key, asking with its episode id, so a trace holding another rollout's call would show.
The precise latency measurement is bench/server_concurrency.py; here the bound is generous.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread
from harbor_server.client import HarborSessionFactory
from harbor_server.errors import TraceNotTrainable
from tests.server.conftest import make_config, running_server
from tests.server.scripted import SERVER_KWARGS

pytestmark = pytest.mark.timeout(600)

N_ROLLOUTS = 32
MODEL = "imitation-model"


@pytest.fixture
def engine_url():
    with serve_in_thread(create_imitation_app(ImitationSettings(model=MODEL, latency_s=0.05))) as url:
        yield url + "/v1"


def _poll_health(url: str, stop: threading.Event, latencies: list[float], failures: list[str]) -> None:
    with httpx.Client(timeout=5) as client:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                response = client.get(url + "/health")
                if response.status_code != 200:
                    failures.append(f"{response.status_code}: {response.text}")
            except httpx.HTTPError as exc:
                failures.append(repr(exc))
            latencies.append(time.perf_counter() - t0)
            stop.wait(0.02)


@pytest.mark.slow
def test_32_concurrent_rollouts_none_lost_none_mixed(tmp_path, sandbox_root, engine_url):
    config = make_config(tmp_path, max_concurrent_envs=N_ROLLOUTS, llm_url=engine_url, model=MODEL)
    with (
        running_server(config, **SERVER_KWARGS) as server,
        HarborSessionFactory(
            server.url, split="builtin", harness="scripted", sandbox="local", purpose="eval"
        ) as factory,
    ):
        n_tasks = len(list(factory.prompt_rows()))
        stop, latencies, failures = threading.Event(), [], []
        poller = threading.Thread(target=_poll_health, args=(server.url, stop, latencies, failures))
        poller.start()
        try:
            with ThreadPoolExecutor(N_ROLLOUTS) as pool:
                sessions = list(pool.map(
                    lambda i: factory.create(i % n_tasks, seed=i, episode_id=f"episode-{i:02d}"), range(N_ROLLOUTS)
                ))  # fmt: skip
                assert len({s.rollout_id for s in sessions}) == N_ROLLOUTS
                results = list(pool.map(lambda s: s.wait_for_completion(timeout_s=500), sessions))
        finally:
            stop.set()
            poller.join()

        for i, (session, result) in enumerate(zip(sessions, results, strict=True)):
            marker = f"episode-{i:02d}"
            assert result.rollout_id == session.rollout_id
            assert result.status == "completed", result.error
            assert result.episode_id == marker and result.seed == i
            assert result.tool_calls_by_name == {"chat": 1, f"marker:{marker}": 1}
            assert result.env_reward == 0.0  # the harness did not touch the task
            assert result.num_turns == 1
            trace = session.fetch_training_trace()
            [turn] = trace.turns
            assert turn.request["messages"] == [{"role": "user", "content": marker}]
            assert trace.metadata["rollout"]["episode_id"] == marker
            assert turn.completion_token_ids and len(turn.per_token_logps) == len(turn.completion_token_ids)

        assert failures == []
        assert len(latencies) > 20
        latencies.sort()
        p99 = latencies[int(0.99 * (len(latencies) - 1))]
        assert p99 < 1.0, f"/health p99 {p99 * 1000:.0f} ms under {N_ROLLOUTS} rollouts"
        assert httpx.get(server.url + "/health").json()["live_rollouts"] == 0


def test_single_call_train_rollout_trace_is_refused_with_findings(tmp_path, sandbox_root, engine_url):
    """A multi-step agent that made one call is a degenerate training capture: 409 with the findings."""
    config = make_config(tmp_path, llm_url=engine_url, model=MODEL)
    with (
        running_server(config, **SERVER_KWARGS) as server,
        HarborSessionFactory(
            server.url, split="builtin", harness="scripted", sandbox="local", purpose="train"
        ) as factory,
    ):
        session = factory.create(0, episode_id="degenerate")
        assert session.verify().env_reward == 0.0
        with pytest.raises(TraceNotTrainable) as caught:
            session.fetch_training_trace()
        assert "degenerate_rollout" in {f["code"] for f in caught.value.findings}
        response = httpx.get(f"{server.url}/rollouts/{session.rollout_id}/trace")
        assert response.status_code == 409 and response.json()["findings"]
