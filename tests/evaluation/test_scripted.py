"""The scripted teacher's policies, played against the real built-in environments, and its
OpenAI-compatible answers as the real `openai` client reads them."""

from __future__ import annotations

import json

import pytest
from openai import AsyncOpenAI

from evaluation.scripted import NO_SCRIPT, echo_move, scripted_teacher, wordle_move
from tasks.environments.wordle import MAX_GUESSES, WORDS, WordleEnv


def _play_wordle(secret: str) -> WordleEnv:
    env = WordleEnv()
    env.reset(secret=secret)
    messages: list[dict] = [{"role": "user", "content": "Play."}]
    for n in range(MAX_GUESSES + 1):
        move = wordle_move(messages)
        if move is None:
            break
        call_id = f"c{n}"
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "guess", "arguments": json.dumps(move)}}]})  # fmt: skip
        messages.append({"role": "tool", "tool_call_id": call_id, "content": env.guess(move["guess"])})
    return env


@pytest.mark.parametrize("secret", WORDS)
def test_wordle_script_wins_for_every_word(secret):
    env = _play_wordle(secret)
    assert env.won and env.reward >= 1.0


def test_echo_script_echoes_the_phrase_once():
    messages = [
        {"role": "user", "content": "Use the echo tool to say exactly this text, and nothing else: Hi there!"}
    ]
    assert echo_move(messages) == {"message": "Hi there!"}
    messages.append({"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "echo", "arguments": '{"message": "Hi there!"}'}}]})  # fmt: skip
    assert echo_move(messages) is None


async def test_teacher_speaks_openai_chat_completions():
    tools = [
        {"type": "function", "function": {"name": "echo", "parameters": {"type": "object", "properties": {}}}}
    ]
    async with scripted_teacher() as url:
        client = AsyncOpenAI(base_url=url, api_key="unused")
        prompt = [
            {"role": "user", "content": "Use the echo tool to say exactly this text, and nothing else: Hey"}
        ]
        reply = await client.chat.completions.create(
            model="scripted", messages=prompt, tools=tools, max_tokens=3
        )
        [call] = reply.choices[0].message.tool_calls
        assert call.function.name == "echo" and json.loads(call.function.arguments) == {"message": "Hey"}
        assert 0 < reply.usage.completion_tokens <= 3
        plain = await client.chat.completions.create(model="scripted", messages=prompt)
        assert plain.choices[0].message.content == NO_SCRIPT and plain.choices[0].finish_reason == "stop"
        assert [m.id for m in (await client.models.list()).data] == ["scripted"]
        await client.close()
