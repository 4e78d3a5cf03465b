"""`harbor`: one command line over every part.

Each command lives in its own `commands/` module and imports its package inside the function body,
so `harbor proxy` never loads torch and `harbor tasks check` never starts a server.
"""

from __future__ import annotations

import typer

from harbor_rl.commands import bench, collect, engine, inspect, jobs, proxy, serve, sft, tasks
from harbor_rl.commands import eval as eval_cmd
from harbor_rl.commands import train as train_cmd

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Harbor-RL: train real coding agents with RL."
)

proxy.register(app)
engine.register(app)
tasks.register(app)
serve.register(app)
inspect.register(app)
eval_cmd.register(app)
collect.register(app)
sft.register(app)
train_cmd.register(app)
bench.register(app)
jobs.register(app)
