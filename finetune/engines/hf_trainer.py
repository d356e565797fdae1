"""The default engine: Hugging Face `Trainer`, configured from `TrainConfig`, reporting through `Progress`."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import PrinterCallback

from finetune.engines.common import Prepared, prepare_run, samples_event, save_final, write_used_ds_config
from finetune.engines.world import trainer_world_if
from finetune.model.inference import generate_answers
from finetune.model.packing import is_packed
from finetune.plan import RunPlan
from finetune.runs.progress import Progress

# What the form does not ask for, chosen here so that every scheduler in config.SCHEDULERS runs with its settings.
MIN_LR_RATE = 0.1  # cosine_with_min_lr: decay to 10% of the peak rate
DECAY_FRACTION = 0.1  # warmup_stable_decay: the last 10% of the steps decay, the rest after warm-up stays flat
POLYNOMIAL_LR_END = 1e-7  # polynomial: Trainer's own default end rate (kept below the peak rate)
# On a GPU every logged loss is a host-device sync (the host waits for the queued kernels, then the device waits for
# the host): log at most once a second there. Each point is then the mean loss of its window (Trainer sums the loss on
# the device between logs). CPU runs log every logging_steps as asked: no device to stall.
GPU_LOG_EVERY_S = 1.0
# The first steps are logged as asked all the same: the start of the curve, where the loss moves most (and a short
# run keeps a curve); a handful of syncs per run.
GPU_LOG_FIRST_STEPS = 10


def training_arguments(plan: RunPlan, output_dir: Path, has_eval: bool) -> TrainingArguments:
    """`TrainingArguments` for the plan: every knob maps to its Trainer name; precision, device, DeepSpeed and Liger
    (Trainer patches the model with Liger's kernels when training starts) as the plan decided them."""
    config, precision = plan.config, plan.precision
    on_gpu = plan.device == "cuda"

    kwargs: dict[str, Any] = {}
    if plan.deepspeed:
        from finetune.engines.deepspeed_config import trainer_deepspeed_config

        kwargs["deepspeed"] = trainer_deepspeed_config(plan)
    return TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=config.per_device_train_batch_size,
        per_device_eval_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        learning_rate=config.learning_rate,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        optim=plan.trainer_optim,
        lr_scheduler_type=config.lr_scheduler_type,
        warmup_steps=config.warmup_steps,
        num_train_epochs=config.num_train_epochs,
        max_steps=config.max_steps,
        logging_steps=config.logging_steps,
        logging_first_step=True,
        save_strategy="steps",
        save_steps=config.save_steps,
        # Keep two: if the process dies while writing the newest, the one before is still complete.
        save_total_limit=2,
        eval_strategy="steps" if has_eval else "no",
        eval_steps=config.eval_steps if has_eval else None,
        seed=config.seed,
        report_to=[] if config.report_to == "none" else [config.report_to],
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        activation_checkpointing=config.gradient_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False} if config.gradient_checkpointing else None,
        use_cpu=not on_gpu,
        include_num_input_tokens_seen="non_padding",
        # Its NaN/Inf test reads each micro batch's loss on the host: one device sync per micro batch on a GPU. There a
        # NaN loss shows in the curve as it is (what a user wants to see) instead of being replaced by the mean.
        logging_nan_inf_filter=not on_gpu,
        use_liger_kernel=plan.liger,
        disable_tqdm=True,  # the run has its own progress (terminal bar, UI)
        dataloader_num_workers=0,
        remove_unused_columns=False,
        save_only_model=False,
        **kwargs,
    )


def scheduler_arguments(
    name: str, num_training_steps: int, num_warmup_steps: int, learning_rate: float
) -> tuple[str, int, dict[str, Any]]:
    """(name, training steps, extra kwargs) for `get_scheduler`, so that `name` runs with the form's settings.

    Fills in what some schedulers need and the form does not ask for, and sidesteps the short-run corners where
    a scheduler divides by zero; the rate at every step the run takes is the one the named schedule gives.
    """
    kwargs: dict[str, Any] = {}
    if name == "cosine_with_min_lr":
        kwargs["min_lr_rate"] = MIN_LR_RATE
    elif name == "warmup_stable_decay":
        after_warmup = max(0, num_training_steps - num_warmup_steps)
        kwargs["num_decay_steps"] = min(after_warmup, max(1, math.ceil(DECAY_FRACTION * num_training_steps)))
    elif name == "polynomial":
        if learning_rate <= 0:
            return "constant", num_training_steps, {}  # a zero rate stays zero: nothing to decay
        kwargs["lr_end"] = min(POLYNOMIAL_LR_END, learning_rate * 1e-3)
        # It divides by (training - warm-up) steps at the end of the run: with warm-up filling the whole run that
        # is 0. One more step changes no rate the run uses (all of them are still warm-up).
        num_training_steps = max(num_training_steps, num_warmup_steps + 1)
    return name, num_training_steps, kwargs


def build_scheduler(args: TrainingArguments, optimizer: Any, num_training_steps: int) -> Any:
    """The learning-rate scheduler for a run of `num_training_steps` optimizer steps (what Trainer would build,
    with the arguments `scheduler_arguments` supplies)."""
    from transformers import SchedulerType, get_scheduler

    name = SchedulerType(args.lr_scheduler_type).value
    warmup = args.get_warmup_steps(num_training_steps)
    name, total, kwargs = scheduler_arguments(name, num_training_steps, warmup, args.learning_rate)
    return get_scheduler(
        name,
        optimizer=optimizer,
        num_warmup_steps=warmup,
        num_training_steps=total,
        scheduler_specific_kwargs=kwargs,
    )


class StudioTrainer(Trainer):
    """`Trainer` whose scheduler comes from `build_scheduler` (also under DeepSpeed, which asks the same method), and
    which counts input tokens on a GPU without a host sync per micro batch."""

    _pending_tokens: Any = None  # GPU: tokens counted on the device since the last `tokens_seen()`

    def _track_num_input_tokens(self, inputs: dict[str, Any]) -> None:
        """Trainer reads each micro batch's token count with `.item()` (a device sync on a GPU); there the count
        stays on the device until `tokens_seen()` reads it, on the status cadence. A packed micro batch has no padding
        and no mask: every token counts (Trainer would count the ids that are not the pad id, and SmolLM2 pads with
        its end-of-turn token, which real text holds)."""
        mask = inputs.get("attention_mask")
        packed = is_packed(inputs)
        on_gpu = self.args.device.type == "cuda"
        if self.args.include_num_input_tokens_seen != "non_padding" or not (packed or (on_gpu and mask is not None)):
            super()._track_num_input_tokens(inputs)
            return
        import torch

        if packed:
            count = torch.tensor([inputs["input_ids"].numel()], device=self.args.device, dtype=torch.int64)
        else:
            count = mask.sum().to(device=self.args.device, dtype=torch.int64).reshape(1)
        count = self.accelerator.gather(count).sum()  # every rank's, as Trainer counts
        if not on_gpu:
            self.state.num_input_tokens_seen += int(count.item())
            return
        self._pending_tokens = count if self._pending_tokens is None else self._pending_tokens + count

    def tokens_seen(self) -> int:
        """Input tokens seen so far, the device's pending count included (one sync when there is one)."""
        if self._pending_tokens is not None:
            self.state.num_input_tokens_seen += int(self._pending_tokens.item())
            self._pending_tokens = None
        return self.state.num_input_tokens_seen

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Trainer's log, with the token count up to date."""
        self.tokens_seen()
        super().log(logs, start_time)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        self.tokens_seen()  # the checkpoint's trainer_state.json carries the count a resumed run continues from
        super()._save_checkpoint(model, trial)

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        """The run's learning-rate scheduler, built once."""
        if self.lr_scheduler is None:
            self.lr_scheduler = build_scheduler(
                self.args, self.optimizer if optimizer is None else optimizer, num_training_steps
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler


class ProgressCallback(TrainerCallback):
    """Feeds `Progress` from the Trainer's events, answers held-out prompts at step 0 and each evaluation, and
    honours the stop flag (save a checkpoint, then end)."""

    def __init__(self, progress: Progress, prepared: Prepared, tokens_seen: Callable[[], int] | None = None) -> None:
        self.progress = progress
        self.prepared = prepared
        self.tokens_seen = tokens_seen  # StudioTrainer.tokens_seen: the count without a sync every step on a GPU
        # One process only: a logged point gathers the loss from every rank, so ranks deciding by their own clocks
        # could disagree and wait on each other forever; several processes keep logging_steps.
        plan = prepared.plan
        self.log_every_s = GPU_LOG_EVERY_S if plan.device == "cuda" and plan.world_size == 1 else 0.0
        self._last_log = 0.0

    def on_train_begin(self, args, state, control, model=None, **kwargs):  # noqa: D102
        write_used_ds_config(args, self.progress)
        self.progress.set_status("running", step=state.global_step, max_steps=state.max_steps)
        if state.global_step == 0:
            self._samples(model, 0)

    def on_step_end(self, args, state, control, **kwargs):  # noqa: D102
        tokens: int | None = state.num_input_tokens_seen
        if self.tokens_seen is not None:
            # Read the device's count only when the status is about to be written (each read is a sync on a GPU).
            tokens = self.tokens_seen() if self.progress.status_due() else None
        self.progress.on_step(state.global_step, state.max_steps, state.epoch or 0.0, tokens)
        if self.progress.stop_requested.is_set():
            control.should_save = True
            control.should_training_stop = True
            self.progress.set_status("stopping", message=f"stopping at step {state.global_step}: saving a checkpoint")
        elif control.should_log and self.log_every_s and GPU_LOG_FIRST_STEPS < state.global_step < state.max_steps:
            self._log_on_cadence(control)

    def _log_on_cadence(self, control: Any) -> None:
        """Skip a log due less than `log_every_s` after the last one: the next point averages the whole window.
        Runs after Trainer's flow callback (which sets should_log from logging_steps), so that stays the densest."""
        now = time.monotonic()
        if now - self._last_log < self.log_every_s:
            control.should_log = False
        else:
            self._last_log = now

    def on_train_end(self, args, state, control, **kwargs):  # noqa: D102
        if self.tokens_seen is not None:
            self.progress.update(tokens_seen=self.tokens_seen())  # the last steps' tokens, not yet read on a GPU

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
        self.progress.on_log(state.global_step, logs or {}, self.prepared.plan.objective)

    def on_evaluate(self, args, state, control, model=None, **kwargs):  # noqa: D102
        self._samples(model, state.global_step)

    def on_save(self, args, state, control, **kwargs):  # noqa: D102
        self.progress.checkpoint_saved(state.global_step, path=f"checkpoint-{state.global_step}")

    def _samples(self, model: Any, step: int) -> None:
        if model is None or not self.prepared.prompts:
            return
        prompts = self.prepared.prompts
        cache = step0_answers_path(self.prepared.plan, prompts) if step == 0 else None
        answers = _read_answers(cache, len(prompts)) if cache is not None else None
        if answers is None:
            answers = generate_answers(model, self.prepared.tokenizer, prompts, max_new_tokens=SAMPLE_MAX_NEW_TOKENS)
            if cache is not None:
                _write_answers(cache, answers)
        self.progress.event("samples", step=step, **samples_event(self.prepared, answers))


def step0_answers_path(plan: RunPlan, prompts: list[str]) -> Path | None:
    """Where the step-0 answers of runs like this one are kept: at step 0 the model is the base itself (full
    fine-tuning, or an adapter that starts as the identity: LoRA/QLoRA with B = 0, not DoRA, PiSSA or OLoRA), so its
    greedy answers are the same run after run (0.3-0.9 s of every CPU run: bench/results/overhead-analysis.md). The
    key holds the base's files (name, size, modification time), every setting that shapes the model at step 0, the
    prompts (and their images' files) and the library versions; None when the answers cannot be reused."""
    import hashlib
    import importlib.metadata as md
    import json

    if plan.lora is not None and (plan.lora.init != "true" or plan.lora.use_dora):
        return None
    if plan.world_size > 1:
        return None  # every rank must take part in generating (ZeRO-3 gathers weights): no rank may skip alone
    files = _base_files(plan.config.model)
    pictures = _image_files(prompts)
    if not files or pictures is None:
        return None
    config = plan.config
    key = [
        files, config.task, config.method, config.quant_type, config.double_quant, plan.precision, plan.weight_dtype,
        plan.device, plan.liger, config.trust_remote_code, prompts, pictures, SAMPLE_MAX_NEW_TOKENS,
        [md.version(name) for name in ("torch", "transformers", "peft")],
    ]  # fmt: skip
    digest = hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()[:32]
    from finetune.paths import studio_home

    return studio_home() / "step0-answers" / f"{digest}.json"


SAMPLE_MAX_NEW_TOKENS = 40  # each sample answer's length (part of the cached answers' key)


def _base_files(model: str) -> list[tuple[str, int, int]] | None:
    """(name, size, mtime) of every file in the base model's folder (local, the embedded model's converted copy, or
    a Hub snapshot already in the cache); None when there is no such folder here."""
    from finetune.config import EMBEDDED_MODEL

    if model == EMBEDDED_MODEL:
        from finetune.model.loading import embedded_cache_dir

        folder = embedded_cache_dir()
    elif (Path(model).expanduser() / "config.json").is_file():
        folder = Path(model).expanduser()
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, "config.json")
        except Exception:  # noqa: BLE001 - not a Hub id: no fingerprint, no reuse
            return None
        if not isinstance(cached, str):
            return None
        folder = Path(cached).parent  # snapshots/<commit>/: the commit names the files' versions too
    try:
        entries = sorted(p for p in folder.iterdir() if p.is_file())
        return [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in entries] or None
    except OSError:
        return None


def _image_files(prompts: list[str]) -> list[list[tuple[str, int, int]]] | None:
    """(path, size, mtime) of each image prompt's pictures (the answers depend on them as much as on the text);
    None when one cannot be read."""
    try:
        return [
            [(p, Path(p).stat().st_size, Path(p).stat().st_mtime_ns) for p in getattr(q, "images", ())] for q in prompts
        ]
    except OSError:
        return None


def _read_answers(path: Path, count: int) -> list[str] | None:
    import json

    try:
        answers = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(answers, list) and len(answers) == count and all(isinstance(a, str) for a in answers)
    return answers if ok else None


def _write_answers(path: Path, answers: list[str]) -> None:
    """Kept for the next run; a cache that cannot be written only costs that run its generation again."""
    from finetune.atomic import write_json

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, answers, durable=False)
    except OSError:
        pass


def train(plan: RunPlan, progress: Progress, resume_from: Path | None = None) -> str:
    """Train to the end (or until stopped); returns the final status: completed or stopped."""
    # DeepSpeed through the Trainer needs a process group: one of size 1 without a launcher, torn down after the run.
    with trainer_world_if(plan):
        return _train(plan, progress, resume_from)


def _train(plan: RunPlan, progress: Progress, resume_from: Path | None = None) -> str:
    from transformers import set_seed

    config = plan.config
    set_seed(config.seed)  # before the adapter is built: the Trainer seeds only later, too late for LoRA's init
    prepared = prepare_run(plan, progress)
    plan = prepared.plan  # as it runs (packing vetoed by the model, if it was)
    if progress.stop_requested.is_set():
        return "stopped"
    args = training_arguments(plan, progress.run.path, prepared.data.eval is not None)
    trainer = StudioTrainer(
        model=prepared.model,
        args=args,
        train_dataset=prepared.data.train,
        eval_dataset=prepared.data.eval,
        data_collator=prepared.collator,
        processing_class=prepared.tokenizer,
    )
    # On a GPU the token count is read on the status cadence (a sync); on a CPU every step, as Trainer counts it.
    tokens_seen = trainer.tokens_seen if prepared.plan.device == "cuda" else None
    trainer.add_callback(ProgressCallback(progress, prepared, tokens_seen=tokens_seen))
    trainer.remove_callback(PrinterCallback)  # our progress (terminal bar, UI) replaces its raw dict prints
    try:
        with liger_patches_undone(prepared.model, prepared.plan.liger):  # until the run's last evaluation is done
            trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
            if progress.stop_requested.is_set():
                return "stopped"
            if prepared.data.eval is not None and trainer.state.global_step % config.eval_steps:
                trainer.evaluate()  # the last evaluation (and sample answers) at the final step
        save_final(trainer.model, prepared.tokenizer, progress, trainer=trainer, plan=prepared.plan)
        return "completed"
    finally:
        # Drop references so the model's memory can be released before the next run in this process.
        trainer.model = trainer.model_wrapped = None
        trainer.optimizer = trainer.lr_scheduler = None
        prepared.model = None


@contextlib.contextmanager
def liger_patches_undone(model: Any, liger: bool) -> Iterator[None]:
    """Liger patches the model's transformers module too (its RMSNorm and MLP classes, the rotary function): put the
    module back after the run, so a later run in this process with liger_kernel off (or on a CPU) gets plain PyTorch.
    The patched instance keeps its kernels for the rest of this run."""
    if not liger:
        yield
        return
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    module = sys.modules[type(base).__module__]
    before = dict(vars(module))
    try:
        yield
    finally:
        for name in [n for n in vars(module) if n not in before]:
            delattr(module, name)
        for name, value in before.items():
            if getattr(module, name, None) is not value:
                setattr(module, name, value)
