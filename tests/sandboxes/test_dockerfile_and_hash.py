"""The small Dockerfile parser and the build-context content hash (pure Python, no engine)."""

from __future__ import annotations

import os

import pytest

from sandboxes import UnsupportedEnvironment
from sandboxes.dockerfile import parse_dockerfile, parse_env_args, substitute
from sandboxes.images import context_files, context_hash

from .conftest import write_env


def test_parses_continuations_comments_flags_and_exec_form(tmp_path):
    env = write_env(
        tmp_path,
        "# syntax=docker/dockerfile:1\n"
        "FROM --platform=linux/amd64 harbor-rl/sandbox-base:bookworm AS base\n"
        "RUN apt-get update && \\\n"
        "    # a comment inside a continuation\n"
        "    echo done\n"
        "COPY --chown=1000:1000 --chmod=755 a b /dest/\n"
        'CMD ["python3", "-m", "http.server"]\n'
        "FROM base\n",
    )
    dockerfile = parse_dockerfile(env / "Dockerfile")
    keywords = [(i.keyword, i.line) for i in dockerfile.instructions]
    assert keywords == [("FROM", 2), ("RUN", 3), ("COPY", 6), ("CMD", 7), ("FROM", 8)]
    run = dockerfile.instructions[1]
    assert run.args == "apt-get update &&  echo done" or run.args.split() == [
        "apt-get",
        "update",
        "&&",
        "echo",
        "done",
    ]
    copy = dockerfile.instructions[2]
    assert copy.flags == {"chown": "1000:1000", "chmod": "755"} and copy.words() == ["a", "b", "/dest/"]
    assert dockerfile.instructions[3].is_exec_form() and dockerfile.instructions[3].words()[0] == "python3"
    assert dockerfile.instructions[0].flags == {"platform": "linux/amd64"}
    assert dockerfile.base_images() == ["harbor-rl/sandbox-base:bookworm"]  # "base" is a stage


def test_heredocs_are_refused_with_the_line(tmp_path):
    env = write_env(tmp_path, "FROM x\nRUN <<EOF\necho hi\nEOF\n")
    with pytest.raises(UnsupportedEnvironment, match=r"Dockerfile:2"):
        parse_dockerfile(env / "Dockerfile")


def test_variable_substitution_and_env_forms():
    variables = {"A": "1", "EMPTY": ""}
    assert (
        substitute("$A-${A}-${MISSING:-dflt}-${EMPTY:-e}-${A:+set}-${MISSING:+x}", variables)
        == "1-1-dflt-e-set-"
    )
    assert parse_env_args('A=1 B="two words"') == {"A": "1", "B": "two words"}
    assert parse_env_args("LEGACY value with spaces") == {"LEGACY": "value with spaces"}


def test_context_hash_follows_content_modes_links_and_dockerignore(tmp_path):
    a = write_env(
        tmp_path / "a",
        "FROM x\n",
        {"src/m.py": "x = 1\n", "notes.log": "ignored", ".dockerignore": "*.log\n"},
    )
    b = write_env(
        tmp_path / "b",
        "FROM x\n",
        {"src/m.py": "x = 1\n", "notes.log": "different", ".dockerignore": "*.log\n"},
    )
    assert "notes.log" not in context_files(a)
    assert context_hash(a) == context_hash(b), "ignored files and the folder's location do not count"
    assert context_hash(a) != context_hash(a, extra="base=sha256:other"), "the base image ID counts"
    (b / "src" / "m.py").write_text("x = 2\n")
    assert context_hash(a) != context_hash(b)
    (b / "src" / "m.py").write_text("x = 1\n")
    os.chmod(b / "src" / "m.py", 0o755)
    assert context_hash(a) != context_hash(b), "the executable bit counts"
    os.chmod(b / "src" / "m.py", 0o644)
    os.symlink("m.py", b / "src" / "link.py")
    assert context_hash(a) != context_hash(b)


def test_base_images_include_images_copied_from_but_no_build_stage(tmp_path):
    """The math-modeling tasks copy uv in with `COPY --from=<image>`: that image is read by the build too, so
    it keys the image cache and a stand-in of it is reported like a FROM's."""
    env = write_env(
        tmp_path,
        "FROM python:3.12-slim AS Build\n"
        "COPY --from=ghcr.io/astral-sh/uv:0.8.15 /uv /uvx /usr/local/bin/\n"
        "FROM python:3.12-slim\n"
        "COPY --from=build /usr/local/bin/uv /bin/\n"
        "COPY --from=0 /usr/local/bin/uvx /bin/\n"
        "COPY --chown=1:1 data /data\n",
    )
    assert parse_dockerfile(env / "Dockerfile").base_images() == [
        "python:3.12-slim",
        "ghcr.io/astral-sh/uv:0.8.15",
    ]
