from echo_env import EchoEnv

# -- the guide's block --
env = EchoEnv(base_url="https://hugface-5b9.pages.dev/proxy/openenv-echo-env.hf.space")
