"""The trainer on two processes: `accelerate launch` starts two CPU ranks (DDP over gloo) that take one
GRPO step against the real embedded engine and push their weights to it.

Everything is real: accelerate's launcher (torchrun underneath), the process group, DDP's gradient
all-reduce, the tiny model, the engine in this process serving the rollouts (DirectSessionFactory, no
Harbor server) and receiving the weights over gloo. Rank 0 runs the rollouts and hands rank 1 a share
of the rows. The run is also this module's `__main__`: each rank runs `_rank_main` and saves its final
parameters for the test to compare. A second, lighter pair of processes checks how rank 0's work and
its failures reach the other rank.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from capture_proxy.rows import TrainingRow
from tests.trainer.direct import DirectSessionFactory
from trainer.config import AsyncGRPOConfig
from trainer.distributed import shard_by_tokens
from trainer.grpo import HarnessAsyncGRPOTrainer
from trainer.packing import TrainItem

REPO = Path(__file__).resolve().parents[2]
# Half the vocabulary: three rollouts of eight random tokens all but surely score differently.
TASKS = [{"task_id": "t0", "prompt_ids": [20, 31, 42, 53], "targets": list(range(0, 6144, 2))}]


class RecordingTrainer(HarnessAsyncGRPOTrainer):
    """Remembers the step's rows (rank 0) and how many of them this rank trained on."""

    step_items: list | None = None
    rows_trained: int | None = None

    def _plan_step(self):
        shards = super()._plan_step()
        self.step_items = [item for shard in shards for item in shard.items]
        return shards

    def _optimize(self, items, trained, rows):
        self.rows_trained = len(items)
        return super()._optimize(items, trained, rows)


def _config(output_dir: Path, engine_url: str | None) -> AsyncGRPOConfig:
    return AsyncGRPOConfig(
        output_dir=str(output_dir), report_to="jsonl", seed=0, max_steps=1, num_generations=3,
        per_device_train_batch_size=3, max_concurrent_rollouts=3, max_completion_length=8, learning_rate=1e-2,
        max_tokens_per_batch=12,  # a row per pass: rank 0 makes two, rank 1 one and an idle one
        vllm_server_base_url=engine_url, weight_sync_backend="gloo", rollout_timeout_s=120,
    )  # fmt: skip


def _rank_main(engine_url: str, model_dir: str, out_dir: str) -> None:
    from engine.tiny_model import load_model_and_tokenizer

    torch.set_num_threads(1)
    model, tokenizer = load_model_and_tokenizer(Path(model_dir))
    config = _config(Path(out_dir) / "run", engine_url)
    factory = functools.partial(DirectSessionFactory, engine_url)
    trainer = RecordingTrainer(model, factory, config, train_dataset=TASKS, processing_class=tokenizer)
    history = trainer.train()
    rank = trainer.processes.rank
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    torch.save(
        {"world_size": trainer.processes.world_size, "rows": trainer.rows_trained, "history": history,
         "policy_version": trainer.policy_version, "params": params, "step_items": trainer.step_items},
        Path(out_dir) / f"rank{rank}.pt",
    )  # fmt: skip
    trainer.processes.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(engine_url: str, model_dir: Path, out_dir: Path) -> subprocess.CompletedProcess:
    # --multi_gpu picks accelerate's torchrun launcher; with no GPU the trainer's Accelerator forms a
    # gloo group on the CPUs (MULTI_CPU) and wraps the model in DDP.
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--main_process_ip", "127.0.0.1", "--main_process_port", str(_free_port()),
        "--mixed_precision", "no", "--dynamo_backend", "no",
        "-m", "tests.trainer.test_ddp", engine_url, str(model_dir), str(out_dir),
    ]  # fmt: skip
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        "TOKENIZERS_PARALLELISM": "false",
        "CUDA_VISIBLE_DEVICES": "",
    }  # fmt: skip  (CPU ranks even where a GPU is present)
    env.pop("WORLD_SIZE", None)
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the launcher and both ranks
        output, _ = process.communicate()
        raise AssertionError(f"the 2-process run did not finish in 240 s:\n{output[-6000:]}") from None
    return subprocess.CompletedProcess(command, process.returncode, output)


def test_two_cpu_ranks_take_a_step_and_sync_weights(fresh_engine, tiny_dir, tiny_model, tmp_path) -> None:
    initial = {name: p.detach().clone() for name, p in tiny_model[0].named_parameters()}
    assert fresh_engine.scheduler.weight_version == "default"  # a fresh engine: vLLM's initial tag
    run = _launch(fresh_engine.url, tiny_dir, tmp_path)
    assert run.returncode == 0, run.stdout[-6000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]

    assert [r["world_size"] for r in ranks] == [2, 2]
    # Rank 0 shared the step's three rows out: two for itself, one for rank 1 (which pads its passes).
    assert [r["rows"] for r in ranks] == [2, 1]
    # One step, logged by rank 0 alone; it had signal (the rewards of the group differ).
    logged = ranks[0]["history"]
    assert [h["step"] for h in logged] == [1] and ranks[1]["history"] == []
    assert logged[0]["num_trained_tokens"] == 3 * 8
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1]
    assert (tmp_path / "run" / "checkpoint-1" / "model.safetensors").is_file()

    # The engine took one push before the step (so it serves the trainer's weights) and one after it,
    # each tagged with the trainer's version.
    assert fresh_engine.scheduler.weight_version == "2"
    assert ranks[0]["policy_version"] == ranks[1]["policy_version"] == 2

    # DDP kept the ranks identical, the step moved every weight, and the engine serves the trained ones.
    engine_params = dict(fresh_engine.scheduler.model.named_parameters())
    for name, before in initial.items():
        on_rank0, on_rank1 = ranks[0]["params"][name], ranks[1]["params"][name]
        assert torch.equal(on_rank0, on_rank1), name
        assert not torch.equal(on_rank0, before), name
        assert torch.equal(engine_params[name].detach(), on_rank0), name

    # The split step is the one-process step on the same rows: same loss, same gradient norm (the ranks'
    # gradients, each over the whole step's trained tokens, averaged by DDP).
    one = HarnessAsyncGRPOTrainer(tiny_model[0], lambda **_: None, _config(tmp_path / "one", None), TASKS)
    items = ranks[0]["step_items"]
    trained = sum(item.row.num_trained_tokens for item in items)
    sums, _, _ = one._optimize(items)
    assert logged[0]["loss"] == pytest.approx(sums["loss"] / trained, rel=1e-4, abs=1e-6)
    assert logged[0]["grad_norm"] == pytest.approx(sums["grad_norm"] / trained, rel=1e-4)


def _item(tokens: int) -> TrainItem:
    row = TrainingRow((1,) * tokens, (0,) + (1,) * (tokens - 1), (0.0,) * tokens, ("n",), (0,), "s", ("n",))
    return TrainItem(row, 1.0)


def test_rows_are_shared_out_by_tokens_in_their_order() -> None:
    items = [_item(n) for n in (10, 40, 20, 30, 5)]
    shards = shard_by_tokens(items, 2)
    assert [[i.num_tokens for i in shard] for shard in shards] == [[10, 40, 5], [20, 30]]
    assert shard_by_tokens(items, 1) == [items]
    assert [len(s) for s in shard_by_tokens(items[:1], 3)] == [1, 0, 0]  # a rank may get nothing


def _collectives_main(rank: int, port: int, out_dir: str) -> None:
    """One of two spawned ranks: rank 0's work and its failure, as the other rank sees them."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES="",
                      OMP_NUM_THREADS="1")  # fmt: skip
    from trainer.distributed import AcceleratedProcesses, processes_from_env
    from trainer.errors import DistributedTrainingError

    processes = processes_from_env("auto")
    assert isinstance(processes, AcceleratedProcesses) and processes.rank == rank
    seen: dict = {
        "scattered": processes.scatter_from_main(lambda: ["for rank 0", "for rank 1"]),
        "broadcast": processes.on_main(lambda: {"version": 7}),
        "sums": processes.sum_metrics({"loss": rank + 1.0, f"only_{rank}": 1.0}),
        "max": processes.max_int(rank * 5),
    }

    def fail() -> None:
        raise ValueError("the rollout worker crashed")

    try:
        processes.on_main(fail)
    except (ValueError, DistributedTrainingError) as exc:
        seen["error"] = [type(exc).__name__, str(exc)]
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(seen))
    processes.close()


def test_rank_zero_hands_out_its_work_and_its_failures(tmp_path) -> None:
    import torch.multiprocessing as mp

    context = mp.start_processes(
        _collectives_main, args=(_free_port(), str(tmp_path)), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 120  # a rank left waiting forever is the failure this test looks for
    while not context.join(timeout=5):  # True once both ranks ended; re-raises a rank's exception
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise AssertionError("the ranks did not finish within 120 s")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["scattered"] for r in ranks] == ["for rank 0", "for rank 1"]
    assert [r["broadcast"] for r in ranks] == [{"version": 7}] * 2
    assert ranks[0]["sums"] == ranks[1]["sums"] == {"loss": 3.0, "only_0": 1.0, "only_1": 1.0}
    assert [r["max"] for r in ranks] == [5, 5]
    # Rank 0 raises its own error; rank 1, which was waiting for rank 0's result, learns why and stops.
    assert ranks[0]["error"] == ["ValueError", "the rollout worker crashed"]
    assert ranks[1]["error"][0] == "DistributedTrainingError"
    assert "rank 0 failed" in ranks[1]["error"][1] and "the rollout worker crashed" in ranks[1]["error"][1]


if __name__ == "__main__":
    _rank_main(*sys.argv[1:4])


def test_the_embedded_default_refuses_to_run_as_several_processes(monkeypatch, tmp_path) -> None:
    """Every rank would start its own engine, server and warm-up: refused, saying what to do instead."""
    from harbor_rl.train_pipeline import TrainRun, run_training
    from trainer.errors import TrainerConfigError

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(TrainerConfigError, match="--server-url and --llm-url"):
        run_training(TrainRun(), AsyncGRPOConfig(output_dir=str(tmp_path)))
