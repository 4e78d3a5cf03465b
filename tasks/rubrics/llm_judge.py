"""`LLMJudge`: a rubric that asks a model, through any OpenAI-compatible endpoint, for a score.

    judge = LLMJudge(AsyncOpenAI(base_url=..., api_key=...), model="judge",
                     prompt_template="Rate 0-10 how well this answers {observation}:\n{action}")
    score = await judge(action, observation)        # 0.7 for a reply "Score: 7"

The reply's first number (by `score_pattern`) is divided by `max_score` and clipped to [0, 1]. A reply
without a number raises JudgeError: the reward cannot be computed, and inventing 0 would hide that.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from tasks.rubrics.base import Rubric, Score
from tasks.rubrics.errors import JudgeError, RubricConfigError

if TYPE_CHECKING:
    from openai import AsyncOpenAI

DEFAULT_SCORE_PATTERN = r"(-?\d+(?:\.\d+)?)"


class LLMJudge(Rubric):
    _state_keys = ("prompt_template", "model", "max_score")

    def __init__(
        self,
        client: AsyncOpenAI,
        *,
        model: str,
        prompt_template: str,
        max_score: float = 10.0,
        score_pattern: str = DEFAULT_SCORE_PATTERN,
        system_prompt: str | None = None,
        max_tokens: int = 64,
        temperature: float = 0.0,
    ) -> None:
        super().__init__()
        if max_score <= 0:
            raise RubricConfigError(f"LLMJudge max_score must be > 0, got {max_score}")
        for field in ("{action}", "{observation}"):
            if field not in prompt_template:
                raise RubricConfigError(f"LLMJudge prompt_template must contain {field}")
        self.client = client
        self.model = model
        self.prompt_template = prompt_template
        self.max_score = float(max_score)
        self.score_pattern = re.compile(score_pattern)
        self.system_prompt = system_prompt
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.last_reply: str | None = None

    def render(self, action: Any, observation: Any) -> list[dict[str, str]]:
        prompt = self.prompt_template.format(action=action, observation=observation)
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*messages, {"role": "user", "content": prompt}]

    def parse(self, reply: str) -> float:
        match = self.score_pattern.search(reply)
        if match is None:
            raise JudgeError(
                f"the judge's reply holds no score matching {self.score_pattern.pattern!r}: {reply!r}"
            )
        return min(1.0, max(0.0, float(match.group(1)) / self.max_score))

    async def forward(self, action: Any, observation: Any) -> Score:
        response = await self.client.chat.completions.create(
            model=self.model,
            messages=self.render(action, observation),  # type: ignore[arg-type]
            max_tokens=self.max_tokens,
            temperature=self.temperature,
        )
        self.last_reply = response.choices[0].message.content or ""
        return self.parse(self.last_reply)
