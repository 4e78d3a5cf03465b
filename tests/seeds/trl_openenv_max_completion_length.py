from harbor_rl import GRPOConfig

# -- the guide's block --
args = GRPOConfig(
    max_completion_length=4096,  # default is usually 256-1024, increase for long episodes
    # ...
)
