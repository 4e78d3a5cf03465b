"""The embedded engine: a vLLM-compatible model server that runs offline on a CPU (`harbor engine`).

- `tiny_model.build_tiny_model(seed)`: the offline default model (tokenizer + random Qwen2 LM).
- `server.create_app(EngineConfig(...))`: the FastAPI app behind `harbor engine`; `serving` holds
  the chat / completions handlers, `protocol` vLLM's request and response shapes, `chat` the chat
  template and hermes tool-call parser.
- `scheduler.BatchScheduler`: the batching generation loop; `prefix_cache`: vLLM's automatic prefix
  caching (earlier prompts' keys and values reused); `sampling`: processed logprobs.
- `weight_transfer.WeightReceiver`: vLLM's weight-transfer endpoints over gloo; `weight_client.
  WeightSyncClient`: the trainer's side of that protocol, against this engine (gloo) or vLLM (NCCL).
- `imitation`: a faithful imitation of vLLM's OpenAI server (byte tokenizer, deterministic sampler,
  failure injection) for tests and benchmarks where no GPU runs vLLM; `python -m engine.imitation`.

It is a separate process to everything else: the server only ever sees an engine URL, and the trainer
uses only `weight_client`.

Nothing is imported here, so `import engine` stays free of torch.
"""
