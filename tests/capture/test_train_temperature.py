"""A train session's temperature must be one the engine really samples at: vLLM (and the embedded engine)
raise any temperature below 0.01 to 0.01, so the trainer's re-score at 0.005 would not match."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from capture_proxy.models import MIN_TRAIN_TEMPERATURE, SamplingParams, SessionCreate


def test_a_train_temperature_below_vllms_floor_is_refused():
    with pytest.raises(ValueError, match=r"at least 0.01, got 0.005: vLLM samples .* at 0.01 below it"):
        SamplingParams(temperature=0.005).require_neutral()
    SamplingParams(temperature=MIN_TRAIN_TEMPERATURE).require_neutral()


def test_a_train_session_below_the_floor_is_not_created_but_an_eval_session_is():
    body = {"llm_url": "http://127.0.0.1:1", "model": "tiny", "sampling": {"temperature": 0.001}}
    with pytest.raises(ValidationError, match="at least 0.01"):
        SessionCreate(**body)
    # An eval samples as asked (vLLM's floor applies there too), and nothing is trained on it.
    SessionCreate(**body, purpose="eval")
