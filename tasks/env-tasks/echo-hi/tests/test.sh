#!/bin/bash
# The reward is born in the environment: the env-factory harness wrote the environment's own reward
# to /logs/agent/env_reward.json after the episode. Forward it unchanged; without it there is no
# reward file, so the rollout is unscoreable (None), never 0.
mkdir -p /logs/verifier
if [ -s /logs/agent/env_reward.json ]; then
  cp /logs/agent/env_reward.json /logs/verifier/reward.json
else
  echo "no environment reward was produced" >&2
fi
