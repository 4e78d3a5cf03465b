"""Where the engine builds the models it makes itself (`tiny`, `smollm2-135m`, converted GGUF files)."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """`$HARBOR_CACHE_DIR` or `~/.cache/harbor-rl`."""
    return Path(os.environ.get("HARBOR_CACHE_DIR") or Path.home() / ".cache" / "harbor-rl")
