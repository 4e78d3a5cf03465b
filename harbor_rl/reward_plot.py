"""A reward-curve PNG drawn with Pillow (no plotting library needed): mean reward per step, and optionally
the evaluations around training as labelled dashed lines (e.g. after SFT, after GRPO)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

WIDTH, HEIGHT, MARGIN = 640, 360, 48
LEVEL_COLOURS = [(214, 39, 40), (44, 160, 44), (148, 103, 189), (140, 86, 75)]


def reward_curve_png(
    history: Sequence[dict[str, Any]],
    path: str | Path,
    key: str = "reward",
    levels: Mapping[str, float] | None = None,
) -> Path | None:
    """Write the curve of `key` over steps to `path`, with each of `levels` (label -> value, such as an
    evaluation's mean) as a dashed line; None when Pillow is missing or nothing was logged."""
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        return None
    points = [(int(h["step"]), float(h[key])) for h in history if h.get(key) is not None]
    if not points:
        return None
    steps = [s for s, _ in points]
    values = [v for _, v in points]
    levels = {k: v for k, v in (levels or {}).items() if v == v}  # NaN (no scored episode) is not drawn
    lo, hi = min([*values, *levels.values()]), max([*values, *levels.values()])
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    s0, s1 = min(steps), max(max(steps), min(steps) + 1)

    def xy(step: int, value: float) -> tuple[float, float]:
        x = MARGIN + (step - s0) / (s1 - s0) * (WIDTH - 2 * MARGIN)
        y = HEIGHT - MARGIN - (value - lo) / (hi - lo) * (HEIGHT - 2 * MARGIN)
        return x, y

    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle([MARGIN, MARGIN, WIDTH - MARGIN, HEIGHT - MARGIN], outline="black")
    draw.text((MARGIN, 12), f"{key} per step", fill="black")
    draw.text((4, MARGIN - 6), f"{hi:.3g}", fill="black")
    draw.text((4, HEIGHT - MARGIN - 6), f"{lo:.3g}", fill="black")
    draw.text((MARGIN, HEIGHT - MARGIN + 8), str(s0), fill="black")
    draw.text((WIDTH - MARGIN - 16, HEIGHT - MARGIN + 8), str(s1), fill="black")
    coords = [xy(s, v) for s, v in points]
    if len(coords) > 1:
        draw.line(coords, fill=(31, 119, 180), width=2)
    for x, y in coords:
        draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=(31, 119, 180))
    for i, (label, value) in enumerate(levels.items()):
        colour = LEVEL_COLOURS[i % len(LEVEL_COLOURS)]
        _, y = xy(s0, value)
        for x in range(MARGIN, WIDTH - MARGIN, 12):
            draw.line([(x, y), (min(x + 6, WIDTH - MARGIN), y)], fill=colour, width=1)
        draw.text((MARGIN + 4 + 150 * i, MARGIN + 4), f"- - {label} {value:.3f}", fill=colour)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path
