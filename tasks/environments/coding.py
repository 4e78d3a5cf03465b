"""`CodingEnv`: a Harbor task's sandbox as tools (bash, read_file, write_file, submit), any backend.

The row carries the running `sandbox` (any `sandboxes.base.Sandbox`: local, docker, e2b) and the task's
`workdir`; relative paths resolve against it. Long outputs are cut by a Transform (head and tail kept).
`submit()` ends the episode. Under `harbor serve` the task's own verifier scores the sandbox after the
episode; standalone, give the loaded task as `task` in the row and `submit()` runs the verifier itself,
setting `reward` (None when the verifier gives none: unscoreable, never 0).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tasks.rubrics import TruncateText

if TYPE_CHECKING:
    from sandboxes.base import Sandbox

MAX_OUTPUT_CHARS = 8000
COMMAND_TIMEOUT_S = 120.0


class CodingEnv:
    """Solve a coding task in its sandbox with shell and file tools, then submit."""

    def __init__(self) -> None:
        self.transform = TruncateText(MAX_OUTPUT_CHARS)
        self.done = False
        self.reward: float | None = None
        self.verifier_rewards: dict[str, float] = {}
        self._sandbox: Sandbox | None = None
        self._workdir = "/app"
        self._task: Any = None
        self._timeout_s = COMMAND_TIMEOUT_S

    def reset(
        self,
        sandbox: Sandbox | None = None,
        workdir: str = "/app",
        task: Any = None,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        **kwargs: Any,
    ) -> str | None:
        if sandbox is None:
            raise ValueError("CodingEnv needs the task's running sandbox in the row (column 'sandbox')")
        self._sandbox, self._workdir, self._task = sandbox, workdir, task
        self._timeout_s = command_timeout_s
        self.done, self.reward, self.verifier_rewards = False, None, {}
        return (
            f"You work in {workdir} inside the task's sandbox. Use the bash, read_file and write_file tools, "
            "and call submit when the task is done."
        )

    def _open(self) -> Sandbox:
        if self._sandbox is None:
            raise RuntimeError("the environment was not reset with a sandbox")
        if self.done:
            raise RuntimeError("the work was already submitted; the episode is over")
        return self._sandbox

    def _path(self, path: str) -> str:
        if not path:
            raise ValueError("path must not be empty")
        return posixpath.normpath(posixpath.join(self._workdir, path))

    async def bash(self, command: str) -> str:
        """
        Run a bash command in the task's working directory and return its exit code and output.

        Args:
            command: The command line to run, e.g. "ls -la" or "python3 -m pytest -q"
        """
        result = await self._open().exec(command, cwd=self._workdir, timeout_s=self._timeout_s)
        if result.timed_out:
            raise TimeoutError(f"the command did not finish within {self._timeout_s:.0f} s")
        output = self.transform(result.stdout + result.stderr)
        return f"exit code {result.exit_code}\n{output}"

    async def read_file(self, path: str) -> str:
        """
        Read a text file.

        Args:
            path: The file's path, absolute or relative to the working directory
        """
        data = await self._open().download_file(self._path(path))
        return self.transform(data.decode("utf-8", errors="replace"))

    async def write_file(self, path: str, content: str) -> str:
        """
        Write a text file, replacing it if it exists.

        Args:
            path: The file's path, absolute or relative to the working directory
            content: The complete new content of the file
        """
        target = self._path(path)
        sandbox = self._open()
        await sandbox.exec(["mkdir", "-p", posixpath.dirname(target)], timeout_s=30.0)
        await sandbox.upload_file(content.encode("utf-8"), target)
        return f"wrote {len(content.encode('utf-8'))} bytes to {target}"

    async def submit(self) -> str:
        """
        Submit the work and end the episode. Call it once the task is done.
        """
        sandbox = self._open()
        self.done = True
        if self._task is None:
            return "Submitted. The task's tests will now be run."
        from tasks import verify

        result = await verify(sandbox, self._task)
        self.reward, self.verifier_rewards = result.reward, dict(result.rewards)
        if result.reward is None:
            return f"Submitted, but the tests gave no reward: {result.error}"
        return f"Submitted. Test reward: {result.reward}"


def coding_reward(environments: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """The verifier's reward for submitted coding episodes; None where there is none."""
    return [env.reward if isinstance(env, CodingEnv) else None for env in environments]
