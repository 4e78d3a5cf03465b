"""A small Dockerfile parser: enough to provision a `local` sandbox and to hash a build context.

It understands line continuations, comments, parser directives, the JSON (exec) form, `ARG`/`ENV`
variable substitution and `COPY`/`ADD` flags. It does not try to be BuildKit: anything it cannot
represent faithfully is reported, never guessed (heredocs, for instance).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from sandboxes.errors import UnsupportedEnvironment

_FLAG = re.compile(r"^--([a-z-]+)(?:=(.*))?$")
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-+][^}]*)?\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    """Upper-case instruction name (FROM, RUN, COPY, ...)."""
    args: str
    """The raw argument text, continuation lines joined."""
    line: int
    """1-based line where the instruction starts (for error messages)."""
    flags: dict[str, str] = field(default_factory=dict)
    """`--name=value` flags that precede the arguments (COPY --chown=..., FROM --platform=...)."""

    def words(self) -> list[str]:
        """The arguments as a list: JSON form when it is one, else shell-like splitting."""
        text = self.args.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                value = None
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return value
        return shlex.split(text, posix=True)

    def is_exec_form(self) -> bool:
        text = self.args.strip()
        if not text.startswith("["):
            return False
        try:
            return isinstance(json.loads(text), list)
        except json.JSONDecodeError:
            return False


@dataclass(frozen=True)
class Dockerfile:
    path: Path
    instructions: list[Instruction]

    def base_images(self) -> list[str]:
        """Images the build reads: those named by `FROM` lines and by `COPY --from=` (Harbor tasks copy uv
        in with `COPY --from=ghcr.io/astral-sh/uv:0.8.15 ...`), excluding earlier build stages (`FROM
        builder`, `COPY --from=builder` or `--from=0`; stage names are case-insensitive, as Docker's)."""
        stages: set[str] = set()
        images: list[str] = []
        for ins in self.instructions:
            words = ins.words() if ins.keyword == "FROM" else []
            if words:
                name = words[0]
            elif ins.keyword == "COPY" and (source := ins.flags.get("from")) and not source.isdigit():
                name = source  # (`--from=1` is a stage by its index)
            else:
                continue
            if name.lower() not in stages and name not in images:
                images.append(name)
            if len(words) >= 3 and words[1].lower() == "as":
                stages.add(words[2].lower())
        return images

    def where(self, ins: Instruction) -> str:
        return f"{self.path}:{ins.line} ({ins.keyword})"


def parse_dockerfile(path: Path) -> Dockerfile:
    """Parse `path` into instructions; raises UnsupportedEnvironment naming the line on heredocs."""
    return parse_dockerfile_text(path.read_text(encoding="utf-8"), path)


def parse_dockerfile_text(text: str, where: Path) -> Dockerfile:
    """Parse Dockerfile text (e.g. a harness's image-layer lines); `where` names it in errors."""
    return Dockerfile(path=where, instructions=list(_instructions(text, where)))


def _instructions(text: str, path: Path):
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        raw = lines[i]
        start = i + 1
        i += 1
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        parts = [raw.rstrip()]
        # A trailing backslash continues the instruction; comment lines inside it are dropped.
        while parts[-1].endswith("\\") and i < len(lines):
            parts[-1] = parts[-1][:-1]
            nxt = lines[i]
            i += 1
            if nxt.strip().startswith("#"):
                parts.append("\\")
                continue
            parts.append(nxt.rstrip())
        if parts[-1].endswith("\\"):
            parts[-1] = parts[-1][:-1]
        joined = " ".join(p.strip() for p in parts if p.strip())
        keyword, _, rest = joined.partition(" ")
        if "<<" in rest and re.search(r"<<-?\s*['\"]?[A-Za-z_]", rest) and keyword.upper() in {"RUN", "COPY"}:
            raise UnsupportedEnvironment(
                f"{path}:{start}: heredocs in {keyword.upper()} are not supported here"
            )
        flags, rest = _split_flags(rest.strip())
        yield Instruction(keyword=keyword.upper(), args=rest, line=start, flags=flags)


def _split_flags(rest: str) -> tuple[dict[str, str], str]:
    flags: dict[str, str] = {}
    while rest.startswith("--"):
        token, _, remainder = rest.partition(" ")
        match = _FLAG.match(token)
        if not match:
            break
        flags[match.group(1)] = match.group(2) or ""
        rest = remainder.lstrip()
    return flags, rest


def substitute(text: str, variables: dict[str, str]) -> str:
    """Expand `$VAR` and `${VAR}` (with `:-default`/`:+alt`) the way Docker does for WORKDIR/COPY/ENV."""

    def repl(match: re.Match[str]) -> str:
        whole = match.group(0)
        name = match.group(1) or match.group(2)
        value = variables.get(name)
        if whole.startswith("${") and (":-" in whole or ":+" in whole):
            op_at = whole.find(":-") if ":-" in whole else whole.find(":+")
            op, word = whole[op_at : op_at + 2], whole[op_at + 2 : -1]
            if op == ":-":
                return value if value else word
            return word if value else ""
        return value or ""

    return _VAR.sub(repl, text)


def parse_env_args(args: str) -> dict[str, str]:
    """`ENV A=1 B="two words"` or the legacy `ENV A value with spaces`."""
    words = shlex.split(args, posix=True)
    if not words:
        return {}
    if "=" not in words[0]:
        name, _, value = args.strip().partition(" ")
        return {name: value.strip()}
    result: dict[str, str] = {}
    for word in words:
        name, sep, value = word.partition("=")
        if not sep:
            raise ValueError(f"expected NAME=value, got {word!r}")
        result[name] = value
    return result
