"""`python -m harbor_rl ...` is the `harbor` command (for launchers that take a module, e.g.
`accelerate launch -m harbor_rl train ...`)."""

from harbor_rl.cli import app

app(prog_name="harbor")
