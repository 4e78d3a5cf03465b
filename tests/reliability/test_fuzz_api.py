"""Schema fuzzing (schemathesis) of the capture proxy and the Harbor server: no 5xx, no crash.

Cases are generated from each app's own OpenAPI schema (valid and schema-violating ones) and sent over
real HTTP to live servers on 127.0.0.1. The proxy's agent routes are plain Starlette routes outside its
schema, so they are fuzzed from `AGENT_SCHEMA`, the slice of the OpenAI API they serve. The engine is
`engine.imitation`, a faithful local imitation of vLLM's OpenAI server (vLLM needs a GPU).

Every run is bounded (`max_examples`) and derandomized; HARBOR_FUZZ_EXAMPLES=N runs a longer random hunt.
"""

from __future__ import annotations

import os

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.reliability._fixtures_input import ADMIN_KEY, MODEL, imitation, live_proxy
from tests.server.conftest import make_config, running_server

__all__ = ["imitation", "live_proxy"]  # fixtures used by name

pytestmark = pytest.mark.timeout(240)

HUNT = os.environ.get("HARBOR_FUZZ_EXAMPLES")
"""Set it (e.g. 2000) for a longer, random hunt; unset, CI runs 120 derandomized cases per test."""
FUZZ = settings(
    max_examples=int(HUNT or 120),
    deadline=None,
    derandomize=HUNT is None,
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)

_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
        "content": {"type": ["string", "null"], "maxLength": 200},
        "tool_call_id": {"type": "string"},
        "tool_calls": {
            "type": "array",
            "maxItems": 2,
            "items": {
                "type": "object",
                "required": ["id", "type", "function"],
                "properties": {
                    "id": {"type": "string"},
                    "type": {"type": "string", "enum": ["function"]},
                    "function": {
                        "type": "object",
                        "required": ["name", "arguments"],
                        # The arguments are any string: models write broken JSON too.
                        "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
                    },
                },
            },
        },
    },
}
_SAMPLING = {
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 32},
    "seed": {"type": "integer"},
    "stream": {"type": "boolean"},
    "n": {"type": "integer", "enum": [1]},
}
AGENT_SCHEMA = {
    "openapi": "3.1.0",
    "info": {"title": "capture proxy agent routes (OpenAI chat and completions)", "version": "1"},
    "paths": {
        "/v1/chat/completions": {
            "post": {
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["model", "messages"],
                                "properties": {
                                    "model": {"type": "string", "enum": [MODEL]},
                                    "messages": {
                                        "type": "array",
                                        "minItems": 1,
                                        "maxItems": 4,
                                        "items": _MESSAGE,
                                    },
                                    "logprobs": {"type": "boolean"},
                                    **_SAMPLING,
                                },
                            }
                        }
                    },
                },
                "responses": {"200": {"description": "a completion"}},
            }
        },
        "/v1/completions": {
            "post": {
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["model", "prompt"],
                                "properties": {
                                    "model": {"type": "string", "enum": [MODEL]},
                                    "prompt": {
                                        "anyOf": [
                                            {"type": "string", "minLength": 1, "maxLength": 200},
                                            {
                                                "type": "array",
                                                "minItems": 1,
                                                "maxItems": 16,
                                                "items": {"type": "integer", "minimum": 3, "maximum": 258},
                                            },
                                        ]
                                    },
                                    **_SAMPLING,
                                },
                            }
                        }
                    },
                },
                "responses": {"200": {"description": "a completion"}},
            }
        },
        "/v1/models": {"get": {"responses": {"200": {"description": "the served models"}}}},
    },
}


def both_modes(schema) -> st.SearchStrategy:
    return st.one_of(
        schema.as_strategy(generation_mode=GenerationMode.POSITIVE),
        schema.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )


def assert_clean(response, case) -> None:
    """No 5xx, and every error is a JSON body that says something."""
    where = f"{case.method} {case.formatted_path} body={getattr(case, 'body', None)!r} query={case.query!r}"
    assert response.status_code < 500, f"{where} -> {response.status_code} {response.text[:500]}"
    if response.status_code >= 400 and response.content:
        body = response.json()
        assert body.get("error") or body.get("detail"), f"{where}: error without a message: {body}"


def test_agent_routes_survive_fuzzing_and_record_every_answered_call(live_proxy):
    session = live_proxy.create()
    auth = {"Authorization": f"Bearer {session.api_key}"}
    schema = schemathesis.openapi.from_dict(AGENT_SCHEMA)
    answered = []

    @FUZZ
    @given(case=both_modes(schema))
    def run(case) -> None:
        response = case.call(base_url=live_proxy.url, headers=auth, timeout=60)
        assert_clean(response, case)
        if response.status_code == 200 and case.path != "/v1/models":
            answered.append(case.path)

    run()
    assert answered, "the fuzzer never produced a valid request; the test proves nothing"
    # Every answered sampling call is in the store; nothing else is.
    record = live_proxy.store.get_session(session.session_id)
    assert record.num_turns == len(answered)
    assert httpx.get(f"{live_proxy.url}/health").status_code == 200


def test_admin_routes_survive_fuzzing(live_proxy):
    live_proxy.create()
    schema = schemathesis.openapi.from_url(f"{live_proxy.url}/openapi.json")
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}

    @FUZZ
    @given(case=both_modes(schema))
    def run(case) -> None:
        assert_clean(case.call(base_url=live_proxy.url, headers=admin, timeout=60), case)

    run()
    assert httpx.get(f"{live_proxy.url}/health").status_code == 200


def test_server_api_survives_fuzzing(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    with running_server(make_config(tmp_path)) as server:
        schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")

        @FUZZ
        @given(case=both_modes(schema))
        def run(case) -> None:
            assert_clean(case.call(base_url=server.url, timeout=60), case)

        run()
        assert httpx.get(f"{server.url}/health").status_code == 200
