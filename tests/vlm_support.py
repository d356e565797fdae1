"""What the vision-language test modules share: a run's settings on a tiny VLM and image data, and that data prepared
as a run prepares it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from finetune.config import TrainConfig
from finetune.plan import plan_for


def vlm_config(model: Path, dataset: Path | str, **overrides: Any) -> TrainConfig:
    """A short LoRA run of `model` on `dataset` (4 steps of 2 rows, constant high learning rate, no eval split)."""
    values = {
        "model": str(model),
        "dataset": str(dataset),
        "eval_split": "",
        "max_steps": 4,
        "learning_rate": 3e-2,
        "warmup_steps": 0,
        "lr_scheduler_type": "constant",
        "max_seq_length": 128,
        "per_device_train_batch_size": 2,
        "save_steps": 4,
        **overrides,
    }
    return TrainConfig.from_dict(values)


def prepared(config: TrainConfig) -> tuple[Any, Any]:
    """(the model's processor, the prepared data) as a run of `config` makes them."""
    from finetune import data
    from finetune.model import loading

    processor = loading.load_processor(plan_for(config))
    return processor, data.prepare(config, processor)


def chat_with_a_picture(run_dir: Path, model_dir: Path, picture: str) -> Any:
    """Ask the tuned run and its base about `picture` through the studio: both answer; the same message without the
    picture is refused in one line naming `images`. Returns the studio (for further checks)."""
    import pytest

    from finetune.errors import UserError
    from finetune.model.inference import GenerationSettings
    from finetune.studio import Studio

    studio = Studio(runs_root=run_dir.parent)
    settings = GenerationSettings(max_new_tokens=4)
    tuned = list(studio.chat(run_dir.name, PICTURE_QUESTION, settings, images=[picture]))
    base = list(
        studio.chat("base", PICTURE_QUESTION, settings, base_values={"model": str(model_dir)}, images=[picture])
    )
    assert tuned and base  # both generate from the image (random tiny models: the words themselves mean nothing)
    with pytest.raises(UserError, match=r"images: 0 image\(s\) for 1 <image> tag") as caught:
        list(studio.chat(run_dir.name, PICTURE_QUESTION, settings))
    assert caught.value.field == "images"
    return studio


PICTURE_QUESTION = [{"role": "user", "content": "<image>What colour?"}]


def trained_text(tokenizer: Any, row: dict) -> str:
    """The text of a prepared row's trained tokens, after checking that its labels are its ids wherever they train."""
    ids, labels = row["input_ids"], row["labels"]
    trained = [i for i, label in zip(ids, labels, strict=True) if label != -100]
    assert [label for label in labels if label != -100] == trained  # labels are the ids where trained
    return tokenizer.decode(trained)


def cli_run(config: TrainConfig, folder: Path) -> Any:
    """`config` trained through `python -m finetune train` (its `main`) into `folder`/run, in a studio home of its own
    (the run outlives the test that asked for it); returns its RunDir."""
    import pytest

    from finetune.cli import main
    from finetune.runs.rundir import RunDir

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FINETUNE_STUDIO_HOME", str(folder / "home"))
        config.replace(output_dir=str(folder / "run")).save(folder / "run.yaml")
        assert main(["train", "--config", str(folder / "run.yaml")]) == 0
    return RunDir(folder / "run")
