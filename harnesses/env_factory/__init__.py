"""The white-box path: TRL's `environment_factory` contract as a built-in harness (`env-factory`).

    from harnesses.env_factory import EnvironmentFactory, LoopConfig, run_episode, combine_rewards

    factory = EnvironmentFactory("tasks.environments.wordle:WordleEnv")  # validated at load
    env = factory.create()                                                         # one per rollout
    result = await run_episode(factory, env, AsyncOpenAI(base_url=proxy_url, api_key=key),
                               model="tiny", prompt="Play.", row={"secret": "crane"})
    combine_rewards([wordle_win, wordle_partial], [env])                             # [0.4]

Under `harbor serve`, `EnvFactoryHarness` runs the same loop against the rollout's capture session.

OpenEnv's harness layer (the `openenv` extra; imported only by these two modules, it takes seconds):
`openenv_sessions.EnvironmentSessionFactory` makes these environments OpenEnv `ResourceSession`s for its
`MCPHarnessAdapter` and `build_harness_rollout_func`, and `openenv_runner` drives an OpenEnv
`ResourceSessionFactory` with that adapter, which is what the harness does for one named in task.toml.
"""

from harnesses.env_factory.contract import (
    RESERVED_TOOL_NAMES,
    EnvironmentFactory,
    Tool,
    ToolCallError,
    discover_tools,
    load_environment_class,
)
from harnesses.env_factory.errors import (
    EnvironmentContractError,
    EnvironmentLoadError,
    EpisodeError,
    RewardFunctionError,
)
from harnesses.env_factory.harness import EnvFactoryHarness, EnvFactorySpec
from harnesses.env_factory.loop import EpisodeResult, LoopConfig, ToolCallRecord, run_episode
from harnesses.env_factory.rewards import (
    RewardTable,
    combine_rewards,
    compute_rewards,
    env_attribute,
    route_by_column,
)

__all__ = [
    "RESERVED_TOOL_NAMES",
    "EnvFactoryHarness",
    "EnvFactorySpec",
    "EnvironmentContractError",
    "EnvironmentFactory",
    "EnvironmentLoadError",
    "EpisodeError",
    "EpisodeResult",
    "LoopConfig",
    "RewardFunctionError",
    "RewardTable",
    "Tool",
    "ToolCallError",
    "ToolCallRecord",
    "combine_rewards",
    "compute_rewards",
    "discover_tools",
    "env_attribute",
    "load_environment_class",
    "route_by_column",
    "run_episode",
]
