"""The images of a vision-language run, for the estimate: how many per row, how large, and how many tokens each
becomes, counted from the model's own image processor (as the run's collator calls it).

Per image: SmolVLM / Idefics3 make tiles × image_seq_len tokens (the tiles of the resized image plus one global view;
64 tokens a tile for SmolVLM); Qwen-VL the patch grid of the resized image over merge_size² (Qwen2-VL / Qwen2.5-VL:
14-pixel patches merged 2 × 2, about H·W / 784; Qwen3-VL: 16-pixel patches, about H·W / 1024), its size capped by
`max_pixels` (image_longest_side squared); Gemma 3 always 256. The rows' images come from the data when it is here
(the most images in a row, the largest image); otherwise one square image a row of the `image_longest_side` setting
(1024 when it is 0).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from finetune.plan import RunPlan

ASSUMED_SIDE = 1024  # the square image assumed per row when neither the data nor the settings say
DATA_ROWS_READ = 5000  # rows whose images are measured (their headers only)


@dataclass(frozen=True)
class ImageLoad:
    """The images one training row holds at most, and their tokens."""

    images_per_row: int
    width: int
    height: int
    tokens_per_image: int
    from_data: bool  # measured in the data (else assumed)

    @property
    def tokens_per_row(self) -> int:
        """Image tokens in one row."""
        return self.images_per_row * self.tokens_per_image

    def longest_side(self, setting: int) -> int:
        """The longest side the images have now: the largest image's, or the `image_longest_side` setting when it
        is smaller (0: no setting)."""
        side = max(self.width, self.height)
        return min(side, setting) if setting else side

    def row_length(self, text_tokens: int) -> int:
        """A row's length: `text_tokens`, or longer where its images need it (their tokens, each image's start and
        end markers, and a token of text), since a run never cuts image tokens."""
        return max(text_tokens, self.tokens_per_row + 2 * self.images_per_row + 1)

    def note(self) -> str:
        """One line for the estimate's notes."""
        where = "the data's largest" if self.from_data else "assumed (no local data to measure)"
        return (
            f"images: {self.images_per_row} per row, {self.width} × {self.height} ({where}): "
            f"{self.tokens_per_image} tokens each, {self.tokens_per_row} a row"
        )


def image_load(plan: RunPlan, model_config: Any) -> ImageLoad:
    """The images of `plan`'s rows and the tokens each becomes."""
    processor = image_processor_for(plan, model_config)
    measured = _data_images(plan.config)
    if measured is not None and measured[0] > 0:
        count, width, height = measured
    else:
        side = plan.vision.image_longest_side or ASSUMED_SIDE
        count, width, height = 1, side, side
    tokens = image_tokens(processor, model_config, plan.vision.family, width, height)
    return ImageLoad(count, width, height, tokens, from_data=measured is not None and measured[0] > 0)


def image_tokens(image_processor: Any, model_config: Any, family: str, width: int, height: int) -> int:
    """The tokens one `width` × `height` image becomes, from what the image processor makes of it."""
    if family == "gemma3":
        return int(getattr(model_config, "mm_tokens_per_image", 256))
    out = image_inputs(image_processor, [[blank(width, height)]])
    if "image_grid_thw" in out:  # Qwen-VL: the patch grid, merged merge_size × merge_size into one token
        merge = int(getattr(image_processor, "merge_size", 2))
        return int(out["image_grid_thw"].prod()) // (merge * merge)
    vision = model_config.vision_config  # Idefics3 / SmolVLM: tiles × tokens per tile
    per_tile = (vision.image_size // vision.patch_size) ** 2 // (model_config.scale_factor**2)
    return int(out["pixel_values"].shape[1]) * per_tile


def blank(width: int, height: int) -> Any:
    """A grey RGB image of a size (what it shows does not change its tokens)."""
    from PIL import Image

    return Image.new("RGB", (max(1, width), max(1, height)), (128, 128, 128))


def image_inputs(image_processor: Any, images: list[list[Any]]) -> dict[str, Any]:
    """What the model reads of rows' images (one list per row), as the run's collator makes it."""
    from finetune.data.images import IMAGE_INPUTS

    out = image_processor(images=images, return_tensors="pt")
    return {k: v for k, v in out.items() if k in IMAGE_INPUTS}


def image_processor_for(plan: RunPlan, model_config: Any) -> Any:
    """The model's image processor with the plan's image size: the model's own files where they are here, else the
    family's defaults built from its config (a catalogue model)."""
    from finetune.model.loading import set_image_size

    processor = _own_image_processor(plan.config.model, plan.config.trust_remote_code)
    if processor is None:
        processor = _family_default(plan.vision.family, model_config)
    set_image_size(processor, plan.vision.image_longest_side)
    return processor


def _own_image_processor(model: str, trust_remote_code: bool) -> Any:
    from finetune.plan import model_config_values

    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, "config.json")
        except Exception:  # noqa: BLE001 - not a Hub id
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached).parent
    if model_config_values(str(path)) is None:
        return None
    try:
        from transformers import AutoImageProcessor

        return AutoImageProcessor.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None


def _family_default(family: str, model_config: Any) -> Any:
    """The image processor a family's models ship, from the model's config (PIL path: no torchvision needed)."""
    vision = model_config.vision_config
    if family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

        patch = int(vision.patch_size)
        merge = int(vision.spatial_merge_size)
        # The pixel bounds the models' published preprocessor_config.json files set (the class defaults cap images at
        # 1,003,520 pixels; Qwen2/2.5-VL ship 3136-12,845,056 pixels, Qwen3-VL 65,536-16,777,216).
        low, high = (65536, 16777216) if family == "qwen3_vl" else (3136, 12845056)
        return Qwen2VLImageProcessorPil(
            patch_size=patch,
            merge_size=merge,
            temporal_patch_size=int(getattr(vision, "temporal_patch_size", 2)),
            size={"shortest_edge": low, "longest_edge": high},
        )
    if family == "gemma3":
        from transformers.models.gemma3 import Gemma3ImageProcessorPil

        return Gemma3ImageProcessorPil(size={"height": vision.image_size, "width": vision.image_size})
    from transformers.models.idefics3 import Idefics3ImageProcessorPil

    tile = int(vision.image_size)
    return Idefics3ImageProcessorPil(size={"longest_edge": 4 * tile}, max_image_size={"longest_edge": tile})


def _data_images(config: Any) -> tuple[int, int, int] | None:
    """(most images in a row, width, height of the largest) of local image data, or None when it is not here."""
    from finetune.data.loading import BUNDLED_DIR, FILE_TYPES

    name = config.dataset
    if name.startswith("bundled:"):
        path = BUNDLED_DIR / name.split(":", 1)[1] / f"{config.dataset_split}.jsonl"
    else:
        path = Path(name).expanduser()
    if not path.is_file() or path.suffix.lower() not in FILE_TYPES:
        return None
    columns = tuple(
        getattr(config, f) for f in ("messages_column", "prompt_column", "completion_column", "text_column")
    )
    try:
        return _measured(str(path), path.stat().st_mtime_ns, config.dataset, config.dataset_split, columns)
    except Exception:  # noqa: BLE001 - data the run will refuse on its own: the estimate assumes instead
        return None


@functools.lru_cache(maxsize=32)
def _measured(path: str, stamp: int, dataset: str, split: str, columns: tuple) -> tuple[int, int, int] | None:
    """Read the data's image columns once per file version (the UI estimates often)."""
    from PIL import Image

    from finetune.config import TrainConfig
    from finetune.data.images import image_list
    from finetune.data.kinds import DataKind
    from finetune.data.loading import load_raw

    names = ("messages_column", "prompt_column", "completion_column", "text_column")
    config = TrainConfig(dataset=dataset, dataset_split=split, eval_split="", **dict(zip(names, columns, strict=True)))
    train, _ = load_raw(config)
    from finetune.data.detection import detect_format

    fmt = detect_format(list(train.column_names), config)
    if fmt.kind != DataKind.IMAGES:
        return None
    most, largest = 0, (0, 0)
    for values in train[fmt.columns["images"]][:DATA_ROWS_READ]:
        found = image_list(values)
        most = max(most, len(found))
        for value in found:
            size = _size(value, Image)
            if size[0] * size[1] > largest[0] * largest[1]:
                largest = size
    return most, largest[0], largest[1]


def _size(value: Any, image_module: Any) -> tuple[int, int]:
    """An image's (width, height) from its header (a path) or itself."""
    if isinstance(value, str):
        with image_module.open(value) as image:
            return image.size
    if isinstance(value, dict):
        import io

        source = io.BytesIO(value["bytes"]) if value.get("bytes") else value["path"]
        with image_module.open(source) as image:
            return image.size
    return tuple(value.size)
