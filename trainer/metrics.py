"""Where metrics go: always `metrics.jsonl` in the output folder, plus trackio (local, offline) or W&B."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from trainer.errors import TrainerConfigError

log = logging.getLogger(__name__)


class MetricsLogger:
    def __init__(self, output_dir: str | Path, report_to: str, run_name: str, config: dict[str, Any]) -> None:
        self.path = Path(output_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.backend = None
        self.backend_name = "jsonl"
        if report_to in ("auto", "trackio"):
            try:
                import trackio
            except ImportError:
                if report_to == "trackio":
                    raise TrainerConfigError(
                        "report_to='trackio' needs trackio: pip install trackio"
                    ) from None
            else:
                trackio.init(project="harbor-rl", name=run_name, config=config, resume="allow", embed=False)
                self.backend, self.backend_name = trackio, "trackio"
        elif report_to == "wandb":
            try:
                import wandb
            except ImportError:
                raise TrainerConfigError("report_to='wandb' needs wandb: pip install wandb") from None
            wandb.init(project="harbor-rl", name=run_name, config=config, resume="allow")
            self.backend, self.backend_name = wandb, "wandb"

    def log(self, metrics: dict[str, Any], step: int) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.backend is not None:
            try:
                self.backend.log(metrics, step=step)
            except Exception:  # a dashboard hiccup must not stop training; the JSONL file has it all
                log.warning("logging to %s failed", self.backend_name, exc_info=True)

    def close(self) -> None:
        if self.backend is not None:
            try:
                self.backend.finish()
            except Exception:
                log.warning("closing %s failed", self.backend_name, exc_info=True)
