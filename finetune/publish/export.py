"""Export a finished run to run outside Python: a merged Transformers model, one GGUF file plus an Ollama Modelfile,
or the LoRA adapter alone as a llama.cpp LoRA GGUF.

    export_run(run_dir, "merged" | "gguf" | "gguf-lora", quant="f16" | "q8_0", out=None, progress=None) -> ExportResult
    python -m finetune export RUN_DIR --format merged|gguf|gguf-lora [...]  # finetune/cli/export.py

LoRA adapters are merged onto the base in its saved precision; a QLoRA adapter is merged onto the full-precision base
(never 4-bit), with a warning that this is not exactly the model training evaluated. A full fine-tune's run directory
already holds the model. Everything is written into a hidden `.export-*` folder beside the target and renamed into
place at the end, so a failed export (a full disk, a file-size limit, a folder it cannot write) leaves nothing under
the final name and says why in one line; such folders left by an export that was killed are removed by the next one.
Export writes only under `--out` (a path without '..' or symbolic links), or under the run's `exports/` folder, never
into the run's own files; damaged weights are refused before any work. Its output is scanned for local paths like a
Hub push, and its files are readable like any file the user creates (some writers make 0600 files).
torch / transformers / peft / gguf are imported inside the functions.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from finetune.atomic import read_json, write_json
from finetune.config import TrainConfig
from finetune.errors import UserError, os_reason
from finetune.publish.public import FULL_MODEL_FILES, TOKENIZER_FILES, check_no_local_paths, looks_like_path
from finetune.runs.failures import disk_error
from finetune.runs.pids import own_start, same_process
from finetune.runs.rundir import RunDir

FORMATS = ("merged", "gguf", "gguf-lora")
GGUF_FORMATS = ("gguf", "gguf-lora")
QUANTS = ("f16", "q8_0")
EXPORTS_FOLDER = "exports"
STAGE_PREFIX = ".export-"  # the hidden folder an export is written in before it is renamed into place
STAGE_OWNER = "export-owner.json"  # in it: the pid and start time of the export writing it
QLORA_WARNING = (
    "warning: this qlora adapter was trained against 4-bit rounded base weights; it is merged into the full-precision "
    "base, so the exported model differs slightly from the one you evaluated (check its answers before you ship it)"
)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote: the folder, the main file (the .gguf, or the folder for merged), total bytes, warnings."""

    folder: Path
    main: Path
    size_bytes: int
    warnings: tuple[str, ...] = ()

    @property
    def size(self) -> str:
        """The total size in a short human form (1.2 MB)."""
        return human_size(self.size_bytes)

    def summary(self) -> str:
        """One line: what was written and its size."""
        return f"wrote {self.main} ({self.size})"


def human_size(n: int) -> str:
    """Bytes in a short human form (1.2 MB)."""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


# ------------------------------------------------------------------------------------------------ public API


def export_run(
    run_dir: str | Path,
    fmt: str,
    quant: str | None = None,
    out: str | Path | None = None,
    progress: Progress | None = None,
) -> ExportResult:
    """Export a finished run as `fmt` under `out` (default: the run's exports/ folder); UserError on bad input."""
    say = progress or (lambda message: None)
    fmt, quant = check_format(fmt, quant)
    run, source = exportable_run(run_dir)
    config = run.load_config()
    if run.load_plan().is_classifier:  # the run's own plan says what it trained
        raise UserError(f"format: export supports causal_lm runs, not {config.task}; push the adapter", "format")
    if fmt in GGUF_FORMATS and run.load_plan().vision is not None:
        raise UserError(
            f"format: {fmt} of a vision-language model is not written here (llama.cpp needs its image encoder as a "
            "separate mmproj file); export --format merged, which loads in transformers with its processor",
            "format",
        )
    check_weights_readable(run, source)
    if fmt == "gguf-lora":
        _check_lora(source, config)  # refuse before any folder is made
    target = _target(run, fmt, quant, out)
    warnings = (QLORA_WARNING,) if config.method == "qlora" else ()
    if source != run.path:
        warnings += (f"{run.name} stopped before its final save: exported from its last checkpoint, {source.name}",)
    for warning in warnings:
        say(warning)
    main = _write_staged(run, config, fmt, quant, target, say, source)
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    result = ExportResult(target, main, size, warnings)
    say(result.summary())
    return result


def check_format(fmt: str, quant: str | None) -> tuple[str, str | None]:
    """The format and quantisation, checked: (merged, None) or (gguf | gguf-lora, f16|q8_0)."""
    fmt = str(fmt or "").strip().lower()  # a number through the API is refused by name like any other value
    if fmt not in FORMATS:
        raise UserError(f"format: expected one of {', '.join(FORMATS)}, got {fmt!r}", "format")
    quant = str(quant or "").strip().lower() or None
    if fmt == "merged" and quant:
        raise UserError("quant: only for --format gguf (a merged model keeps its own precision)", "quant")
    if fmt in GGUF_FORMATS:
        quant = quant or "f16"
        if quant not in QUANTS:
            raise UserError(f"quant: expected one of {', '.join(QUANTS)}, got {quant!r}", "quant")
    return fmt, quant


def finished_run(run_dir: str | Path) -> RunDir:
    """A run that finished with a final adapter or model, or a UserError saying why not."""
    from finetune.paths import runs_root
    from finetune.runs.rundir import find_finished_run

    return find_finished_run(run_dir, runs_root(), "export")


def exportable_run(run_dir: str | Path) -> tuple[RunDir, Path]:
    """(the run, the folder whose weights to export): the final adapter or model, or, for a run that stopped,
    failed or was interrupted before its final save, its last complete checkpoint; a UserError saying why not."""
    from finetune.paths import runs_root
    from finetune.runs.rundir import ACTIVE, find_run

    run = find_run(run_dir, runs_root(), field="run_dir")
    checkpoint = run.last_checkpoint()
    if not run.has_final_model() and checkpoint is not None and run.effective_status() not in ACTIVE:
        return run, checkpoint
    return finished_run(run_dir), run.path


def check_weights_readable(run: RunDir, source: Path | None = None) -> None:
    """Refuse, naming the file, a run whose saved weights (in `source`: the run, or a checkpoint of it) are cut
    short or damaged, before minutes of work."""
    from safetensors import SafetensorError, safe_open

    for path in sorted((source or run.path).glob("*.safetensors")):
        try:
            with safe_open(str(path), "pt"):
                pass
        except (SafetensorError, OSError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(
                f"run_dir: {run.name}/{path.relative_to(run.path)} cannot be read ({reason}): the file is damaged or "
                "cut short; train the run again or resume it from a checkpoint",
                "run_dir",
            ) from None


def _target(run: RunDir, fmt: str, quant: str | None, out: str | Path | None) -> Path:
    """Where the export goes; a user's --out must not exist yet (or be empty); the default is replaced each time."""
    if out:
        target = _out_path(out)
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise UserError(f"out: {target.name} already exists and is not empty; pick a new folder", "out")
        if target.resolve().is_relative_to(run.path.resolve()) and EXPORTS_FOLDER not in target.parts:
            raise UserError(f"out: not among the run's own files; use its {EXPORTS_FOLDER}/ folder or elsewhere", "out")
    else:
        target = run.path / EXPORTS_FOLDER / (fmt if fmt == "merged" else f"{fmt}-{quant}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"out: cannot create {target.parent.name}: {os_reason(exc)}", "out") from None
    return target


def _out_path(out: str | Path) -> Path:
    """--out as an absolute path that means what it says: through '..' or a symbolic link it is refused, naming
    where it really leads (a link can be changed between the check and the write)."""
    given = Path(out).expanduser()
    target = given.absolute()
    if ".." in given.parts:
        raise UserError(f"out: {out} goes through '..'; give the folder's own path ({target.resolve()})", "out")
    real = target.resolve()
    if real != target:
        raise UserError(f"out: {out} goes through a symbolic link; give the folder's real path ({real})", "out")
    return target


def _write_staged(
    run: RunDir, config: TrainConfig, fmt: str, quant: str | None, target: Path, say: Progress, source: Path
) -> Path:
    """Write the export into a hidden `.export-*` folder beside `target`, then rename it into place: whatever fails
    (a full disk, a file-size limit, a folder that cannot be written), nothing is left under the final name.
    Returns the export's main file."""
    remove_stale_stages(target.parent)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=target.parent))
    except OSError as exc:
        raise _not_written(exc, run, target.parent) from None
    try:
        write_json(tmp / STAGE_OWNER, {"pid": os.getpid(), "started": own_start()})
        stage = tmp / target.name
        main = _write(run, config, fmt, quant, stage, say, source)
        _readable_like_new_files(stage)
        check_no_local_paths(stage, config, run)
        _replace(stage, target)
    except UserError:
        raise
    except Exception as exc:  # torch and safetensors report a full disk in their own words
        disk = disk_error(exc, target.parent)
        if disk is None and not isinstance(exc, OSError):
            raise
        raise _not_written(disk or exc, run, target.parent) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target / main.relative_to(stage) if main != stage else target


def _not_written(exc: OSError, run: RunDir, folder: Path) -> UserError:
    """The one line for a failed write, naming the folder (the file that failed was in the hidden stage); the run's
    own exports/ folder by the run's name, never by a server path."""
    reason = exc.strerror or type(exc).__name__
    shown = folder.relative_to(run.path.parent) if folder.is_relative_to(run.path.parent) else folder
    return UserError(f"out: cannot write the export in {shown}: {reason}; nothing was written", "out")


def remove_stale_stages(folder: Path) -> None:
    """Delete `.export-*` folders that exports killed mid-way left in `folder`: only those that carry an export's
    owner file naming a process that has ended (never one still being written, never a folder we did not make)."""
    try:
        stages = [p for p in folder.glob(STAGE_PREFIX + "*") if p.is_dir() and not p.is_symlink()]
    except OSError:
        return
    for stage in stages:
        owner = read_json(stage / STAGE_OWNER)
        if isinstance(owner, dict) and not same_process(owner.get("pid"), owner.get("started")):
            shutil.rmtree(stage, ignore_errors=True)


def _replace(stage: Path, target: Path) -> None:
    """Move the finished export into place; a previous export there (ours or an empty folder) goes only now."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
    stage.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# -------------------------------------------------------------------------------------------------- writing


def _write(
    run: RunDir, config: TrainConfig, fmt: str, quant: str | None, stage: Path, say: Progress, source: Path
) -> Path:
    """Write the export of the weights in `source` into `stage`; returns its main file (the folder for merged)."""
    if fmt == "merged":
        write_merged(run, config, stage, say, source)
        return stage
    if fmt == "gguf-lora":
        return _write_lora(run, config, quant or "f16", stage, say, source)
    from finetune.publish import gguf_writer, modelfile

    stage.mkdir()
    with tempfile.TemporaryDirectory(prefix=".merged-", dir=stage.parent) as tmp:
        merged = Path(tmp) / "merged"
        if config.method == "full":
            gguf_writer.check_gguf_support(source)  # refuse before any work
            merged = source
        else:
            _check_base_supported(config)
            write_merged(run, config, merged, say, source)
        name = _export_name(run)
        gguf_file = stage / f"{name}-{quant}.gguf"
        gguf_writer.write_gguf(merged, gguf_file, quant or "f16", name, say)
        say("Writing the Ollama Modelfile…")
        (stage / "Modelfile").write_text(modelfile.modelfile_text(merged, gguf_file.name), encoding="utf-8")
    return gguf_file


def _write_lora(run: RunDir, config: TrainConfig, quant: str, stage: Path, say: Progress, source: Path) -> Path:
    """The run's adapter (in `source`: the run, or its last checkpoint) alone as a llama.cpp LoRA GGUF, for a GGUF
    of its base model."""
    from finetune.publish import gguf_lora

    stage.mkdir()
    target = stage / f"{_export_name(run)}-lora-{quant}.gguf"
    gguf_lora.write_lora_gguf(source, _base_config(config), target, quant, _export_name(run), say)
    return target


def _check_lora(source: Path, config: TrainConfig) -> None:
    """A one-line UserError when the adapter in `source` has no llama.cpp LoRA form (or there is no adapter)."""
    from finetune.publish import gguf_lora

    if config.method == "full":
        raise UserError("format: gguf-lora needs a LoRA run; a full fine-tune has no adapter (use gguf)", "format")
    gguf_lora.check_lora_support(source, _base_config(config))


def _base_config(config: TrainConfig) -> dict:
    """The base model's config values (architecture, layers, heads): its config only, never its weights."""
    from finetune.model.loading import load_model_config

    return load_model_config(config.model, trust_remote_code=config.trust_remote_code).to_dict()


def _check_base_supported(config: TrainConfig) -> None:
    """Refuse an unsupported base before spending minutes on the merge."""
    from finetune.model.loading import resolve_model_path
    from finetune.publish import gguf_writer

    path = Path(resolve_model_path(config.model))
    if path.is_dir():
        gguf_writer.check_gguf_support(path)


def _export_name(run: RunDir) -> str:
    keep = "".join(c if c.isalnum() or c in "._-" else "-" for c in run.name).strip(".-")
    return keep or "model"


def write_merged(run: RunDir, config: TrainConfig, stage: Path, say: Progress, source: Path | None = None) -> None:
    """A standalone Transformers model in `stage`: weights (adapter merged in), config, tokenizer, chat template;
    the weights from `source` (the run's final save, or a checkpoint of it)."""
    source = source or run.path
    stage.mkdir(parents=True)
    if config.method == "full":
        say("Copying the model files…")
        _copy_files(source, stage, FULL_MODEL_FILES)
    else:
        say("Merging the adapter into the base model…")
        _merge_adapter(run, source, config, stage)
    _copy_files(source, stage, TOKENIZER_FILES)
    _copy_files(run.path, stage, TOKENIZER_FILES)  # the run's own, where a checkpoint holds none
    _drop_local_name(stage / "config.json")


def _merge_adapter(run: RunDir, source: Path, config: TrainConfig, stage: Path) -> None:
    """Load the base as the run's plan loaded it, but never 4-bit, merge the adapter in `source` (the run, or a
    checkpoint of it), save."""
    import torch
    from peft import PeftModel

    from finetune.model.loading import load_base

    plan = run.load_plan().for_merge()  # the run's base as it trained, merged in float32 on the CPU, never 4-bit
    base = load_base(plan)
    saved_dtype = _saved_dtype(config)
    with torch.no_grad():
        model = PeftModel.from_pretrained(base, str(source)).merge_and_unload()
        if saved_dtype is not None:  # merged in float32 on the CPU; saved as the base was (bf16 stays half the size)
            model = model.to(saved_dtype)
    model.save_pretrained(str(stage))


def _saved_dtype(config: TrainConfig) -> object | None:
    """The floating dtype the base model's files hold (its saved config's dtype), or None when unknown."""
    import torch
    from transformers import AutoConfig

    from finetune.model.loading import resolve_model_path

    saved = AutoConfig.from_pretrained(resolve_model_path(config.model), trust_remote_code=config.trust_remote_code)
    dtype = getattr(saved, "dtype", None) or getattr(saved, "torch_dtype", None)
    dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


def _readable_like_new_files(folder: Path) -> None:
    """Give every file the mode a newly created file gets (0644 under the usual umask): safetensors writes 0600."""
    probe = folder / ".mode-probe"  # read the umask by creating a file (os.umask would change it for all threads)
    probe.touch()
    mode = probe.stat().st_mode & 0o666
    probe.unlink()
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(mode)


def _copy_files(source: Path, stage: Path, patterns: tuple[str, ...]) -> None:
    """Copy (never link: the export must stand alone) the top-level files matching `patterns`."""
    for pattern in patterns:
        for path in sorted(source.glob(pattern)):
            if path.is_file() and not (stage / path.name).exists():
                shutil.copy2(path, stage / path.name)


def _drop_local_name(path: Path) -> None:
    """A saved config may record the local folder it came from: that names this machine, and means nothing elsewhere."""
    if not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data.get("_name_or_path"), str) and looks_like_path(data["_name_or_path"]):
        data.pop("_name_or_path")
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
