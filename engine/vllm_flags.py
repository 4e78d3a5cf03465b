"""`vllm serve`'s flags on `harbor engine`: each one the embedded engine honours, ignores with a note, or
refuses in one line, so a user can swap `vllm serve` for `harbor engine` on the same command line.

Names and values are vLLM's (`vllm/engine/arg_utils.py` EngineArgs, `vllm/config/model.py` LogprobsMode,
`vllm/config/weight_transfer.py`, `vllm/entrypoints/openai/cli_args.py`), read at 0.33.0.
"""

from __future__ import annotations

import dataclasses
import json

from engine.errors import EngineConfigError

DTYPES = {"auto": "float32", "float32": "float32", "float": "float32", "bfloat16": "bfloat16",
          "float16": "float16", "half": "float16"}  # fmt: skip
"""vLLM's `--dtype` choices -> the torch dtype served. `auto` is float32 here: the CPU's fast kernels are
float32 ones (vLLM's auto would pick the checkpoint's half precision)."""
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
"""vLLM's LogprobsMode; the engine reports processed logprobs, what the trainer recomputes."""
TOOL_CALL_PARSER = "hermes"
"""The one format the engine parses: Qwen2.5's `<tool_call>` JSON, as vLLM's `hermes` parser does."""


@dataclasses.dataclass(frozen=True)
class VllmFlags:
    """The `vllm serve` flags given to `harbor engine`; construction refuses what cannot be honoured."""

    unknown: list[str]
    """Arguments the command did not recognise."""
    model_arg: str | None
    """`vllm serve MODEL`'s positional model."""
    model: str
    dtype: str = "auto"
    tool_call_parser: str | None = None
    logprobs_mode: str = "processed_logprobs"
    weight_transfer_config: str | None = None
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        # click hands an unknown option to the positional MODEL when it comes first
        given = ([self.model_arg] if self.model_arg else []) + self.unknown
        flags = [a for a in given if a.startswith("-")]
        if flags or self.unknown:
            first = (flags or self.unknown)[0]
            raise EngineConfigError(
                f"{first}: not an option of harbor engine (nor a vllm serve flag it takes); "
                "`harbor engine --help` lists the ones it does"
            )
        if self.model_arg is not None and self.model not in ("tiny", self.model_arg):
            raise EngineConfigError(
                f"the model is given twice: {self.model_arg!r} and --model {self.model!r}; give one"
            )
        if self.dtype not in DTYPES:
            raise EngineConfigError(f"--dtype {self.dtype!r}: expected one of {', '.join(DTYPES)}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise EngineConfigError(
                f"--logprobs-mode {self.logprobs_mode!r}: expected one of {', '.join(LOGPROBS_MODES)}"
            )
        if self.logprobs_mode != "processed_logprobs":
            raise EngineConfigError(
                f"--logprobs-mode {self.logprobs_mode}: the embedded engine reports processed_logprobs only "
                "(the logprobs of the sampling distribution, which the trainer recomputes)"
            )
        if self.tool_call_parser not in (None, TOOL_CALL_PARSER):
            raise EngineConfigError(
                f"--tool-call-parser {self.tool_call_parser}: the embedded engine parses hermes tool calls "
                "only (the Qwen2.5 format of its models); use --tool-call-parser hermes"
            )
        if self.tensor_parallel_size != 1:
            raise EngineConfigError(
                f"--tensor-parallel-size {self.tensor_parallel_size}: the embedded engine runs on one device; "
                "serve with vllm for tensor parallelism"
            )
        _ = self.weight_transfer_backend  # refuses bad JSON at start-up, not at the first push

    @property
    def served_model(self) -> str:
        return self.model_arg or self.model

    @property
    def torch_dtype(self) -> str:
        return DTYPES[self.dtype]

    @property
    def weight_transfer_backend(self) -> str | None:
        if self.weight_transfer_config is None:
            return None
        try:
            config = json.loads(self.weight_transfer_config)
        except ValueError as exc:
            raise EngineConfigError(f"--weight-transfer-config is not JSON: {exc}") from None
        if not isinstance(config, dict) or set(config) - {"backend"}:
            raise EngineConfigError(
                f"--weight-transfer-config {self.weight_transfer_config}: expected an object with only "
                '"backend", as vLLM\'s WeightTransferConfig'
            )
        backend = config.get("backend", "nccl")
        if backend not in ("nccl", "gloo"):
            raise EngineConfigError(
                f"--weight-transfer-config backend {backend!r}: the embedded engine receives over gloo"
            )
        return str(backend)

    def notes(self) -> list[str]:
        """One line for each flag that is accepted but changes nothing here."""
        notes = []
        if self.weight_transfer_backend == "nccl":
            notes.append(
                "--weight-transfer-config backend nccl: the embedded engine receives weights over gloo "
                "(trainers on weight_sync_backend auto follow it)"
            )
        if self.gpu_memory_utilization is not None:
            notes.append(
                "--gpu-memory-utilization is ignored: the embedded engine preallocates no KV-cache pool"
            )
        if self.trust_remote_code:
            notes.append("--trust-remote-code is ignored: models load with transformers' own code")
        return notes
