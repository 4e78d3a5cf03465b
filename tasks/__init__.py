"""Harbor tasks: the task format, datasets, the verifier and the built-in tasks.

task = load_task("tasks/builtin/fix-pagination")        # validated, typed (TaskFormatError if not)
spec = task.sandbox_spec("rollout-1", proxy_port=8300)    # what a sandbox backend needs
result = await verify(sandbox, task)                      # VerifierResult(reward, rewards, ...)
dataset = load_dataset_spec("builtin")                    # or "env-tasks", a folder, "NAME@VERSION", "hf:REPO"
outcome = await sanity_check(task, backend, "oracle")     # oracle must score 1.0, nop 0.0
"""

from tasks.datasets import (
    BUILTIN_DIR,
    NAMED_DATASETS,
    Dataset,
    Refusal,
    load_dataset_spec,
    task_dirs,
    task_to_row,
)
from tasks.errors import (
    DatasetError,
    TaskEnvError,
    TaskError,
    TaskFormatError,
    TaskNotFound,
    UnsupportedTaskFeature,
)
from tasks.loader import Step, Task, TaskPaths, load_task
from tasks.models import TaskConfig
from tasks.sanity import EXPECTED_REWARD, SanityResult, sanity_check
from tasks.verifier import VerifierResult, verify

__all__ = [
    "BUILTIN_DIR",
    "EXPECTED_REWARD",
    "NAMED_DATASETS",
    "Dataset",
    "Refusal",
    "DatasetError",
    "SanityResult",
    "Task",
    "TaskConfig",
    "TaskEnvError",
    "TaskError",
    "TaskFormatError",
    "TaskNotFound",
    "Step",
    "UnsupportedTaskFeature",
    "TaskPaths",
    "VerifierResult",
    "load_dataset_spec",
    "load_task",
    "sanity_check",
    "task_dirs",
    "task_to_row",
    "verify",
]
