"""The held-out prompts a run answers at step 0 and at each evaluation, with their reference answers."""

from __future__ import annotations

import json

from finetune import objectives
from finetune.config import TrainConfig
from finetune.data.detection import detect_format
from finetune.data.loading import BUNDLED_DIR, load_raw
from finetune.data.registry import handler
from finetune.errors import UserError


def heldout_prompts(config: TrainConfig, limit: int = 5) -> list[str]:
    """Prompts answered at step 0 and at each evaluation, so the user sees the tuning take hold."""
    return [prompt for prompt, _ in heldout_samples(config, limit)]


def heldout_samples(config: TrainConfig, limit: int = 5) -> list[tuple[str, str | None]]:
    """The held-out prompts with their reference answers (None where the data has none): a bundled set's
    heldout.json (entries are a prompt, or {"prompt", "reference"}), else the first rows of the eval split (of the
    training data when there is none) with their answer (preference data: the chosen one; kto: a good one; prompts
    for learning from rewards: their `answer` column)."""
    if objectives.of(config).is_classifier:
        return []
    if config.dataset.startswith("bundled:"):
        path = BUNDLED_DIR / config.dataset.split(":", 1)[1] / "heldout.json"
        if path.is_file():
            entries = json.loads(path.read_text(encoding="utf-8"))[:limit]
            return [(e, None) if isinstance(e, str) else (e["prompt"], e.get("reference")) for e in entries]
    try:
        train_raw, eval_raw = load_raw(config)
    except UserError:
        return []
    source = eval_raw if eval_raw is not None else train_raw
    fmt = detect_format(list(source.column_names), config)
    samples: list[tuple[str, str | None]] = []
    from_row = handler(fmt.kind).samples
    for row in source.select(range(min(limit, len(source)))):
        samples += from_row(row, fmt)
    return samples[: min(limit, 3)]
