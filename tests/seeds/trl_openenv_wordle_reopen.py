"""The guide's "long runs against a Space" fragment: reset() opens a new client per episode. Above the
marker, the names it uses that the guide defines elsewhere (the client, and the Space URL of TRL's
Wordle script)."""

from textarena_env import TextArenaEnv

env_url = "https://openenv-wordle.hf.space"

# -- the guide's block --
def reset(self, **kwargs) -> str | None:
    self.client.close()
    self.client = TextArenaEnv(base_url=env_url).sync()
    result = self.client.reset()
    ...
