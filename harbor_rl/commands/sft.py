"""`harbor sft`: supervised fine-tuning on a `harbor collect` dataset; saves a model folder the engine serves."""

from __future__ import annotations

from pathlib import Path

import typer


def sft_command(
    data: Path = typer.Argument(..., help="results.jsonl from `harbor collect`, or the folder holding it."),
    model: str = typer.Option("tiny", "--model", help="'tiny', 'smollm2-135m', a .gguf file or a local Hugging Face model folder."),
    output_dir: Path = typer.Option(Path("runs/sft"), "--output-dir", "-o", help="Where the model is saved."),
    max_steps: int | None = typer.Option(
        None, "--max-steps", min=1, help="Optimizer steps (overrides --epochs)."
    ),
    epochs: float = typer.Option(1.0, "--epochs", min=0.0, help="Passes over the kept episodes."),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="Conversations per step."),
    learning_rate: float = typer.Option(2e-5, "--learning-rate", help="AdamW learning rate."),
    min_reward: float = typer.Option(0.0, "--min-reward", help="Keep episodes with reward >= this."),
    keep_all: bool = typer.Option(False, "--keep-all", help="Train on every episode, unscored ones too."),
    task: list[str] = typer.Option([], "--task", help="Train on this task id only. Repeatable."),
    max_length: int = typer.Option(4096, "--max-length", min=8, help="Tokens per conversation (cut after)."),
    seed: int = typer.Option(0, "--seed", help="Seeds torch and the example order."),
) -> None:
    """Fine-tune a policy on collected episodes, with the loss on assistant tokens only."""
    import torch
    from pydantic import ValidationError
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engine.errors import ModelBuildError
    from engine.tiny_model import resolve_model_path
    from trainer import SFTConfig, run_sft

    console = Console()
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    try:
        model_path = resolve_model_path(model, seed=seed)
    except ModelBuildError as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from exc
    try:
        config = SFTConfig(
            data=str(data), model=str(model_path), output_dir=str(output_dir), seed=seed, max_steps=max_steps,
            num_train_epochs=epochs, per_device_train_batch_size=batch_size, learning_rate=learning_rate,
            min_reward=None if keep_all else min_reward, task_ids=task or None, max_length=max_length,
        )  # fmt: skip
    except ValidationError as exc:
        raise typer.BadParameter("; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors())) from exc
    progress = Progress(
        TextColumn("[bold]sft"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), console=console,
    )  # fmt: skip
    bar = progress.add_task("sft", total=None, info="")
    # A TrainerError (no results.jsonl, nothing passes the filters) is one line through the CLI layer.
    with progress:
        result = run_sft(
            config,
            on_start=lambda steps: progress.update(bar, total=steps),
            on_step=lambda step, loss: progress.update(bar, completed=step, info=f"loss {loss:.4f}"),
        )
    console.print(
        f"trained on {result.episodes} episodes ({result.trained_tokens} assistant tokens) for {result.steps} "
        f"steps in {result.seconds:.1f}s: loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f}"
    )
    console.print(
        f"model saved to {result.output_dir} (serve it with `harbor engine --model {result.output_dir}`)"
    )


def register(app: typer.Typer) -> None:
    app.command("sft")(sft_command)
