"""The verifier (docs/design.md 3.5): score what the agent left behind, in a way the agent cannot spoof.

After the agent stopped, in this order:
1. kill every process the agent left running (`kill -9 -1` as root; only PID 1 and the killer
   survive), so nothing the agent started can write a reward file while the tests run;
2. wipe `/logs/verifier` and `/tests`, so a reward file or a planted test folder does not count;
3. upload the task's `tests/` to `/tests` (the agent never saw it);
4. run `bash /tests/test.sh` as root under `[verifier] timeout_sec`;
5. read `/logs/verifier/reward.json` (a JSON object of numbers; `reward_key` picks one, a single key is
   used as is, else `reward`) or else `reward.txt` (one float).

No reward file, an unparsable one, a timeout, or a verifier that never ran gives reward None with the
reason in `error`, never 0. The exit code of `test.sh` is reported but is not the reward.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

from pydantic import BaseModel, Field

from sandboxes.base import ExecResult, Sandbox
from sandboxes.errors import SandboxError
from tasks.loader import Task

log = logging.getLogger(__name__)

VERIFIER_DIR = "/logs/verifier"
TESTS_DIR = "/tests"
REWARD_JSON = f"{VERIFIER_DIR}/reward.json"
REWARD_TXT = f"{VERIFIER_DIR}/reward.txt"
_MAX_REWARD_BYTES = 64 * 1024
_MAX_OUTPUT_CHARS = 64 * 1024
_HOUSEKEEPING_TIMEOUT_S = 60.0


class VerifierResult(BaseModel):
    reward: float | None
    """The reward; None when it could not be computed (see `error`)."""
    rewards: dict[str, float] = Field(default_factory=dict)
    """Every number the reward file held (`{"reward": x}` for reward.txt)."""
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    error: str | None = None
    """Why `reward` is None; None when it is not."""
    duration_s: float = 0.0
    exit_code: int | None = None
    """`test.sh`'s exit status: informative only, never the reward."""
    ran: bool = True
    """False when the sandbox could not run the tests at all (e.g. its container is gone)."""


class RewardFileError(ValueError):
    """A reward file exists but holds no usable reward."""


def parse_reward_json(text: str, reward_key: str | None) -> tuple[float, dict[str, float]]:
    """The reward and all numbers of a reward.json; raises RewardFileError saying what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RewardFileError(f"reward.json is not JSON ({exc})") from exc
    if not isinstance(data, dict) or not data:
        raise RewardFileError("reward.json must be a non-empty JSON object of numbers")
    rewards: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise RewardFileError(f"reward.json key {key!r} is not a finite number ({value!r})")
        rewards[key] = float(value)
    if reward_key is not None:
        if reward_key not in rewards:
            raise RewardFileError(
                f"reward.json has no key {reward_key!r} (reward_key); keys: {sorted(rewards)}"
            )
        return rewards[reward_key], rewards
    if len(rewards) == 1:
        return next(iter(rewards.values())), rewards
    if "reward" in rewards:
        return rewards["reward"], rewards
    raise RewardFileError(
        f"reward.json has keys {sorted(rewards)}: set [verifier] reward_key or add 'reward'"
    )


def parse_reward_txt(text: str) -> float:
    """The one float of a reward.txt; raises RewardFileError otherwise."""
    try:
        value = float(text.strip())
    except ValueError as exc:
        raise RewardFileError(f"reward.txt does not hold one number ({text.strip()[:80]!r})") from exc
    if not math.isfinite(value):
        raise RewardFileError(f"reward.txt holds {value}, not a finite number")
    return value


# `kill -9 -1`, spelled out so the sandbox itself survives it. Run as root inside the sandbox with the
# host's identity as $1. It SIGKILLs every process except PID 1, this script and its ancestors (the
# exec's own wrapper), and - when PID 1 is an init wrapper such as docker-init or tini - PID 1's oldest
# child, the keeper (`sleep infinity`) whose exit would stop the container. Several rounds catch
# processes forked mid-sweep. A sandbox that shares this process's PID namespace on this boot (an
# unisolated local sandbox) is the host itself, where this would take down the machine: skipped there.
_KILL_SCRIPT = r"""
me="$(readlink /proc/self/ns/pid) $(cat /proc/sys/kernel/random/boot_id 2>/dev/null)"
if [ "$me" = "$1" ]; then echo shared-host; exit 0; fi
stat_of() { local line; read -r line 2>/dev/null < "/proc/$1/stat" || return 1; STAT=(${line##*) }); }
keep=" 1 $$ "
pid=$$
while stat_of "$pid" && [ "${STAT[1]}" -gt 1 ]; do pid=${STAT[1]}; keep="$keep$pid "; done
read -r init < /proc/1/comm
case "$init" in
  docker-init|tini|dumb-init|catatonit)
    keeper=""; oldest=""
    for p in /proc/[0-9]*; do
      stat_of "${p#/proc/}" || continue
      if [ "${STAT[1]}" = 1 ] && { [ -z "$oldest" ] || [ "${STAT[19]}" -lt "$oldest" ]; }; then
        keeper=${p#/proc/}; oldest=${STAT[19]}
      fi
    done
    keep="$keep$keeper ";;
esac
for round in 1 2 3 4 5 6 7 8; do
  killed=0
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    case "$keep" in *" $pid "*) continue;; esac
    kill -9 "$pid" 2>/dev/null && killed=$((killed + 1))
  done
  [ "$killed" -eq 0 ] && break
done
exit 0
"""


def host_identity() -> str:
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{os.readlink('/proc/self/ns/pid')} {boot_id}"
    except OSError:
        return "unknown-host"


async def kill_leftover_processes(sandbox: Sandbox) -> bool:
    """`kill -9 -1` as root (see `_KILL_SCRIPT`): every process the agent left; its status is ignored.

    Returns False (and warns) when the sandbox shares the host's PID namespace, where it is skipped."""
    result = await sandbox.exec(
        ["bash", "-c", _KILL_SCRIPT, "kill-leftovers", host_identity()], user="root", timeout_s=30.0
    )
    if "shared-host" in result.stdout:
        log.warning(
            "sandbox %s shares the host's PID namespace: leftover agent processes not killed",
            sandbox.spec.name,
        )
        return False
    return True


async def verify(sandbox: Sandbox, task: Task, *, timeout_sec: float | None = None) -> VerifierResult:
    """Run the task's verifier in `sandbox` (the agent must have stopped) and read its reward."""
    timeout = timeout_sec if timeout_sec is not None else task.config.verifier.timeout_sec
    started = time.monotonic()
    try:
        await kill_leftover_processes(sandbox)
        await _prepare(sandbox)
        await sandbox.upload_dir(task.paths.tests_dir, TESTS_DIR)
        run = await sandbox.exec(
            ["bash", f"{TESTS_DIR}/test.sh"],
            timeout_s=timeout,
            cwd=task.config.environment.workdir,
            env=dict(task.config.verifier.env),
            user="root",
        )
    except (SandboxError, OSError) as exc:
        return VerifierResult(
            reward=None, error=f"verifier never ran: {exc}", duration_s=time.monotonic() - started, ran=False
        )
    result = await _score(sandbox, task, run, timeout)
    result.duration_s = time.monotonic() - started
    return result


async def _prepare(sandbox: Sandbox) -> None:
    # Empty each folder in place (it may be a mount point); a symlink or file the agent planted there
    # is removed itself, never followed.
    script = (
        f"set -e; for d in {VERIFIER_DIR} {TESTS_DIR}; do "
        'if [ -L "$d" ] || { [ -e "$d" ] && [ ! -d "$d" ]; }; then rm -f "$d"; fi; '
        'mkdir -p "$d"; find "$d" -mindepth 1 -delete; done; '
        f"chmod 777 {VERIFIER_DIR}"
    )
    result = await sandbox.exec(["bash", "-c", script], user="root", timeout_s=_HOUSEKEEPING_TIMEOUT_S)
    if not result.ok:
        output = (result.stderr or result.stdout).strip()
        raise SandboxError(
            f"could not reset {VERIFIER_DIR} and {TESTS_DIR} (exit {result.exit_code}): {output}"
        )


async def _score(sandbox: Sandbox, task: Task, run: ExecResult, timeout: float) -> VerifierResult:
    base = {
        "stdout": run.stdout[-_MAX_OUTPUT_CHARS:],
        "stderr": run.stderr[-_MAX_OUTPUT_CHARS:],
        "timed_out": run.timed_out,
        "exit_code": run.exit_code,
    }
    if run.timed_out:
        # Whatever the hung test left half-written is not a reward; stop it for good.
        await _kill_quietly(sandbox)
        return VerifierResult(reward=None, error=f"verifier timed out after {timeout:g}s", **base)
    try:
        reward, rewards = await _read_reward(sandbox, task.config.verifier.reward_key)
    except RewardFileError as exc:
        return VerifierResult(reward=None, error=str(exc), **base)
    except (SandboxError, OSError) as exc:
        return VerifierResult(reward=None, error=f"could not read the reward file: {exc}", **base)
    return VerifierResult(reward=reward, rewards=rewards, **base)


async def _kill_quietly(sandbox: Sandbox) -> None:
    try:
        await kill_leftover_processes(sandbox)
    except (SandboxError, OSError) as exc:
        log.warning("could not kill the timed-out verifier's processes: %s", exc)


async def _read_reward(sandbox: Sandbox, reward_key: str | None) -> tuple[float, dict[str, float]]:
    listing = await sandbox.exec(
        [
            "bash",
            "-c",
            f"for f in {REWARD_JSON} {REWARD_TXT}; do [ -f $f ] && stat -c '%s %n' $f; done; true",
        ],
        user="root",
        timeout_s=_HOUSEKEEPING_TIMEOUT_S,
    )
    sizes = {}
    for line in listing.stdout.splitlines():
        size, _, name = line.partition(" ")
        sizes[name] = int(size)
    if not sizes:
        raise RewardFileError(f"the verifier wrote no {REWARD_JSON} or {REWARD_TXT}")
    chosen = REWARD_JSON if REWARD_JSON in sizes else REWARD_TXT
    if sizes[chosen] > _MAX_REWARD_BYTES:
        raise RewardFileError(f"{chosen} is {sizes[chosen]} bytes; a reward file holds a few numbers")
    raw = await sandbox.download_file(chosen)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RewardFileError(f"{chosen} is not UTF-8 text") from exc
    if chosen == REWARD_JSON:
        return parse_reward_json(text, reward_key)
    value = parse_reward_txt(text)
    return value, {"reward": value}
