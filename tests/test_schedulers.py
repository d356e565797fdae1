"""Every offered learning-rate scheduler runs with any settings the form allows, on both backends.

The Trainer cases build the scheduler the engine builds (`StudioTrainer.create_optimizer_and_scheduler` with the
engine's `TrainingArguments`) and step it through the whole run, including the step after the last one, where
short runs used to divide by zero. The DeepSpeed cases build the scheduler from the generated ds_config section.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch

from finetune import config as config_module
from finetune.config import TrainConfig
from finetune.engines.deepspeed_config import SCHEDULERS as DS_SCHEDULERS
from finetune.engines.deepspeed_config import deepspeed_config
from finetune.engines.hf_trainer import MIN_LR_RATE, StudioTrainer, training_arguments
from finetune.plan import plan_for
from finetune.runs.manager import RunManager
from finetune.runs.rundir import RunDir
from tests.helpers import tiny_config, write_jsonl

LR = 1e-3
# (max_steps, warmup_steps): a normal run, one step, warm-up ending one step before the end, as long as the run,
# and longer than it.
CASES = [(40, 2), (1, 0), (20, 19), (1, 1), (2, 2), (3, 10)]
CASE_IDS = [f"steps{steps}-warmup{warmup}" for steps, warmup in CASES]


def cfg(**values) -> TrainConfig:
    return TrainConfig(model="m", dataset="d.jsonl", **values)


def trainer_rates(tmp_path: Path, name: str, max_steps: int, warmup: int, lr: float = LR) -> list[float]:
    """The learning rate of each optimizer step of a run, from the scheduler the Trainer engine builds."""
    c = cfg(lr_scheduler_type=name, max_steps=max_steps, warmup_steps=warmup, learning_rate=lr)
    args = training_arguments(plan_for(c, "cpu"), tmp_path, has_eval=False)
    trainer = StudioTrainer(model=torch.nn.Linear(2, 2), args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=max_steps)
    rates = []
    for _ in range(max_steps):
        rates.append(trainer.lr_scheduler.get_last_lr()[0])
        trainer.optimizer.step()
        trainer.lr_scheduler.step()  # also after the last step, as Trainer does
    return rates


@pytest.mark.parametrize(("max_steps", "warmup"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("name", config_module.SCHEDULERS)
def test_every_trainer_scheduler_runs_with_the_forms_settings(tmp_path, name, max_steps, warmup):
    rates = trainer_rates(tmp_path, name, max_steps, warmup)
    assert len(rates) == max_steps and all(math.isfinite(r) and 0.0 <= r <= LR * (1 + 1e-9) for r in rates), rates
    if name == "constant":
        assert rates == pytest.approx([LR] * max_steps)
    elif warmup >= max_steps:
        # The whole run is warm-up: a straight ramp from 0, whatever comes after.
        assert rates == pytest.approx([LR * step / warmup for step in range(max_steps)]), rates
    else:
        assert rates[warmup] == pytest.approx(LR), rates  # the peak right after the warm-up


@pytest.mark.parametrize("name", [n for n in config_module.SCHEDULERS if n not in ("constant", "constant_with_warmup")])
def test_decaying_schedules_decay_and_min_lr_keeps_its_floor(tmp_path, name):
    rates = trainer_rates(tmp_path, name, 40, 2)
    assert rates[-1] < 0.8 * LR, (name, rates)
    if name == "cosine_with_min_lr":
        assert min(rates[2:]) >= MIN_LR_RATE * LR * (1 - 1e-9)
    if name == "warmup_stable_decay":
        assert rates[2:30] == pytest.approx([LR] * 28)  # the stable phase holds the peak


@pytest.mark.parametrize("name", config_module.SCHEDULERS)
def test_a_zero_learning_rate_runs_with_every_scheduler(tmp_path, name):
    assert trainer_rates(tmp_path, name, 3, 1, lr=0.0) == [0.0, 0.0, 0.0]


def deepspeed_rates(name: str, max_steps: int, warmup: int) -> list[float]:
    """The learning rate of each step of a `backend: deepspeed` run, from the generated scheduler section."""
    from deepspeed.runtime import lr_schedules

    c = cfg(backend="deepspeed", lr_scheduler_type=name, max_steps=max_steps, warmup_steps=warmup, learning_rate=LR)
    section = deepspeed_config(plan_for(c, device="cpu"), total_steps=max_steps)["scheduler"]
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    scheduler = getattr(lr_schedules, section["type"])(optimizer, **section["params"])
    scheduler.step()  # the engine steps once before training (DeepSpeed's schedulers start one step behind)
    rates = []
    for _ in range(max_steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize(("max_steps", "warmup"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("name", list(DS_SCHEDULERS))
def test_every_deepspeed_scheduler_runs_with_the_forms_settings(name, max_steps, warmup):
    records = _Records()
    logger = logging.getLogger("DeepSpeed")
    logger.addHandler(records)
    try:
        rates = deepspeed_rates(name, max_steps, warmup)
    finally:
        logger.removeHandler(records)
    assert len(rates) == max_steps and all(math.isfinite(r) and 0.0 <= r <= LR * (1 + 1e-9) for r in rates), rates
    assert not [m for m in records.messages if "less than warmup" in m], records.messages
    if name == "constant" or warmup == 0:
        assert rates[0] == pytest.approx(LR)
    elif warmup >= max_steps:
        assert rates[0] == 0.0 and rates == sorted(rates), rates  # still warming up when the run ends
    elif warmup < max_steps - 1:  # DeepSpeed's cosine starts decaying at the first step after warm-up
        assert max(rates) == pytest.approx(LR, rel=0.01), rates


def test_every_deepspeed_scheduler_is_offered_by_the_form():
    assert set(DS_SCHEDULERS) <= set(config_module.SCHEDULERS)


@pytest.mark.parametrize(
    ("name", "max_steps", "warmup"),
    [("polynomial", 2, 2), ("warmup_stable_decay", 1, 0), ("cosine_with_min_lr", 2, 5)],
)
def test_short_real_runs_complete(tiny_model_dir, tmp_path, name, max_steps, warmup):
    """The engine really trains with the schedulers that used to crash (a missing argument, a division by 0)."""
    text = write_jsonl(tmp_path / "text.jsonl", [{"text": f"Arr, matey number {i}!"} for i in range(8)])
    config = tiny_config(
        tiny_model_dir,
        dataset=str(text),  # plain text: no held-out prompts to answer, so the run takes a second or two
        lr_scheduler_type=name,
        max_steps=max_steps,
        warmup_steps=warmup,
        save_steps=max_steps,
    )
    state = RunManager().start(config, background=False)
    assert state.status == "completed", (state.status, state.error)
    assert RunDir(Path(state.run_dir)).read_status()["step"] == max_steps
