"""The trainer-facing REST API of a real `harbor serve`: info, tasks, bad requests (4xx with a message
naming what is wrong), the OpenAPI schema, and the sandbox-facing port that offers only agent routes."""

from __future__ import annotations

import httpx
import pytest

from harbor_server.client import HarborClient
from harbor_server.errors import BadRolloutRequest, RolloutNotFound
from harbor_server.models import RolloutRequest
from tests.server.conftest import make_config, running_server

pytestmark = pytest.mark.timeout(120)


def rollout(**overrides) -> dict:
    body = {"split": "builtin", "task_index": 0, "harness": "nop", "sandbox": "local"}
    return body | overrides


def test_health_info_and_tasks(client):
    assert client.get("/health").json() == {"status": "ok", "live_rollouts": 0}
    info = client.get("/info").json()
    [builtin] = info["datasets"]
    assert builtin["split"] == "builtin" and builtin["num_tasks"] >= 3
    assert {"nop", "oracle", "mini-swe-agent", "opencode"} <= set(info["harnesses"])
    sandboxes = {s["name"]: s for s in info["sandboxes"]}
    assert set(sandboxes) == {"local", "docker", "e2b"}
    assert sandboxes["local"]["healthy"] is True
    assert info["capacity"] == {"max_concurrent_envs": 8, "live": 0}
    assert info["engine"]["checked"] is False

    page = client.get("/tasks", params={"split": "builtin", "offset": 1, "limit": 2}).json()
    assert page["total"] == builtin["num_tasks"] and page["offset"] == 1
    assert [t["index"] for t in page["tasks"]] == [1, 2]
    first = client.get("/tasks", params={"split": "builtin", "limit": 1}).json()["tasks"][0]
    assert first["instruction"].strip() and first["has_solution"] is True
    assert client.get(f"/tasks/builtin/{first['task_id']}").json() == first


def test_openapi_schema_describes_the_api(client):
    schema = client.get("/openapi.json").json()
    paths = set(schema["paths"])
    assert {
        "/health", "/info", "/tasks", "/rollouts", "/rollouts/{rollout_id}", "/rollouts/{rollout_id}/wait",
        "/rollouts/{rollout_id}/result", "/rollouts/{rollout_id}/trace", "/rollouts/{rollout_id}/cancel",
    } <= paths  # fmt: skip
    assert "RolloutRequest" in schema["components"]["schemas"]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (rollout(split="nope"), 400, ["unknown split 'nope'", "builtin"]),
        (rollout(task_index=999), 404, ["task_index 999 is out of range"]),
        (rollout(task_index=None, task_id="no-such-task"), 404, ["no task 'no-such-task'"]),
        (rollout(harness="claude-magic"), 400, ["unknown harness 'claude-magic'", "oracle"]),
        (rollout(sandbox="vm"), 400, ["unknown sandbox 'vm'", "docker"]),
        (rollout(task_index=-1), 422, ["task_index"]),
        (rollout(task_id="fix-pagination"), 422, ["exactly one of task_index and task_id"]),
        (rollout(llm_url="ftp://engine"), 400, ["llm_url", "http://"]),
        ({"split": "builtin", "task_index": 0}, 422, ["harness"]),
        (rollout(surprise=1), 422, ["surprise"]),
    ],
)
def test_bad_rollout_requests_get_4xx_with_a_message(client, body, status, words):
    response = client.post("/rollouts", json=body)
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, str)
    for word in words:
        assert word in detail
    assert client.get("/health").json()["live_rollouts"] == 0


def test_missing_llm_url_and_model_are_4xx(tmp_path, sandbox_root):
    config = make_config(tmp_path, llm_url=None, model=None)
    with running_server(config) as server, httpx.Client(base_url=server.url) as client:
        response = client.post("/rollouts", json=rollout())
        assert response.status_code == 400
        assert "llm_url is missing" in response.json()["detail"]
        response = client.post("/rollouts", json=rollout(llm_url="http://127.0.0.1:9"))
        assert response.status_code == 400
        assert "model is missing" in response.json()["detail"]


def test_unknown_rollout_is_404_and_client_raises_typed_errors(server):
    client = HarborClient(server.url)
    try:
        with pytest.raises(RolloutNotFound, match="no rollout with id 'nope'"):
            client.rollout("nope")
        for path in ("/wait", "/result", "/trace", "/cancel"):
            method = "POST" if path == "/cancel" else "GET"
            assert httpx.request(method, f"{server.url}/rollouts/nope{path}").status_code == 404
        with pytest.raises(BadRolloutRequest, match="unknown split 'nope'"):
            client.start_rollout(RolloutRequest(**rollout(split="nope")))
        with pytest.raises(BadRolloutRequest, match="unknown split"):
            client.tasks("nope")
    finally:
        client.close()


def test_capture_port_offers_only_agent_routes(server):
    capture = server.capture_url
    assert httpx.get(f"{capture}/health").status_code == 200
    for method, path in [
        ("GET", "/sessions"), ("POST", "/sessions"), ("GET", "/info"), ("POST", "/rollouts"),
        ("GET", "/tasks"), ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/metrics"),
    ]:  # fmt: skip
        assert httpx.request(method, capture + path).status_code in (404, 405), path
    # The agent routes are there, and refuse an unknown session key.
    response = httpx.post(
        f"{capture}/v1/chat/completions",
        json={"model": "m", "messages": []},
        headers={"Authorization": "Bearer sk-unknown"},
    )
    assert response.status_code == 401


def test_inspector_is_served_beside_the_api(tmp_path, sandbox_root):
    """`--inspector` mounts the read-only trace inspector at /inspect on the trainer-facing port."""
    config = make_config(tmp_path, inspector=True)
    with running_server(config) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/health").json()["status"] == "ok"
        page = client.get("/inspect/", follow_redirects=True)
        assert page.status_code == 200
        assert "gradio" in page.text.lower()
    plain = make_config(tmp_path)
    with running_server(plain) as server, httpx.Client(base_url=server.url) as client:
        assert client.get("/inspect/").status_code == 404
