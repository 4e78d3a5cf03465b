"""The SFT warm-up on the real tiny model and tokenizer: the loss mask covers assistant tokens only, a few
steps lower the loss on the demonstrations, the keep-filter drops what it should, and the saved folder
is served by the real embedded engine (uvicorn on 127.0.0.1) through the real `openai` client."""

from __future__ import annotations

import json

import openai
import pytest
import torch

from engine.tiny_model import load_model_and_tokenizer
from evaluation.collect import Episode
from tests.engine.conftest import engine_app, serve
from trainer.sft import (
    IGNORE_INDEX,
    SFTConfig,
    SFTDataError,
    load_episodes,
    run_sft,
    sft_loss,
    tokenize_conversation,
)

ECHO_TOOL = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Echo the message back from the environment.",
        "parameters": {
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        },
    },
}


def echo_call(text: str, call_id: str = "call_1") -> dict:
    arguments = json.dumps({"message": text})
    return {"id": call_id, "type": "function", "function": {"name": "echo", "arguments": arguments}}


def conversation(target: str) -> list[dict]:
    return [
        {"role": "user", "content": f"Use the echo tool to say exactly this text: {target}"},
        {"role": "assistant", "content": "", "tool_calls": [echo_call(target)]},
        {"role": "tool", "tool_call_id": "call_1", "content": target},
        {"role": "assistant", "content": "Done."},
    ]


def write_results(path, rows: list[tuple[str, str, float | None]]) -> None:
    """results.jsonl lines in `harbor collect`'s format: (task id, echo target, reward) each."""
    with path.open("w") as f:
        for i, (task_id, target, reward) in enumerate(rows):
            episode = Episode(
                episode_id=f"demo-{i:06d}", messages=conversation(target), reward=reward, done=True,
                tool_trace=[], metrics={}, verify_metrics={}, artifacts={},
                task={"split": "env-tasks", "task_id": task_id}, extra={}, tools=[ECHO_TOOL],
            )  # fmt: skip
            f.write(episode.model_dump_json() + "\n")


def test_mask_covers_exactly_the_assistant_messages(tiny_dir) -> None:
    _, tokenizer = load_model_and_tokenizer(tiny_dir)
    example = tokenize_conversation(tokenizer, conversation("Hi!"), [ECHO_TOOL])
    assert len(example.input_ids) == len(example.labels)
    trained = [t for t, label in zip(example.input_ids, example.labels, strict=True) if label != IGNORE_INDEX]
    assert all(label in (IGNORE_INDEX, t) for t, label in zip(example.input_ids, example.labels, strict=True))
    # Both assistant messages, each with its end token; nothing of the system, user or tool turns.
    assert tokenizer.decode(trained) == (
        '<tool_call>\n{"name": "echo", "arguments": {"message": "Hi!"}}\n</tool_call><|im_end|>'
        "Done.<|im_end|>"
    )
    context = tokenizer.decode([t for t, label in zip(example.input_ids, example.labels, strict=True)
                                if label == IGNORE_INDEX])  # fmt: skip
    assert "Use the echo tool" in context and "<tools>" in context and "<tool_response>\nHi!" in context
    assert context.endswith("<|im_start|>assistant\n\n")  # the newline after each <|im_end|> is context
    with pytest.raises(SFTDataError, match="start with a system or user"):
        tokenize_conversation(tokenizer, conversation("Hi!")[1:], [ECHO_TOOL])


def test_keep_filter_and_task_filter(tmp_path) -> None:
    write_results(
        tmp_path / "results.jsonl",
        [("echo-hi", "Hi!", 1.0), ("echo-hi", "Hi!", 0.2), ("echo-hello-world", "Hello World!", None)],
    )
    ids = lambda **kw: [ep.episode_id for ep in load_episodes(SFTConfig(data=str(tmp_path), model="unused", **kw))]  # noqa: E731
    assert ids() == ["demo-000000", "demo-000001"]  # reward >= 0 by default; unscored is dropped
    assert ids(min_reward=0.5) == ["demo-000000"]
    assert ids(min_reward=None) == ["demo-000000", "demo-000001", "demo-000002"]
    assert ids(min_reward=None, task_ids=["echo-hello-world"]) == ["demo-000002"]
    with pytest.raises(SFTDataError, match="passes the filters"):
        load_episodes(SFTConfig(data=str(tmp_path), model="unused", min_reward=2.0))
    with pytest.raises(SFTDataError, match="no results.jsonl"):
        load_episodes(SFTConfig(data=str(tmp_path / "missing"), model="unused"))


def test_a_few_steps_lower_the_loss_and_the_folder_is_served(tiny_dir, tmp_path) -> None:
    write_results(tmp_path / "results.jsonl", [("echo-hi", "Hi!", 1.0), ("echo-hello", "Hello!", 1.0)])
    config = SFTConfig(
        data=str(tmp_path / "results.jsonl"), model=str(tiny_dir), output_dir=str(tmp_path / "sft"),
        max_steps=6, per_device_train_batch_size=2, learning_rate=3e-4,
    )  # fmt: skip
    model, tokenizer = load_model_and_tokenizer(tiny_dir)
    examples = [tokenize_conversation(tokenizer, ep.messages, ep.tools) for ep in load_episodes(config)]
    with torch.no_grad():
        before = float(sft_loss(model, examples, tokenizer.pad_token_id))
    steps: list[int] = []
    result = run_sft(config, on_step=lambda step, _loss: steps.append(step))
    assert steps == [1, 2, 3, 4, 5, 6] and result.episodes == 2
    trained, _ = load_model_and_tokenizer(result.output_dir)
    with torch.no_grad():
        after = float(sft_loss(trained, examples, tokenizer.pad_token_id))
    assert after < before - 0.5, (before, after, result.losses)  # 8.58 -> 5.79 nats per assistant token here
    summary = json.loads((result.output_dir / "sft_summary.json").read_text())
    assert summary["steps"] == 6 and summary["final_loss"] == result.losses[-1]

    with serve(engine_app(result.output_dir)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x")
        reply = client.chat.completions.create(
            model="tiny", messages=conversation("Hi!")[:1], tools=[ECHO_TOOL], max_tokens=8, temperature=0
        )
        client.close()
    assert reply.model == "tiny" and reply.usage.completion_tokens >= 1


def plain_cross_entropy(model, examples, pad_id):
    """The reference: every position's logits of the whole padded rows, cross-entropy at the labels."""
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id)
    labels = torch.full((len(examples), width), IGNORE_INDEX)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        ids[row, :n], labels[row, :n], attention[row, :n] = (
            torch.tensor(example.input_ids),
            torch.tensor(example.labels),
            1,
        )
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1)
    )


def test_the_loss_is_the_cross_entropy_of_the_assistant_tokens_with_shared_prompts_run_once(tiny_dir) -> None:
    """Demonstrations of one task share their prompt: it runs once per batch, and the loss and gradients
    are those of plain cross-entropy over every position's logits (within 1e-5)."""
    model, tokenizer = load_model_and_tokenizer(tiny_dir)
    examples = [
        tokenize_conversation(tokenizer, conversation(target), [ECHO_TOOL])
        for target in ("Hi!", "Hello there, world!", "Hi!", "A much longer text to say back")
    ]
    other = conversation("Hi!")
    other[0]["content"] = "Please echo: Hi!"  # another task's prompt: computed apart
    examples.append(tokenize_conversation(tokenizer, other, [ECHO_TOOL]))
    losses, grads = [], []
    for loss_fn in (sft_loss, plain_cross_entropy):
        model.zero_grad()
        loss = loss_fn(model, examples, tokenizer.pad_token_id)
        loss.backward()
        losses.append(float(loss))
        grads.append([p.grad.clone() for p in model.parameters()])
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert max(g.abs().max().item() for g in grads[1]) > 1e-3  # the comparison is not of zeros
