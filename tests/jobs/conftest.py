"""Fixtures of the `harbor jobs` tests. The Hugging Face Hub is not reachable here, so Hub calls go to an
`HfApi` autospec'd from the installed huggingface_hub (same signatures; a wrong keyword fails) that
answers with real `JobInfo` objects built from the Hub's JSON shape."""

from __future__ import annotations

from typing import Any
from unittest.mock import create_autospec

import pytest
from huggingface_hub import HfApi, JobInfo

from harbor_rl.jobs import hub

HF_VALUE = "hf_test_token_value_0123456789"
E2B_VALUE = "e2b_test_key_value_9876543210"


def job_info(**overrides: Any) -> JobInfo:
    """A JobInfo as the Hub's JSON would build it."""
    data: dict[str, Any] = {
        "id": "6650a1b2c3d4e5f600000001",
        "createdAt": "2026-11-30T01:00:00.000Z",
        "dockerImage": "myorg/harbor-rl-trainer:0.1.0",
        "command": ["harbor", "jobs", "run-on-host", "--config-json", "{}"],
        "environment": {"PYTHONUNBUFFERED": "1"},
        "secrets": {"HF_TOKEN": None, "E2B_API_KEY": None},
        "flavor": "h200x2",
        "labels": {"harbor-run": "harbor-demo"},
        "status": {"stage": "RUNNING", "message": None},
        "owner": {"id": "u1", "name": "alice", "type": "user"},
    }
    data.update(overrides)
    return JobInfo(**data)


@pytest.fixture
def fake_api(monkeypatch):
    api = create_autospec(HfApi, instance=True)
    monkeypatch.setattr(hub, "make_api", lambda: api)
    return api


@pytest.fixture
def secrets_env(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", HF_VALUE)
    monkeypatch.setenv("E2B_API_KEY", E2B_VALUE)
