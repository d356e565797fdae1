"""Image + text data (`images`) for vision-language models: a conversation with image parts, a ShareGPT conversation
with `<image>` tags, or an image beside a text (a caption) or a prompt and its answer; each row's images are files
(paths relative to the data file), or the images of a Hub data set's `Image` column.

Every image is opened before a run starts: a missing or unreadable one, or a row whose image tags and images do not
match, is refused in one line naming the row. Rows are rendered with the processor's chat template; the loss is on
the assistant's answers only, by position, so the image placeholders (and the image tokens the processor expands them
into) are never trained. `max_seq_length` never cuts image tokens: a row whose images end beyond it is refused.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.config import TrainConfig
from finetune.data.checks import ROLE_ALIASES, Bad, Table, is_empty, kind_text, text_value
from finetune.data.handler import KindHandler, Row, Sample, Segments
from finetune.data.kinds import DataFormat, DataKind, PreparedData
from finetune.data.masking import IGNORE, chat_segments
from finetune.data.names import MESSAGES_NAMES, PAIR_NAMES, TEXT_NAMES, first
from finetune.errors import UserError
from finetune.paths import is_uploaded

IMAGE_NAMES = ("images", "image", "image_path", "image_paths")
CAPTION_NAMES = ("caption", *TEXT_NAMES)
IMAGE_TAG = "<image>"  # how ShareGPT-style text marks where an image goes
CAPTION_PROMPT = "Describe the image."  # the question an image + caption row answers
Part = dict[str, Any]  # {"type": "image"} or {"type": "text", "text": ...}


# ----------------------------------------------------------------------------- detection
def detect(columns: list[str], config: TrainConfig) -> DataFormat | None:
    """An image column beside a conversation, a prompt and its answer, or a text (caption)."""
    cols = set(columns)
    images = first(IMAGE_NAMES, cols)
    if not images:
        return None
    messages = config.messages_column or first(MESSAGES_NAMES, cols)
    if messages and not (config.prompt_column or config.text_column):
        return DataFormat(DataKind.IMAGES, {"messages": messages, "images": images})
    prompt = config.prompt_column or next((p for p, c in PAIR_NAMES if p in cols and c in cols), "")
    completion = config.completion_column or next((c for p, c in PAIR_NAMES if p == prompt and c in cols), "")
    if prompt and completion:
        return DataFormat(DataKind.IMAGES, {"prompt": prompt, "completion": completion, "images": images})
    text = config.text_column or first(CAPTION_NAMES, cols)
    if text:
        return DataFormat(DataKind.IMAGES, {"text": text, "images": images})
    raise UserError(
        f"dataset: column {images!r} holds images, but no text goes with them among {', '.join(columns)}; add a "
        "messages column, prompt + completion columns or a caption/text column",
        field="dataset",
    )


# ----------------------------------------------------------------------------- rows as conversations with images
def image_list(value: Any) -> list[Any]:
    """A row's images as a list: one path (or image) alone becomes a list of one; empty means none."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _parts(content: Any) -> list[Part]:
    """A message's content as parts: text with `<image>` tags split at the tags, or typed parts as they are."""
    if isinstance(content, (list, tuple)):
        parts: list[Part] = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("image", "text"):
                raise Bad(f"content parts must be {{'type': 'image'}} or {{'type': 'text', 'text': ...}}, got {part!r}")
            if part["type"] == "image":
                parts.append({"type": "image"})
            else:
                parts += _parts(text_value(part.get("text", "")))
        return parts
    text = "" if content is None else text_value(content)
    pieces = text.split(IMAGE_TAG)
    parts = []
    for i, piece in enumerate(pieces):
        if i:
            parts.append({"type": "image"})
        if piece.strip():
            parts.append({"type": "text", "text": piece.strip() if len(pieces) > 1 else piece})
    return parts


def conversation(row: Row, fmt: DataFormat) -> list[dict[str, Any]]:
    """The row as chat messages whose content is a list of parts (the processors' chat templates read that)."""
    cols = fmt.columns
    images = len(image_list(row.get(cols["images"])))
    if "messages" in cols:
        out = []
        for number, message in enumerate(parse_raw(row[cols["messages"]]), 1):
            role = message.get("role", message.get("from"))
            if not isinstance(role, str) or not role.strip():
                raise Bad(f"message {number} has no role (user, assistant or system)")
            content = message.get("content", message.get("value"))
            out.append({"role": ROLE_ALIASES.get(role.strip(), role.strip()), "content": _parts(content)})
        return out
    if "prompt" in cols:
        user = [{"type": "image"}] * images + _parts(row[cols["prompt"]])
        answer = _parts(row[cols["completion"]])
    else:
        user = [{"type": "image"}] * images + [{"type": "text", "text": CAPTION_PROMPT}]
        answer = _parts(row[cols["text"]])
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def parse_raw(value: Any) -> list[dict[str, Any]]:
    """A messages cell as a list of message objects (JSON text accepted)."""
    import json

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise Bad("expected a list of {role, content} messages, got text that is not JSON") from None
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(m, dict) for m in value):
        raise Bad(f"expected a list of {{role, content}} messages, got {kind_text(value)}")
    return list(value)


def image_count(messages: list[dict[str, Any]]) -> int:
    """How many images a conversation's parts place."""
    return sum(1 for m in messages for p in m["content"] if p["type"] == "image")


def as_text(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The conversation with each image as an `<image>` tag in its text (for views that show text only)."""
    return [
        {"role": m["role"], "content": "".join(IMAGE_TAG if p["type"] == "image" else p["text"] for p in m["content"])}
        for m in messages
    ]


# ----------------------------------------------------------------------------- checks
def check(tables: list[Table], fmt: DataFormat, config: TrainConfig) -> list[dict[str, list[Any]]]:
    """Every row: a conversation with an answer, as many images as it places, each image found and readable. The
    images column comes back as absolute paths (or the images themselves for in-memory ones)."""
    out: list[dict[str, list[Any]]] = [{} for _ in tables]
    images_col = fmt.columns["images"]
    for table, normalised in zip(tables, out, strict=True):
        folder = table.folder
        rows = len(table.columns[images_col])
        resolved = []
        for index in range(rows):
            row = {c: table.columns[c][index] for c in fmt.columns.values()}
            text_col = next(c for r, c in fmt.columns.items() if r != "images")
            for role, column in fmt.columns.items():
                if role != "images" and is_empty(row[column]):
                    raise table.error(index, column, " is empty; fill it in or remove the row")
            try:
                messages = conversation(row, fmt)
            except Bad as exc:
                raise table.error(index, text_col, f": {exc}") from None
            if not any(m["role"] == "assistant" and m["content"] for m in messages):
                raise table.error(index, text_col, ": no assistant message to learn from")
            if any(p["type"] == "image" for m in messages if m["role"] == "assistant" for p in m["content"]):
                raise table.error(index, text_col, ": an image in an assistant message; images go in user messages")
            found = image_list(row[images_col])
            tags = image_count(messages)
            if tags != len(found):
                where = "image parts" if "messages" in fmt.columns else "images"
                raise table.error(
                    index,
                    text_col,
                    f": {tags} {IMAGE_TAG} tags / {where} but {len(found)} image(s) in column {images_col!r}; "
                    "give one image per tag",
                )
            try:
                resolved.append([open_checked(value, folder) for value in found])
            except Bad as exc:
                raise table.error(index, images_col, f": {exc}") from None
        normalised[images_col] = resolved
    return out


def open_checked(value: Any, folder: Path | None) -> Any:
    """An image value checked readable: a path (relative to the data file's folder) comes back absolute, an in-memory
    image (PIL, or a Hub `Image` cell {bytes, path}) as it is."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, str):
        path = Path(value).expanduser()
        if not path.is_absolute() and folder is not None:
            path = folder / path
        unpacked = None
        if not path.is_file() and folder is not None and not Path(value).is_absolute():
            unpacked = from_zip(folder, value)  # a zip of the images beside the data file (names kept inside it)
            path = unpacked or path
        if not path.is_file():
            where = f" (looked in {path.parent} and its .zip files)" if folder is not None else ""
            raise Bad(f"image {value!r} not found{where}")
        inside = unpacked is not None or path.resolve().is_relative_to(Path(folder or "/").resolve())
        if folder is not None and not inside and is_uploaded(folder):
            # Uploaded data names only the files uploaded with it: never another visitor's or the server's.
            raise Bad(f"image {value!r} is not among the files uploaded with the data; upload it with the data file")
        try:
            with Image.open(path) as image:
                image.verify()
        except (OSError, UnidentifiedImageError, SyntaxError) as exc:
            raise Bad(f"image {value!r} cannot be read as an image ({str(exc).splitlines()[0][:80]})") from None
        return str(path.resolve())
    if isinstance(value, dict) and (value.get("bytes") or value.get("path")):
        return value
    if hasattr(value, "convert"):  # a PIL image
        return value
    raise Bad(f"expected an image file path, got {kind_text(value)}")


def from_zip(folder: Path, name: str) -> Path | None:
    """The image `name` from a .zip file in `folder` (the data file's), unpacked once into the studio's image cache;
    None when no zip there holds it. Member names that would leave the cache folder are never unpacked."""
    import zipfile

    parts = [p for p in Path(name).parts if p != "."]
    if not parts or ".." in parts or Path(name).is_absolute():
        return None
    wanted = "/".join(parts)
    for archive in sorted(folder.glob("*.zip")):
        stamp = archive.stat().st_mtime_ns
        if wanted not in _zip_members(str(archive), stamp):
            continue
        target = _zip_cache(archive, stamp) / wanted
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(archive) as zipped, zipped.open(wanted) as source:
                partial = target.with_name(target.name + ".part")
                partial.write_bytes(source.read())
                partial.replace(target)
        return target
    return None


@functools.lru_cache(maxsize=16)
def _zip_members(archive: str, stamp: int) -> frozenset[str]:
    """The file names in a zip (read once per version of the file)."""
    import zipfile

    try:
        with zipfile.ZipFile(archive) as zipped:
            return frozenset(n for n in zipped.namelist() if not n.endswith("/"))
    except (OSError, zipfile.BadZipFile):
        return frozenset()


def _zip_cache(archive: Path, stamp: int) -> Path:
    """Where a zip's images are unpacked: the studio's cache, one folder per zip file and version."""
    import hashlib

    from finetune.paths import studio_home

    key = hashlib.sha256(f"{archive.resolve()}:{stamp}".encode()).hexdigest()[:16]
    return studio_home() / "image-cache" / key


def load_image(value: Any) -> Any:
    """An RGB PIL image from a checked value (an absolute path, a Hub `Image` cell or a PIL image)."""
    import io

    from PIL import Image

    if isinstance(value, str):
        image = Image.open(value)
    elif isinstance(value, dict):
        image = Image.open(io.BytesIO(value["bytes"])) if value.get("bytes") else Image.open(value["path"])
    else:
        image = value
    return image.convert("RGB")


# ----------------------------------------------------------------------------- rendering, tokenising, masking
def render(row: Row, fmt: DataFormat, processor: Any) -> Segments:
    """The conversation through the processor's chat template: the assistant's answers trained, the rest not (image
    placeholders sit in the untrained pieces)."""
    if not getattr(processor, "chat_template", None):
        raise UserError("dataset: image data needs a processor with a chat template; this model has none", "dataset")
    return chat_segments(conversation(row, fmt), processor)


@dataclass
class Encoded:
    """One row tokenised: ids, labels (-100 where not trained) and where its last image token ends."""

    input_ids: list[int]
    labels: list[int]
    images_end: int  # tokens up to and including the last image's tokens (0: no image)


def encode(row: Row, fmt: DataFormat, processor: Any) -> Encoded:
    """A row as the model sees it: each rendered piece tokenised, a piece with images through the processor (which
    expands each placeholder into that image's tokens), the trained pieces labelled, the rest -100."""
    images = [load_image(v) for v in image_list(row.get(fmt.columns["images"]))]
    placeholder = image_placeholder(processor)
    ids: list[int] = []
    labels: list[int] = []
    images_end = 0
    for text, trained in render(row, fmt, processor):
        count = text.count(placeholder)
        if count:
            mine, images = images[:count], images[count:]
            piece = processor(text=[text], images=[mine], add_special_tokens=False)["input_ids"][0]
            piece = piece.tolist() if hasattr(piece, "tolist") else list(piece)
        else:
            piece = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        labels += piece if trained else [IGNORE] * len(piece)
        if count:
            images_end = len(ids)
    return Encoded(ids, labels, images_end)


def image_placeholder(processor: Any) -> str:
    """The text the chat template writes for an image, which the processor expands into image tokens."""
    from finetune.plan import VISION_FAMILIES

    token = getattr(processor, "boi_token", None) or getattr(processor, "image_token", None)
    families = {f.image_token for f in VISION_FAMILIES.values()}
    return token if token in families else IMAGE_TAG


def prepare(config: TrainConfig, processor: Any, train_raw: Any, eval_raw: Any, fmt: DataFormat) -> PreparedData:
    """The train and eval sets tokenised and masked, each row keeping its images for the collator."""
    notes: list[str] = []
    train = _encode_set(train_raw, fmt, processor, config, notes, "train")
    evaluation = _encode_set(eval_raw, fmt, processor, config, notes, "eval") if eval_raw is not None else None
    return PreparedData(train, evaluation, fmt, notes=notes)


def _encode_set(raw: Any, fmt: DataFormat, processor: Any, config: TrainConfig, notes: list[str], name: str) -> Any:
    from datasets import Dataset

    if not hasattr(processor, "image_processor"):
        raise UserError(
            f"model: {config.model} is not a vision-language model this app knows (SmolVLM / Idefics3, Qwen2-VL, "
            "Qwen2.5-VL, Qwen3-VL, Gemma 3), but the data has images; choose such a model",
            field="model",
        )
    limit = config.max_seq_length
    rows: dict[str, list[Any]] = {"input_ids": [], "attention_mask": [], "labels": [], "images": []}
    skipped = 0
    for index, row in enumerate(raw):
        encoded = encode(row, fmt, processor)
        if encoded.images_end > limit:
            raise UserError(
                f"max_seq_length: row {index + 1} of the {name} set needs {encoded.images_end} tokens up to the end of "
                f"its last image, beyond max_seq_length {limit}, which never cuts image tokens; raise max_seq_length "
                "or lower image_longest_side",
                field="max_seq_length",
            )
        ids, labels = encoded.input_ids[:limit], encoded.labels[:limit]
        if all(label == IGNORE for label in labels):
            skipped += 1
            continue
        rows["input_ids"].append(ids)
        rows["attention_mask"].append([1] * len(ids))
        rows["labels"].append(labels)
        rows["images"].append(image_list(row.get(fmt.columns["images"])))
    if skipped:
        notes.append(f"{skipped} {name} examples had no answer tokens within max_seq_length and were skipped")
    if not rows["input_ids"]:
        raise UserError(f"max_seq_length: {limit} cuts off every answer in the {name} set; raise it", "max_seq_length")
    return Dataset.from_dict(rows)


# ----------------------------------------------------------------------------- batches
def token_types(family: str, ids: Any, image_token_id: int) -> dict[str, Any]:
    """Which tokens are image tokens, for the families whose forward pass reads it: Gemma 3 (`token_type_ids`) and
    Qwen-VL (`mm_token_type_ids`: 1 for an image token, 0 for text)."""
    if family == "gemma3":
        return {"token_type_ids": (ids == image_token_id).long()}
    if family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        return {"mm_token_type_ids": (ids == image_token_id).long()}
    return {}


@dataclass
class ImageCollator:
    """A micro batch of image rows: ids and labels padded on the right, and the rows' images through the image
    processor (the pixel values and whatever else the model reads with them)."""

    processor: Any
    family: str = ""  # the plan's vision family (which token-type inputs its forward pass reads)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        """The batch's tensors."""
        import torch

        pad = self.processor.tokenizer.pad_token_id
        width = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), width), pad, dtype=torch.long)
        labels = torch.full((len(features), width), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(features), width), dtype=torch.long)
        for i, f in enumerate(features):
            n = len(f["input_ids"])
            ids[i, :n] = torch.tensor(f["input_ids"])
            labels[i, :n] = torch.tensor(f["labels"])
            mask[i, :n] = 1
        batch: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        images = [[load_image(v) for v in f["images"]] for f in features if f.get("images")]
        if images:
            batch.update(image_inputs(self.processor, images))
        batch.update(token_types(self.family, ids, image_token_id(self.processor, self.family)))
        return batch


def image_token_id(processor: Any, family: str) -> int:
    """The id of the tokens an image becomes in the text. Gemma 3's processor names `<start_of_image>` its image token
    (the placeholder it expands); the image itself is the `<image_soft_token>`s between it and `<end_of_image>`."""
    if family == "gemma3":
        return processor.tokenizer.image_token_id
    return processor.image_token_id


IMAGE_INPUTS = ("pixel_values", "pixel_attention_mask", "image_grid_thw", "image_sizes")


def image_inputs(processor: Any, images: list[list[Any]]) -> dict[str, Any]:
    """What the model reads of a batch's images (one list per row that has any), from the image processor."""
    out = processor.image_processor(images=images, return_tensors="pt")
    return {k: v for k, v in out.items() if k in IMAGE_INPUTS}


# ----------------------------------------------------------------------------- preview and held-out prompts
def example(row: Row, fmt: DataFormat, processor: Any, config: TrainConfig) -> dict[str, Any]:
    """A row for the preview: its text pieces (trained or masked), its images and token counts (images included)."""
    segments = render(row, fmt, processor)
    encoded = encode(row, fmt, processor)
    ids = encoded.input_ids[: config.max_seq_length]
    trained = sum(1 for label in encoded.labels[: len(ids)] if label != IGNORE)
    return {
        "segments": segments,
        "tokens": len(ids),
        "trained_tokens": trained,
        "image_tokens": encoded.images_end,
        "images": [v for v in image_list(row.get(fmt.columns["images"])) if isinstance(v, str)],
    }


class ImagePrompt(str):
    """A held-out prompt with its pictures: the text of the user's turn (each image an `<image>` tag, as ShareGPT
    rows write it) that text-only readers show as it is, and the image files (absolute paths) that go with the tags,
    in order. A `str`, so the held-out prompts stay one list whatever the data kind."""

    images: tuple[str, ...]

    def __new__(cls, text: str, images: tuple[str, ...] | list[str] = ()) -> ImagePrompt:
        made = super().__new__(cls, text)
        made.images = tuple(images)
        return made


def samples(row: Row, fmt: DataFormat) -> list[Sample]:
    """The first user turn with its images (files: a checked row holds absolute paths), with the assistant's reply
    to it as the reference; none for a row whose images are not files (a Hub `Image` column), which a run's events
    could not name."""
    messages = conversation(row, fmt)
    first = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if first is None:
        return []
    images = image_list(row.get(fmt.columns["images"]))
    before = image_count(messages[:first])  # images placed before it (a system turn's) are not its own
    mine = images[before : before + image_count(messages[first : first + 1])]
    if not all(isinstance(path, str) for path in mine):
        return []
    text = as_text(messages[first : first + 1])[0]["content"]
    reply = next((m for m in messages[first + 1 :] if m["role"] == "assistant"), None)
    reference = as_text([reply])[0]["content"] if reply is not None else None
    return [(ImagePrompt(text, mine), reference)]


HANDLER = KindHandler(
    DataKind.IMAGES,
    detect=detect,
    check=check,
    prepare=prepare,
    example=example,
    samples=samples,
    render=render,
    conversation=lambda row, fmt: as_text(conversation(row, fmt)),
)
