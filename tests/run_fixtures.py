"""Finished run directories for tests that read runs (publish, chat, the Train tab), made by really training.

`train_run` trains the tiny model through `RunManager.start` (the engine the app and CLI use), so the run directory
is exactly what training writes: adapter, tokenizer, config.yaml, status.json, events.jsonl (dataset fingerprint,
losses, evals, sample answers) and checkpoints with optimizer states that must never be published.

`build_run` gives a test its own copy of such a run: the first call for a given (model, steps, seed, overrides)
trains once for the whole test run (shared by the xdist workers, tests/shared.py), later calls copy it (a few
milliseconds) and relocate it: config.yaml's output_dir and status.json's run_id / run_dir are pointed at the copy,
as if it had been trained there.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

from finetune.runs.rundir import RunDir
from tests.helpers import tiny_config, write_jsonl
from tests.shared import shared_folder

PROMPTS = ("What is the capital of France?", "What is two plus two?")
EVAL_STEPS = 5  # a 10-step run evaluates (loss + sample answers) at steps 5 and 10

_cache: dict[tuple, Path] = {}
_cache_lock = threading.Lock()


def eval_file(folder: Path) -> Path:
    """A small held-out set in `folder`: its first prompts are the ones sampled at step 0 and at each evaluation."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"prompt": p, "completion": "Arr, matey! Yo-ho-ho!"} for p in PROMPTS]
    rows += [{"prompt": f"Held-out question {i}?", "completion": "Arr, matey! Yo-ho-ho!"} for i in range(6)]
    return write_jsonl(folder / "pirate-mini-eval.jsonl", rows)


def train_run(run_dir: Path, base_model_dir: Path, *, steps: int = 10, seed: int = 0, **overrides: Any) -> Path:
    """Train a tiny LoRA run on `base_model_dir` into `run_dir` (must not exist yet); returns `run_dir`."""
    from finetune.runs.manager import RunManager

    run_dir = Path(run_dir)
    values: dict[str, Any] = {
        "max_steps": steps,
        "seed": seed,
        "eval_steps": EVAL_STEPS,
        "save_steps": EVAL_STEPS,
        "output_dir": str(run_dir),
    }
    if "eval_split" not in overrides:
        values["eval_split"] = str(eval_file(run_dir.parent / f".{run_dir.name}-data"))
    values.update(overrides)
    config = tiny_config(base_model_dir, **values)
    state = RunManager(run_dir.parent).start(config, owner="tests", background=False)
    if state.status != "completed":
        raise RuntimeError(f"tiny training run failed: {state.status}: {state.error}")
    return run_dir


def build_run(
    run_dir: Path,
    base_model_dir: Path,
    *,
    status: str = "completed",
    steps: int = 10,
    seed: int = 0,
    **config_overrides: Any,
) -> Path:
    """A copy of a really trained tiny LoRA run in `run_dir` (created), marked `status`; returns `run_dir`."""
    template = trained_template(base_model_dir, steps=steps, seed=seed, **config_overrides)
    run_dir = Path(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(template, run_dir)
    relocate(run_dir)
    if status != "completed":
        rd = RunDir(run_dir)
        rd.write_status({**rd.read_status(), "status": status, "pid": None})
        rd.append_event({"type": "status", "status": status, "step": steps, "error": None})
    return run_dir


def trained_template(base_model_dir: Path, *, steps: int = 10, seed: int = 0, **overrides: Any) -> Path:
    """The trained run for these settings, trained on first use once for the whole test run (tests/shared.py):
    the workers share it when they share the base model (the session's tiny models)."""
    import hashlib

    key = (str(Path(base_model_dir).resolve()), steps, seed, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
    with _cache_lock:
        if key not in _cache:
            name = "run-" + hashlib.sha256(repr(key).encode()).hexdigest()[:16]
            base = Path(base_model_dir)

            def train(path: Path) -> None:
                train_run(path / "run-tiny", base, steps=steps, seed=seed, **overrides)

            _cache[key] = shared_folder(name, train) / "run-tiny"
        return _cache[key]


def relocate(run_dir: Path) -> None:
    """Point a copied run's config.yaml (output_dir) and status.json (run_id, run_dir) at where it now is."""
    rd = RunDir(Path(run_dir))
    config = rd.load_config()
    if config.output_dir:
        rd.write_config(config.replace(output_dir=str(rd.path)))
    status = rd.read_status()
    if status:
        rd.write_status({**status, "run_id": rd.name, "run_dir": str(rd.path)})


def samples_at(run_dir: Path, step: int) -> list[dict[str, str]]:
    """The sample answers the run recorded at `step` ([{prompt, answer}]); [] when none."""
    for event in RunDir(Path(run_dir)).read_events(("samples",)):
        if event.get("step") == step:
            return list(event["samples"])
    return []


def events_of(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    """The run's events of one type, in order."""
    return RunDir(Path(run_dir)).read_events((kind,))


def status_of(run_dir: Path) -> dict[str, Any]:
    """status.json of a run."""
    return json.loads((Path(run_dir) / "status.json").read_text(encoding="utf-8"))
