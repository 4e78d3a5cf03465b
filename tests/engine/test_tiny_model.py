"""The tiny model: deterministic, offline, a real HF folder with a tool-aware chat template."""

from __future__ import annotations

import pytest

from engine.errors import ModelBuildError
from engine.tiny_model import build_tiny_model, load_model_and_tokenizer, resolve_model_path


def test_same_seed_builds_identical_files_and_another_seed_other_weights(tmp_path, tiny_dir):
    again = build_tiny_model(seed=0, cache_dir=tmp_path / "a")
    names = sorted(p.name for p in tiny_dir.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(names)
    for name in names:
        assert (tiny_dir / name).read_bytes() == (again / name).read_bytes(), name
    other = build_tiny_model(seed=1, cache_dir=tmp_path / "b")
    assert (other / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    assert (other / "model.safetensors").read_bytes() != (tiny_dir / "model.safetensors").read_bytes()


def test_cached_folder_is_reused(tiny_dir):
    before = (tiny_dir / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(seed=0, cache_dir=tiny_dir.parent) == tiny_dir
    assert (tiny_dir / "model.safetensors").stat().st_mtime_ns == before


def test_model_and_tokenizer_shape(reference):
    model, tokenizer = reference
    params = sum(p.numel() for p in model.parameters())
    assert 1_000_000 < params < 10_000_000
    assert 4000 <= len(tokenizer) <= 8192
    for token in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>"):
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1, token
    # Markup tokens survive skip_special_tokens (the tool parser needs them); chat specials do not.
    ids = tokenizer.encode("<|im_start|>x<tool_call>{}</tool_call><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "x<tool_call>{}</tool_call>"


def test_chat_template_renders_tools_calls_and_responses(reference):
    """Arguments as objects, the way an OpenAI-compatible server hands messages to the template."""
    _, tokenizer = reference
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": {"command": "ls"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '<tools>\n{"type": "function", "function": {"name": "bash"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'
        in text
    )
    assert "<|im_start|>user\n<tool_response>\na.py\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_unknown_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelBuildError, match="neither 'tiny' nor a local Hugging Face model folder"):
        resolve_model_path(str(tmp_path / "nothing-here"))


def test_any_local_hf_folder_loads(tiny_dir):
    assert resolve_model_path(str(tiny_dir)) == tiny_dir
    model, tokenizer = load_model_and_tokenizer(tiny_dir)
    assert model.config.model_type == "qwen2" and tokenizer.eos_token == "<|im_end|>"


def test_cache_dir_follows_harbor_cache_dir(monkeypatch, tmp_path):
    from engine.tiny_model import default_cache_dir

    monkeypatch.setenv("HARBOR_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path


def test_engine_command_rejects_a_missing_model_folder(tmp_path):
    from typer.testing import CliRunner

    from harbor_rl.cli import app

    result = CliRunner().invoke(app, ["engine", "--model", str(tmp_path / "missing")])
    assert result.exit_code == 2
    assert "neither 'tiny' nor a local Hugging Face model folder" in result.output


def test_chat_template_is_qwen25_and_without_a_system_message_uses_its_default(reference):
    from engine.chat import CHAT_TEMPLATE

    _, tokenizer = reference
    assert tokenizer.chat_template == CHAT_TEMPLATE
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
    )
