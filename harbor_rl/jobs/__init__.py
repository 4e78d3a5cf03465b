"""Launch training runs on Hugging Face Jobs (`harbor jobs ...`) and run them there.

    config = load_launch_config({"model": "Qwen/Qwen3-1.7B", "push_to_hub": "me/run-out"})  # stock image
    spec, missing = build_job_spec(config, os.environ)      # what HfApi.run_job gets
    print(render_dry_run(config, spec, missing))            # `harbor jobs launch --dry-run`

On the job, `run_on_host(config.run_config())` starts the engine, `harbor serve` and `harbor train`
(`build_plan` says how), stops them in reverse order and pushes the outputs (`outputs.push_outputs`). Nothing here imports the trainer: the
trainer and server run as `harbor` subprocesses.
"""

from harbor_rl.jobs.config import EngineSettings, LaunchConfig, RunConfig, load_launch_config, load_run_config
from harbor_rl.jobs.errors import (
    HubError,
    JobConfigError,
    JobsError,
    LauncherError,
    MissingSecretError,
    ProcessFailedError,
)
from harbor_rl.jobs.host import run_on_host
from harbor_rl.jobs.launcher import run_plan
from harbor_rl.jobs.plan import ProcessSpec, build_plan
from harbor_rl.jobs.spec import JobSpec, build_job_spec, render_dry_run

__all__ = [
    "EngineSettings", "HubError", "JobConfigError", "JobSpec", "JobsError", "LaunchConfig", "LauncherError",
    "MissingSecretError", "ProcessFailedError", "ProcessSpec", "RunConfig", "build_job_spec", "build_plan",
    "load_launch_config", "load_run_config", "render_dry_run", "run_on_host", "run_plan",
]  # fmt: skip
