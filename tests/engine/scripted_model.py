"""A real Hugging Face model folder whose weights are set by hand so that greedy decoding after the chat
generation prompt writes a fixed text, e.g. a hermes tool call. No mock: the engine loads and runs it
like any checkpoint, which lets tests see real `<tool_call>` output parsed into `message.tool_calls`.

How: every attention and MLP output projection is zero, so the hidden state is the current token's
embedding. Token i of the chain gets the i-th basis vector as embedding, and the LM head maps that
basis vector to token i+1, so each token deterministically predicts its successor. That needs every
token of the chain (but the last) to be distinct, which the chosen text satisfies.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

TOOL_CALL_TEXT = 'Sure.<tool_call>{"name": "bash"}</tool_call>'


def build_scripted_model(tiny_dir: Path, out_dir: Path, text: str = TOOL_CALL_TEXT) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    start = tokenizer.encode(prompt, add_special_tokens=False)[-1]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    chain = [start, *tokenizer.encode(text, add_special_tokens=False), end]
    if len(set(chain[:-1])) != len(chain) - 1:
        raise ValueError(f"tokens of {text!r} repeat; a token can have only one successor here")
    config = Qwen2Config.from_pretrained(tiny_dir)
    config.tie_word_embeddings = False
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.fill_(1.0 if name.endswith("norm.weight") else 0.0)
        embed = model.model.embed_tokens.weight
        head = model.lm_head.weight
        for i, (token, successor) in enumerate(zip(chain, chain[1:], strict=False)):
            embed[token, i] = 1.0
            head[successor, i] = 10.0
    model.generation_config = GenerationConfig(eos_token_id=[end], max_new_tokens=64)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
