"""The Hub's jobs API, wrapped: launch, status, logs, cancel, uploading the wheel a job installs, and
what the launcher asks of the Hub on the job (its own public URL, the model's files). Every call takes
the `HfApi` to use."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from harbor_rl.jobs.config import RUN_LABEL, LaunchConfig, RunConfig
from harbor_rl.jobs.errors import HubError, LauncherError
from harbor_rl.jobs.spec import JobSpec
from harbor_rl.jobs.wheel import WheelRef, build_wheel, required_checkout, sha256_of, wheel_repo

if TYPE_CHECKING:
    from huggingface_hub import HfApi, JobInfo

T = TypeVar("T")


def make_api() -> HfApi:
    from huggingface_hub import HfApi

    return HfApi()


def hub_call(what: str, call: Callable[[], T]) -> T:
    """Run one Hub call; its HTTP and lookup errors become a HubError that says what failed."""
    from huggingface_hub.errors import HfHubHTTPError, JobNotFoundError, LocalTokenNotFoundError

    try:
        return call()
    except JobNotFoundError as exc:
        raise HubError(f"{what}: no such job ({exc})") from exc
    except LocalTokenNotFoundError as exc:
        raise HubError(f"{what}: not logged in to the Hub (export HF_TOKEN or `hf auth login`)") from exc
    except HfHubHTTPError as exc:
        raise HubError(f"{what}: the Hub answered {exc}") from exc
    except OSError as exc:  # connection refused, DNS, timeouts
        raise HubError(f"{what}: cannot reach the Hub ({exc})") from exc


def launch(api: HfApi, spec: JobSpec) -> JobInfo:
    return hub_call("launching the job", lambda: api.run_job(**spec.run_job_kwargs()))


def status(api: HfApi, job_id: str, namespace: str | None = None) -> JobInfo:
    return hub_call(f"inspecting job {job_id}", lambda: api.inspect_job(job_id=job_id, namespace=namespace))


def cancel(api: HfApi, job_id: str, namespace: str | None = None) -> None:
    hub_call(f"cancelling job {job_id}", lambda: api.cancel_job(job_id=job_id, namespace=namespace))


def logs(
    api: HfApi, job_id: str, namespace: str | None = None, *, follow: bool = False, tail: int | None = None
) -> Iterator[str]:
    """The job's log lines; with `follow`, streamed until the job ends."""
    what = f"fetching the logs of job {job_id}"
    lines = hub_call(
        what, lambda: iter(api.fetch_job_logs(job_id=job_id, namespace=namespace, follow=follow, tail=tail))
    )
    while True:  # fetch_job_logs is lazy: errors surface while iterating, so each step is wrapped
        line = hub_call(what, lambda: next(lines, None))
        if line is None:
            return
        yield line


def status_rows(job: JobInfo) -> list[tuple[str, str]]:
    """The fields `harbor jobs status` shows (the secrets' names only)."""
    stage = getattr(job.status, "stage", None)
    rows = [
        ("id", job.id),
        ("stage", str(getattr(stage, "value", stage))),
        ("message", (job.status.message if job.status else None) or ""),
        ("flavor", str(job.flavor)),
        ("image", job.docker_image or job.space_id or ""),
        ("created", str(job.created_at or "")),
        ("started", str(getattr(job, "started_at", None) or "")),
        ("finished", str(getattr(job, "finished_at", None) or "")),
        ("labels", ", ".join(f"{k}={v}" for k, v in (job.labels or {}).items())),
        ("secrets", ", ".join(sorted(job.secrets or {}))),
        ("exposed", ", ".join((job.status.expose_urls if job.status else None) or [])),
        ("url", getattr(job, "url", "") or ""),
    ]
    return rows


def find_public_url(api: HfApi, config: RunConfig, *, timeout_s: float = 120.0, poll_s: float = 5.0) -> str:
    """This job's Jobs-proxy URL of the capture port, found by the run's label (the container is not
    told its own job id). The URL may appear a little after the job starts, so look for a while."""
    deadline = time.monotonic() + timeout_s
    marker = f"--{config.capture_port}."
    while True:
        jobs = hub_call(
            "looking up this job",
            lambda: list(
                api.list_jobs(
                    labels={RUN_LABEL: config.run_name}, status="RUNNING", namespace=config.namespace
                )
            ),
        )
        urls = [u for job in jobs for u in ((job.status.expose_urls if job.status else None) or [])]
        matching = [u for u in urls if marker in u] or (urls if len(urls) == 1 else [])
        if matching:
            return matching[0].rstrip("/")
        if time.monotonic() > deadline:
            raise LauncherError(
                f"no public URL for the capture port {config.capture_port} on a running job labelled "
                f"{RUN_LABEL}={config.run_name} (found {len(jobs)} job(s), URLs {urls}); set public_url"
            )
        time.sleep(poll_s)


def download_model(repo_id: str, local_dir: str) -> str:
    """The model's files into LOCAL_DIR (HF_TOKEN from the job's secrets serves gated models)."""
    from huggingface_hub import snapshot_download

    return hub_call(f"downloading {repo_id}", lambda: snapshot_download(repo_id, local_dir=local_dir))


def upload_wheel(api: HfApi, wheel: Path, repo_id: str, *, private: bool = True) -> WheelRef:
    """Put the wheel under `wheels/` of the model repo (created private if missing); pinned to the
    commit that added it."""
    hub_call(
        f"creating {repo_id}",
        lambda: api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True),
    )
    path_in_repo = f"wheels/{wheel.name}"
    what = f"uploading {wheel.name} to {repo_id}"
    try:
        commit = hub_call(
            what,
            lambda: api.upload_file(path_or_fileobj=str(wheel), path_in_repo=path_in_repo, repo_id=repo_id,
                                    repo_type="model", commit_message=f"harbor jobs: {wheel.name}"),
        )  # fmt: skip
    except RuntimeError as exc:  # huggingface_hub wraps a failed LFS/Xet transfer in a RuntimeError
        raise HubError(f"{what}: {exc} ({exc.__cause__ or 'no cause given'})") from exc
    return WheelRef(repo_id, path_in_repo, commit.oid, sha256_of(wheel))


def ship_checkout(api: HfApi, config: LaunchConfig, say: Callable[[str], None]) -> WheelRef:
    """Build this checkout's wheel and upload it where the job will install it from."""
    root = required_checkout()
    named = config.wheel_repo or config.push_to_hub or config.namespace
    user = None if named else hub_call("asking the Hub who you are", lambda: api.whoami()["name"])
    repo = wheel_repo(config, user)
    with tempfile.TemporaryDirectory(prefix="harbor-wheel-") as out:
        wheel = build_wheel(root, Path(out))
        say(f"built {wheel.name} from {root}")
        ref = upload_wheel(api, wheel, repo, private=config.hub_private)
    say(f"uploaded it to hf.co/{repo}/blob/{ref.revision}/{ref.path_in_repo} (sha256 {ref.sha256})")
    return ref
