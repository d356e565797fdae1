"""What a model produces on the rows, batch by batch (each batch ticks the progress): answers, the log-likelihood of
the reference answers on the tokens training counts, and a classifier's labels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from finetune import data
from finetune.evaluation.rows import EvalRow, Segments
from finetune.model.inference import generate_answers

BATCH = 8  # rows per generation batch
SCORE_BATCH = 4  # rows per log-likelihood batch (the logits of a large vocabulary are the biggest tensor)
SAMPLING_SEED = 0
Tick = Callable[[int], None]  # advances the progress by that many rows


def answers(
    model: Any,
    tokenizer: Any,
    rows: list[EvalRow],
    max_new_tokens: int,
    temperature: float = 0.0,
    tick: Tick | None = None,
) -> list[str]:
    """The model's answer to each row's prompt (greedy unless `temperature` > 0; sampled answers are seeded, so the
    same evaluation samples the same answers again)."""
    if temperature > 0:
        import torch

        torch.manual_seed(SAMPLING_SEED)
    out: list[str] = []
    images = hasattr(tokenizer, "image_processor")  # a vision-language model's processor reads each row's pictures
    for start in range(0, len(rows), BATCH):
        chunk = rows[start : start + BATCH]
        batch = [row.prompt or [] for row in chunk]
        pictures = [row.images for row in chunk] if images else None
        out += generate_answers(
            model, tokenizer, batch, max_new_tokens=max_new_tokens, temperature=temperature, images=pictures
        )
        _tick(tick, len(batch))
    return out


def answer_nll(
    model: Any, tokenizer: Any, pieces: list[Segments], max_length: int, tick: Tick | None = None
) -> list[tuple[float, int]]:
    """(summed negative log-likelihood in nats, token count) over the trained tokens of each row, tokenised and cut
    to `max_length` as training does; (0.0, 0) for a row with no trained token left."""
    import torch

    encoded = [data.tokenize_segments(segments, tokenizer, max_length) for segments in pieces]
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out: list[tuple[float, int]] = []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(encoded), SCORE_BATCH):
            batch = encoded[start : start + SCORE_BATCH]
            width = max(len(row["input_ids"]) for row in batch)
            ids = torch.tensor([row["input_ids"] + [pad] * (width - len(row["input_ids"])) for row in batch])
            mask = torch.tensor([[1] * len(row["input_ids"]) + [0] * (width - len(row["input_ids"])) for row in batch])
            labels = torch.tensor([row["labels"] + [data.IGNORE] * (width - len(row["labels"])) for row in batch])
            with torch.no_grad():
                logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
            out += _summed_nll(logits, labels)
            _tick(tick, len(batch))
    finally:
        if was_training:
            model.train()
    return out


def image_answer_nll(
    model: Any, processor: Any, rows: list[dict[str, Any]], family: str, tick: Tick | None = None
) -> list[tuple[float, int]]:
    """`answer_nll` for image rows ({input_ids, labels, images} as training tokenised them): each batch laid out by
    training's image collator, so the model reads the rows' pictures as it did in training."""
    import torch

    from finetune.data.images import ImageCollator

    collate = ImageCollator(processor, family=family)
    device = next(model.parameters()).device
    out: list[tuple[float, int]] = []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(rows), SCORE_BATCH):
            batch = collate(rows[start : start + SCORE_BATCH])
            labels = batch.pop("labels")
            with torch.no_grad():
                logits = model(**{k: v.to(device) for k, v in batch.items()}).logits.float()
            out += _summed_nll(logits, labels)
            _tick(tick, len(rows[start : start + SCORE_BATCH]))
    finally:
        if was_training:
            model.train()
    return out


def _summed_nll(logits: Any, labels: Any) -> list[tuple[float, int]]:
    """(summed NLL, counted tokens) of each row: the token at t is predicted from the logits at t - 1 (as the
    model's own loss shifts them); -100 labels are not counted."""
    import torch

    targets = labels[:, 1:].to(logits.device)
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), targets, ignore_index=data.IGNORE, reduction="none"
    )
    counted = targets != data.IGNORE
    return [(float(n), int(c)) for n, c in zip(nll.sum(1).tolist(), counted.sum(1).tolist(), strict=True)]


def labels(
    model: Any, tokenizer: Any, rows: list[EvalRow], max_length: int, tick: Tick | None = None
) -> tuple[list[int], list[float]]:
    """A classifier's predicted class for each row and the negative log-likelihood of the row's true class, read as
    training reads the texts (same tokenisation and truncation)."""
    import torch

    predicted: list[int] = []
    nll: list[float] = []
    device = next(model.parameters()).device
    for start in range(0, len(rows), BATCH):
        batch = rows[start : start + BATCH]
        pairs = [row.text_pair or None for row in batch]
        texts = [row.text for row in batch]
        encoded = tokenizer(
            texts, pairs if any(pairs) else None, truncation=True, max_length=max_length, padding=True,
            return_tensors="pt",
        )  # fmt: skip
        with torch.no_grad():
            logits = model(**{k: v.to(device) for k, v in encoded.items()}).logits.float()
        truth = torch.tensor([row.label for row in batch], device=logits.device)
        nll += torch.nn.functional.cross_entropy(logits, truth, reduction="none").tolist()
        predicted += logits.argmax(-1).tolist()
        _tick(tick, len(batch))
    return predicted, nll


def _tick(tick: Tick | None, n: int) -> None:
    if tick is not None:
        tick(n)
