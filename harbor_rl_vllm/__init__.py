"""Harbor-RL's vLLM plugin: a `gloo` weight-transfer backend, so a vLLM without NCCL (its CPU build) takes
the trainer's weight pushes over the same HTTP routes and the same wire format as NCCL.

vLLM runs `register` in each of its processes (the `vllm.general_plugins` entry point,
`vllm/plugins/__init__.py`: `load_general_plugins`). It registers the engine lazily by module path
through vLLM's own plugin point, `WeightTransferEngineFactory.register_engine`
(`vllm/distributed/weight_transfer/factory.py`), so vLLM imports it only in the worker that builds it, and
only when started with `--weight-transfer-config '{"backend": "gloo"}'`.
"""

BACKEND = "gloo"


def register() -> None:
    # Imported here: this package is also imported (for its wire format) where vLLM is not installed.
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    # vLLM may load the plugins twice in one process (load_general_plugins' own warning); the registry
    # refuses a second registration of a name.
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, "harbor_rl_vllm.gloo_engine", "GlooWeightTransferEngine")
