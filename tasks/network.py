"""Which network each phase of a run gets, as Harbor resolves it, plus the training override.

Harbor (`harbor/trial/network_policy.py`, 0.26): the environment's `network_mode` / `allowed_hosts`
is the baseline; `[agent]` and `[verifier]` may each set a policy of their own, and a step's
`[steps.agent]` / `[steps.verifier]` overrides the task's. A phase without one gets the baseline. The
model endpoint (our capture port) is reachable in every phase, whatever its policy.

`agent_network="none"` (`harbor serve/eval --agent-network none`) denies the agent phase everything
but the capture port, while set-up and the verifier keep what the task declares: the training default,
so a policy cannot learn to fetch answers from the internet (docs/reliability.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tasks.models import NetworkMode, NetworkPolicy, StepConfig, TaskConfig

AgentNetwork = Literal["task", "none"]
"""`task`: the agent phase gets what the task declares; `none`: only the capture port."""
NO_NETWORK = NetworkPolicy(network_mode="no-network")
_OPENNESS: dict[NetworkMode, int] = {"no-network": 0, "allowlist": 1, "public": 2}


@dataclass(frozen=True)
class PhasePolicies:
    """The policies of one run (one step, for a `[[steps]]` task)."""

    baseline: NetworkPolicy
    """The environment's: what the sandbox has while it starts and between phases (set-up)."""
    agent: NetworkPolicy
    verifier: NetworkPolicy


def phase_policies(
    config: TaskConfig, step: StepConfig | None = None, *, agent_network: AgentNetwork = "task"
) -> PhasePolicies:
    baseline = config.environment.baseline_policy()
    agent = _explicit(config, step, "agent") or baseline
    verifier = _explicit(config, step, "verifier") or baseline
    return PhasePolicies(
        baseline=baseline, agent=NO_NETWORK if agent_network == "none" else agent, verifier=verifier
    )


def _explicit(
    config: TaskConfig, step: StepConfig | None, role: Literal["agent", "verifier"]
) -> NetworkPolicy | None:
    task_policy = getattr(config, role).explicit_policy()
    if step is None:
        return task_policy
    return getattr(step, role).explicit_policy() or task_policy


def sandbox_network(config: TaskConfig, *, agent_network: AgentNetwork = "task") -> NetworkPolicy:
    """The most open policy any phase of any step needs: the sandbox starts on it, phases narrow it.

    Allow-lists of several phases are merged; a public phase makes the sandbox public."""
    steps: list[StepConfig | None] = list(config.steps or []) or [None]
    policies: list[NetworkPolicy] = []
    for step in steps:
        phases = phase_policies(config, step, agent_network=agent_network)
        policies += [phases.baseline, phases.agent, phases.verifier]
    widest = max(policies, key=lambda p: _OPENNESS[p.network_mode])
    if widest.network_mode != "allowlist":
        return widest
    hosts = dict.fromkeys(h for p in policies if p.network_mode == "allowlist" for h in p.allowed_hosts)
    return NetworkPolicy(network_mode="allowlist", allowed_hosts=tuple(hosts))
