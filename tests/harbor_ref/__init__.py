"""Harbor itself, as the judge of what a task means: its own package, in a venv of its own.

The `harbor` package (Python >= 3.12) installs a console script named `harbor`, like ours, so it never
goes into the project's environment: scripts/setup.sh makes a venv for it (`harbor_venv()` finds it)
and `dump_tasks()` runs `load.py` there, which loads task folders with Harbor's own `Task` and prints
what Harbor resolved; `validate_job()` runs `validate_job.py`, which loads a `harbor eval` job folder
with Harbor's models, validators and stats.
"""

from tests.harbor_ref.venv import (
    HARBOR_VERSION,
    dump_tasks,
    harbor_python,
    run_in_harbor,
    validate_job,
    validate_trajectory,
)

__all__ = [
    "HARBOR_VERSION",
    "dump_tasks",
    "harbor_python",
    "run_in_harbor",
    "validate_job",
    "validate_trajectory",
]
