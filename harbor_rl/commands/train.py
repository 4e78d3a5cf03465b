"""`harbor train`: async GRPO through a Harbor server (or the embedded default), with a before/after table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer


def _parse_set(items: list[str]) -> dict[str, Any]:
    import yaml

    values: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--set takes KEY=VALUE, got {item!r}")
        values[key.strip()] = yaml.safe_load(raw)
    return values


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train(
        config: Path | None = typer.Option(
            None, "--config", help="YAML file of settings (AsyncGRPOConfig fields and run fields); flags win."
        ),
        model: str | None = typer.Option(
            None, "--model", help="'tiny' or a local Hugging Face model folder."
        ),
        server_url: str | None = typer.Option(
            None,
            "--server-url",
            help="A running `harbor serve`; without it the engine and server start in-process.",
        ),
        split: str | None = typer.Option(None, "--split", help="Task split on the server."),
        task: list[str] = typer.Option([], "--task", help="Train on this task id only. Repeatable."),
        harness: str | None = typer.Option(
            None, "--harness", help="env-factory, mini-swe-agent, opencode, ..."
        ),
        sandbox: str | None = typer.Option(None, "--sandbox", help="local, docker or e2b."),
        llm_url: str | None = typer.Option(None, "--llm-url", help="Engine OpenAI base URL the agents call."),
        output_dir: str | None = typer.Option(None, "--output-dir", help="Checkpoints and metrics.jsonl."),
        max_steps: int | None = typer.Option(None, "--max-steps", help="Optimizer steps."),
        num_generations: int | None = typer.Option(None, "--num-generations", help="Rollouts per group."),
        learning_rate: float | None = typer.Option(None, "--learning-rate", help="AdamW learning rate."),
        eval_episodes: int | None = typer.Option(
            None, "--eval-episodes", help="Episodes before and after (0: none)."
        ),
        set_: list[str] = typer.Option(
            [], "--set", help="Any other setting as KEY=VALUE (YAML value). Repeatable."
        ),
        resume: bool = typer.Option(
            False, "--resume", help="Continue from the newest checkpoint in --output-dir."
        ),
    ) -> None:
        """Train a policy with async GRPO on rollouts that Harbor's harnesses run."""
        import torch
        import yaml
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from trainer.errors import TrainerError
        from trainer.run import run_training, split_settings

        console = Console()
        torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
        data: dict[str, Any] = {}
        if config is not None:
            try:
                loaded = yaml.safe_load(config.read_text()) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise typer.BadParameter(f"cannot read {config}: {exc}") from exc
            if not isinstance(loaded, dict):
                raise typer.BadParameter(f"{config} must hold a mapping of settings")
            data.update(loaded)
        flags = {
            "model": model, "server_url": server_url, "split": split, "tasks": task or None, "harness": harness,
            "sandbox": sandbox, "llm_url": llm_url, "output_dir": output_dir, "max_steps": max_steps,
            "num_generations": num_generations, "learning_rate": learning_rate, "eval_episodes": eval_episodes,
        }  # fmt: skip
        data.update({k: v for k, v in flags.items() if v is not None})
        data.update(_parse_set(set_))
        if "server_url" not in data:  # the embedded default: small and quick on two CPU cores
            defaults = {"num_generations": 4, "per_device_train_batch_size": 8, "max_concurrent_rollouts": 8,
                        "max_steps": 20, "learning_rate": 1e-4, "max_completion_length": 64,
                        "output_dir": "runs/train-embedded"}  # fmt: skip
            data = {**defaults, **data}
        try:
            run, grpo = split_settings(data)
        except TrainerError as exc:
            raise typer.BadParameter(str(exc)) from exc

        progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), console=console,
        )  # fmt: skip
        bar = progress.add_task("GRPO steps", total=grpo.max_steps, info="")

        def on_step(step: int, metrics: dict[str, Any]) -> None:
            reward = metrics.get("reward")
            info = f"reward {reward:.3f}" if reward is not None else "no scoreable rollout"
            progress.update(bar, completed=step, info=f"{info}  v{metrics.get('policy_version')}")

        try:
            with progress:
                before, after, history = run_training(
                    run, grpo, resume=resume, on_phase=lambda text: console.log(text), on_step=on_step
                )
        except TrainerError as exc:
            console.print(f"[bold red]harbor train failed:[/] {exc}")
            raise typer.Exit(1) from exc
        _report(console, before, after, history, grpo.output_dir)

    return None


def _report(console, before, after, history, output_dir: str) -> None:
    from rich.table import Table

    if before is not None and after is not None:
        table = Table(title="Evaluation (env reward, fresh episodes)")
        for col in ("", "episodes", "unscoreable", "mean", "std. error"):
            table.add_column(col, justify="right")
        for name, result in (("before", before), ("after", after)):
            table.add_row(name, str(len(result.rewards)), str(result.unscoreable), f"{result.mean:.3f}",
                          f"{result.stderr:.3f}")  # fmt: skip
        console.print(table)
        gain = after.mean - before.mean
        noise = (before.stderr**2 + after.stderr**2) ** 0.5
        verdict = "above noise" if noise == noise and gain > 2 * noise else "within noise"
        console.print(f"gain {gain:+.3f} (2 s.e. = {2 * noise:.3f}): {verdict}")
    rewards = [h.get("reward") for h in history]
    console.print("reward per step: " + " ".join("-" if r is None else f"{r:.2f}" for r in rewards))
    from trainer.plot import reward_curve_png

    png = reward_curve_png(history, Path(output_dir) / "reward_curve.png")
    console.print(f"metrics: {Path(output_dir) / 'metrics.jsonl'}; checkpoints in {output_dir}")
    if png is not None:
        console.print(f"reward curve: {png}")
