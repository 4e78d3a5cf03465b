"""`nop`: the harness that does nothing, so the verifier must score the untouched task 0."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harnesses.base import AgentOutcome, AgentRun

if TYPE_CHECKING:
    from sandboxes.base import ImageLayer, Sandbox


class NopHarness:
    name = "nop"

    def image_layer(self) -> ImageLayer | None:
        return None

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        return AgentOutcome(exit_code=0)
