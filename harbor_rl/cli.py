"""`harbor`: one command line over every part.

Each command lives in its own `commands/` module and imports its package inside the function body,
so `harbor proxy` never loads torch and `harbor tasks check` never starts a server.

What every command shares lives here, in `HarborGroup`:
- an error the user caused (any package's own errors, a config that fails validation) is one line,
  `harbor CMD: message`, and a hint, never a traceback; `--debug` (anywhere on the line) or
  HARBOR_DEBUG=1 shows the traceback; any other exception is a bug and keeps its traceback;
- one name per setting across commands; the old spellings (`DEPRECATED_FLAGS`) still work, print a
  one-line note and are left out of --help;
- which Harbor registry `--dataset NAME@VERSION` reads (`--registry-path FILE`, `--registry-url URL`,
  anywhere on the line, like `--debug`): every command that loads datasets, and the server it may
  start in-process, resolves them through `tasks.registry`, which reads the setting from its
  environment variable, so the flag works the same for `serve`, `eval`, `collect` and `tasks check`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click
import typer
from typer.core import TyperGroup

from harbor_rl.commands import bench, collect, engine, inspect, jobs, proxy, serve, sft, tasks
from harbor_rl.commands import eval as eval_cmd
from harbor_rl.commands import train as train_cmd
from harbor_rl.user_errors import user_error_message

# The usage errors typer's parser raises: from its own copy of click (typer/_click, since typer 0.26) or
# from click itself (older typer). Either way they are BadParameter's bases.
UsageError = next(cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "UsageError")
NoArgsIsHelpError = getattr(sys.modules[UsageError.__module__], "NoArgsIsHelpError", ())

DEBUG_FLAG = "--debug"
DEBUG_ENV = "HARBOR_DEBUG"
REGISTRY_FLAGS: dict[str, str] = {
    "--registry-path": "HARBOR_REGISTRY_PATH",
    "--registry-url": "HARBOR_REGISTRY_URL",
}
"""Global flag -> the environment variable `tasks.registry` reads (the same names as there)."""
DEPRECATED_FLAGS: dict[tuple[str, ...], dict[str, str]] = {
    ("eval",): {
        "--n-concurrent": "--max-concurrent",
        "--jobs-dir": "--output-dir",
        "--task-glob": "--task",
        "--agent-timeout": "--agent-timeout-sec",
        "--step-limit": "--agent-step-limit",
    },
    ("collect",): {
        "--n-concurrent": "--max-concurrent",
        "--output": "--output-dir",
        "--task-glob": "--task",
        "--keep-losses": "--keep-all",
    },
    ("serve",): {"--max-concurrent-envs": "--max-concurrent"},
    ("tasks", "check"): {"--concurrency": "--max-concurrent"},
}
"""Old flag -> its one name now, per command. Concurrency is `--max-concurrent`, limits are the client's
`--agent-timeout-sec` / `--agent-step-limit`, output folders `--output-dir` (`-o`), task selection
`--task` (eval and collect take fnmatch patterns), and keeping every episode `--keep-all`."""


def _debug_requested() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class HarborGroup(TyperGroup):
    """The top-level `harbor` group: old flag spellings, `--debug`, and user errors as one line."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        args, debug = _strip_debug(list(args))
        ctx.meta["harbor.debug"] = debug or _debug_requested()
        ctx.meta["harbor.command"] = self._command_path(args)
        try:
            args = _take_registry_flags(args)
            args = _rename_deprecated(args, ctx.meta["harbor.command"])
            return super().parse_args(ctx, args)
        except NoArgsIsHelpError:
            raise
        except UsageError as exc:
            _usage_error(ctx, exc)

    def _command_path(self, args: list[str]) -> tuple[str, ...]:
        """`("eval",)` for `harbor eval ...`, `("tasks", "check")` for a command of a group."""
        words = [a for a in args if not a.startswith("-")][:2]
        if not words:
            return ()
        if isinstance(self.commands.get(words[0]), click.Group | TyperGroup) and len(words) > 1:
            return (words[0], words[1])
        return (words[0],)

    def invoke(self, ctx: click.Context) -> Any:
        from harbor_rl import interrupts

        command = ctx.meta.get("harbor.command", ())
        if command[:1] and command[0] in INTERRUPTIBLE:
            with interrupts.handling(command[0]):
                return self._invoke(ctx)
        return self._invoke(ctx)

    def _invoke(self, ctx: click.Context) -> Any:
        from harbor_rl import interrupts

        try:
            return super().invoke(ctx)
        except NoArgsIsHelpError:
            raise  # typer shows the help
        except UsageError as exc:  # a bad flag or value: one line, not typer's framed box
            _usage_error(ctx, exc)
        except KeyboardInterrupt:  # from harbor_rl.interrupts, or Python's own handler (other commands)
            _interrupted(ctx)
        except Exception as exc:
            if interrupts.interrupted() and not ctx.meta.get("harbor.debug"):
                _interrupted(ctx)  # a follow-on error of the interrupt (a stopped server, a closed session)
            message = user_error_message(exc)
            if message is None or ctx.meta.get("harbor.debug"):
                raise  # a bug (or --debug): the traceback is what helps
            from rich.markup import escape

            command = " ".join(["harbor", *ctx.meta.get("harbor.command", ())])
            console = _stderr()
            # The message is text, not markup: `pip install 'harbor-rl[gpu]'` keeps its brackets.
            # A refusal naming the flag that avoids it (harbor_server.errors.StartRefused) is a usage error.
            flag = getattr(exc, "flag", None)
            hint = f"; pass {flag} to choose another" if flag else ""
            console.print(f"[bold red]{command}:[/] {escape(message)}{hint}", highlight=False, markup=True)
            if not flag:  # a refusal is the whole story; an error may need its traceback
                console.print(f"[dim]for the traceback: {DEBUG_FLAG} or {DEBUG_ENV}=1[/]")
            raise typer.Exit(2 if flag else 1) from None


INTERRUPTIBLE = ("train", "eval", "collect", "serve")
"""The long commands whose Ctrl-C (and SIGTERM) `harbor_rl.interrupts` handles: one line, 128+signal."""


def _usage_error(ctx: click.Context, exc: Exception) -> None:
    """`harbor CMD: <what is wrong>; see harbor CMD --help`, exit 2 (click's code for a usage error)."""
    from rich.markup import escape

    where = getattr(getattr(exc, "ctx", None), "command_path", None)  # the (sub)command that refused it
    command = where or " ".join(["harbor", *ctx.meta.get("harbor.command", ())])
    message = " ".join(exc.format_message().split()).rstrip(".")  # one line, however it was wrapped
    _stderr().print(
        f"[bold red]{escape(command)}:[/] {escape(message)}; see {command} --help", highlight=False
    )
    raise typer.Exit(getattr(exc, "exit_code", 2))


def _interrupted(ctx: click.Context) -> None:
    from rich.markup import escape

    from harbor_rl import interrupts

    command = " ".join(["harbor", *ctx.meta.get("harbor.command", ())])
    _stderr().print(f"[bold yellow]{escape(command)}:[/] {escape(interrupts.message())}", highlight=False)
    interrupts.finish(interrupts.exit_code())
    raise typer.Exit(interrupts.exit_code())


def _stderr():
    from rich.console import Console

    # soft_wrap: the message stays one line however narrow the terminal (it wraps, it is not split).
    return Console(stderr=True, soft_wrap=True)


def _strip_debug(args: list[str]) -> tuple[list[str], bool]:
    """`--debug` may come anywhere before a `--`; no command has an option of that name."""
    end = args.index("--") if "--" in args else len(args)
    kept = [a for a in args[:end] if a != DEBUG_FLAG]
    return kept + args[end:], len(kept) != end


def _take_registry_flags(args: list[str]) -> list[str]:
    """`--registry-path FILE` / `--registry-url URL` (or `=VALUE`) out of the line, into the environment."""
    end = args.index("--") if "--" in args else len(args)
    kept: list[str] = []
    i = 0
    while i < end:
        name, sep, value = args[i].partition("=")
        if name not in REGISTRY_FLAGS:
            kept.append(args[i])
            i += 1
            continue
        if not sep:
            if i + 1 >= end:
                raise UsageError(f"{name} needs a value")
            value, i = args[i + 1], i + 1
        # A relative file is relative to where the command was typed, whatever folder reads it later.
        os.environ[REGISTRY_FLAGS[name]] = os.path.abspath(value) if name == "--registry-path" else value
        i += 1
    return kept + args[end:]


def _rename_deprecated(args: list[str], path: tuple[str, ...]) -> list[str]:
    renames = next((DEPRECATED_FLAGS[p] for p in (path[:2], path[:1]) if p in DEPRECATED_FLAGS), None)
    if not renames:
        return args
    out, noted = [], set()
    end = args.index("--") if "--" in args else len(args)
    for i, arg in enumerate(args):
        name, sep, value = arg.partition("=")
        if i < end and name in renames:
            if name not in noted:
                noted.add(name)
                _stderr().print(
                    f"[yellow]harbor {' '.join(path)}: {name} is deprecated; use {renames[name]}[/]",
                    highlight=False,
                )
            arg = renames[name] + sep + value
        out.append(arg)
    return out


app = typer.Typer(
    cls=HarborGroup,
    no_args_is_help=True,
    add_completion=False,
    help="Harbor-RL: train real coding agents with RL.",
)


def _show_version(value: bool) -> None:
    if value:
        from harbor_rl import __version__

        typer.echo(f"harbor-rl {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_show_version,
        is_eager=True,  # before the other options, and without a command
        help="Print harbor-rl's version and exit.",
    ),
    debug: bool = typer.Option(
        False,
        DEBUG_FLAG,
        help=f"Show the traceback of an error (also {DEBUG_ENV}=1); accepted anywhere on the line.",
    ),
    registry_path: str | None = typer.Option(
        None,
        "--registry-path",
        help="Harbor registry file for --dataset NAME@VERSION (also HARBOR_REGISTRY_PATH); anywhere on the line.",
    ),
    registry_url: str | None = typer.Option(
        None,
        "--registry-url",
        help="Harbor registry URL for --dataset NAME@VERSION (also HARBOR_REGISTRY_URL; default Harbor's "
        "public registry); anywhere on the line.",
    ),
) -> None:
    """Harbor-RL: train real coding agents with RL."""
    # HarborGroup.parse_args takes --debug and the registry flags out before the options are parsed;
    # this declares them for --help.


proxy.register(app)
engine.register(app)
tasks.register(app)
serve.register(app)
inspect.register(app)
eval_cmd.register(app)
collect.register(app)
sft.register(app)
train_cmd.register(app)
bench.register(app)
jobs.register(app)
