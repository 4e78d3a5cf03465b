"""`harbor serve --stream-mode replay` reaches the capture port: a real server in front of
`engine.imitation` (a faithful local imitation of vLLM's OpenAI server; vLLM needs a GPU), called by the
real `openai` client. What replay answers is tested in tests/proxy/test_replay.py."""

from __future__ import annotations

import asyncio

import openai
import pytest
from typer.testing import CliRunner

from capture_proxy.models import SessionCreate
from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread
from harbor_rl.cli import app
from tests.server.conftest import make_config, running_server

pytestmark = pytest.mark.timeout(300)
MODEL = "imitation-model"


@pytest.mark.parametrize("mode", ["relay", "replay"])
def test_the_capture_port_streams_as_the_server_is_told(tmp_path, sandbox_root, mode):
    with serve_in_thread(create_imitation_app(ImitationSettings(model=MODEL))) as engine:
        config = make_config(tmp_path, llm_url=engine + "/v1", model=MODEL, stream_mode=mode)
        with running_server(config) as server:
            created = asyncio.run_coroutine_threadsafe(
                server.server.service.create_session(SessionCreate(model=MODEL), base_url=server.capture_url),
                server.loop,
            ).result(timeout=30)
            client = openai.OpenAI(base_url=created.base_url, api_key=created.api_key, max_retries=0)
            stream = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
            )
            chunks = [chunk for chunk in stream if chunk.choices]
            (turn,) = server.server.store.get_turns(created.session_id)
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks)
        == turn.response["choices"][0]["message"]["content"]
    )
    assert turn.metadata.streamed is True and turn.metadata.capture == "ok"
    assert (len(chunks) == 1) is (mode == "replay")  # replayed as one event, or relayed token by token


def test_an_unknown_stream_mode_is_one_line():
    result = CliRunner().invoke(app, ["serve", "--stream-mode", "buffer"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "stream_mode: Input should be 'relay' or 'replay'" in " ".join(result.output.split())
