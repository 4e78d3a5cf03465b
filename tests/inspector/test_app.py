"""The Gradio app's callbacks, its mounting in FastAPI, and `harbor inspect`, on real stores."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html import escape
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from typer.testing import CliRunner

from engine.in_process import serve_in_thread
from harbor_rl.cli import app as cli
from inspector.app import ALL, Inspector, build_query, create_inspector, mount_inspector, parse_date
from inspector.errors import InvalidQuery, RolloutNotFound
from inspector.queries import RolloutQuery
from tests.inspector.conftest import DAY, T0, add_session, add_text_session, tiny_tokenizer

NO_FILTERS = dict(
    dataset=ALL,
    task="",
    harness=ALL,
    statuses=[],
    reward_min="",
    reward_max="",
    pv_min="",
    pv_max="",
    date_from="",
    date_to="",
    run=ALL,
    sort="newest first",
    page=1,
    page_size=50,
)


def test_blank_widgets_mean_no_filter():
    assert build_query(**NO_FILTERS) == RolloutQuery()


def test_widgets_become_a_query():
    q = build_query(
        **NO_FILTERS
        | dict(
            dataset="builtin",
            task=" hello ",
            reward_min="0.5",
            pv_min="2",
            pv_max="3",
            date_from="2026-01-10",
            date_to="2026-01-11",
            sort="reward, low to high",
            page=2,
        )
    )
    assert (q.dataset, q.task, q.reward_min, q.policy_version_min, q.policy_version_max) == (
        "builtin",
        "hello",
        0.5,
        2,
        3,
    )
    assert (q.sort, q.descending, q.page) == ("reward", False, 2)
    assert q.created_from == parse_date("2026-01-10T00:00", "x")
    assert q.created_to == parse_date("2026-01-12", "x")  # an end date includes its whole day


@pytest.mark.parametrize(
    ("widgets", "message"),
    [
        ({"reward_min": "high"}, "reward from: 'high' is not a number"),
        ({"pv_min": "1.5"}, "policy version from: a policy version is a whole number"),
        ({"date_from": "10/01/2026"}, "created from: '10/01/2026' is not a date"),
        ({"reward_min": "1", "reward_max": "0"}, "reward_min=1.0 is greater than reward_max=0.0"),
        ({"sort": "random"}, "sort: unknown order 'random'"),
    ],
)
def test_bad_widgets_say_which(widgets, message):
    with pytest.raises(InvalidQuery, match=message):
        build_query(**NO_FILTERS | widgets)


@pytest.fixture
def inspector(synthetic_store):
    for i in range(4):
        add_session(
            synthetic_store,
            f"r{i}",
            created_at=T0 + i * DAY,
            turns=2,
            policy_version=i // 2,
            metadata={"run": "run-x"},
            task_id=f"task-{i}",
            reward=None if i == 3 else i / 2,
            status="completed",
        )
    insp = Inspector(synthetic_store.url)
    yield insp
    insp.close()


def test_list_page_frame_and_run_rewards(inspector):
    page = inspector.page(RolloutQuery(page_size=3))
    frame = inspector.page_frame(page)
    assert list(frame["rollout"]) == ["r3", "r2", "r1"]
    assert list(frame["reward"]) == ["unscoreable", "1", "0.5"]
    assert list(frame["purpose"]) == ["train", "train", "train"] and list(frame["run"])[0] == "run-x"
    assert page.pages == 2
    runs = inspector.run_frame("run-x")
    assert runs[["policy_version", "mean_reward", "rollouts", "scored"]].values.tolist() == [
        [0, 0.25, 2, 2],
        [1, 1.0, 2, 1],
    ]
    assert inspector.filter_choices()["run"] == [ALL, "run-x", "(no run)"]


def test_mounted_app_serves_the_page_and_the_rollout_api(inspector, synthetic_store):
    app = mount_inspector(FastAPI(), synthetic_store.url, "/inspect")
    with serve_in_thread(app) as url:
        page = httpx.get(f"{url}/inspect/", timeout=30)
        assert page.status_code == 200 and "gradio" in page.text.lower()
        config = httpx.get(f"{url}/inspect/config", timeout=30).json()
        labels = json.dumps(config)
        assert "Rollouts" in labels and "Runs" in labels and "rollout-table" in labels


def test_create_inspector_renders_rollouts_and_names_missing_ones(inspector, synthetic_store):
    demo = create_inspector(synthetic_store.url)
    insp = demo.inspector  # type: ignore[attr-defined]
    assert insp.rollout_html("r0").count('<details class="turn"') == 2
    with pytest.raises(RolloutNotFound, match="no rollout 'nope'"):
        insp.rollout_html("nope")
    insp.close()


def test_cli_refuses_a_missing_store_with_a_clear_message(tmp_path: Path):
    result = CliRunner().invoke(cli, ["inspect", "--store", f"sqlite:///{tmp_path}/none.db"])
    assert result.exit_code == 2
    assert "no such file" in " ".join(result.output.split())


def test_cli_refuses_a_missing_tokenizer(tmp_path: Path, synthetic_store):
    add_session(synthetic_store, "r0", created_at=T0)
    result = CliRunner().invoke(
        cli, ["inspect", "--store", synthetic_store.url, "--tokenizer", str(tmp_path / "tok.json")]
    )
    assert result.exit_code == 2
    output = " ".join(result.output.split())  # rich wraps long lines
    assert "--tokenizer" in output and "no such file or folder" in output


# -- token text: each rollout's tokenizer, found from its model ---------------------------------------


def _text_session(store, tiny_cache, session_id: str, model: str) -> tuple[list[int], list[int]]:
    tok = tiny_tokenizer(tiny_cache)
    prompt = tok.encode("def add(a, b):\n    return a + b\n").ids
    completion = tok.encode("print(add(2, 3))").ids
    add_text_session(store, session_id, model=model, prompt=prompt, completion=completion)
    return prompt, completion


def _texts(html: str) -> str:
    """The token view's text, as a reader sees it (spans joined)."""
    return "".join(re.findall(r'<span class="tok [^"]*" data-token-id[^>]*>([^<]*)</span>', html)).replace(
        "\u21b5", ""
    )


def test_the_tiny_models_rollouts_show_token_text_without_a_tokenizer_flag(
    synthetic_store, tiny_cache, monkeypatch
):
    monkeypatch.setenv("HARBOR_CACHE_DIR", str(tiny_cache))
    _text_session(synthetic_store, tiny_cache, "tiny-run", "tiny")
    insp = Inspector(synthetic_store.url)
    try:
        html = insp.rollout_html("tiny-run")
    finally:
        insp.close()
    assert "print(add(2, 3))" in _texts(html)
    assert "def add(a, b):" in _texts(html)
    assert escape(f"token text from the tiny model's tokenizer ({tiny_cache / 'tiny-0'})") in html


def test_a_local_model_folder_gives_its_tokenizer(synthetic_store, tiny_cache, tmp_path):
    folder = tmp_path / "my-sft-model"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json"):
        (folder / name).write_bytes((tiny_cache / "tiny-0" / name).read_bytes())
    _text_session(synthetic_store, tiny_cache, "sft-run", str(folder))
    insp = Inspector(synthetic_store.url)
    try:
        html = insp.rollout_html("sft-run")
    finally:
        insp.close()
    assert "print(add(2, 3))" in _texts(html)
    assert f"token text from the tokenizer of model folder {folder}" in html


def test_without_a_tokenizer_ids_are_shown_with_a_note_that_says_why(
    synthetic_store, tiny_cache, tmp_path, monkeypatch
):
    monkeypatch.setenv("HARBOR_CACHE_DIR", str(tmp_path / "empty-cache"))  # tiny not built here
    prompt, completion = _text_session(synthetic_store, tiny_cache, "tiny-run", "tiny")
    _text_session(synthetic_store, tiny_cache, "hub-run", "acme/never-downloaded")
    insp = Inspector(synthetic_store.url)
    try:
        tiny_html, hub_html = insp.rollout_html("tiny-run"), insp.rollout_html("hub-run")
    finally:
        insp.close()
    assert _texts(tiny_html).split() == [str(t) for t in prompt + completion]
    assert "token ids shown: the tiny model is not built under" in tiny_html
    assert "harbor engine --model tiny" in tiny_html and "--tokenizer PATH" in tiny_html
    assert (
        escape(
            "token ids shown: no tokenizer found for model 'acme/never-downloaded' (not a local folder, "
            "and not in the Hugging Face cache)"
        )
        in hub_html
    )


def test_a_hub_model_is_read_from_the_hugging_face_cache_only(tiny_cache, tmp_path):
    """A Hub model name resolves in the local Hub cache (`local_files_only`: nothing is downloaded).
    In a subprocess: the Hub cache folder is fixed when huggingface_hub is imported."""
    snapshot = tmp_path / "hub" / "models--acme--tiny-chat" / "snapshots" / "0123456789abcdef"
    snapshot.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json"):
        (snapshot / name).write_bytes((tiny_cache / "tiny-0" / name).read_bytes())
    (tmp_path / "hub" / "models--acme--tiny-chat" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny-chat" / "refs" / "main").write_text("0123456789abcdef")
    ids = tiny_tokenizer(tiny_cache).encode("print(add(2, 3))").ids
    script = (
        "import sys; from inspector.tokens import TokenizerFinder\n"
        "text = TokenizerFinder().for_model('acme/tiny-chat')\n"
        "print(text.note); print(''.join(text.decode(int(i)) for i in sys.argv[1:]))\n"
    )
    env = os.environ | {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script, *map(str, ids)], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "token text from the tokenizer of acme/tiny-chat in the Hugging Face cache",
        "print(add(2, 3))",
    ]


def test_cli_takes_a_plain_path_to_the_store(synthetic_store, tmp_path, monkeypatch):
    """`harbor inspect --store runs/traces.db`: a file path works as well as a SQLAlchemy URL."""
    import uvicorn

    add_session(synthetic_store, "r0", created_at=T0)
    served: list[int] = []

    def run(app, host, port, **_):  # serve as `harbor inspect` would, but return once checked
        with serve_in_thread(app) as url:
            served.append(httpx.get(f"{url}/config", timeout=30).status_code)

    monkeypatch.setattr(uvicorn, "run", run)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["inspect", "--store", "synthetic.db"])  # relative to the cwd
    assert result.exit_code == 0, result.output
    assert served == [200]
    unwrapped = "".join(result.output.split())  # rich wraps long lines, even inside a word
    assert f"store:sqlite:///{tmp_path / 'synthetic.db'}(read-only)" in unwrapped
    missing = CliRunner().invoke(cli, ["inspect", "--store", str(tmp_path / "none.db")])
    assert missing.exit_code == 2
    assert f"nosuchfile{tmp_path / 'none.db'}" in "".join(missing.output.split())
