"""The web UI without a browser: build the Blocks (never launched) and call the tab handlers directly.

Handlers return gradio update dicts (`{"__type__": "update", "value": ..., "visible": ...}`) or plain values; the
tests read those. Everything behind the handlers is real: the memory estimator, training runs of a tiny model, chat
with a really trained tiny run (tests/run_fixtures.py), and publishing to the stand-in Hub (tests/hub_standin.py).
A run that must still be going when a test acts on it is held at a step by `RunGate` (tests/test_ui_support.py);
faults that cannot be produced for real on a CPU (out of memory, a generation that crashes mid-reply) are injected
at the one place they would arise.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gradio as gr
import pytest

from finetune.config import FIELD_NAMES, TrainConfig, field_groups, field_label
from finetune.plan import plan_for
from finetune.runs.manager import DeviceLock
from finetune.runs.rundir import RunDir
from finetune.studio import Studio
from tests.helpers import assert_resumed_exactly, events_size
from tests.run_fixtures import build_run, samples_at
from tests.test_ui_support import (
    BAD_TOKEN,
    GOOD_TOKEN,
    RunGate,
    greedy_reply,
    human,
    pushed_files_hold_no_secret,
    standin_hub,
    wait_run_ended,
)
from ui.app import TAB_NAMES, build_app, follow_running, running_notice
from ui.chat_tab import EMPTY, ERROR_PREFIX, LOADING
from ui.config_tab import ConfigTab, make_field, parse_number
from ui.formatting import run_title
from ui.memory_tab import MEMORY_FIELDS, OWN

ROOT = Path(__file__).resolve().parents[1]
GIB, MIB = 2**30, 2**20
PROMPT = "Question 7?"  # shaped like the tiny runs' training prompts: the tuned model answers like a pirate


# ----------------------------------------------------------------------------------------------- helpers
@pytest.fixture()
def studio(studio_home):
    return Studio(studio_home / "runs")


@pytest.fixture()
def demo(studio):
    return build_app(studio)


@pytest.fixture()
def ui(demo):
    return demo.studio_ui


@pytest.fixture()
def trained_run(studio, tiny_model_dir) -> Path:
    """A really trained tiny LoRA run (10 steps, evaluated at 5 and 10) named run-a in the studio's runs folder."""
    return build_run(studio.manager.root / "run-a", tiny_model_dir)


@pytest.fixture()
def gate(monkeypatch, studio):
    """Hold or fail this studio's runs at a step; whatever the test did, the run is ended afterwards."""
    gate = RunGate().install(monkeypatch, studio.manager.root)
    yield gate
    studio.stop()
    gate.release()
    studio.manager.wait(timeout=120)


@pytest.fixture()
def hub(monkeypatch):
    with standin_hub(monkeypatch) as standin:
        yield standin


def form(**changes: Any) -> dict[str, Any]:
    """The Configure form's values (defaults + changes) by field name, as the page sends them to a handler."""
    return {**Studio.default_values(), **changes}


def memory_form(**changes: Any) -> dict[str, Any]:
    """The Memory tab's own fields (defaults + changes), under the names its handlers receive them."""
    values = {**Studio.default_values(), **changes}
    return {OWN + n: values[n] for n in MEMORY_FIELDS}


def on_page(ui, out: dict) -> dict[str, Any]:
    """A Train handler's {component: update} as {attribute name: update} (what changed on the page)."""
    names = {id(getattr(ui.train, n)): n for n in vars(ui.train) if hasattr(getattr(ui.train, n), "_id")}
    return {names[id(c)]: v for c, v in out.items() if id(c) in names}


def by_field(ui, out: dict) -> dict[str, str]:
    """The visible field errors among a handler's {component: update}."""
    errors = {id(c): n for n, c in ui.config.errors.items()}
    return {errors[id(c)]: u["value"] for c, u in out.items() if id(c) in errors and u.get("visible")}


def errors_by_field(updates: list) -> dict[str, str]:
    """The visible field errors from a list of `ConfigTab.error_outputs` updates."""
    return {n: u["value"] for n, u in zip(FIELD_NAMES, updates, strict=False) if u.get("visible")}


def summary_of(updates: list) -> str:
    return updates[-1]


def tiny_data(folder: Path, n: int = 24) -> Path:
    path = folder / "tiny.jsonl"
    rows = [{"prompt": f"Question {i}?", "completion": "Arr, matey! Yo-ho-ho!"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def tiny_run_form(model_dir: Path, folder: Path, **changes: Any) -> list[Any]:
    """A Configure form that trains the tiny model for a few fast steps."""
    values = {
        "model": str(model_dir),
        "dataset": str(tiny_data(folder)),
        "eval_split": "",
        "max_seq_length": 32,
        "learning_rate": 0.03,
        "warmup_steps": 0,
        **changes,
    }
    return form(**values)


def log_steps(run_dir: Path | str) -> list[int]:
    return [e["step"] for e in RunDir(Path(run_dir)).read_events(("log",))]


def drain(gen) -> list:
    return list(gen)[-1]


def chat(ui, message: str, source: str, *, compare: bool = False, tokens: int = 12, values: list | None = None):
    """Every [textbox, chatbot, base chatbot] the Chat tab streams for one message (greedy, no system prompt)."""
    return list(ui.chat.respond(message, [], [], source, compare, tokens, 0.0, 1.0, "", **(values or form())))


# ----------------------------------------------------------------------------------------------- the page
def test_seven_tabs_named_exactly(ui, demo):
    tabs = [b for b in demo.blocks.values() if isinstance(b, gr.Tab)]
    assert [t.label for t in tabs] == list(TAB_NAMES)
    assert list(TAB_NAMES) == ["Start", "Memory", "Configure", "Train", "Chat", "Evaluate", "Publish"]
    header = next(b for b in demo.blocks.values() if isinstance(b, gr.Markdown) and b.elem_id == "fs-header")
    assert "How it works" in header.value
    assert demo.title == "Finetune Studio"


def _inside(block: Any, container: Any) -> bool:
    while block is not None:
        if block is container:
            return True
        block = block.parent
    return False


def test_every_config_field_has_a_component_with_help_in_configure(ui):
    assert list(ui.config.fields) == list(FIELD_NAMES)  # each field once, in the order API clients send the values
    for name, component in ui.config.fields.items():
        assert _inside(component, ui.tabs["Configure"]), name
        assert component.info and component.info.endswith(f"YAML key: {name}"), f"{name}: no help or key hint"
        assert component.label == field_label(name), name
        group = next(g for g, names in field_groups().items() if name in names)
        assert _inside(component, ui.config.groups[group]), f"{name} not in group {group}"
    assert ui.config.fields["per_device_train_batch_size"].label == "Batch size per device"
    assert list(ui.config.groups) == [
        "Model",
        "Data",
        "Objective",
        "Method",
        "Optimisation",
        "Precision & memory",
        "DeepSpeed",
        "Output",
        "Where it runs",
    ]


def test_events_are_wired_with_stable_api_names(demo):
    names = {d.get("api_name") for d in demo.config["dependencies"]}
    assert {"estimate", "check", "preview_data", "commands", "start", "stop", "resume", "status", "chat"} <= names
    assert {"evaluate", "compare"} <= names


def test_importing_and_building_the_ui_does_not_import_torch(tmp_path):
    code = (
        "import sys, app, ui; from finetune.studio import Studio; ui.build_app(Studio(sys.argv[1]));"
        "heavy = [m for m in ('torch', 'transformers', 'datasets', 'peft') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, check=True, timeout=120)


def test_app_arguments_default_to_localhost_and_honour_spaces_and_auth():
    from app import parse_args

    args = parse_args([], env={})
    assert (args.host, args.port, args.auth, args.runs_root) == ("127.0.0.1", 7860, None, None)
    args = parse_args([], env={"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "7861", "FINETUNE_AUTH": "a:b"})
    assert (args.host, args.port, args.auth) == ("0.0.0.0", 7861, [("a", "b")])
    args = parse_args(["--auth", "ann:s3:cret", "--port", "9000", "--runs-root", "/tmp/r"], env={})
    assert args.auth == [("ann", "s3:cret")] and args.port == 9000 and str(args.runs_root) == "/tmp/r"
    with pytest.raises(SystemExit):
        parse_args(["--auth", "nopassword"], env={})


def test_the_publish_token_field_is_a_password_field(demo, ui):
    """The page gets the token box as a password input (the browser test sees `type="password"` in the DOM)."""
    config = next(c for c in demo.config["components"] if c["id"] == ui.publish.token._id)
    assert config["props"]["elem_id"] == "pub-token" and config["props"]["type"] == "password"


# ----------------------------------------------------------------------------------------------- Configure
def test_check_shows_each_error_beside_its_field_and_opens_its_group(ui):
    updates = ui.config.check(**form(max_steps=-5, lora_r=0, learning_rate="fast"))
    errors = errors_by_field(updates)
    assert set(errors) == {"max_steps", "lora_r", "learning_rate"}
    assert "max_steps" in errors["max_steps"] and "allowed" in errors["max_steps"]
    assert "\n" not in errors["lora_r"] and "Traceback" not in errors["lora_r"]
    groups = dict(zip(ui.config.groups, updates[2 * len(FIELD_NAMES) : -1], strict=True))
    assert groups["Optimisation"].get("open") is True and groups["Method"].get("open") is True
    assert "open" not in groups["Model"]
    assert "3 fields need a change" in summary_of(updates)

    good = ui.config.check(**form())
    assert errors_by_field(good) == {} and "valid" in summary_of(good)
    *quiet, saved = ui.config.check_quiet(**form(lora_r=4))
    assert summary_of(quiet) == "" and saved["lora_r"] == 4  # kept in the browser for a page reload


def test_a_reload_restores_the_settings_kept_in_the_browser(ui):
    out = ui.memory.restore({"lora_r": 4, "dataset": "my.jsonl", "not_a_field": 1})
    config_values = dict(zip(FIELD_NAMES, out[: len(FIELD_NAMES)], strict=True))
    memory_values = dict(zip(MEMORY_FIELDS, out[len(FIELD_NAMES) :], strict=True))
    assert config_values["lora_r"] == 4 and config_values["dataset"] == "my.jsonl"
    assert config_values["model"] == {"__type__": "update"}  # nothing kept: left as it is
    assert memory_values["lora_r"] == 4 and len(out) == len(FIELD_NAMES) + len(MEMORY_FIELDS)
    assert all(v == {"__type__": "update"} for v in ui.memory.restore(None))


def test_contradictory_settings_name_the_field_to_change(ui):
    errors = errors_by_field(ui.config.check(**form(offload_param="cpu", zero_stage=2)))
    assert list(errors) == ["offload_param"] and "zero_stage" in errors["offload_param"]


def test_yaml_download_and_upload_round_trip(ui):
    values = form(lora_r=16, max_steps=7, learning_rate=1e-4, method="full", gradient_checkpointing=True)
    saved = ui.config.save(**values)
    path = Path(saved[0]["value"])
    assert saved[0]["visible"] and path.suffix == ".yaml"
    assert TrainConfig.from_yaml(path.read_text()).lora_r == 16
    loaded = ui.config.load(str(path))
    assert path.name == "run.yaml"  # the name the launch commands use
    assert loaded[: len(FIELD_NAMES)] == [values[n] for n in FIELD_NAMES]
    assert errors_by_field(loaded[len(FIELD_NAMES) :]) == {}
    assert path.name in summary_of(loaded)


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("bad.yaml", "max_steps: [1, 2\n", "not valid YAML"),
        ("typo.yaml", "lora_rank: 8\n", "did you mean 'lora_r'"),
        ("range.yaml", "max_steps: -9\n", "max_steps"),
        ("notes.txt", "max_steps: 3\n", "is not a .yaml / .yml file"),
        ("big.yaml", "# " + "x" * 300_000 + "\n", "larger than"),
        ("binary.yaml", b"\xff\xfe\x00garbage", "not UTF-8"),
    ],
)
def test_a_bad_yaml_upload_changes_nothing_and_says_why(ui, tmp_path, name, content, expected):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = ui.config.load(str(path))
    assert all(u == {"__type__": "update"} for u in out[: len(FIELD_NAMES)])
    shown = " ".join(errors_by_field(out[len(FIELD_NAMES) :]).values()) + summary_of(out[len(FIELD_NAMES) :])
    assert expected in shown


def test_data_upload_is_type_and_size_checked_and_kept_under_the_studio_home(ui, studio_home, tmp_path, monkeypatch):
    data = tiny_data(tmp_path)
    dataset, error, note = ui.config.use_data_file(str(data))
    assert dataset == "upload:tiny.jsonl"  # the file's name, never a server path
    kept = ui.studio.uploads.resolve(ui.studio.identity, dataset)
    assert kept.parent.parent == studio_home / "uploads" and kept.read_text() == data.read_text()
    assert not error["visible"] and "tiny.jsonl" in note

    exe = tmp_path / "payload.exe"
    exe.write_bytes(b"MZ")
    dataset, error, _ = ui.config.use_data_file(str(exe))
    assert dataset == {"__type__": "update"} and "not a .jsonl" in error["value"]

    from finetune.access.uploads import MB, UploadLimits

    monkeypatch.setattr(ui.studio.uploads, "limits", UploadLimits(file_mb=10 / MB))
    _, error, _ = ui.config.use_data_file(str(data))
    assert "more than the 10 bytes allowed per file" in error["value"]


def test_data_preview_shows_trained_and_masked_text(ui, tiny_model_dir, tmp_path):
    html, *updates = ui.config.show_preview(**form(model=str(tiny_model_dir), dataset=str(tiny_data(tmp_path))))
    assert errors_by_field(updates) == {}
    assert "24</b> training rows" in html and "fs-trained" in html and "fs-masked" in html
    assert "Arr, matey! Yo-ho-ho!" in html and "tokens" in html


def test_data_preview_of_a_missing_file_is_an_error_beside_dataset(ui, tiny_model_dir, tmp_path):
    html, *updates = ui.config.show_preview(**form(model=str(tiny_model_dir), dataset=str(tmp_path / "none.jsonl")))
    assert html == "" and "file not found" in errors_by_field(updates)["dataset"]


def test_show_command_lists_each_launcher(ui, studio, monkeypatch):
    monkeypatch.setattr(studio, "commands", lambda values, **kw: {"single": "python -m finetune train", "x": "y"})
    code, *updates = ui.config.show_commands(2, 1, **form())
    assert code["visible"] and "run.yaml" in code["value"]
    assert "# one GPU (or the CPU)\npython -m finetune train" in code["value"] and "# x\ny" in code["value"]
    code, *updates = ui.config.show_commands(2, 1, **form(max_steps=0))
    assert not code["visible"] and "max_steps" in errors_by_field(updates)


def test_show_command_with_the_real_launcher(ui):
    code, *updates = ui.config.show_commands(2, 1, **form(zero_stage=2))
    assert code["visible"] and "torchrun" in code["value"] and "--config run.yaml" in code["value"]
    assert errors_by_field(updates) == {}


def test_fields_that_do_not_apply_are_hidden_and_their_values_kept(ui, demo):
    def shown(**changes: Any) -> set[str]:
        return {n for n, u in zip(FIELD_NAMES, ui.config.visibility(**form(**changes)), strict=True) if u["visible"]}

    lora = shown()
    assert {"lora_r", "use_dora", "max_steps"} <= lora
    assert not {"quant_type", "beta", "loss_type", "chosen_column", "offload_param", "num_labels"} & lora
    assert "lora_r" not in shown(method="full") and {"quant_type", "double_quant"} <= shown(method="qlora")
    assert {"beta", "loss_type", "chosen_column", "rejected_column"} <= shown(objective="dpo")
    kto = shown(objective="kto")
    assert "beta" in kto and "label_column" in kto and not {"loss_type", "chosen_column"} & kto
    assert {"offload_optimizer", "offload_param"} <= shown(zero_stage=2)
    assert {"num_labels", "text_pair_column", "label_column"} <= shown(task="sequence_classification")
    # A change of task, method, goal or ZeRO stage (typed, uploaded, reset, applied) re-decides every cell.
    cells = sorted(c._id for c in ui.config.cells.values())
    for name in ("task", "method", "objective", "zero_stage"):
        deps = [
            d
            for d in demo.config["dependencies"]
            if d["targets"] and list(d["targets"][0]) == [ui.config.fields[name]._id, "change"]
        ]
        assert any(sorted(d["outputs"]) == cells for d in deps), name
    # Hidden, never lost: a hidden field still reaches the backend, and its error opens its cell.
    updates = ui.config.check(**form(method="full", lora_r=0))
    assert "lora_r" in errors_by_field(updates)
    cell_updates = dict(zip(FIELD_NAMES, updates[len(FIELD_NAMES) : 2 * len(FIELD_NAMES)], strict=True))
    assert cell_updates["lora_r"] == {"__type__": "update", "visible": True}


def test_an_emptied_number_field_says_which_and_what_to_do(ui):
    errors = errors_by_field(ui.config.check(**form(learning_rate=None, max_steps=None)))
    assert errors == {
        "learning_rate": "⚠ Learning rate: empty; give a number",
        "max_steps": "⚠ Training steps: empty; give a number",
    }


def test_check_verifies_the_data_as_start_does_and_drops_a_stale_answer(ui, tmp_path, tiny_model_dir):
    """Check reads the data file as Start would; its answer is shown only while the form still holds the values it
    was computed for (a slow answer for an older value is dropped, and says so)."""
    missing = form(model=str(tiny_model_dir), dataset=str(tmp_path / "gone.jsonl"))
    errors = errors_by_field(ui.config.check(**missing))
    assert list(errors) == ["dataset"] and "file not found" in errors["dataset"]

    answer, stamp = ui.config.verify(**missing)
    late = ui.config.show_verified(answer, stamp, **form())  # the user picked other data meanwhile
    assert late[:-1] == [{"__type__": "update"}] * (len(late) - 1)
    assert late[-1].startswith("The settings changed while this was running")
    assert "dataset" in errors_by_field(ui.config.show_verified(answer, stamp, **missing))
    html, *updates = ui.config.show_preview_answer(*ui.config.make_preview(**missing), **form())
    assert "press <b>Preview data</b> again" in html and updates == [{"__type__": "update"}] * len(updates)


def test_slow_actions_say_they_are_pending_first(demo, ui):
    """Check, Preview and Show command each answer at once with a pending line (before any backend call)."""
    deps = demo.config["dependencies"]
    for button, shown in ((ui.config.check_btn, ui.config.summary), (ui.config.preview_btn, ui.config.preview)):
        first = next(d for d in deps if d["targets"] and list(d["targets"][0]) == [button._id, "click"])
        assert first["outputs"] == [shown._id] and first["queue"] is False and first["inputs"] == []
        pending = demo.fns[first["id"]].fn()
        assert pending.lstrip("<p>").startswith("⏳")


def test_show_command_lists_each_case_once_with_relative_paths(ui, studio):
    code, *updates = ui.config.show_commands(4, 2, **form())
    text = code["value"]
    commands = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(commands) == len(set(commands)) >= 3  # without DeepSpeed, torchrun's multi-node command once
    assert "--nproc_per_node 4" in text and "--nnodes 2" in text and "2 GPUs" not in text
    assert str(studio.manager.root) not in text and "output_dir=runs/" in text
    code, *_ = ui.config.show_commands(2, 1, **form())
    assert "--nnodes" not in code["value"]
    _, *updates = ui.config.show_commands(0, 1, **form())
    assert "GPUs per machine" in summary_of(updates)


def test_reset_restores_the_defaults(ui):
    out = ui.config.reset()
    assert out[: len(FIELD_NAMES)] == list(form().values())


def test_config_tab_outputs_line_up(ui):
    """Each handler returns exactly one value per output it is wired to."""
    tab: ConfigTab = ui.config
    assert len(tab.error_outputs) == len(tab.problem_updates({})) == 2 * len(FIELD_NAMES) + len(tab.groups) + 1
    assert len(tab.reset()) == len(FIELD_NAMES) + len(tab.error_outputs)
    assert len(tab.show_commands(2, 1, **form(max_steps=0))) == 1 + len(tab.error_outputs)


# ----------------------------------------------------------------------------------------------- Memory
def _estimate_for(changes: dict[str, Any], **kwargs: Any):
    """The estimator's own answer for these settings (what the Memory tab must show)."""
    from finetune import memory

    config = TrainConfig.from_dict({**Studio.default_values(), **changes})
    plan = plan_for(config, kwargs.pop("device", "cuda"), kwargs.pop("gpus", 1))
    return memory.estimate(plan, **kwargs)


def test_memory_estimate_shows_the_estimators_verdict_breakdown_and_ranked_advice(ui, tiny_model_dir):
    """The real estimator on the tiny model, with a GPU that holds it but leaves 16 MiB less than the headroom a fit
    keeps (1 GiB): "tight"; the verdict, breakdown and advice are the estimator's; the tab's own fields win over the
    Configure form's; Apply makes the next estimate fit with headroom."""
    mine = {
        "model": str(tiny_model_dir),
        "max_seq_length": 512,
        "packing": False,  # padded rows of 512 tokens: activations worth advice (packed, the short data needs little)
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
    }
    full = _estimate_for(mine, device="cuda")
    gib = (full.total_bytes + GIB - 16 * MIB) / GIB
    expected = _estimate_for(mine, device="cuda", gpu_gib=gib)
    assert expected.verdict == "tight" and expected.advice, "the tiny config no longer needs advice: adjust the test"

    # The form says 64 tokens; the Memory tab's 512 must be what is estimated.
    out = ui.memory.estimate(
        "GPU", "custom", gib, 1, **memory_form(**mine), **form(model=str(tiny_model_dir), max_seq_length=64)
    )
    verdict, chart, table, comparisons, advice, pick, apply_btn, state, *errors = out
    assert "Tight on a custom GPU" in verdict and "a fit keeps at least 1.00 GiB free" in verdict
    assert f"Needs about **{human(expected.total_bytes)}**" in verdict
    assert f"only {human(expected.headroom_bytes)} to spare" in verdict
    shown = {n.replace("_", " "): v for n, v in expected.components.items() if v}
    names = sorted(shown, key=lambda n: -shown[n]) + [f"{n.replace('_', ' ')} (overhead)" for n in expected.overheads]
    assert list(table["value"]["Component"]) == names and table["visible"]
    assert table["value"].iloc[0, 1] == human(max(shown.values()))
    assert list(chart["value"]["component"]) == names
    assert "rule of thumb" in comparisons
    assert list(advice["value"]["Suggestion"]) == [a.title for a in expected.advice] and advice["visible"]
    assert pick["choices"] == [(f"{i}. {a.title}", i - 1) for i, a in enumerate(expected.advice, start=1)]
    assert apply_btn["visible"] and state == [a.changes for a in expected.advice]
    assert not any(e["visible"] for e in errors)

    # Apply the first suggestion: the shared form gets it, nothing else is lost, and the estimate now fits.
    applied = ui.memory.apply(0, state, **memory_form(**mine), **form(model=str(tiny_model_dir), learning_rate=0.001))
    config_values = dict(zip(FIELD_NAMES, applied[: len(FIELD_NAMES)], strict=True))
    memory_values = dict(zip(MEMORY_FIELDS, applied[len(FIELD_NAMES) : -1], strict=True))
    for name, value in expected.advice[0].changes.items():
        assert config_values[name] == value and memory_values.get(name, value) == value, name
    assert (
        config_values["learning_rate"] == 0.001 and config_values["max_seq_length"] == memory_values["max_seq_length"]
    )
    assert applied[-1].startswith("✓ Applied")
    again = ui.memory.estimate(
        "GPU", "custom", gib, 1, **{OWN + n: v for n, v in memory_values.items()}, **config_values
    )
    assert again[0].startswith("### ✓ Fits on a custom GPU"), again[0]
    assert ui.memory.apply(None, [], **memory_form(), **form())[-1] == "Nothing applied."


def test_memory_estimate_on_the_cpu_on_several_gpus_and_on_a_named_card(ui, tiny_model_dir):
    mine = {"model": str(tiny_model_dir), "max_seq_length": 128}
    values = {**memory_form(**mine), **form(**mine)}

    verdict = ui.memory.estimate("CPU", "custom", None, 1, **values)[0]
    assert verdict == f"### Estimated peak: about **{human(_estimate_for(mine, device='cpu').total_bytes)}**"

    four = _estimate_for(mine, device="cuda", gpus=4, gpu_gib=80.0)
    verdict = ui.memory.estimate("GPU", "custom", 80, 4, **values)[0]
    assert "Fits on a custom GPU · 80 GiB × 4 GPUs" in verdict
    assert f"about **{human(four.total_bytes)}** per GPU" in verdict

    card = "A10G (24 GB)"
    capacity = ui.memory.cards()[card]
    on_card = _estimate_for(mine, device="cuda", gpu_gib=capacity)
    verdict = ui.memory.estimate("GPU", card, None, 1, **values)[0]
    assert f"Fits on {card} · {capacity:g} GiB" in verdict and f"{human(on_card.headroom_bytes)} to spare" in verdict

    verdict = ui.memory.estimate("GPU", "custom", None, 1, **values)[0]
    assert verdict.startswith("⚠ custom GPU memory")


def test_memory_field_errors_appear_beside_the_memory_field(ui):
    out = ui.memory.estimate("GPU", "custom", 24, 1, **memory_form(per_device_train_batch_size=0), **form())
    errors = dict(zip(MEMORY_FIELDS, out[8:], strict=True))
    assert errors["per_device_train_batch_size"]["visible"]
    assert "per_device_train_batch_size" in errors["per_device_train_batch_size"]["value"]
    # A problem in a field this tab does not show is named in the verdict.
    out = ui.memory.estimate("GPU", "custom", 24, 1, **memory_form(), **form(max_steps=0))
    assert "max_steps" in out[0] and "Configure" in out[0]


def test_a_memory_edit_says_it_changes_the_next_run(demo, ui):
    note = ui.memory.edited("per_device_train_batch_size", 8)
    assert note.startswith("✎ Batch size per device is now **8** for the next run too")
    applied = ui.memory.applied._id
    for name in MEMORY_FIELDS:  # every Memory field's edit writes that note
        mem = ui.memory.fields[name]._id
        assert any(d["inputs"] == [mem] and d["outputs"] == [applied] for d in demo.config["dependencies"]), name


def test_memory_fields_mirror_configure_in_the_browser(demo, ui):
    """Each Memory field and its Configure twin copy user edits to each other."""
    deps = demo.config["dependencies"]
    for name in MEMORY_FIELDS:
        mem, cfg = ui.memory.fields[name]._id, ui.config.fields[name]._id
        assert any(d["inputs"] == [mem] and d["outputs"] == [cfg] for d in deps), name
        assert any(d["inputs"] == [cfg] and d["outputs"] == [mem] for d in deps), name


# ----------------------------------------------------------------------------------------------- Start
def test_each_start_goal_sets_what_propose_goal_sets_by_the_one_function(ui, monkeypatch):
    """A goal chosen on the Start tab writes into the form exactly what `propose --goal` and /propose set: the
    registry's `goal_settings` (task, objective, what suits the goal), asked once per choice. A value the user set is
    kept, and orpo chosen in Configure stays when the goal is preferences."""
    from finetune import objectives

    asked: list[tuple[str, list[str]]] = []
    real = objectives.goal_settings

    def spy(goal: str, given: Any = ()) -> dict[str, Any]:
        asked.append((goal, list(given)))
        return real(goal, given)

    monkeypatch.setattr(objectives, "goal_settings", spy)
    tab, fields = ui.start, ui.start.config.fields
    defaults = ui.studio.default_values()
    for goal in objectives.GOALS:
        page = {fields[n]: v for n, v in defaults.items()}
        page.update({tab.model: defaults["model"], tab.data: defaults["dataset"], tab.goal: goal, tab.hardware: "cpu"})
        answer = tab.choose(page)
        expected = real(goal)
        assert {n: answer[fields[n]] for n in expected} == expected, goal
        assert asked[-1:] == [(goal, [])], asked
    assert len(asked) == len(objectives.GOALS)

    page.update({tab.goal: "grpo", fields["max_completion_length"]: 64})  # typed by the user before the goal
    answer = tab.choose(page)
    assert answer[fields["objective"]] == "grpo" and answer[fields["rewards"]] == "number_match"
    assert fields["max_completion_length"] not in answer and asked[-1:] == [("grpo", ["max_completion_length"])]
    page.update({tab.goal: "dpo", fields["objective"]: "orpo"})
    answer = tab.choose(page)
    assert (answer[fields["task"]], answer[fields["objective"]]) == ("causal_lm", "orpo")


# ----------------------------------------------------------------------------------------------- Train
def test_start_with_a_bad_value_starts_nothing_and_points_at_the_field(ui, studio):
    out = ui.train.start(None, **form(max_steps=-3))
    message = on_page(ui, out)["message"]
    assert message.startswith("⚠ Not started: max_steps") and "Configure" in message
    assert "max_steps" in by_field(ui, out) and "viewing" not in on_page(ui, out)
    assert studio.state() is None and studio.runs() == []


def test_start_while_another_process_trains_says_who_and_since_when(ui, studio, tiny_model_dir, tmp_path, gate):
    """Another process (a command-line run) holds the device lock: Start names its run, owner and start time."""
    started = time.time()
    other = DeviceLock(studio.manager.root)
    other.acquire({"run_id": "run-x", "owner": "ann", "started_at": started, "pid": 1})
    try:
        out = on_page(ui, ui.train.start(None, **tiny_run_form(tiny_model_dir, tmp_path)))
    finally:
        other.release()
    message = out["message"]
    assert message.startswith("⚠ busy: run run-x started by ann at ")
    assert time.strftime("%H:%M:%S", time.localtime(started)) in message
    assert "viewing" not in out
    assert studio.state() is None and studio.runs() == []  # nothing started, no run folder


def test_a_past_run_shows_its_progress_loss_curve_and_answers(ui, studio, trained_run):
    events = RunDir(trained_run).read_events()
    losses = [e["loss"] for e in events if e["type"] == "log"]
    evals = [e["eval_loss"] for e in events if e["type"] == "eval"]
    page = on_page(ui, ui.train.attach())
    viewing, shown, progress, problem, plot = (page[n] for n in ("viewing", "shown", "progress", "problem", "plot"))
    samples, log, runs, pick = page["samples"], page["log"], page["runs_table"], page["run_pick"]
    assert viewing == "run-a"
    assert 'data-status="completed"' in progress and "step <b>10</b> / 10" in progress
    assert problem == ""
    assert list(plot[plot.series == "train"].loss) == losses and len(losses) == 10
    assert list(plot[plot.series == "eval"].loss) == evals and len(evals) == 2
    assert list(samples.columns) == ["Held-out prompt", "Answer before training (step 0)", "Answer at step 10"]
    before, after = samples_at(trained_run, 0)[0], samples_at(trained_run, 10)[0]
    assert list(samples.iloc[0]) == [before["prompt"], before["answer"], after["answer"]]
    assert samples.iloc[0, 1] != samples.iloc[0, 2]  # the tuning shows in the answers
    assert "step 10 · loss" in log and "eval loss" in log and "status → completed" in log
    assert list(runs.iloc[0])[1:3] == ["Finished", "10 / 10"] and list(runs.iloc[0])[-2:] == ["", "run-a"]
    model = Path(RunDir(trained_run).load_config().model).name
    assert runs.iloc[0, 0].startswith(f"{model} · LoRA · ")  # a readable name: model · method · date
    assert pick["value"] == "run-a" and page["start_btn"]["interactive"] and not page["stop_btn"]["interactive"]
    assert not page["resume_btn"]["interactive"]  # a completed run cannot resume

    again = on_page(ui, ui.train.tick(viewing, shown))
    assert set(again) == {"viewing", "shown"}  # nothing changed: nothing redrawn


def test_the_train_tab_says_what_start_will_run(ui, tiny_model_dir, tmp_path):
    text, stamp = ui.train.describe(**tiny_run_form(tiny_model_dir, tmp_path, lora_r=4, max_steps=7))
    assert f"`{tiny_model_dir}`" in text and "tiny.jsonl" in text and "LoRA, supervised fine-tuning (SFT)" in text
    assert "**7 steps** of 4 examples each" in text and "up to 32 tokens" in text
    assert "at the peak" in text and "LoRA rank = 4" in text and "Training steps = 7" in text
    assert ui.train.show_plan(text, stamp, **tiny_run_form(tiny_model_dir, tmp_path, lora_r=4, max_steps=7)) == text
    assert ui.train.show_plan(text, stamp, **form()) == {"__type__": "update"}  # the form changed: dropped
    text, _ = ui.train.describe(**form(max_steps=0))
    assert text.startswith("⚠ Start would refuse these settings: max_steps")


def log_preference_steps(run_dir: Path) -> None:
    """Two more logged steps carrying what a preference trainer logs beside the loss (rewards, KL)."""
    with (run_dir / "events.jsonl").open("a", encoding="utf-8") as log:
        for step, margin in ((11, 0.25), (12, 0.5)):
            event = {"type": "log", "step": step, "loss": 0.6, "rewards_chosen": 0.1, "rewards_rejected": -0.4}
            event.update({"rewards_margin": margin, "rewards_accuracy": 0.75, "kl": 0.02, "time": time.time()})
            log.write(json.dumps(event) + "\n")


def test_preference_metrics_are_shown_beside_the_loss(ui, trained_run):
    """A preference run (its plan.json's record says so) logs rewards and KL: the page shows the latest as numbers
    and a second plot, titled by the record."""
    rd = RunDir(trained_run)
    config = rd.load_config().replace(objective="dpo")
    rd.write_config(config)
    rd.write_plan(plan_for(config))
    log_preference_steps(trained_run)
    page = on_page(ui, ui.train.select("run-a"))
    assert "reward margin <b>0.5</b>" in page["prefs"] and "chosen preferred <b>75%</b>" in page["prefs"]
    assert "KL <b>0.02</b>" in page["prefs"] and 'data-step="12"' in page["prefs"]
    plot = page["prefs_plot"]
    assert plot["visible"] and list(plot["value"][plot["value"].series == "reward margin"].value) == [0.25, 0.5]
    assert plot["title"] == "Preference: reward margin (chosen − rejected) and KL"
    assert "margin 0.5" in page["log"]
    assert " · DPO · " in run_title(ui.studio.run("run-a"))


def test_a_sft_run_shows_no_preference_plot_whatever_its_log_carries(ui, trained_run):
    """The objective is the run's record, never guessed from its log: a SFT run whose log lines carry reward-like keys
    shows no preference numbers, plot or log words."""
    log_preference_steps(trained_run)
    page = on_page(ui, ui.train.select("run-a"))
    assert page["prefs"] == "" and page["prefs_plot"]["visible"] is False
    assert "step 12 · loss 0.6" in page["log"] and "margin" not in page["log"]


def test_resume_of_a_completed_run_is_refused_in_one_line(ui, studio, trained_run):
    out = on_page(ui, ui.train.resume(None, "run-a"))
    assert out["message"].startswith("⚠ resume:") and "already completed" in out["message"]
    assert "\n" not in out["message"] and "viewing" not in out and studio.state() is None
    assert on_page(ui, ui.train.resume(None, None))["message"].startswith("Pick a run")


def test_stop_then_resume_continues_from_the_checkpoint(ui, studio, tiny_model_dir, tmp_path, gate):
    """A run held at step 3 is really going: the page follows it, Start is refused as busy, Chat offers its latest
    checkpoint. Stop saves checkpoint-3; Resume trains steps 4-6 only (each step is logged once)."""
    gate.hold_at = 3
    values = tiny_run_form(tiny_model_dir, tmp_path, max_steps=6, save_steps=2)
    started = on_page(ui, ui.train.start(None, **values))
    run_id = started["viewing"]
    assert started["message"].startswith(f"▶ Started run `{run_id}`") and started["shown"] is None
    gate.wait_held()
    run_dir = studio.manager.root / run_id

    page = on_page(ui, ui.train.attach())  # a page opened (or reloaded) now follows the run
    assert page["viewing"] == run_id and 'data-status="running"' in page["progress"]
    row, notice = running_notice(studio)  # ... and says so on Start, where it opens, with the way to it
    assert row["visible"] and f"A run is training: **{run_title(studio.run(run_id))}** (step 3 of 6)" in notice
    assert follow_running(studio)[1] == run_id
    assert 'data-step="3"' in page["progress"]
    assert list(page["runs_table"].iloc[0])[1:3] == ["Training", "3 / 6"]  # the live step, not the status file's
    assert not page["resume_btn"]["interactive"] and page["stop_btn"]["interactive"]
    busy = on_page(ui, ui.train.start(None, **values))["message"]
    assert busy.startswith(f"⚠ busy: run {run_id} started by the web app")
    assert dict((v, k) for k, v in studio.chat_sources())[run_id] == f"{run_id} (checkpoint 2, running)"
    _, history, _ = chat(ui, PROMPT, run_id, tokens=8)[-1]
    assert history[-1]["content"] == greedy_reply(tiny_model_dir, run_dir / "checkpoint-2", PROMPT, 8)

    assert ui.train.stop().startswith("■ Stopping")
    gate.release()
    assert wait_run_ended(studio).status == "stopped"
    page = on_page(ui, ui.train.select(run_id))
    assert 'data-status="stopped"' in page["progress"] and 'data-step="3"' in page["progress"]
    assert "Run stopped at step 3" in page["problem"] and "Resume" in page["problem"]
    assert page["resume_btn"]["interactive"]
    run = studio.run(run_id)
    assert run.status == "stopped" and run.resumable, run
    assert RunDir(run_dir).last_checkpoint().name == "checkpoint-3"
    assert log_steps(run_dir) == [1, 2, 3]

    mark = events_size(run_dir)
    resumed = on_page(ui, ui.train.resume(None, run_id))
    viewing, shown = resumed["viewing"], resumed["shown"]
    assert resumed["message"] == f"▶ Resuming `{run_id}` from its last checkpoint." and viewing == run_id
    # The page follows the resumed run (as the timer sees it while it trains).
    shown = on_page(ui, ui.train.tick(viewing, shown))["shown"]
    assert wait_run_ended(studio).status == "completed"
    assert log_steps(run_dir) == [1, 2, 3, 4, 5, 6]  # a restart from step 1 would log 1-3 again
    assert_resumed_exactly(run_dir, mark, checkpoint_step=3, max_steps=6)  # read as written, duplicates included
    out = on_page(ui, ui.train.tick(viewing, shown))
    assert 'data-status="completed"' in out["progress"] and "step <b>6</b> / 6" in out["progress"]
    assert len(out["plot"][out["plot"].series == "train"]) == 6
    assert list(out["runs_table"].iloc[0])[1:3] == ["Finished", "6 / 6"]
    assert out["message"] == ""  # "Resuming…" does not outlive the run
    assert not out["resume_btn"]["interactive"]
    assert ui.train.stop() == "Nothing is running."
    assert running_notice(studio)[0]["visible"] is False
    assert dict((v, k) for k, v in studio.chat_sources())[run_id] == f"{run_id} (final)"


def test_a_run_that_runs_out_of_memory_says_why_with_advice_and_resumes(ui, studio, tiny_model_dir, tmp_path, gate):
    """An out-of-memory error at step 2 (injected where torch raises it): the page says so in plain words with the
    estimator's advice, the run keeps checkpoint-1, and Resume finishes it."""
    import torch

    gate.fail_at, gate.fail_with = 2, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    started = on_page(ui, ui.train.start(None, **tiny_run_form(tiny_model_dir, tmp_path, max_steps=3, save_steps=1)))
    run_id = started["viewing"]
    assert started["message"].startswith("▶ Started run")
    assert wait_run_ended(studio).status == "failed"
    page = on_page(ui, ui.train.select(run_id))
    assert 'data-status="failed"' in page["progress"]
    assert page["problem"].startswith("**The run failed.** out of memory at step 2")
    assert "**What to try:** Out of memory. This run needs about " in page["problem"]  # the estimator's advice
    assert "Traceback" not in page["problem"] and "Tried to allocate" not in page["problem"]
    assert studio.run(run_id).resumable

    gate.fail_at = None
    assert on_page(ui, ui.train.resume(None, run_id))["message"].startswith("▶ Resuming")
    assert wait_run_ended(studio).status == "completed"
    assert log_steps(studio.manager.root / run_id) == [1, 2, 3]  # steps 2-3 once, after the checkpoint at 1


def test_data_with_the_wrong_columns_is_refused_at_start_in_plain_words(ui, studio, tiny_model_dir, tmp_path):
    bad = tmp_path / "wrong-columns.jsonl"
    bad.write_text("".join(json.dumps({"foo": i, "bar": "x"}) + "\n" for i in range(8)), encoding="utf-8")
    out = ui.train.start(None, **form(model=str(tiny_model_dir), dataset=str(bad), eval_split=""))
    message = on_page(ui, out)["message"]
    assert message.startswith("⚠ Not started: dataset:") and "foo" in message and "\n" not in message
    assert "Traceback" not in message and "viewing" not in on_page(ui, out)
    assert "dataset" in by_field(ui, out)
    assert studio.state() is None and studio.runs() == []


def test_the_cli_bad_input_table_gets_the_same_one_line_errors_in_the_ui(ui, studio, tiny_model_dir, tmp_path):
    """Every `--set` case of the command line's bad-input table, typed into the form instead: Start refuses it with the
    same message (naming the field), starts nothing, and leaves no run directory."""
    from tests.test_cli import bad_cases

    checked = 0
    for args, expected in bad_cases(tmp_path, tiny_model_dir):
        if args[1] != "--set" or any(a.startswith("max_step=") or a == "lora_r" for a in args):
            continue  # config files, --resume and malformed --set items have no form equivalent
        changes = dict(a.split("=", 1) for a in args[2::2])
        message = on_page(ui, ui.train.start(None, **form(**changes)))["message"]
        assert message.startswith("⚠ Not started"), (changes, message)
        assert expected in message and "Traceback" not in message, (changes, message)
        checked += 1
    assert checked >= 13
    assert studio.state() is None and studio.runs() == []


def test_a_long_run_plot_is_thinned_but_keeps_its_ends():
    from finetune.runs.events import EvalEvent, LogEvent
    from ui.formatting import loss_rows

    events = [LogEvent(step=s, loss=1.0 / s) for s in range(1, 10_001)]
    events += [EvalEvent(step=s, eval_loss=0.5) for s in range(1000, 10_001, 1000)]
    rows = loss_rows(events)
    train = [r for r in rows if r["series"] == "train"]
    assert 500 <= len(train) <= 601 and train[0]["step"] == 1 and train[-1]["step"] == 10_000
    assert len(rows) - len(train) == 10


# ----------------------------------------------------------------------------------------------- Chat
def test_chat_streams_the_runs_greedy_reply_beside_its_base_model(ui, studio, trained_run, tiny_model_dir):
    """Side by side: the tuned column is the run's adapter's greedy reply, the other column the greedy reply of the
    model the run started from (whatever the form's model is now), and the two differ."""
    steps = chat(ui, PROMPT, "run-a", compare=True, values=form(model=str(tiny_model_dir / "not-this-model")))
    assert steps[0][1][-1]["content"] == LOADING  # visible loading state before the first token
    text, history, base_history = steps[-1]
    tuned = greedy_reply(tiny_model_dir, trained_run, PROMPT, 12)
    base = greedy_reply(tiny_model_dir, None, PROMPT, 12)
    assert text == "" and history == [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": tuned}]
    assert base_history == [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": base}]
    assert tuned != base and tuned.startswith("Arr")
    # It streamed: the tuned reply grew through several partial texts, each extending the last.
    grown = [s[1][-1]["content"] for s in steps if s[1][-1]["content"] != LOADING]
    assert len(set(grown)) >= 3 and all(b.startswith(a) for a, b in zip(grown, grown[1:], strict=False))

    _, history, base_history = steps = chat(ui, PROMPT, "base", compare=True, values=form(model=str(tiny_model_dir)))[
        -1
    ]
    assert history[-1]["content"] == base and base_history == []  # base vs base: no second column


def test_side_by_side_both_replies_stream_at_the_same_time(ui, trained_run, monkeypatch):
    """Each model's stream waits for a piece of the other's before its next one: one reply after the other would
    stall here (the wait's deadline fails the stub); both at once, the columns grow in turn."""
    import threading

    from finetune.studio import BASE_OF

    turns = {"run": threading.Event(), "base": threading.Event()}
    base_model = ui.studio._chat_model(BASE_OF + "run-a", None)[0]  # loaded now; the chat gets it from the cache

    def stream_reply(model, tokenizer, messages, settings):
        side = "base" if model is base_model else "run"
        other = "run" if side == "base" else "base"
        text = ""
        for piece in ("Arr", ", matey", "!"):
            text += piece
            turns[side].set()
            yield text
            assert turns[other].wait(timeout=30), f"the {other} reply never started while the {side} one streamed"

    monkeypatch.setattr("finetune.model.inference.stream_reply", stream_reply)
    steps = chat(ui, PROMPT, "run-a", compare=True)
    assert steps[-1][1][-1]["content"] == steps[-1][2][-1]["content"] == "Arr, matey!"
    sides = [(s[1][-1]["content"], s[2][-1]["content"]) for s in steps]
    first_base = next(i for i, (_, base) in enumerate(sides) if base.startswith("Arr"))
    assert sides[first_base][0] != "Arr, matey!"  # the base column began before the tuned one finished


def test_chat_settings_reach_the_model(ui, trained_run, tiny_model_dir):
    """max new tokens bounds the reply; the system prompt goes before the user's message."""
    short = chat(ui, PROMPT, "run-a", tokens=3)[-1][1][-1]["content"]
    assert short == greedy_reply(tiny_model_dir, trained_run, PROMPT, 3)
    assert short != greedy_reply(tiny_model_dir, trained_run, PROMPT, 12)
    values = form(model=str(tiny_model_dir))
    _, history, _ = drain(ui.chat.respond(PROMPT, [], [], "base", False, 12, 0.0, 1.0, " Be brief. ", **values))
    with_system = greedy_reply(tiny_model_dir, None, PROMPT, 12, system="Be brief.")
    assert history[-1]["content"] == with_system != greedy_reply(tiny_model_dir, None, PROMPT, 12)


def test_chat_errors_are_one_line_in_the_conversation(ui, studio, trained_run, tiny_model_dir, monkeypatch):
    _, history, _ = chat(ui, "Hi", "gone")[-1]
    assert history[-1]["content"].startswith(ERROR_PREFIX + "run: 'gone' is not a run in ")
    assert "\n" not in history[-1]["content"]

    # A run whose weights do not load (a damaged adapter file): one line, never a traceback.
    (trained_run / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    _, history, _ = chat(ui, "Hi", "run-a")[-1]
    assert history[-1]["content"].startswith(ERROR_PREFIX) and "\n" not in history[-1]["content"]
    assert "Traceback" not in history[-1]["content"]

    # A generation that crashes after its first words (a CUDA device assert cannot happen on a CPU): injected where
    # the model generates; the conversation shows the error's first line.
    def crash(model, tokenizer, messages, settings):
        yield "par"
        raise RuntimeError("CUDA error: device-side assert\nlong trace")

    monkeypatch.setattr("finetune.model.inference.stream_reply", crash)
    _, history, _ = chat(ui, "Hi", "base", values=form(model=str(tiny_model_dir)))[-1]
    assert history[-1]["content"] == ERROR_PREFIX + "RuntimeError: CUDA error: device-side assert"

    monkeypatch.setattr("finetune.model.inference.stream_reply", lambda *a: iter(["  "]))  # a model that ends at once
    _, history, _ = chat(ui, "Hi", "base", values=form(model=str(tiny_model_dir)))[-1]
    assert history[-1]["content"] == EMPTY


def test_chat_sources_list_runs_by_readable_name_the_newest_finished_first_chosen(ui, studio, tiny_model_dir):
    from ui.formatting import run_title

    assert ui.chat.sources()["choices"] == [("Base model", "base")] and ui.chat.sources()["value"] == "base"
    build_run(studio.manager.root / "run-a", tiny_model_dir)
    name = run_title(studio.run("run-a"))
    assert name.startswith(f"{tiny_model_dir.name} · LoRA · ")
    update = ui.chat.sources("base")  # the page had nothing to offer but the base model: the new run is chosen
    assert (f"{name} (tuned)", "run-a") in update["choices"] and update["value"] == "run-a"
    assert ui.chat.sources("base", picked=True)["value"] == "base"  # the user's own choice stays
    assert ui.chat.sources("deleted-run")["value"] == "run-a"


# ----------------------------------------------------------------------------------------------- Publish
def test_publish_pushes_a_trained_run_and_always_clears_the_token(ui, studio, trained_run, hub):
    assert ui.publish.runs()["value"] == "run-a"
    result, token = ui.publish.push("run-a", " alice/pirate-lora ", GOOD_TOKEN, True, False)
    assert result == f"✓ Pushed the adapter of `run-a` to [{hub.url}/alice/pirate-lora]({hub.url}/alice/pirate-lora)."
    assert token == ""
    repo = hub.repos["alice/pirate-lora"]
    assert repo.private and len(repo.commits) == 1
    assert repo.files["adapter_model.safetensors"] == (trained_run / "adapter_model.safetensors").read_bytes()
    pushed = json.loads(repo.files["adapter_config.json"])
    trained = json.loads((trained_run / "adapter_config.json").read_text())
    assert (pushed["r"], pushed["target_modules"]) == (trained["r"], trained["target_modules"])
    assert "README.md" in repo.files and not any("checkpoint" in f or "optimizer" in f for f in repo.files)

    result, token = ui.publish.push("run-a", "alice/pirate-merged", GOOD_TOKEN, False, True)
    assert result.startswith("✓ Pushed the merged model of `run-a`") and token == ""
    merged = hub.repos["alice/pirate-merged"]
    assert not merged.private and "config.json" in merged.files and "adapter_config.json" not in merged.files

    result, token = ui.publish.push("run-a", "alice/other", BAD_TOKEN, True, False)
    assert result.startswith("⚠ ") and "token" in result and "\n" not in result and token == ""
    assert "alice/other" not in hub.repos
    result, token = ui.publish.push("run-a", "alice/other", "", True, False)  # no token anywhere (HF_TOKEN unset)
    assert result.startswith("⚠ no Hugging Face token") and token == ""
    assert BAD_TOKEN not in result and pushed_files_hold_no_secret(hub, GOOD_TOKEN)


# ----------------------------------------------------------------------------------------------- path confinement
@pytest.mark.parametrize("name", ["../outside", "ABSOLUTE", "run-a/../../outside", "link-to-outside"])
def test_run_names_outside_the_runs_folder_are_refused_in_one_line(ui, studio, tiny_model_dir, hub, gate, name):
    """A real, resumable run sits next to the runs folder; naming it by `..`, an absolute path or a symlink from the
    Train, Chat or Publish tab is refused in one line, and nothing is loaded, started or pushed."""
    root = studio.manager.root
    outside = build_run(root.parent / "outside", tiny_model_dir, status="stopped")
    shutil.rmtree(outside / "checkpoint-10")  # stopped at step 5 of 10: resumable, were it allowed
    assert RunDir(outside).last_checkpoint().name == "checkpoint-5"
    root.mkdir(parents=True, exist_ok=True)
    (root / "link-to-outside").symlink_to(outside, target_is_directory=True)
    name = str(outside) if name == "ABSOLUTE" else name
    status_before = (outside / "status.json").read_bytes()

    out = on_page(ui, ui.train.resume(None, name))
    message = out["message"]
    assert message.startswith("⚠ run: ") and "is not a run in" in message and "\n" not in message
    assert "viewing" not in out and studio.state() is None

    _, history, _ = chat(ui, "Hi", name, values=form(model=str(tiny_model_dir)))[-1]
    assert history[-1]["content"].startswith(ERROR_PREFIX + "run: ") and "\n" not in history[-1]["content"]

    result, token = ui.publish.push(name, "alice/stolen", GOOD_TOKEN, True, False)
    assert result.startswith("⚠ run: ") and "\n" not in result and token == ""
    assert hub.requests == [] and hub.repos == {}

    if name != "link-to-outside":  # (a link placed in the runs folder on the server is listed; see the report)
        page = on_page(ui, ui.train.select(name))  # the Train tab shows nothing of it either
        assert 'data-status="stopped"' not in page["progress"] and page["samples"].empty
    assert (outside / "status.json").read_bytes() == status_before


def test_an_estimate_for_settings_changed_meanwhile_is_dropped(ui, tiny_model_dir):
    """The Memory tab shows an estimate only for the settings it was computed for; a change while it was worked out
    asks for a new one instead of showing a figure for the old settings."""
    values = {**memory_form(model=str(tiny_model_dir)), **form(model=str(tiny_model_dir))}
    answer = ui.memory.estimate_for("CPU", "custom", None, 1, **values)
    assert ui.memory.show_estimate(answer, "CPU", "custom", None, 1, **values) == answer[0]
    changed = {**values, "memory__max_seq_length": 32}
    stale = ui.memory.show_estimate(answer, "CPU", "custom", None, 1, **changed)
    assert "settings changed while this was estimated" in stale[0]["value"]
    assert len(stale) == len(answer[0])


# ----------------------------------------------------------------------------------------------- number fields
def test_number_fields_keep_what_was_typed_or_refuse_it_whole(ui, studio):
    """A number field is a text box (a browser's number input drops or mangles `1e-4x`): what was typed reaches the
    backend as typed, which reads it as a number or refuses it whole in one line naming the field."""
    field = make_field("learning_rate", 5e-4)
    assert isinstance(field, gr.Textbox) and field.value == "0.0005" and "fs-number" in field.elem_classes
    assert make_field("max_steps", 40).value == "40" and make_field("weight_decay", 1e-05).value == "1e-05"
    assert [parse_number(t) for t in ("1e-4", " 2e-5 ", "", "1e-4x", "nan", "1,5")] == [
        1e-4, 2e-5, None, "1e-4x", "nan", "1,5"
    ]  # fmt: skip
    assert [parse_number(t, whole=True) for t in ("12", "12.0", "2.5")] == [12, 12, 2.5]
    config, problems = studio.check(form(learning_rate="1e-4", max_steps="12"))
    assert problems == {} and (config.learning_rate, config.max_steps) == (1e-4, 12)
    _, problems = studio.check(form(learning_rate="1e-4x", max_steps="2.5"))
    assert problems["learning_rate"].startswith("learning_rate: '1e-4x' is not a number")
    assert problems["max_steps"].startswith("max_steps: '2.5' is not a whole number")
    assert "\n" not in problems["learning_rate"] + problems["max_steps"]


# ----------------------------------------------------------------------------------------------- evaluate and compare
def evaluate_form(source: str, **changes: Any) -> dict[str, Any]:
    """The Evaluate tab's fields as the page sends them (3 rows, short answers, with the base model)."""
    values = {"source": source, "data": "", "split": "", "limit": 3, "max_new_tokens": 8, "base": True}
    values.update(lm_eval="", judge="", include_path="", num_fewshot=None, temperature=0.0)
    return {**values, **changes}


def on_evaluate(ui, out: dict) -> dict[str, Any]:
    """An Evaluate handler's {component: update} by attribute name."""
    names = {id(getattr(ui.evaluate, n)): n for n in vars(ui.evaluate) if hasattr(getattr(ui.evaluate, n), "_id")}
    return {names[id(c)]: v for c, v in out.items() if id(c) in names}


def test_evaluate_scores_a_run_base_next_to_tuned_and_the_train_tab_and_run_list_show_it(ui, trained_run):
    sources, _ = ui.evaluate.choices()
    assert ("run-a (final)", "run-a") in sources["choices"] and ("run-a · checkpoint 5 (completed)", "run-a@5") in (
        sources["choices"]
    )
    assert sources["value"] == "run-a"
    progress: list[tuple[float, str]] = []
    out = on_evaluate(
        ui, ui.evaluate.evaluate(**evaluate_form("run-a"), progress=lambda f, desc="": progress.append((f, desc)))
    )
    table, chart, answers = out["table"], out["chart"], out["answers"]
    assert list(table.columns) == ["Metric", "Base model", "Tuned", "Change"]
    rouge = table[table.Metric == "ROUGE-L"].iloc[0]
    assert rouge["Base model"] == "0.000" and float(rouge["Tuned"]) > 0 and rouge["Change"].startswith("+")
    assert list(chart.bar[chart.bar.str.startswith("ROUGE-L")]) == ["ROUGE-L · base", "ROUGE-L · tuned"]
    assert len(answers) == 3 and list(answers.columns) == ["Prompt", "Reference", "Base model", "Tuned"]
    assert "3 rows of pirate-mini-eval.jsonl" in out["message"] and "saved as `eval/" in out["message"]
    assert out["history"]["choices"] and progress[-1] == (1.0, "done")

    page = on_page(ui, ui.train.select("run-a"))
    assert page["evaluation"].startswith("**Latest evaluation**") and "ROUGE-L" in page["evaluation"]
    runs = page["runs_table"]
    assert runs.iloc[0]["Evaluation"].startswith("ROUGE-L") and "(base 0.000)" in runs.iloc[0]["Evaluation"]
    scores = page["scores_plot"]
    assert scores["visible"] and sorted(set(scores["value"][scores["value"].series == "ROUGE-L"].step)) == [0, 5, 10]

    shown = on_evaluate(ui, ui.evaluate.show("run-a"))  # opening the tab again shows the latest one, runs nothing
    assert list(shown["table"].Tuned) == list(table.Tuned)


def test_evaluate_refuses_in_one_line(ui, trained_run):
    assert on_evaluate(ui, ui.evaluate.evaluate(**evaluate_form("")))["message"].startswith("⚠ Pick a run")
    out = on_evaluate(ui, ui.evaluate.evaluate(**evaluate_form("run-a", limit=0), progress=lambda *a, **k: None))
    assert out["message"].startswith("⚠ Not evaluated: limit: ") and out["table"].empty
    out = on_evaluate(ui, ui.evaluate.evaluate(**evaluate_form("../run-a"), progress=lambda *a, **k: None))
    assert out["message"].startswith("⚠ Not evaluated: run: ") and "is not a run" in out["message"]


def test_compare_overlays_loss_curves_and_puts_scores_and_answers_side_by_side(ui, studio, trained_run, tiny_model_dir):
    build_run(studio.manager.root / "run-b", tiny_model_dir)
    ui.evaluate.evaluate(**evaluate_form("run-a"), progress=lambda *a, **k: None)
    out = on_evaluate(ui, ui.evaluate.compare(["run-a", "run-b"]))
    curves = out["curves"]["value"]
    assert out["curves"]["visible"] and set(curves.run) == {"run-a", "run-b"} and len(curves) == 20
    assert list(out["compare_table"].columns) == ["Metric", "run-a", "run-b"]
    assert "ROUGE-L" in list(out["compare_table"].Metric)
    assert list(out["compare_answers"].columns) == ["Prompt", "run-a", "run-b"] and len(out["compare_answers"])
    assert "run-b has no evaluation yet" in out["compare_message"]
    assert on_evaluate(ui, ui.evaluate.compare(["run-a"]))["compare_message"].startswith("⚠ runs: pick two or more")
