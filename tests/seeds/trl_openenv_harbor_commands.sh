MAX_CONCURRENT_ENVS=9 harbor serve --dataset tiny-coding --port 8200 --capture-port 8300 --expose gradio
harbor engine tiny \
    --enable-auto-tool-choice --tool-call-parser hermes \
    --logprobs-mode processed_logprobs \
    --return-tokens-as-token-ids \
    --weight-transfer-config '{"backend":"nccl"}'
