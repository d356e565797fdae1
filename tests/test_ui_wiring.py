"""The web UI without a browser: build the Blocks (never launched) and call the tab handlers directly.

Handlers return gradio update dicts (`{"__type__": "update", "value": ..., "visible": ...}`) or plain values; the
tests read those. The memory estimator and the Hub are stood in where a test is about the UI, not about them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr
import pytest

from finetune.config import FIELD_NAMES, TrainConfig, field_groups
from finetune.errors import BusyError, UserError
from finetune.runs import busy_message
from finetune.studio import Studio
from tests.run_fixtures import build_run
from ui.app import TAB_NAMES, build_app
from ui.chat_tab import ERROR_PREFIX, LOADING
from ui.config_tab import ConfigTab
from ui.memory_tab import MEMORY_FIELDS

ROOT = Path(__file__).resolve().parents[1]


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


def form(**changes: Any) -> list[Any]:
    """The Configure form's values (defaults + changes) in field order, as the browser sends them."""
    values = {**Studio.default_values(), **changes}
    return [values[n] for n in FIELD_NAMES]


def memory_form(**changes: Any) -> list[Any]:
    values = {**Studio.default_values(), **changes}
    return [values[n] for n in MEMORY_FIELDS]


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


@dataclass
class Suggestion:
    title: str
    changes: dict[str, Any]
    new_total_bytes: int
    cost: str


@dataclass
class FakeEstimate:
    """The shape of `finetune.memory.MemoryEstimate` that the Memory tab reads."""

    components: dict[str, int] = field(default_factory=lambda: {"weights": 2 << 30, "activations": 30 << 30})
    tensor_bytes: int = 32 << 30
    total_bytes: int = 33 << 30
    overheads: dict[str, int] = field(default_factory=lambda: {"cuda_context": 1 << 30})
    comparisons: dict[str, int] = field(default_factory=lambda: {"rule_of_thumb": 10 << 30})
    fits: bool | None = False
    headroom_bytes: int | None = -(9 << 30)
    advice: list = field(
        default_factory=lambda: [
            Suggestion("Turn on gradient checkpointing", {"gradient_checkpointing": True}, 12 << 30, "≈30% slower"),
            Suggestion(
                "Micro batch 1 × accumulation 4",
                {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4},
                14 << 30,
                "slower",
            ),
        ]
    )


# ----------------------------------------------------------------------------------------------- the page
def test_five_tabs_named_exactly(ui, demo):
    tabs = [b for b in demo.blocks.values() if isinstance(b, gr.Tab)]
    assert [t.label for t in tabs] == list(TAB_NAMES) == ["Memory", "Configure", "Train", "Chat", "Publish"]
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
    assert list(ui.config.fields) == list(FIELD_NAMES) or set(ui.config.fields) == set(FIELD_NAMES)
    for name, component in ui.config.fields.items():
        assert _inside(component, ui.tabs["Configure"]), name
        assert component.info, f"{name} has no help text"
        assert component.label == name
        group = next(g for g, names in field_groups().items() if name in names)
        assert _inside(component, ui.config.groups[group]), f"{name} not in group {group}"
    assert list(ui.config.groups) == [
        "Model",
        "Data",
        "Method",
        "Optimisation",
        "Precision & memory",
        "DeepSpeed",
        "Output",
    ]


def test_events_are_wired_with_stable_api_names(demo):
    names = {d.get("api_name") for d in demo.config["dependencies"]}
    assert {"estimate", "check", "preview_data", "commands", "start", "stop", "resume", "status", "chat"} <= names


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
    assert (args.host, args.port, args.auth) == ("0.0.0.0", 7861, ("a", "b"))
    args = parse_args(["--auth", "ann:s3:cret", "--port", "9000", "--runs-root", "/tmp/r"], env={})
    assert args.auth == ("ann", "s3:cret") and args.port == 9000 and str(args.runs_root) == "/tmp/r"
    with pytest.raises(SystemExit):
        parse_args(["--auth", "nopassword"], env={})


# ----------------------------------------------------------------------------------------------- Configure
def test_check_shows_each_error_beside_its_field_and_opens_its_group(ui):
    updates = ui.config.check(*form(max_steps=-5, lora_r=0, learning_rate="fast"))
    errors = errors_by_field(updates)
    assert set(errors) == {"max_steps", "lora_r", "learning_rate"}
    assert "max_steps" in errors["max_steps"] and "allowed" in errors["max_steps"]
    assert "\n" not in errors["lora_r"] and "Traceback" not in errors["lora_r"]
    groups = dict(zip(ui.config.groups, updates[len(FIELD_NAMES) : -1], strict=True))
    assert groups["Optimisation"].get("open") is True and groups["Method"].get("open") is True
    assert "open" not in groups["Model"]
    assert "3 fields need a change" in summary_of(updates)

    good = ui.config.check(*form())
    assert errors_by_field(good) == {} and "valid" in summary_of(good)
    *quiet, saved = ui.config.check_quiet(*form(lora_r=4))
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
    errors = errors_by_field(ui.config.check(*form(offload_param="cpu", zero_stage=2)))
    assert list(errors) == ["offload_param"] and "zero_stage" in errors["offload_param"]


def test_yaml_download_and_upload_round_trip(ui):
    values = form(lora_r=16, max_steps=7, learning_rate=1e-4, method="full", gradient_checkpointing=True)
    saved = ui.config.save(*values)
    path = Path(saved[0]["value"])
    assert saved[0]["visible"] and path.suffix == ".yaml"
    assert TrainConfig.from_yaml(path.read_text()).lora_r == 16
    loaded = ui.config.load(str(path), *form())
    assert loaded[: len(FIELD_NAMES)] == values
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
    out = ui.config.load(str(path), *form())
    assert all(u == {"__type__": "update"} for u in out[: len(FIELD_NAMES)])
    shown = " ".join(errors_by_field(out[len(FIELD_NAMES) :]).values()) + summary_of(out[len(FIELD_NAMES) :])
    assert expected in shown


def test_data_upload_is_type_and_size_checked_and_kept_under_the_studio_home(ui, studio_home, tmp_path, monkeypatch):
    data = tiny_data(tmp_path)
    dataset, error, note = ui.config.use_data_file(str(data))
    assert Path(dataset).parent == studio_home / "uploads" and Path(dataset).read_text() == data.read_text()
    assert not error["visible"] and "tiny.jsonl" in note

    exe = tmp_path / "payload.exe"
    exe.write_bytes(b"MZ")
    dataset, error, _ = ui.config.use_data_file(str(exe))
    assert dataset == {"__type__": "update"} and "not a .jsonl" in error["value"]

    monkeypatch.setattr("ui.config_tab.DATA_LIMIT_BYTES", 10)
    _, error, _ = ui.config.use_data_file(str(data))
    assert "larger than" in error["value"]


def test_data_preview_shows_trained_and_masked_text(ui, tiny_model_dir, tmp_path):
    html, *updates = ui.config.show_preview(*form(model=str(tiny_model_dir), dataset=str(tiny_data(tmp_path))))
    assert errors_by_field(updates) == {}
    assert "24</b> training rows" in html and "fs-trained" in html and "fs-masked" in html
    assert "Arr, matey! Yo-ho-ho!" in html and "tokens" in html


def test_data_preview_of_a_missing_file_is_an_error_beside_dataset(ui, tiny_model_dir, tmp_path):
    html, *updates = ui.config.show_preview(*form(model=str(tiny_model_dir), dataset=str(tmp_path / "none.jsonl")))
    assert html == "" and "file not found" in errors_by_field(updates)["dataset"]


def test_show_command_lists_each_launcher(ui, studio, monkeypatch):
    monkeypatch.setattr(studio, "commands", lambda values, **kw: {"single": "python -m finetune train", "x": "y"})
    code, *updates = ui.config.show_commands(*form())
    assert code["visible"] and "run.yaml" in code["value"]
    assert "# one GPU (or the CPU)\npython -m finetune train" in code["value"] and "# x\ny" in code["value"]
    code, *updates = ui.config.show_commands(*form(max_steps=0))
    assert not code["visible"] and "max_steps" in errors_by_field(updates)


def test_show_command_with_the_real_launcher(ui):
    code, *updates = ui.config.show_commands(*form(zero_stage=2))
    assert code["visible"] and "torchrun" in code["value"] and "--config run.yaml" in code["value"]
    assert errors_by_field(updates) == {}


def test_reset_restores_the_defaults(ui):
    out = ui.config.reset()
    assert out[: len(FIELD_NAMES)] == form()


# ----------------------------------------------------------------------------------------------- Memory
def test_memory_estimate_shows_verdict_breakdown_and_ranked_suggestions(ui, studio, monkeypatch):
    calls = []
    monkeypatch.setattr(studio, "estimate", lambda values, **kw: calls.append((values, kw)) or FakeEstimate())
    monkeypatch.setattr(ui.memory, "cards_cache", {"NVIDIA A10G": 24.0})
    out = ui.memory.estimate("GPU", "NVIDIA A10G", None, 1, *memory_form(max_seq_length=2048), *form())
    verdict, chart, table, comparisons, advice, pick, apply_btn, state, *errors = out
    assert "Does not fit" in verdict and "NVIDIA A10G · 24 GiB" in verdict and "9.00 GiB short" in verdict
    assert calls[0][0]["max_seq_length"] == 2048  # this tab's values win over the form's
    assert calls[0][1] == {"device": "cuda", "gpus": 1, "gpu_gib": 24.0}
    assert list(chart["value"]["component"]) == ["activations", "weights", "cuda context (overhead)"]
    assert table["value"].iloc[0, 0] == "activations"
    assert "rule of thumb: 10.00 GiB" in comparisons
    assert advice["visible"] and advice["value"].iloc[0, 1] == "Turn on gradient checkpointing"
    assert pick["choices"][0] == ("1. Turn on gradient checkpointing", 0) and apply_btn["visible"]
    assert state == [
        {"gradient_checkpointing": True},
        {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4},
    ]
    assert not any(e["visible"] for e in errors)


def test_memory_estimate_on_cpu_and_custom_gpu(ui, studio, monkeypatch):
    calls = []
    monkeypatch.setattr(
        studio, "estimate", lambda values, **kw: calls.append(kw) or FakeEstimate(fits=True, headroom_bytes=1)
    )
    verdict = ui.memory.estimate("CPU", "custom", None, 1, *memory_form(), *form())[0]
    assert calls[-1] == {"device": "cpu", "gpus": 1, "gpu_gib": None} and "Fits" in verdict
    ui.memory.estimate("GPU", "custom", 80, 4, *memory_form(), *form())
    assert calls[-1] == {"device": "cuda", "gpus": 4, "gpu_gib": 80.0}
    verdict = ui.memory.estimate("GPU", "custom", None, 1, *memory_form(), *form())[0]
    assert "custom GPU memory" in verdict


def test_memory_field_errors_appear_beside_the_memory_field(ui):
    out = ui.memory.estimate("GPU", "custom", 24, 1, *memory_form(per_device_train_batch_size=0), *form())
    errors = dict(zip(MEMORY_FIELDS, out[8:], strict=True))
    assert errors["per_device_train_batch_size"]["visible"]
    assert "per_device_train_batch_size" in errors["per_device_train_batch_size"]["value"]
    # A problem in a field this tab does not show is named in the verdict.
    out = ui.memory.estimate("GPU", "custom", 24, 1, *memory_form(), *form(max_steps=0))
    assert "max_steps" in out[0] and "Configure" in out[0]


def test_apply_copies_a_suggestion_into_the_shared_form(ui):
    suggestions = [
        {"gradient_checkpointing": True},
        {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4},
    ]
    out = ui.memory.apply(1, suggestions, *memory_form(max_seq_length=512), *form(learning_rate=0.001))
    config_values = dict(zip(FIELD_NAMES, out[: len(FIELD_NAMES)], strict=True))
    memory_values = dict(zip(MEMORY_FIELDS, out[len(FIELD_NAMES) : -1], strict=True))
    assert config_values["per_device_train_batch_size"] == 1 and config_values["gradient_accumulation_steps"] == 4
    assert config_values["learning_rate"] == 0.001 and config_values["max_seq_length"] == 512  # nothing else lost
    assert memory_values["per_device_train_batch_size"] == 1
    assert "Applied" in out[-1] and "gradient_accumulation_steps=4" in out[-1]
    nothing = ui.memory.apply(None, [], *memory_form(), *form())
    assert nothing[-1] == "Nothing applied."


def test_memory_fields_mirror_configure_in_the_browser(demo, ui):
    """Each Memory field and its Configure twin copy user edits to each other."""
    deps = demo.config["dependencies"]
    for name in MEMORY_FIELDS:
        mem, cfg = ui.memory.fields[name]._id, ui.config.fields[name]._id
        assert any(d["inputs"] == [mem] and d["outputs"] == [cfg] for d in deps), name
        assert any(d["inputs"] == [cfg] and d["outputs"] == [mem] for d in deps), name


# ----------------------------------------------------------------------------------------------- Train
def test_start_with_a_bad_value_starts_nothing_and_points_at_the_field(ui, studio):
    message, viewing, shown, *updates = ui.train.start(None, *form(max_steps=-3))
    assert message.startswith("⚠ Not started: max_steps") and "Configure" in message
    assert "max_steps" in errors_by_field(updates)
    assert studio.state() is None and studio.runs() == []


def test_start_while_busy_says_who_started_the_run_and_when(ui, studio, monkeypatch):
    started = time.time()

    def busy(values, owner=""):
        raise BusyError(busy_message({"run_id": "run-x", "owner": "ann", "started_at": started}))

    monkeypatch.setattr(studio, "start", busy)
    message, viewing, shown, *updates = ui.train.start(None, *form())
    assert "run-x" in message and "ann" in message and time.strftime("%H:%M", time.localtime(started)) in message
    assert viewing == {"__type__": "update"}


def test_runs_list_progress_loss_plot_and_samples_for_a_past_run(ui, studio, tiny_model_dir):
    build_run(studio.manager.root / "run-a", tiny_model_dir, steps=10)
    out = ui.train.attach()
    viewing, shown, progress, problem, plot, samples, log, runs, pick, start, stop = out
    assert viewing == "run-a"
    assert 'data-status="completed"' in progress and "step <b>10</b> / 10" in progress
    assert problem == ""
    assert len(plot[plot.series == "train"]) == 10 and len(plot[plot.series == "eval"]) == 2
    assert list(samples.columns) == ["Held-out prompt", "Answer before training (step 0)", "Answer at step 10"]
    assert samples.iloc[0, 1].startswith("I do not know") and "Paris" in samples.iloc[0, 2]
    assert "step 10 · loss" in log and "eval loss" in log
    assert list(runs.iloc[0])[:3] == ["run-a", "completed", "10 / 10"]
    assert pick["value"] == "run-a" and start["interactive"] and not stop["interactive"]

    again = ui.train.tick(viewing, shown)
    assert again[2:] == [{"__type__": "update"}] * 9  # nothing changed: nothing redrawn


def test_a_failed_run_shows_its_error_and_the_advice(ui, studio, tiny_model_dir):
    run = build_run(studio.manager.root / "run-oom", tiny_model_dir, status="failed", steps=3)
    status = json.loads((run / "status.json").read_text())
    status.update(
        error="out of memory at step 3: the run needs more memory than the device has",
        advice="Turn on gradient_checkpointing: true (−60% activations).",
    )
    (run / "status.json").write_text(json.dumps(status))
    problem = ui.train.select("run-oom")[3]
    assert "The run failed." in problem and "out of memory at step 3" in problem
    assert "What to try:" in problem and "gradient_checkpointing" in problem


def test_resume_of_a_completed_run_is_refused_in_one_line(ui, studio, tiny_model_dir):
    build_run(studio.manager.root / "run-a", tiny_model_dir)
    message, viewing, shown = ui.train.resume(None, "run-a")
    assert message.startswith("⚠ resume:") and "\n" not in message
    assert ui.train.resume(None, None)[0].startswith("Pick a run")


def test_a_short_real_run_through_the_handlers(ui, studio, tiny_model_dir, tmp_path):
    values = form(
        model=str(tiny_model_dir),
        dataset=str(tiny_data(tmp_path)),
        eval_split="",
        max_steps=3,
        max_seq_length=32,
        save_steps=3,
        learning_rate=0.03,
        warmup_steps=0,
    )
    message, viewing, shown, *_ = ui.train.start(None, *values)
    assert message.startswith("▶ Started run") and viewing
    busy = ui.train.start(None, *values)[0]
    assert "busy" in busy and "the web app" in busy
    studio.manager.wait(timeout=120)
    out = ui.train.tick(viewing, shown)
    assert 'data-status="completed"' in out[2] and len(out[4][out[4].series == "train"]) == 3
    assert out[7].iloc[0, 1] == "completed"
    assert ui.train.stop() == "Nothing is running."
    labels = dict((v, k) for k, v in studio.chat_sources())
    assert viewing in labels and "(final)" in labels[viewing]


# ----------------------------------------------------------------------------------------------- Chat
def drain(gen) -> list:
    return list(gen)[-1]


def test_chat_streams_a_reply_and_compares_with_the_base_model(ui, studio, monkeypatch):
    calls = []

    def fake_chat(source, messages, settings, base_values=None):
        calls.append((source, messages, settings, base_values))
        yield "Arr"
        yield f"Arr from {source}"

    monkeypatch.setattr(studio, "chat", fake_chat)
    monkeypatch.setattr(studio, "run_config", lambda run_id: TrainConfig(model="the-run-base"))
    steps = list(ui.chat.respond("Hello?", [], [], "run-a", True, 64, 0.0, 1.0, "Be brief.", *form()))
    assert steps[0][1][-1]["content"] == LOADING  # visible loading state before the first token
    text, history, base_history = steps[-1]
    assert text == "" and history == [
        {"role": "user", "content": "Hello?"},
        {"role": "assistant", "content": "Arr from run-a"},
    ]
    assert base_history[-1] == {"role": "assistant", "content": "Arr from base"}
    assert [c[0] for c in calls] == ["run-a", "base"]
    assert calls[1][3]["model"] == "the-run-base"  # compared with the run's own base model, not the form's
    assert calls[0][2].max_new_tokens == 64 and calls[0][2].system_prompt == "Be brief."

    _, history, base_history = drain(ui.chat.respond("Again", history, [], "base", True, 64, 0, 1, "", *form()))
    assert len(history) == 4 and base_history == []  # base vs base: no second column


def test_chat_errors_are_one_line_in_the_conversation(ui, studio, monkeypatch):
    def broken(source, messages, settings, base_values=None):
        raise UserError("run: 'gone' is not a run in /x", field="run")
        yield ""

    monkeypatch.setattr(studio, "chat", broken)
    _, history, _ = drain(ui.chat.respond("Hi", [], [], "gone", False, 8, 0, 1, "", *form()))
    assert history[-1]["content"].startswith(ERROR_PREFIX + "run:") and "\n" not in history[-1]["content"]

    def crash(source, messages, settings, base_values=None):
        yield "par"
        raise RuntimeError("CUDA error: device-side assert\nlong trace")

    monkeypatch.setattr(studio, "chat", crash)
    _, history, _ = drain(ui.chat.respond("Hi", [], [], "base", False, 8, 0, 1, "", *form()))
    assert history[-1]["content"] == ERROR_PREFIX + "RuntimeError: CUDA error: device-side assert"

    monkeypatch.setattr(studio, "chat", lambda *a, **k: iter(["  "]))
    _, history, _ = drain(ui.chat.respond("Hi", [], [], "base", False, 8, 0, 1, "", *form()))
    assert "answered with nothing" in history[-1]["content"]


def test_chat_sources_list_the_base_model_and_finished_runs(ui, studio, tiny_model_dir):
    assert ui.chat.sources()["choices"] == [("Base model", "base")]
    build_run(studio.manager.root / "run-a", tiny_model_dir)
    update = ui.chat.sources("base")
    assert ("run-a (final)", "run-a") in update["choices"] and update["value"] == "base"
    assert ui.chat.sources("deleted-run")["value"] == "base"


# ----------------------------------------------------------------------------------------------- Publish
def test_publish_pushes_and_always_clears_the_token(ui, studio, tiny_model_dir, monkeypatch):
    build_run(studio.manager.root / "run-a", tiny_model_dir)
    assert ui.publish.runs()["value"] == "run-a"
    pushed = []
    monkeypatch.setattr(studio, "push", lambda *a: pushed.append(a) or "https://huggingface.co/ann/pirate")
    result, token = ui.publish.push("run-a", " ann/pirate ", "hf_secret", True, False)
    assert pushed == [("run-a", "ann/pirate", "hf_secret", True, False)]
    assert "https://huggingface.co/ann/pirate" in result and token == ""

    def rejected(*a):
        raise UserError("token rejected by the Hub (401); create a write token at https://huggingface.co/settings")

    monkeypatch.setattr(studio, "push", rejected)
    result, token = ui.publish.push("run-a", "ann/pirate", "hf_secret", True, False)
    assert result.startswith("⚠ token rejected") and "hf_secret" not in result and token == ""


def test_config_tab_outputs_line_up(ui):
    """Each handler returns exactly one value per output it is wired to."""
    tab: ConfigTab = ui.config
    assert len(tab.error_outputs) == len(tab.problem_updates({})) == len(FIELD_NAMES) + len(tab.groups) + 1
    assert len(tab.reset()) == len(FIELD_NAMES) + len(tab.error_outputs)
    assert len(tab.show_commands(*form(max_steps=0))) == 1 + len(tab.error_outputs)


def test_a_long_run_plot_is_thinned_but_keeps_its_ends():
    from ui.formatting import loss_rows

    events = [{"type": "log", "step": s, "loss": 1.0 / s} for s in range(1, 10_001)]
    events += [{"type": "eval", "step": s, "eval_loss": 0.5} for s in range(1000, 10_001, 1000)]
    rows = loss_rows(events)
    train = [r for r in rows if r["series"] == "train"]
    assert 500 <= len(train) <= 601 and train[0]["step"] == 1 and train[-1]["step"] == 10_000
    assert len(rows) - len(train) == 10


def test_stop_then_resume_from_the_train_tab(ui, studio, tiny_model_dir, tmp_path):
    values = form(
        model=str(tiny_model_dir),
        dataset=str(tiny_data(tmp_path)),
        eval_split="",
        max_steps=40,
        max_seq_length=32,
        save_steps=2,
        learning_rate=0.03,
        warmup_steps=0,
    )
    _, run_id, _, *_ = ui.train.start(None, *values)
    deadline = time.time() + 120
    while (studio.state().step < 2 or studio.state().status != "running") and time.time() < deadline:
        time.sleep(0.05)
    assert ui.train.stop().startswith("■ Stopping")
    studio.manager.wait(timeout=120)
    page = ui.train.select(run_id)
    assert 'data-status="stopped"' in page[2] and "Resume" in page[3]
    run = next(r for r in studio.runs() if r["run_id"] == run_id)
    assert run["status"] == "stopped" and run["resumable"], run
    message, viewing, _ = ui.train.resume(None, run_id)
    assert message.startswith("▶ Resuming") and viewing == run_id
    studio.manager.wait(timeout=120)
    assert 'data-status="completed"' in ui.train.select(run_id)[2] and studio.state().step == 40


def test_a_run_that_fails_says_why_in_plain_words(ui, studio, tiny_model_dir, tmp_path):
    bad = tmp_path / "wrong-columns.jsonl"
    bad.write_text("".join(json.dumps({"foo": i, "bar": "x"}) + "\n" for i in range(8)), encoding="utf-8")
    message, run_id, *_ = ui.train.start(None, *form(model=str(tiny_model_dir), dataset=str(bad), eval_split=""))
    if message.startswith("⚠ Not started"):  # refused before a run began: the reason is named at once
        assert "dataset" in message or "column" in message
        return
    studio.manager.wait(timeout=120)
    page = ui.train.select(run_id)
    assert 'data-status="failed"' in page[2] and page[3].startswith("**The run failed.**")
    assert "Traceback" not in page[3] and "\n\n**What to try" not in page[3]


def test_the_cli_bad_input_table_gets_the_same_one_line_errors_in_the_ui(ui, studio, tiny_model_dir, tmp_path):
    """Every `--set` case of the command line's bad-input table, typed into the form instead: Start refuses it with the
    same message (naming the field), starts nothing, and leaves no run directory."""
    from tests.test_cli import bad_cases

    checked = 0
    for args, expected in bad_cases(tmp_path, tiny_model_dir):
        if args[1] != "--set" or any(a.startswith("max_step=") or a == "lora_r" for a in args):
            continue  # config files, --resume and malformed --set items have no form equivalent
        changes = dict(a.split("=", 1) for a in args[2::2])
        message, *_ = ui.train.start(None, *form(**changes))
        assert message.startswith("⚠ Not started"), (changes, message)
        assert expected in message and "Traceback" not in message, (changes, message)
        checked += 1
    assert checked >= 13
    assert studio.state() is None and studio.runs() == []
