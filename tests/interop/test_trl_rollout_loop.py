"""TRL's own rollout loop drives our server: trl 1.16.0's `_HarnessRolloutLoop`
(`trl/experimental/async_grpo/openenv_harness.py`), built in loop-owning mode exactly as
`HarnessRolloutWorker` builds it in its child process, with `partial(HarborSessionFactory, ...)` as its
`harness_session_factory`, against a real `harbor serve` (local sandboxes) and the embedded engine
serving the tiny model. Nothing of TRL or OpenEnv is imitated; only vLLM is absent, and loop-owning
rollouts never call it from the loop (the agents call the engine through the capture proxy)."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

datasets = pytest.importorskip("datasets")
harness_module = pytest.importorskip("trl.experimental.async_grpo.openenv_harness")
from openenv.core.harness import TrainableSession  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from engine.in_process import serve_in_thread  # noqa: E402
from engine.tiny_model import build_tiny_model  # noqa: E402
from harbor_server import HarborSessionFactory  # noqa: E402
from tests.server.conftest import make_config, running_server, sandbox_root  # noqa: E402, F401 - fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(seed=0, cache_dir=tmp_path_factory.mktemp("harbor-cache"))


@pytest.fixture(scope="module")
def engine_url(tiny_dir):
    from engine.server import EngineConfig, create_app

    config = EngineConfig(model=str(tiny_dir), served_model_name="tiny", return_tokens_as_token_ids=True,
                          num_threads=1)  # fmt: skip
    with serve_in_thread(create_app(config)) as url:
        yield url + "/v1"


@pytest.fixture
def server(tmp_path, sandbox_root, engine_url):  # noqa: F811 - the imported fixture
    with running_server(make_config(tmp_path, llm_url=engine_url, model="tiny")) as thread:
        yield thread


def _trl_loop(factory, tokenizer, rows) -> harness_module._HarnessRolloutLoop:
    """The loop as HarnessRolloutWorker's child builds it (`_child_main`: loop kwargs + the mp plumbing)."""
    ctx = mp.get_context("spawn")
    return harness_module._HarnessRolloutLoop(
        harness_session_factory=factory,
        rollout_reward_fn=None,
        model_name="tiny",
        dataset=datasets.Dataset.from_list(rows),
        reward_funcs=[],
        processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
        num_generations=2,
        max_tokens=48,
        temperature=1.0,
        rollout_buffer=ctx.Queue(),
        model_version_value=ctx.Value("i", 0),
        heartbeat_value=ctx.Value("d", 0.0),
        failed_event=ctx.Event(),
        exception_info_queue=ctx.Queue(maxsize=1),
        metrics_queue=ctx.Queue(),
    )


def _rows(server) -> list[dict]:
    with HarborSessionFactory(server.url, split="builtin", harness="oracle") as lister:
        return [{"prompt": row["prompt"], "task_id": row["task_id"]} for row in lister.prompt_rows()]


def test_trls_loop_scores_the_oracle_through_our_factory(server, engine_url, tiny_dir):
    factory = functools.partial(
        HarborSessionFactory, server.url, split="builtin", harness="oracle", sandbox="local",
        llm_url=engine_url, model="tiny",
    )  # fmt: skip
    rows = _rows(server)
    loop = _trl_loop(factory, AutoTokenizer.from_pretrained(tiny_dir), rows)
    # TRL built our factory with OpenEnv's full neutral training policy.
    assert (
        loop._factory.config.sampling.repetition_penalty == 1.0 and loop._factory.config.sampling.top_k == -1
    )
    session = loop._factory.create(rows[0]["prompt"], seed=0, episode_id="probe")
    assert isinstance(session, TrainableSession)
    session.close()

    (completion, completion_ids, sequences, calls, failures, reward), metrics = loop._run_session(
        rows[0]["prompt"], group_id=3
    )
    assert reward == 1.0 and metrics is not None  # None would mean TRL found it unscoreable
    assert sequences == [] and completion_ids == []  # the oracle makes no model call


def test_a_mini_swe_agent_rollout_gives_trl_the_engines_tokens(server, engine_url, tiny_dir):
    factory = functools.partial(
        HarborSessionFactory, server.url, split="builtin", harness="mini-swe-agent", sandbox="local",
        llm_url=engine_url, model="tiny", agent_timeout_sec=300, agent_step_limit=3,
    )  # fmt: skip
    rows = _rows(server)
    row = next(r for r in rows if r["task_id"] == "fix-pagination")
    loop = _trl_loop(factory, AutoTokenizer.from_pretrained(tiny_dir), rows)
    (completion, completion_ids, sequences, calls, failures, reward), metrics = loop._run_session(
        row["prompt"], group_id=0
    )
    assert isinstance(reward, float) and reward == 0.0  # scored: the tiny model does not fix the bug
    assert sequences and completion_ids and metrics["turns"] >= 1
    assert completion[-1]["role"] == "assistant" and completion[0]["role"] in ("system", "user")

    # What TRL trains on is the engine's own tokens, as the server stored them (never re-tokenised).
    with HarborSessionFactory(server.url, split="builtin", harness="oracle") as lister:
        [state] = [s for s in lister.client.rollouts(task_id="fix-pagination") if s.status == "completed"]
        trace = lister.client.trace(state.rollout_id)
    sampled = [tid for turn in trace.turns for tid in turn.completion_token_ids]
    assert completion_ids == sampled
    first = sequences[0]
    engine_turn = trace.turns[0]
    assert list(first.input_ids[: len(engine_turn.prompt_token_ids)]) == engine_turn.prompt_token_ids


def test_the_trl_guide_example_runs_until_trl_needs_vllm(server, engine_url, tiny_dir):
    """examples/trl_harness_grpo.py against a real server: it reads the tasks and gets as far as TRL's
    rollout worker, which needs vLLM (not installed here) and says so."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "trl_harness_grpo.py"
    done = subprocess.run(
        [sys.executable, str(script), "--server-url", server.url, "--vllm-url", engine_url.removesuffix("/v1"),
         "--model", str(tiny_dir), "--sandbox", "local"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-2000:]
    assert "13 tasks from" in done.stdout and "stopping where TRL needs vLLM" in done.stderr
