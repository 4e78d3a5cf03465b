"""Datasets by name and layout, offline: Harbor registry datasets (`NAME@VERSION`) from a registry file
and a git repository of tasks made here (real git, file:// URL), Hub repos of task folders from a
pre-filled Hugging Face cache (real `snapshot_download`, HF_HUB_OFFLINE), and nested local folders.
Every task loaded goes through the same validation as a local folder."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading

import huggingface_hub.constants
import pytest

from tasks import BUILTIN_DIR, DatasetError, TaskFormatError, load_dataset_spec, load_task
from tasks.registry import REGISTRY_PATH_ENV, REGISTRY_URL_ENV, load_registry
from tests.tasks.dataset_sources import (
    HARBOR_1_1_TASK_TOML,
    HARBOR_TASK_TOML,
    builtin_tasks_repo,
    git,
    prefill_hub_cache,
    registry_entry,
    write_registry,
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def registry_env(monkeypatch):
    """Point `tasks.registry` at a file for one test; the variables are restored afterwards."""
    monkeypatch.delenv(REGISTRY_URL_ENV, raising=False)

    def use(path):
        monkeypatch.setenv(REGISTRY_PATH_ENV, str(path))

    return use


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """huggingface_hub reading a cache under tmp_path with HF_HUB_OFFLINE=1 (its constants are read at
    import, so the test sets them where snapshot_download looks)."""
    hub = tmp_path / "hf-home" / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return hub


# --- Harbor's registry ------------------------------------------------------------------------


def test_registry_dataset_from_a_git_repo_pinned_by_commit(tmp_path, cache, registry_env):
    url, first = builtin_tasks_repo(tmp_path / "repo", ["fix-pagination", "implement-roman"])
    # A later commit changes a task: the registry's pin, not the branch tip, is what loads.
    (tmp_path / "repo" / "tasks" / "fix-pagination" / "instruction.md").write_text("changed later\n")
    git(tmp_path / "repo", "commit", "-qam", "later")
    tasks = [{"name": n, "git_url": url, "git_commit_id": first, "path": f"tasks/{n}"}
             for n in ("fix-pagination", "implement-roman")]  # fmt: skip
    registry_env(write_registry(tmp_path / "registry.json", [registry_entry("demo", "1.0", tasks)]))

    dataset = load_dataset_spec("demo@1.0")
    assert (dataset.source, dataset.split, dataset.ids) == (
        "demo@1.0",
        "demo@1.0",
        ["fix-pagination", "implement-roman"],
    )
    for task in dataset:
        original = load_task(BUILTIN_DIR / task.id)
        assert task.digest() == original.digest() and task.config == original.config
        assert task.paths.root.is_relative_to(cache / "git-tasks")
        assert first in task.paths.root.parts  # cached by commit
    # Cached: with the repository gone, the same pin loads again without git.
    shutil.rmtree(tmp_path / "repo")
    again = load_dataset_spec("demo@1.0")
    assert [t.paths.root for t in again] == [t.paths.root for t in dataset]


def test_registry_branch_ref_resolves_to_its_commit(tmp_path, cache, registry_env):
    url, _ = builtin_tasks_repo(tmp_path / "repo", ["lru-cache"])
    (tmp_path / "repo" / "tasks" / "lru-cache" / "instruction.md").write_text("The newer instruction.\n")
    git(tmp_path / "repo", "commit", "-qam", "newer")
    tip = git(tmp_path / "repo", "rev-parse", "HEAD")
    plain_path = str(tmp_path / "repo")  # as some registries write a local repository
    # A branch, Harbor's "HEAD", and no commit at all: each is the default branch's tip.
    for ref, repo_url in (("main", url), ("HEAD", plain_path), (None, url)):
        entry = {"name": "lru-cache", "git_url": repo_url, "path": "tasks/lru-cache"}
        if ref:
            entry["git_commit_id"] = ref
        registry_env(write_registry(tmp_path / "registry.json", [registry_entry("tip", "head", [entry])]))
        task = load_dataset_spec("tip@head")[0]
        assert task.instruction == "The newer instruction.\n" and tip in task.paths.root.parts


def test_harbor_format_task_and_local_registry_paths_load(tmp_path, cache, registry_env):
    """Harbor's own example task.toml loads: legacy spellings mapped, Harbor-only keys kept, not fatal."""
    task = tmp_path / "local-tasks" / "harbor-example"
    shutil.copytree(BUILTIN_DIR / "fix-pagination", task)
    (task / "task.toml").write_text(HARBOR_TASK_TOML)
    entry = {"name": "org/harbor-example", "path": "local-tasks/harbor-example"}  # no git_url: local
    registry_env(write_registry(tmp_path / "registry.json", [registry_entry("local", "0.1", [entry])]))
    loaded = load_dataset_spec("local@0.1")[0]
    assert loaded.id == "harbor-example"
    env = loaded.config.environment
    assert (env.network_mode, env.docker_image, env.memory_mb) == (
        "public",
        "some-org/some-name:some-tag",
        2048,
    )
    assert loaded.config.schema_version == "1.0" and loaded.config.verifier.env == {"API_KEY": "sk-test-123"}
    # Harbor's whole schema is known now: gpus, gpu_types, mcp_servers and source are fields.
    assert loaded.config.unknown_keys() == []
    assert loaded.config.environment.mcp_servers[0].name == "mcp-server" and loaded.config.source is not None


def test_a_terminal_bench_2_task_toml_from_a_git_registry_loads(tmp_path, cache, registry_env):
    url, _ = builtin_tasks_repo(tmp_path / "repo", ["fix-pagination"], under="extract-elf")
    toml = tmp_path / "repo" / "extract-elf" / "fix-pagination" / "task.toml"
    toml.write_text(HARBOR_1_1_TASK_TOML)
    git(tmp_path / "repo", "commit", "-qam", "a Harbor 1.1 task")
    entry = {"name": "terminal-bench/extract-elf", "git_url": url, "git_commit_id": "HEAD",
             "path": "extract-elf/fix-pagination"}  # fmt: skip
    registry_env(
        write_registry(tmp_path / "registry.json", [registry_entry("terminal-bench", "2.0", [entry])])
    )
    task = load_dataset_spec("terminal-bench@2.0")[0]
    assert (task.id, task.name) == ("extract-elf", "terminal-bench/extract-elf")
    assert task.config.schema_version == "1.1" and task.config.environment.network_mode == "public"
    assert task.config.verifier.timeout_sec == 900.0 and task.config.environment.env == {}
    assert task.config.unknown_keys() == []
    assert task.config.task is not None and task.config.task.keywords


def test_unknown_dataset_or_version_names_what_the_registry_has(tmp_path, cache, registry_env):
    entries = [registry_entry("terminal-bench", v, []) for v in ("1.0", "2.0")]
    entries.append(registry_entry("swebench-verified", "1.0", []))
    registry_env(write_registry(tmp_path / "registry.json", entries))
    with pytest.raises(
        DatasetError, match=r"no version '3\.0' of 'terminal-bench'; its versions: 1\.0, 2\.0"
    ):
        load_dataset_spec("terminal-bench@3.0")
    with pytest.raises(DatasetError, match=r"no dataset 'terminal-bnch'; did you mean terminal-bench\?"):
        load_dataset_spec("terminal-bnch@2.0")
    with pytest.raises(DatasetError, match="lists no tasks"):
        load_dataset_spec("terminal-bench@2.0")


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"name": "x", "git_url": "URL", "git_commit_id": "COMMIT", "path": "../outside"}, "must be a folder inside"),
        ({"name": "x", "git_url": "URL", "git_commit_id": "COMMIT", "path": "tasks/missing"}, "has no folder 'tasks/missing'"),
        ({"name": "x", "git_url": "URL", "git_commit_id": "no-such-branch", "path": "tasks/lru-cache"}, "no branch or tag 'no-such-branch'"),
        ({"name": "x", "git_url": "file:///nonexistent/repo", "path": "t"}, "git ls-remote failed"),
        ({"name": "x", "path": "nowhere"}, "local task 'x' has no folder"),
    ],
)  # fmt: skip
def test_bad_registry_tasks_are_one_clear_error(tmp_path, cache, registry_env, entry, words):
    url, commit = builtin_tasks_repo(tmp_path / "repo", ["lru-cache"])
    entry = {k: v.replace("URL", url).replace("COMMIT", commit) for k, v in entry.items()}
    registry_env(write_registry(tmp_path / "registry.json", [registry_entry("bad", "1", [entry])]))
    with pytest.raises(DatasetError, match="bad@1") as info:
        load_dataset_spec("bad@1")
    assert words in str(info.value)


def test_malformed_registry_file_names_the_entry(tmp_path, cache, registry_env):
    broken = [registry_entry("ok", "1", []), {"name": "no-version", "description": "", "tasks": []}]
    registry_env(write_registry(tmp_path / "registry.json", broken))
    with pytest.raises(DatasetError, match=r"entry \[1\]\.version: Field required"):
        load_dataset_spec("ok@1")
    (tmp_path / "registry.json").write_text("{not json")
    with pytest.raises(DatasetError, match="is not JSON"):
        load_dataset_spec("ok@1")


def test_a_task_of_a_registry_dataset_is_validated_like_a_folder(tmp_path, cache, registry_env):
    url, commit = builtin_tasks_repo(tmp_path / "repo", ["lru-cache"])
    (tmp_path / "repo" / "tasks" / "lru-cache" / "tests" / "test.sh").unlink()
    git(tmp_path / "repo", "commit", "-qam", "break it")
    commit = git(tmp_path / "repo", "rev-parse", "HEAD")
    entry = {"name": "lru-cache", "git_url": url, "git_commit_id": commit, "path": "tasks/lru-cache"}
    registry_env(write_registry(tmp_path / "registry.json", [registry_entry("broken", "1", [entry])]))
    with pytest.raises(TaskFormatError, match="tests/test.sh"):
        load_dataset_spec("broken@1")


def test_registry_url_is_fetched_then_served_from_its_cached_copy(tmp_path, cache, monkeypatch):
    monkeypatch.delenv(REGISTRY_PATH_ENV, raising=False)
    url, commit = builtin_tasks_repo(tmp_path / "repo", ["lru-cache"])
    entry = {"name": "lru-cache", "git_url": url, "git_commit_id": commit, "path": "tasks/lru-cache"}
    (tmp_path / "site").mkdir()
    write_registry(tmp_path / "site" / "registry.json", [registry_entry("web", "1", [entry])])
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "site"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv(REGISTRY_URL_ENV, f"http://127.0.0.1:{server.server_port}/registry.json")
    try:
        assert load_dataset_spec("web@1").ids == ["lru-cache"]
    finally:
        server.shutdown()
        server.server_close()
    # The registry's host is gone: the copy kept at the first fetch answers.
    assert load_dataset_spec("web@1").ids == ["lru-cache"]


def test_remote_registry_offline_uses_the_cached_copy_or_says_what_to_do(tmp_path, cache, monkeypatch):
    monkeypatch.delenv(REGISTRY_PATH_ENV, raising=False)
    monkeypatch.setenv("HARBOR_OFFLINE", "1")
    with pytest.raises(
        DatasetError,
        match="HARBOR_OFFLINE is set and no copy is cached; give a local registry file with --registry-path",
    ):
        load_registry(url="https://registry.invalid/registry.json")
    # A registry fetched once is kept; offline, that copy is what is read.
    import hashlib

    url = "https://registry.invalid/registry.json"
    copy = cache / "registry" / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}.json"
    copy.parent.mkdir(parents=True)
    copy.write_text('[{"name": "kept", "version": "1", "description": "", "tasks": []}]')
    assert [d.name for d in load_registry(url=url).datasets] == ["kept"]


# --- Hub repos of task folders -----------------------------------------------------------------


def test_hub_repo_of_task_folders_from_an_offline_cache(tmp_path, cache, offline_hub):
    source = tmp_path / "src"
    for name in ("fix-pagination", "sqlite-query"):
        shutil.copytree(BUILTIN_DIR / name, source / "tasks" / name)
    commit = prefill_hub_cache(offline_hub, "org/harbor-tasks", source)
    dataset = load_dataset_spec("hf:org/harbor-tasks")
    assert (dataset.source, dataset.split, dataset.ids) == (
        "hf:org/harbor-tasks",
        "train",
        ["fix-pagination", "sqlite-query"],
    )
    for task in dataset:
        assert task.digest() == load_task(BUILTIN_DIR / task.id).digest()
        # Real files (the Hub cache's links resolved), copied once per commit.
        assert not any(p.is_symlink() for p in task.paths.root.rglob("*"))
        assert task.paths.root.is_relative_to(cache / "hf-repos" / "org__harbor-tasks" / commit)
    assert load_dataset_spec("hf:org/harbor-tasks@test").split == "test"
    # OpenEnv's form, `--dataset ORG/NAME`, is the same Hub dataset (no folder of that path here).
    plain = load_dataset_spec("org/harbor-tasks")
    assert (plain.source, plain.split, plain.ids) == (dataset.source, dataset.split, dataset.ids)


def test_a_server_takes_a_hub_datasets_id_as_its_split(tmp_path, cache, offline_hub, monkeypatch):
    """OpenEnv's clients name the split by the Hub id they served (`split="ORG/NAME"`)."""
    from harbor_server import HarborClient, ServeConfig, free_port, running_server
    from harbor_server.errors import BadRolloutRequest

    shutil.copytree(BUILTIN_DIR / "fix-pagination", tmp_path / "src" / "tasks" / "fix-pagination")
    prefill_hub_cache(offline_hub, "org/harbor-tasks", tmp_path / "src")
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    config = ServeConfig(
        datasets=["org/harbor-tasks", "builtin"], port=free_port(), capture_port=free_port(), sandbox="local",
        store_url=f"sqlite:///{tmp_path}/t.db", check_engine=False,
    )  # fmt: skip
    with running_server(config) as server:
        client = HarborClient(server.url)
        assert [t.task_id for t in client.iter_tasks("org/harbor-tasks")] == ["fix-pagination"]
        assert [t.task_id for t in client.iter_tasks("train")] == ["fix-pagination"]
        with pytest.raises(
            BadRolloutRequest, match=r"unknown split 'org/other'; .* train \(hf:org/harbor-tasks\)"
        ):
            client.tasks("org/other")


def test_hub_repo_with_grouped_task_folders(tmp_path, cache, offline_hub):
    source = tmp_path / "src"
    shutil.copytree(BUILTIN_DIR / "deep-merge", source / "tasks" / "python" / "easy" / "deep-merge")
    shutil.copytree(BUILTIN_DIR / "git-recover", source / "tasks" / "shell" / "git-recover")
    prefill_hub_cache(offline_hub, "org/grouped", source)
    assert load_dataset_spec("hf:org/grouped").ids == ["deep-merge", "git-recover"]


def test_hub_repo_offline_and_not_cached_is_one_clear_error(cache, offline_hub):
    with pytest.raises(
        DatasetError, match="hf:org/absent: no cached snapshot and HF_HUB_OFFLINE is set; as rows: "
    ):
        load_dataset_spec("hf:org/absent")


# --- nested local folders ----------------------------------------------------------------------


def test_nested_local_folders(tmp_path):
    root = tmp_path / "suite"
    shutil.copytree(BUILTIN_DIR / "deep-merge", root / "tasks" / "python" / "deep-merge")
    shutil.copytree(BUILTIN_DIR / "wordcount-cli", root / "tasks" / "cli" / "tools" / "wordcount-cli")
    (root / "tasks" / "empty-group").mkdir()
    hidden = root / "tasks" / ".hidden" / "lru-cache"
    shutil.copytree(BUILTIN_DIR / "lru-cache", hidden)
    (root / "tasks" / "linked").symlink_to(BUILTIN_DIR)  # a link is not followed
    dataset = load_dataset_spec(str(root))
    assert dataset.ids == ["deep-merge", "wordcount-cli"] and dataset.split == "suite"


def test_nested_duplicate_names_are_refused(tmp_path):
    root = tmp_path / "suite"
    shutil.copytree(BUILTIN_DIR / "deep-merge", root / "a" / "deep-merge")
    shutil.copytree(BUILTIN_DIR / "deep-merge", root / "b" / "deep-merge")
    with pytest.raises(DatasetError, match="task id 'deep-merge' appears twice"):
        load_dataset_spec(str(root))


def test_unknown_plain_name_mentions_every_form(tmp_path):
    with pytest.raises(DatasetError, match="registry dataset NAME@VERSION"):
        load_dataset_spec(str(tmp_path / "missing"))
