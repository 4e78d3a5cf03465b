"""The two plots a user opens first, drawn with matplotlib: `harbor train`'s reward curve and
`harbor eval --compare`'s pass rate per task of two jobs.

Both use matplotlib's object-oriented API (a `Figure` saved with its own Agg canvas), never pyplot: pyplot
keeps global state and picks a GUI backend, which a headless server or a thread must not touch. Sized for
a README: 8 in wide at 150 dpi (1200 px).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WIDTH_IN, DPI = 8.0, 150
STEP_COLOUR = "#1f77b4"
LEVEL_COLOURS = {
    "base model": "#7f7f7f",
    "after SFT": "#ff7f0e",
    "before GRPO": "#ff7f0e",
    "after GRPO": "#2ca02c",
}
OTHER_COLOURS = ["#9467bd", "#8c564b", "#e377c2", "#17becf"]
CHANGE_COLOURS = {"fixed": "#2ca02c", "broke": "#d62728"}


@dataclass(frozen=True)
class Level:
    """An evaluation drawn across the curve: its mean, the standard error of that mean, and episodes."""

    mean: float
    stderr: float | None = None
    n: int | None = None

    def label(self, name: str) -> str:
        """`after SFT: 0.175 ± 0.033 (n=128)`."""
        spread = "" if self.stderr is None or math.isnan(self.stderr) else f" ± {self.stderr:.3f}"
        count = "" if self.n is None else f" (n={self.n})"
        return f"{name}: {self.mean:.3f}{spread}{count}"


def smoothing_window(points: int) -> int:
    """Steps in the rolling mean: about an eighth of the run, at least 3 (40 steps -> 5)."""
    return max(3, round(points / 8))


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """The mean of each value and the `window - 1` before it (fewer at the start)."""
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(math.fsum(chunk) / len(chunk))
    return out


def _figure(height_in: float):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, height_in), dpi=DPI, layout="constrained")
    return fig, fig.add_subplot()


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def reward_curve_png(
    history: Sequence[Mapping[str, Any]],
    path: str | Path,
    key: str = "reward",
    levels: Mapping[str, Level | float] | None = None,
    title: str = "Reward per GRPO step",
) -> Path | None:
    """Write `reward_curve_figure` to `path`; None when no step logged `key`."""
    fig = reward_curve_figure(history, key, levels, title)
    return None if fig is None else _save(fig, path)


def reward_curve_figure(
    history: Sequence[Mapping[str, Any]],
    key: str = "reward",
    levels: Mapping[str, Level | float] | None = None,
    title: str = "Reward per GRPO step",
):
    """The curve of `key` per step: each step's value, their rolling mean, and each of `levels`
    (name -> evaluation, such as `after SFT`) as a horizontal line in a band of ± 1 s.e.

    A level of NaN (no episode scored) is not drawn. None when no step logged `key`."""
    points = [(int(h["step"]), float(h[key])) for h in history if h.get(key) is not None]
    shown = {
        name: level if isinstance(level, Level) else Level(float(level))
        for name, level in (levels or {}).items()
    }
    shown = {name: level for name, level in shown.items() if not math.isnan(level.mean)}
    if not points:
        return None
    fig, ax = _figure(4.5)
    steps = [s for s, _ in points]
    values = [v for _, v in points]
    ax.plot(steps, values, "o", color=STEP_COLOUR, alpha=0.35, markersize=4, label=f"{key} of each step")
    if len(points) > 2:
        window = smoothing_window(len(points))
        ax.plot(
            steps, rolling_mean(values, window), "-", color=STEP_COLOUR, linewidth=2.2,
            label=f"rolling mean over {window} steps",
        )  # fmt: skip
    others = iter(OTHER_COLOURS * 4)
    for name, level in shown.items():
        colour = LEVEL_COLOURS.get(name) or next(others)
        ax.axhline(level.mean, color=colour, linestyle="--", linewidth=1.6, label=f"eval {level.label(name)}")
        if level.stderr is not None and not math.isnan(level.stderr) and level.stderr > 0:
            ax.axhspan(level.mean - level.stderr, level.mean + level.stderr, color=colour, alpha=0.15, lw=0)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel(f"{key} (mean of the step's rollouts)")
    ax.set_title(title)
    every = [*values, *(lv.mean for lv in shown.values())]
    if all(0.0 <= v <= 1.0 for v in every):
        ax.set_ylim(-0.03, 1.03)  # a reward in [0, 1] on its whole scale, so gains look their true size
    ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.text(
        0.99, 0.005, "bands: ± 1 standard error of each evaluation's mean", ha="right", va="bottom",
        fontsize=7, color="#555555",
    )  # fmt: skip
    return fig


@dataclass(frozen=True)
class TaskRate:
    """One task's pass rate in one job: trials that passed of those that passed or failed."""

    passed: int
    judged: int

    @property
    def rate(self) -> float | None:
        return self.passed / self.judged if self.judged else None

    @property
    def stderr(self) -> float | None:
        """The binomial standard error of the rate, sqrt(p(1-p)/n)."""
        p = self.rate
        return None if p is None else math.sqrt(p * (1 - p) / self.judged)


MAX_TASKS_DRAWN = 40


def compare_png(
    first: str,
    second: str,
    rates_a: Mapping[str, TaskRate],
    rates_b: Mapping[str, TaskRate],
    changes: Mapping[str, str],
    path: str | Path,
) -> Path | None:
    """Each task's pass rate in job `first` and job `second` (± 1 s.e.), joined by a line coloured by
    `changes` (task -> fixed/broke/...), changed tasks first; the jobs' overall pass rates in the legend.
    None when neither job has a task with a pass rate."""
    tasks = [
        t
        for t in sorted(set(rates_a) | set(rates_b))
        if _rate(rates_a, t) is not None or _rate(rates_b, t) is not None
    ]
    if not tasks:
        return None
    tasks.sort(key=lambda t: (t not in changes, t))
    hidden = max(0, len(tasks) - MAX_TASKS_DRAWN)
    tasks = tasks[:MAX_TASKS_DRAWN]
    fig, ax = _figure(max(3.0, 1.6 + 0.3 * len(tasks)))
    ys = list(range(len(tasks)))[::-1]  # the first task on top
    for y, task in zip(ys, tasks, strict=True):
        a, b = _rate(rates_a, task), _rate(rates_b, task)
        if a is not None and b is not None and task in changes:
            colour = CHANGE_COLOURS.get(changes[task], "#bbbbbb")
            ax.plot([a, b], [y, y], color=colour, linewidth=6, alpha=0.35, solid_capstyle="butt", zorder=1)
    # The two jobs a little above and below the task's line, so equal rates do not hide each other.
    jobs = ((rates_a, first, "#7f7f7f", "o", 0.14), (rates_b, second, STEP_COLOUR, "D", -0.14))
    for rates, name, colour, marker, offset in jobs:
        drawn = [
            (y, rates[t]) for y, t in zip(ys, tasks, strict=True) if t in rates and rates[t].rate is not None
        ]
        ax.errorbar(
            [r.rate for _, r in drawn], [y + offset for y, _ in drawn], xerr=[r.stderr for _, r in drawn],
            fmt=marker, color=colour, markersize=6, capsize=3, elinewidth=1, zorder=2,
            label=_overall_label(name, rates),
        )  # fmt: skip
    for label, colour in CHANGE_COLOURS.items():
        ax.plot([], [], color=colour, linewidth=6, alpha=0.35, label=label)
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i] in CHANGE_COLOURS)  # the jobs first
    ax.set_yticks(ys, tasks, fontsize=8 if len(tasks) > 15 else 9)
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-0.7, len(tasks) - 0.3)
    ax.set_xlabel("pass rate (passed / passed or failed; ± 1 s.e.)")
    more = f"; {hidden} more unchanged task(s) not drawn" if hidden else ""
    ax.set_title(f"{first} -> {second}: {len(changes)} task(s) changed{more}")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(
        [handles[i] for i in order], [labels[i] for i in order], loc="upper left", bbox_to_anchor=(1.01, 1.0),
        fontsize=8, frameon=False,
    )  # fmt: skip
    return _save(fig, path)


def _rate(rates: Mapping[str, TaskRate], task: str) -> float | None:
    return rates[task].rate if task in rates else None


def _overall_label(name: str, rates: Mapping[str, TaskRate]) -> str:
    """`JOB: 0.420 ± 0.064 (n=60)`: the pass rate over every judged trial of the job."""
    passed = sum(r.passed for r in rates.values())
    judged = sum(r.judged for r in rates.values())
    if not judged:
        return f"{name}: no judged trial"
    return Level(passed / judged, TaskRate(passed, judged).stderr, judged).label(name)
