"""Push a `harbor collect` dataset to the Hugging Face Hub, with a card the dataset viewer reads.

The card's YAML front matter declares one config whose train split is `results.jsonl`, so the Hub's
viewer and `datasets.load_dataset(REPO)` read the episodes as they are, with no conversion.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evaluation.collect import METADATA_FILE, RESULTS_FILE

CARD_FILE = "README.md"
UPLOADED = (RESULTS_FILE, METADATA_FILE, CARD_FILE)


def dataset_card(repo_id: str, metadata: dict[str, Any]) -> str:
    """README.md: YAML front matter (configs -> train split = results.jsonl) and a short description."""
    summary = {
        k: metadata.get(k) for k in ("provider", "model", "harness", "datasets", "num_written", "num_dropped")
    }
    return f"""---
configs:
- config_name: default
  data_files:
  - split: train
    path: {RESULTS_FILE}
tags:
- harbor-rl
- agent-traces
- sft
---

# {repo_id}

Agent episodes collected with `harbor collect` (Harbor-RL): one episode per line of `{RESULTS_FILE}`
with `episode_id`, `messages` (OpenAI chat format, tool calls included), `reward` (None: unscoreable),
`done`, `tool_trace`, `metrics`, `verify_metrics`, `artifacts`, `task` and `extra`. `{METADATA_FILE}`
records how the run was made.

```python
from datasets import load_dataset
ds = load_dataset("{repo_id}", split="train")
```

Run summary:

```json
{json.dumps(summary, indent=2)}
```
"""


def push_to_hub(
    folder: Path,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    api: Any | None = None,
) -> str:
    """Create (or reuse) the dataset repo and upload results.jsonl, metadata.json and the card in one commit."""
    from huggingface_hub import HfApi

    results = folder / RESULTS_FILE
    if not results.is_file():
        raise FileNotFoundError(f"{results} does not exist: run harbor collect first")
    metadata_path = folder / METADATA_FILE
    metadata = json.loads(metadata_path.read_text()) if metadata_path.is_file() else {}
    (folder / CARD_FILE).write_text(dataset_card(repo_id, metadata))
    api = api if api is not None else HfApi(token=token)
    api.create_repo(repo_id=repo_id, repo_type="dataset", private=private, exist_ok=True)
    api.upload_folder(
        repo_id=repo_id,
        repo_type="dataset",
        folder_path=str(folder),
        allow_patterns=list(UPLOADED),
        commit_message=f"harbor collect: {metadata.get('num_written', '?')} episodes",
    )
    return f"https://huggingface.co/datasets/{repo_id}"
