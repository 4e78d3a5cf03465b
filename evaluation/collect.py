"""`harbor collect`: rollouts written as an SFT dataset (`results.jsonl` + `metadata.json`).

    summary = await run_collect(CollectConfig(provider="scripted", datasets=["env-tasks"]),
                                out_dir=Path("sft"))
    datasets.load_dataset("json", data_files="sft/results.jsonl")

Episode `i` of a run is `<prefix>-<i:06d>` and always runs task `i % len(tasks)` (tasks in dataset
order after --task), so an id names the same task across runs. Resume reads what is written,
skips those ids and the ones `should_keep` dropped before (listed in metadata.json), and refuses a
file whose ids map to other tasks than this run's plan. A corrupt line (a run killed mid-write, a
hand edit) is skipped with a warning and left out when the file is rewritten.

Rollouts run on the same in-process Harbor server as `harbor eval` (see `evaluation.rollouts`), or
on a running `harbor serve` given as `base_url` (OpenEnv's `--base-url`), so the teacher's calls are
captured sessions in the trace store too.

The command is OpenEnv's `openenv collect` (openenv 0.10.0, `openenv/cli/commands/collect.py`;
`openenv/core/harness/collect.py` holds its `EpisodeRecord`, `RolloutSerializer` and `CollectRunner`):
the same files and record fields, ids `<prefix>-<i:06d>`, resume by id, a keep filter, and the
teachers `scripted`, `openai` and `anthropic` (`openenv/core/llm_client.py`'s `create_llm_client`).
OpenEnv's `openspiel:tic_tac_toe` is the dataset `openspiel:GAME` (`tasks.environments.openspiel`, the
same OpenSpiel game), and the scripted teacher plays its first legal move, as OpenEnv's does; it also
has scripts for the built-in environments (`evaluation.scripted`). Where they differ: OpenEnv's
`--base-url` is the game's OpenEnv environment server, which the collect process drives, ours a
`harbor serve` of the game (`harbor serve --dataset openspiel:tic_tac_toe`), which runs the episodes and
keeps the teacher's calls in its trace store (an OpenEnv server given there is refused, saying so); our
`openai` is any OpenAI-compatible `--llm-url` (OpenEnv's `--llm-endpoint`); OpenEnv's CLI resumes by
default (`--no-resume` moves the old file aside), ours continues only with --resume and otherwise
refuses a non-empty results.jsonl; and the keep filter is `reward >= min_reward` (0 by default:
OpenEnv's `reward >= 0`; `--keep-losses`, OpenEnv's flag, is our `--keep-all`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fnmatch
import hashlib
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, Literal, get_args

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from capture_proxy.episodes import Episode, read_episodes
from capture_proxy.models import SamplingParams
from evaluation.errors import ConflictingOptions, DatasetMisaligned, NoTasksSelected, ProviderError
from evaluation.jobs import error_line, job_store_url, write_json_atomic
from evaluation.models import chosen_reward, classify_error, is_scored
from evaluation.rollouts import LocalHarbor, RemoteHarbor, RolloutOutcome, check_choices, token_counts
from evaluation.runner import load_datasets, print_errors, print_refused, select_tasks
from harbor_server import RolloutRequest
from tasks import Dataset, Task

RESULTS_FILE = "results.jsonl"
METADATA_FILE = "metadata.json"
FORMAT = "harbor-collect/1"
Provider = Literal["scripted", "openai", "anthropic"]
MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


class CollectConfig(BaseModel):
    """One `harbor collect` run."""

    model_config = ConfigDict(extra="forbid")

    datasets: list[str]
    """Dataset specs (in process) or the server's splits naming them (`base_url`; empty: all it serves)."""
    harness: str = "env-factory"
    sandbox: str | None = None
    """local, docker or e2b; None: local in process, the server's --sandbox with `base_url`."""
    provider: Provider = "openai"
    """scripted: the model-free script of `evaluation.scripted`; openai: any OpenAI-compatible teacher
    at `llm_url`; anthropic: Anthropic's Messages API (`llm_url`: its base URL, None: the SDK's)."""
    llm_url: str | None = None
    model: str | None = None
    base_url: str | None = None
    """A running `harbor serve` to collect from; None: one started in this process."""
    num_episodes: int | None = Field(default=None, ge=1)
    """Episodes in the dataset; None: one per selected task."""
    prefix: str = Field(default="episode", pattern=r"^[A-Za-z0-9_.]+(-[A-Za-z0-9_.]+)*$")
    """Episode ids are `<prefix>-<6 digits>`."""
    n_concurrent: int = Field(default=4, ge=1)
    task_globs: list[str] = Field(default_factory=list)
    keep_losses: bool = False
    """Keep every episode, unscoreable ones too; otherwise `should_keep` (reward >= min_reward)."""
    min_reward: float = 0.0
    reward_key: str | None = Field(default=None, min_length=1)
    """The verifier metric that is an episode's `reward` (what `should_keep` reads); None: the server's
    choice (the task's `reward_key`, `reward`, or the only metric). `verify_metrics` holds them all."""
    agent_timeout_sec: float | None = Field(default=None, gt=0)
    agent_step_limit: int = Field(default=0, ge=0)
    sampling: SamplingParams | None = None
    """Sampling applied over the teacher agent's own (only the fields set); None: the agent's own."""

    @field_validator("provider", mode="before")
    @classmethod
    def _known_provider(cls, provider: Any) -> Any:
        if isinstance(provider, str) and provider not in get_args(Provider):
            raise ValueError(
                f"unknown --provider {provider!r}; choose one of: {', '.join(get_args(Provider))}"
            )
        return provider

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"--base-url {url!r} is not an http:// or https:// URL of a harbor server")
        return url.rstrip("/") if url is not None else None

    @model_validator(mode="after")
    def _teacher_is_reachable(self) -> CollectConfig:
        if (
            self.provider == "openai"
            and self.base_url is None
            and (self.llm_url is None or self.model is None)
        ):
            raise ValueError("--provider openai needs --llm-url and --model (or use --provider scripted)")
        if self.provider == "openai" and self.llm_url is not None and self.model is None:
            raise ValueError("--provider openai needs --model for --llm-url")
        if self.provider == "anthropic" and self.model is None:
            raise ValueError("--provider anthropic needs --model (a Claude model id)")
        return self


def episode_id(prefix: str, index: int) -> str:
    return f"{prefix}-{index:06d}"


def episode_index(prefix: str, eid: str) -> int | None:
    head, _, digits = eid.rpartition("-")
    return int(digits) if head == prefix and len(digits) == 6 and digits.isdigit() else None


def should_keep(episode: Episode, *, keep_losses: bool = False, min_reward: float = 0.0) -> bool:
    """Keep every episode with keep_losses; otherwise only scored ones with reward >= min_reward."""
    if keep_losses:
        return True
    return episode.reward is not None and episode.reward >= min_reward


def _clean_message(message: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: message[k] for k in MESSAGE_KEYS if message.get(k) is not None}
    out.setdefault("content", "")
    return out


def transcript(outcome: RolloutOutcome, instruction: str) -> list[dict[str, Any]]:
    """The conversation: the last model call's messages plus its answer (the instruction when none)."""
    agent_turns = [t for t in outcome.turns if t.metadata.role == "agent"] or outcome.turns
    if not agent_turns:
        return [{"role": "user", "content": instruction}]
    last = agent_turns[-1]
    messages = [_clean_message(m) for m in last.request.get("messages") or []]
    choices = last.response.get("choices") or []
    if choices and choices[0].get("message"):
        messages.append(_clean_message(choices[0]["message"]))
    return messages


def offered_tools(outcome: RolloutOutcome) -> list[dict[str, Any]]:
    """The `tools` of the last model call, as the harness sent them."""
    agent_turns = [t for t in outcome.turns if t.metadata.role == "agent"] or outcome.turns
    return list(agent_turns[-1].request.get("tools") or []) if agent_turns else []


def tool_trace(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    outputs = {m.get("tool_call_id"): m.get("content") for m in messages if m.get("role") == "tool"}
    return [
        {
            "call_id": call.get("id"),
            "name": call["function"]["name"],
            "arguments": call["function"].get("arguments") or "",
            "output": outputs.get(call.get("id")),
        }
        for m in messages
        for call in m.get("tool_calls") or []
    ]


def build_episode(
    eid: str,
    split: str,
    task_id: str,
    instruction: str,
    outcome: RolloutOutcome,
    config: CollectConfig,
    model: str | None,
) -> Episode:
    result = outcome.result
    messages = transcript(outcome, instruction)
    prompt_tokens, completion_tokens = token_counts(outcome.turns)
    reward = chosen_reward(result, config.reward_key)
    return Episode(
        episode_id=eid,
        messages=messages,
        reward=reward,
        done=result.status == "completed" and not result.timed_out,
        tool_trace=tool_trace(messages),
        metrics={
            "model_calls": len(outcome.turns),
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "tool_calls": result.tool_call_count,
            "tool_failures": result.tool_failures,
            "wall_time_s": float(result.timings.get("total", 0.0)),
        },
        verify_metrics={k: float(v) for k, v in result.rewards.items()},
        artifacts={
            "rollout_id": result.rollout_id,
            "agent_log_tail": result.agent_log_tail,
            "verifier_output": result.verifier_output,
        },
        task={"split": split, "task_id": task_id},
        extra={
            "harness": config.harness,
            "provider": config.provider,
            "model": model or result.model or "",
            "status": result.status,
            "error": result.error or "",
            "seed": result.seed if result.seed is not None else -1,
        },
        tools=offered_tools(outcome),
    )


class SFTDataset:
    """The output folder: results.jsonl appended one fsync'd line per episode, metadata.json beside it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.results = root / RESULTS_FILE
        self.metadata_path = root / METADATA_FILE
        self.ids: set[str] = set()
        self.dropped: set[str] = set()
        self.metadata: dict[str, Any] = {}

    def read_valid_lines(self) -> list[Episode]:
        """Every valid episode in results.jsonl; each corrupt line is skipped with a CorruptLineWarning."""
        return read_episodes(self.results) if self.results.exists() else []

    def open(self, plan: Mapping[str, tuple[str, str]], *, resume: bool) -> None:
        """Load what is there (resume) or refuse to overwrite it; check ids map to the planned tasks."""
        if not resume and self.results.exists() and self.results.stat().st_size > 0:
            raise DatasetMisaligned(
                f"{self.results} already has episodes; pass --resume to continue it or choose another --output-dir"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        episodes = self.read_valid_lines() if resume else []
        for ep in episodes:
            planned = plan.get(ep.episode_id)
            here = (ep.task.get("split"), ep.task.get("task_id"))
            if planned is not None and here != planned:
                raise DatasetMisaligned(
                    f"{self.results}: {ep.episode_id} holds task {here[1]!r} but this run plans {planned[1]!r} "
                    "for it (the datasets, --task or --prefix changed); use a new --output-dir"
                )
        self.ids = {ep.episode_id for ep in episodes}
        if resume and self.metadata_path.exists():
            with contextlib.suppress(orjson.JSONDecodeError):
                self.metadata = orjson.loads(self.metadata_path.read_bytes())
                self.dropped = set(self.metadata.get("dropped_ids") or []) - self.ids
        # Rewrite without corrupt or partial lines, so appends start on a clean line.
        self._rewrite(episodes)

    def _rewrite(self, episodes: list[Episode]) -> None:
        tmp = self.results.with_name(f".{RESULTS_FILE}.tmp")
        with tmp.open("wb") as f:
            for ep in episodes:
                f.write(orjson.dumps(ep.model_dump(mode="json")) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.results)

    def sort(self) -> None:
        """Rewrite results.jsonl in episode-id order."""
        self._rewrite(sorted(self.read_valid_lines(), key=lambda ep: ep.episode_id))

    def append(self, episode: Episode) -> None:
        with self.results.open("ab") as f:
            f.write(orjson.dumps(episode.model_dump(mode="json")) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        self.ids.add(episode.episode_id)

    def drop(self, eid: str) -> None:
        self.dropped.add(eid)

    def write_metadata(self, base: dict[str, Any], counts: dict[str, int]) -> None:
        self.metadata = {
            **self.metadata,
            **base,
            "format": FORMAT,
            "fields": list(Episode.model_fields),
            "num_written": len(self.ids),
            "num_dropped": len(self.dropped),
            "dropped_ids": sorted(self.dropped),
            "runs": counts,
            "updated_at": time.time(),
        }
        self.metadata.setdefault("created_at", time.time())
        write_json_atomic(self.metadata_path, self.metadata)


class CollectSummary(BaseModel):
    out_dir: str
    planned: int
    written: int
    dropped: int
    ran: int
    skipped: int
    """Episodes already written or dropped before this run."""
    errors: int
    """Episodes of this run whose verifier gave no metrics."""
    metrics_only: int = 0
    """Episodes of this run with metrics but no one reward (several metrics, none chosen by --reward-key)."""
    error_messages: dict[str, int] = Field(default_factory=dict)
    """`kind: first line of the error` -> episodes of this run, most first."""


@dataclasses.dataclass(frozen=True)
class Teacher:
    """Where the harness's model calls go: an OpenAI base URL, its model, the key the proxy sends it.
    None (only with a `base_url` server): the server's own --llm-url / --model / key."""

    llm_url: str | None
    model: str | None
    api_key: str | None = None

    def request_fields(self) -> dict[str, Any]:
        """The RolloutRequest fields that point a running server's rollout at this teacher."""
        return {"llm_url": self.llm_url, "model": self.model, "api_key": self.api_key}


Harbor = LocalHarbor | RemoteHarbor
OpenHarbor = Callable[[Teacher], contextlib.AbstractAsyncContextManager[tuple[Harbor, dict[str, Any]]]]
"""Given the teacher: the server to run on and the engine fields each request carries to it."""


@contextlib.asynccontextmanager
async def teacher(
    config: CollectConfig, tasks: list[Task] | None = None, llm_api_key: str | None = None
) -> AsyncIterator[Teacher]:
    """The run's teacher; the scripted and anthropic ones are served on 127.0.0.1 for its duration.

    `tasks`: what a coding harness may meet; the scripted teacher plays their solutions (a harness other
    than env-factory offers it `bash`, not the white-box tools). `llm_api_key`: the openai teacher's
    key, or the anthropic one's (else ANTHROPIC_API_KEY)."""
    if config.provider == "scripted":
        from evaluation.scripted import SCRIPTED_MODEL, scripted_teacher
        from evaluation.scripted_coding import CodingScripts

        coding = CodingScripts(tasks) if tasks and config.harness != "env-factory" else None
        async with scripted_teacher(coding) as url:
            yield Teacher(url, SCRIPTED_MODEL)
        return
    if config.provider == "anthropic":
        from evaluation.anthropic_teacher import anthropic_api_key, anthropic_teacher

        async with anthropic_teacher(anthropic_api_key(llm_api_key), config.llm_url) as (url, token):
            yield Teacher(url, config.model, token)
        return
    if config.base_url is None and (config.llm_url is None or config.model is None):  # CollectConfig refuses
        raise ProviderError("--provider openai needs --llm-url and --model (or use --provider scripted)")
    yield Teacher(config.llm_url, config.model, llm_api_key)


def _check_teacher_key(config: CollectConfig, llm_api_key: str | None) -> None:
    """Refuse a run whose teacher has no key before the output folder exists."""
    if config.provider == "anthropic":
        from evaluation.anthropic_teacher import anthropic_api_key

        anthropic_api_key(llm_api_key)


@dataclasses.dataclass
class _Catalog:
    """The run's tasks: (split, task id) in plan order, each one's instruction, and (in process) the
    loaded datasets."""

    tasks: list[tuple[str, str]]
    instructions: dict[tuple[str, str], str]
    datasets: Mapping[str, Dataset] | None = None

    def planned(self, plan: Mapping[str, tuple[str, str]]) -> list[Task] | None:
        if self.datasets is None:
            return None  # a remote server's tasks: no solutions here for the scripted coding teacher
        return [self.datasets[split].get(task_id) for split, task_id in dict.fromkeys(plan.values())]


def _local_catalog(datasets: Mapping[str, Dataset], globs: list[str], console: Console) -> _Catalog:
    print_refused(console, datasets, globs)
    tasks = select_tasks(datasets, globs)
    return _Catalog(tasks, {(s, t): datasets[s].get(t).instruction for s, t in tasks}, datasets)


async def _remote_catalog(harbor: RemoteHarbor, config: CollectConfig) -> _Catalog:
    infos = [task for split in harbor.splits(config.datasets) for task in await harbor.tasks(split)]
    picked = [
        t
        for t in infos
        if not config.task_globs or any(fnmatch.fnmatchcase(t.task_id, g) for g in config.task_globs)
    ]
    if not picked:
        available = ", ".join(t.task_id for t in infos)
        raise NoTasksSelected(f"no task matches --task {' '.join(config.task_globs)!r}; tasks: {available}")
    return _Catalog(
        [(t.split, t.task_id) for t in picked], {(t.split, t.task_id): t.instruction for t in picked}
    )


async def run_collect(
    config: CollectConfig,
    *,
    out_dir: Path,
    resume: bool = False,
    store_url: str | None = None,
    llm_api_key: str | None = None,
    console: Console | None = None,
    datasets: Mapping[str, Dataset] | None = None,
    strict: bool = False,
) -> CollectSummary:
    """Collect `config` into `out_dir`, on an in-process server or the running one at `config.base_url`."""
    console = console or Console(stderr=True)
    check_choices(config.harness, config.sandbox or "local")  # before the output folder exists
    _check_teacher_key(config, llm_api_key)
    if config.base_url is not None:
        if store_url is not None:
            raise ConflictingOptions("--store is the server's own with --base-url (inspect it where it runs)")
        async with RemoteHarbor(config.base_url) as remote:

            @contextlib.asynccontextmanager
            async def on_server(chosen: Teacher) -> AsyncIterator[tuple[Harbor, dict[str, Any]]]:
                yield remote, chosen.request_fields()

            catalog = await _remote_catalog(remote, config)
            return await _collect(config, catalog, on_server, out_dir, resume, llm_api_key, console)
    datasets = (
        dict(datasets)
        if datasets is not None
        else await asyncio.to_thread(load_datasets, config.datasets, strict=strict)
    )
    catalog = _local_catalog(datasets, config.task_globs, console)

    @contextlib.asynccontextmanager
    async def in_process(chosen: Teacher) -> AsyncIterator[tuple[Harbor, dict[str, Any]]]:
        assert chosen.llm_url is not None and chosen.model is not None  # only a server has its own
        async with LocalHarbor(
            datasets,
            sandbox=config.sandbox or "local",
            llm_url=chosen.llm_url,
            model=chosen.model,
            llm_api_key=chosen.api_key,
            store_url=store_url or job_store_url(out_dir),
            max_concurrent=config.n_concurrent,
            server_id=collect_server_id(out_dir),
        ) as harbor:
            yield harbor, {}  # the server was started with the teacher as its engine

    return await _collect(config, catalog, in_process, out_dir, resume, llm_api_key, console)


async def _collect(
    config: CollectConfig,
    catalog: _Catalog,
    open_harbor: OpenHarbor,
    out_dir: Path,
    resume: bool,
    llm_api_key: str | None,
    console: Console,
) -> CollectSummary:
    """Plan, open the output, run what is missing on the server `open_harbor` gives for the teacher."""
    tasks = catalog.tasks
    total = config.num_episodes or len(tasks)
    plan = {episode_id(config.prefix, i): tasks[i % len(tasks)] for i in range(total)}
    dataset = SFTDataset(out_dir)
    dataset.open(plan, resume=resume)
    todo = [eid for eid in plan if eid not in dataset.ids and eid not in dataset.dropped]
    skipped = total - len(todo)
    console.print(
        f"collect into {out_dir}: {total} episodes planned, {skipped} already done, {len(todo)} to run"
    )
    counts = {"ran": 0, "written": 0, "dropped": 0, "errors": 0, "metrics_only": 0}
    errors: Counter[str] = Counter()
    base = {
        "prefix": config.prefix,
        "num_episodes": total,
        "datasets": config.datasets,
        "tasks": [f"{split}/{task_id}" for split, task_id in tasks],
        "harness": config.harness,
        "sandbox": config.sandbox or ("local" if config.base_url is None else None),
        "provider": config.provider,
        "base_url": config.base_url,
        "keep_losses": config.keep_losses,
        "sampling": config.sampling.model_dump(exclude_unset=True) if config.sampling is not None else None,
        "min_reward": config.min_reward,
        "reward_key": config.reward_key,
    }
    if todo:
        async with teacher(config, catalog.planned(plan), llm_api_key) as chosen:
            base["model"] = chosen.model
            async with open_harbor(chosen) as (harbor, engine):
                await _run_episodes(
                    harbor, engine, dataset, config, catalog, plan, todo, base, counts, errors, console
                )
        dataset.sort()  # concurrent episodes were appended as they ended
    dataset.write_metadata(base, counts)
    print_errors(console, dict(errors.most_common()))
    return CollectSummary(
        out_dir=str(out_dir),
        planned=total,
        written=len(dataset.ids),
        dropped=len(dataset.dropped),
        ran=counts["ran"],
        skipped=skipped,
        errors=counts["errors"],
        metrics_only=counts["metrics_only"],
        error_messages=dict(errors.most_common()),
    )


def collect_server_id(out_dir: Path) -> str:
    """The in-process server's owner name, the same in every run into `out_dir`: a resumed run marks
    the sessions a killed one left `running` as failed."""
    return "harbor-collect:" + hashlib.sha256(str(out_dir.resolve()).encode()).hexdigest()[:12]


async def _run_episodes(
    harbor: Harbor,
    engine: dict[str, Any],
    dataset: SFTDataset,
    config: CollectConfig,
    catalog: _Catalog,
    plan: Mapping[str, tuple[str, str]],
    todo: list[str],
    base: dict[str, Any],
    counts: dict[str, int],
    errors: Counter[str],
    console: Console,
) -> None:
    """`engine`: the teacher's fields of each request (none when the server was started with it)."""
    semaphore = asyncio.Semaphore(config.n_concurrent)
    progress = Progress(
        TextColumn("[bold]collect"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("kept {task.fields[kept]}  dropped {task.fields[dropped]}"),
        TimeElapsedColumn(),
        console=console,
    )

    async def one(eid: str, bar) -> None:
        split, task_id = plan[eid]
        async with semaphore:
            sampling = {"sampling": config.sampling} if config.sampling is not None else {}
            request = RolloutRequest(
                **sampling,
                **engine,
                split=split,
                task_id=task_id,
                harness=config.harness,
                sandbox=config.sandbox,
                agent_timeout_sec=config.agent_timeout_sec,
                agent_step_limit=config.agent_step_limit,
                purpose="eval",
                seed=episode_index(config.prefix, eid),
                episode_id=eid,
                metadata={"collect": str(dataset.root), "run": dataset.root.name},
            )
            outcome = await harbor.run(request)
        instruction = catalog.instructions[(split, task_id)]
        episode = build_episode(eid, split, task_id, instruction, outcome, config, base.get("model"))
        result = outcome.result
        scored = is_scored(result)
        counts["ran"] += 1
        counts["errors"] += not scored
        counts["metrics_only"] += scored and episode.reward is None
        if not scored:
            errors[
                error_line(classify_error(result.status, False, result.error, result.timed_out), result.error)
            ] += 1
        if should_keep(episode, keep_losses=config.keep_losses, min_reward=config.min_reward):
            dataset.append(episode)
            counts["written"] += 1
        else:
            dataset.drop(eid)
            counts["dropped"] += 1
        dataset.write_metadata(base, counts)  # after each episode, so a kill keeps the dropped ids
        progress.update(bar, advance=1, kept=counts["written"], dropped=counts["dropped"])

    with progress:
        bar = progress.add_task("collect", total=len(todo), kept=0, dropped=0)
        await asyncio.gather(*(one(eid, bar) for eid in todo))
