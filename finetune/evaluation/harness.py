"""EleutherAI's lm-evaluation-harness, through its Python API, on a run's model as it is loaded for chat (the base
plus the adapter, 4-bit for QLoRA): `lm_eval.simple_evaluate` with an `HFLM` wrapping that model.

Tasks are lm-eval's own, the bundled ones (finetune/bundled/lm-eval: `pirate_quiz`, offline) and any defined in
`--include-path DIR` (lm-eval's `TaskManager(include_path=...)`; offline a local task reads its rows through
`dataset_path: json` and `dataset_kwargs.data_files`). Refused in one line before any model loads: an unknown task, an
include path that is not a folder, and a task that needs the network (its data is on the Hub) on a machine that is
offline.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.errors import UserError
from finetune.paths import BUNDLED

BUNDLED_TASKS = BUNDLED / "lm-eval"
BUNDLED_TASK = "pirate_quiz"
# `datasets` builders that read local files: a task using one of them (or a local folder) needs no network.
LOCAL_BUILDERS = frozenset({"json", "csv", "parquet", "text", "arrow", "pandas"})
BATCH_SIZE = 8


@dataclass
class Tasks:
    """Checked task names and the task manager that knows them."""

    names: list[str]
    manager: Any


def check_tasks(names: list[str], include_path: str = "") -> Tasks:
    """The tasks, checked before any model loads (one-line UserError naming `lm_eval` or `include_path`)."""
    names = [name.strip() for name in names if name.strip()]
    if not names:
        raise UserError("lm_eval: name at least one task, e.g. pirate_quiz", field="lm_eval")
    paths = [BUNDLED_TASKS]
    if include_path:
        folder = Path(include_path).expanduser()
        if not folder.is_dir():
            raise UserError(f"include_path: {include_path} is not a folder of lm-eval task files", "include_path")
        paths.append(folder)
    manager = _manager(paths, defaults=False)
    if any(name not in manager.all_tasks for name in names):
        manager = _manager(paths, defaults=True)  # lm-eval's own tasks too (indexing them takes ~10 s)
    for name in names:
        if name not in manager.all_tasks:
            raise UserError(
                f"lm_eval: unknown task {name!r}; give a task lm-eval knows (hellaswag, arc_easy, ...), the bundled "
                f"{BUNDLED_TASK}, or one defined in a folder given with --include-path",
                field="lm_eval",
            )
    _check_offline(manager, names)
    return Tasks(names, manager)


_MANAGERS: dict[tuple, Any] = {}  # task managers of the bundled tasks (with lm-eval's own): indexed once


def _manager(paths: list[Path], defaults: bool) -> Any:
    """lm-eval's TaskManager over `paths` (and its own tasks with `defaults`); kept when it covers only the bundled
    tasks, which never change, and indexed afresh for a user's folder, whose files may have."""
    _quiet()
    from lm_eval.tasks import TaskManager

    key = (defaults,)
    if len(paths) == 1 and key in _MANAGERS:
        return _MANAGERS[key]
    manager = TaskManager(include_path=[str(p) for p in paths], include_defaults=defaults)
    if len(paths) == 1:
        _MANAGERS[key] = manager
    return manager


def _check_offline(manager: Any, names: list[str]) -> None:
    """Refuse a task whose data is on the Hub when this machine cannot reach it."""
    from finetune.model import catalogue

    for name in names:
        remote = next(iter(_hub_datasets(manager, name, set())), None)
        if remote is not None and not catalogue.hub_reachable():
            raise UserError(
                f"lm_eval: task {name!r} downloads its data from the Hub ({remote}) and this machine is offline; run "
                "it with network access, or define a local task (dataset_path: json) in a folder given with "
                "--include-path",
                field="lm_eval",
            )


def _hub_datasets(manager: Any, name: str, seen: set[str]) -> list[str]:
    """The Hub datasets a task, group or tag reads (local builders and folders left out)."""
    if name in seen:
        return []
    seen.add(name)
    entry = manager.task_index.get(name)
    if entry is None:
        return []
    cfg = entry.cfg or {}
    kind = entry.kind.name
    if kind == "GROUP":
        members = [t for t in cfg.get("task", []) if isinstance(t, str)]
        return [d for member in members for d in _hub_datasets(manager, member, seen)]
    if kind == "TAG":
        members = [n for n, e in manager.task_index.items() if name in e.tags and n != name]
        return [d for member in members for d in _hub_datasets(manager, member, seen)]
    path = cfg.get("dataset_path")
    if not isinstance(path, str) or path in LOCAL_BUILDERS or Path(path).expanduser().exists():
        return []
    return [path]


def run_tasks(
    model: Any, tokenizer: Any, tasks: Tasks, num_fewshot: int | None = None, limit: int | None = None
) -> dict[str, dict]:
    """{task: {metric: value}} of `model` on the tasks (stderr figures as METRIC_stderr); `limit`: at most that many
    examples of each task."""
    _quiet()
    import lm_eval

    wrapped = _quiet_lm()(pretrained=model, tokenizer=tokenizer, batch_size=BATCH_SIZE)
    try:
        out = lm_eval.simple_evaluate(
            model=wrapped,
            tasks=tasks.names,
            num_fewshot=num_fewshot,
            limit=limit,
            task_manager=tasks.manager,
            log_samples=False,
            bootstrap_iters=0,
            verbosity="ERROR",
        )
    except (ConnectionError, OSError) as exc:  # a task's data or code not reachable
        raise UserError(f"lm_eval: a task's data could not be loaded ({_first_line(exc)})", field="lm_eval") from None
    return {task: _metrics(values) for task, values in (out or {}).get("results", {}).items()}


def _quiet_lm() -> Any:
    """lm-eval's `HFLM` without its per-request progress bars (the evaluation's own progress says what runs)."""
    from lm_eval.models.huggingface import HFLM

    class QuietHFLM(HFLM):
        def loglikelihood(self, requests: Any, disable_tqdm: bool = False) -> Any:
            return super().loglikelihood(requests, disable_tqdm=True)

        def loglikelihood_rolling(self, requests: Any, disable_tqdm: bool = False) -> Any:
            return super().loglikelihood_rolling(requests, disable_tqdm=True)

        def generate_until(self, requests: Any, disable_tqdm: bool = False) -> Any:
            return super().generate_until(requests, disable_tqdm=True)

    return QuietHFLM


def _metrics(values: dict[str, Any]) -> dict[str, float]:
    """lm-eval's "acc,none": 0.5 / "acc_stderr,none": 0.1 as {"acc": 0.5, "acc_stderr": 0.1} (numbers only)."""
    out = {}
    for key, value in values.items():
        name = key.split(",", 1)[0]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and name not in ("alias", "sample_len"):
            out[name] = float(value)
    return out


def _quiet() -> None:
    """lm-eval logs every request at INFO; keep its warnings only where the CLI asks for quiet libraries."""
    if os.environ.get("TRANSFORMERS_VERBOSITY") == "error":
        for name in ("lm_eval", "lm-eval"):
            logging.getLogger(name).setLevel(logging.ERROR)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:200]
