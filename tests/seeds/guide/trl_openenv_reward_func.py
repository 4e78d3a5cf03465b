def reward_func(environments, **kwargs) -> list[float]:
    return [env.reward for env in environments]
