"""The collator: how a micro batch of prepared examples is laid out."""

from __future__ import annotations

from typing import Any

from finetune import objectives
from finetune.config import TrainConfig
from finetune.data.kinds import DataKind
from finetune.data.masking import IGNORE


def collator(config: TrainConfig, tokenizer: Any, packing: bool = False, kind: DataKind | None = None) -> Any:
    """How a micro batch is laid out: padded to its longest row (labels with -100), or with `packing` (the plan's
    decision) the same examples end to end in one row without padding, their boundaries beside them for the packed
    attention (`finetune.model.packing`); each example's first label is -100, as a padded row's first never counts.
    Image rows (`kind` images; `tokenizer` is then the model's processor) are padded, their images processed."""
    if kind == DataKind.IMAGES:
        from finetune.data.images import ImageCollator
        from finetune.plan import vision_family

        return ImageCollator(tokenizer, family=vision_family(config.model) or "")
    if packing:
        from transformers import DataCollatorWithFlattening

        return DataCollatorWithFlattening(return_flash_attn_kwargs=True, separator_id=IGNORE)
    if objectives.of(config).is_classifier:
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(tokenizer)
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE, padding=True)
