"""The Echo environment's action (OpenEnv's `EchoAction`: one message)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EchoAction:
    message: str
