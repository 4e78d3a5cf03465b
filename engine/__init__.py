"""The embedded engine: a vLLM-compatible model server that runs offline on a CPU.

- `tiny_model.build_tiny_model(seed)`: the offline default model (tokenizer + random Qwen2 LM).
- `server.create_app(EngineConfig(...))`: the FastAPI app behind `harbor engine`; `serving` holds
  the chat / completions handlers, `protocol` vLLM's request and response shapes, `chat` the chat
  template and hermes tool-call parser.
- `scheduler.BatchScheduler`: the batching generation loop; `sampling`: processed logprobs.
- `weight_transfer.WeightReceiver`: vLLM's weight-transfer endpoints over gloo (the trainer's side is
  `engine.weight_client`).

Nothing is imported here, so `import engine` stays free of torch.
"""
