"""Configure tab: every `TrainConfig` field, grouped, labelled in plain words (the config key as a small hint), with
its help text and its error beside it; fields that do not apply to the chosen task, method or objective hidden (their
values kept); data preview; YAML upload / download; "Show command".

The field components built here are the one form the whole app shares: Memory reads and writes some of them, Train
starts a run from them, Chat uses their model as the base. Handlers receive the form keyed by field name (gradio's
`inputs_kwargs`: `tab.form`), so no handler depends on the order of the fields.

Answers never go stale: an action that waits (Check, Preview, Show command) first says it is pending, and its answer
is shown only if the form still holds the values it was computed for (`fresh`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from finetune import objectives
from finetune.config import (
    FIELD_NAMES,
    FIELDS,
    MAX_YAML_BYTES,
    field_groups,
    field_kind,
    field_label,
    field_optional,
)
from finetune.errors import UserError
from finetune.studio import BASE, Studio, field_problem
from ui.formatting import one_line, plain, preview_html, size
from ui.visitor import per_visitor

YAML_LIMIT_BYTES = MAX_YAML_BYTES  # the backend parser's own bound: a larger file is not read at all
DATA_TYPES = (".jsonl", ".json", ".csv", ".parquet")  # finetune.data.FILE_TYPES (not imported: it pulls in datasets)
OPEN_GROUPS = ("Model", "Data", "Objective", "Method")
COMMAND_TITLES = {
    "single": "one GPU (or the CPU)",
    "torchrun": "several GPUs on this machine (torchrun)",
    "deepspeed": "several GPUs on this machine (deepspeed launcher)",
    "multinode": "several machines",
    "multinode_torchrun": "several machines with torchrun (run on every node with its NODE_RANK)",
}
STALE = "The settings changed while this was running, so its answer was dropped; press {button} again."
# The fields whose value decides which other fields apply (a change of one of them shows or hides others).
DECIDING_FIELDS = ("task", "method", "objective", "zero_stage", "model")
LORA_FIELDS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "use_dora", "use_rslora")
LORA_FIELDS += ("init_lora_weights",)
OFFLOAD_FIELDS = ("offload_optimizer", "offload_param", "nvme_path")
VISION_FIELDS = ("image_longest_side", "freeze_vision_tower", "freeze_projector")  # a vision-language model's only
DATA_UPLOAD_TYPES = (*DATA_TYPES, ".zip", ".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")  # a data file + images


# ----------------------------------------------------------------------------------------------- the form
def kind_of(name: str) -> str:
    """A field's value type: bool, int, float or str."""
    return field_kind(name)


def label_of(name: str) -> str:
    """What a person reads above a field (finetune.config's human label)."""
    return field_label(name)


def help_of(name: str) -> str:
    """The help line under a field, ending with the config key as a hint for YAML and CLI users."""
    return f"{FIELDS[name].metadata['help'].replace('`', '')} · YAML key: {name}"


def hidden_fields(values: dict[str, Any], vision: bool = False) -> set[str]:
    """The fields that do not apply to these settings (LoRA knobs for full fine-tuning, 4-bit knobs unless QLoRA,
    offload unless ZeRO, image settings unless the model is a vision-language one (`vision`), and another
    objective's knobs: the objectives registry says which apply). They are hidden, never dropped: their values still
    travel with the form."""
    hidden = objectives.fields_not_applying(values)
    if not vision:
        hidden.update(VISION_FIELDS)
    method = values.get("method")
    if method == "full":
        hidden.update(LORA_FIELDS)
    if method != "qlora":
        hidden.update(("quant_type", "double_quant"))
    zero = parse_number(values.get("zero_stage"))
    if not isinstance(zero, (int, float)) or zero <= 0:
        hidden.update(OFFLOAD_FIELDS)
    return hidden


def number_box(value: Any = None, **kwargs: Any) -> gr.Textbox:
    """A number field that keeps exactly what the user typed: a text box. A browser's number input silently drops
    or mangles text it cannot read (typing `1e-4x` could leave `-4`); here the text reaches the backend as typed,
    where the config reads it as a number or refuses it whole, in one line naming the field (`parse_number` reads it
    where the page itself needs the number)."""
    classes = [*kwargs.pop("elem_classes", []), "fs-number"]
    return gr.Textbox(value=format_number(value), elem_classes=classes, **kwargs)


def parse_number(text: Any, whole: bool = False) -> Any:
    """`text` as an int (whole) or a finite float when all of it is one; None when empty; else the text as typed."""
    if text is None or isinstance(text, (int, float)) and not isinstance(text, bool):
        return text
    typed = str(text).strip()
    if not typed:
        return None
    try:
        number = float(typed)
    except ValueError:
        return str(text)
    if not math.isfinite(number):
        return str(text)
    if whole:
        try:
            return int(typed)
        except ValueError:
            return int(number) if number.is_integer() else number  # 2.5: the config says it is not whole
    return number


def format_number(value: Any) -> Any:
    """A number as the text a person would type back (0.0005, 1e-05, 40); anything else unchanged."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return str(value) if isinstance(value, int) else repr(float(value))


def make_field(name: str, value: Any, prefix: str = "cfg", note: str | None = None) -> gr.components.Component:
    """The component for one config field: checkbox, dropdown, number or textbox, labelled in plain words, with the
    help text (and the config key) as info.

    Numbers are `number_box`es (text) with no minimum/maximum: the config validates them, so a bad value is kept as
    typed and gets our one-line error beside the field instead of a generic one. `note` replaces the help text (what a
    public app allows); a note on a checkbox also locks it (the backend refuses the value anyway).
    """
    meta, kind = FIELDS[name].metadata, kind_of(name)
    info = f"{note} · YAML key: {name}" if note else help_of(name)
    common = {"label": label_of(name), "info": info, "elem_id": f"{prefix}-{name}"}
    if note and kind == "bool":
        common["interactive"] = False
    if kind == "bool":
        return gr.Checkbox(value=bool(value), **common)
    if meta.get("choices"):
        return gr.Dropdown(choices=list(meta["choices"]), value=value, **common)
    if kind in ("int", "float"):  # an optional number may be left empty: it then takes the usual value
        optional = {"placeholder": "empty: the usual value"} if field_optional(name) else {}
        return number_box("" if value is None else value, **optional, **common)
    return gr.Textbox(value=value, **common)


def form_stamp(values: dict[str, Any]) -> str:
    """The form's values as one comparable string: an answer is shown only for the values it was computed for."""
    return json.dumps({n: values.get(n) for n in FIELD_NAMES}, sort_keys=True, default=str)


def public_notes(studio: Studio) -> dict[str, str]:
    """{field: what this public app allows}, shown instead of the help text; empty for the local app."""
    policy = studio.policy
    if not policy.public:
        return {}
    notes = {}
    if not policy.server_paths:
        notes["model"] = "A Hub model id (owner/name) or the embedded model. Files on the server are off in this app."
        notes["dataset"] = (
            "A Hub dataset id, the bundled data (bundled:pirate), or a file you upload below. Files on the server are "
            "off in this app."
        )
    if not policy.remote_code:
        notes["trust_remote_code"] = "Off in this public app: a model repository's own code never runs here."
    return notes


def field_error_md(name: str, prefix: str = "cfg") -> gr.Markdown:
    return gr.Markdown("", visible=False, elem_id=f"{prefix}-err-{name}", elem_classes=["fs-field-error"])


def error_update(message: str | None) -> dict:
    if message:
        return gr.update(value=f"⚠ {plain(message)}", visible=True)
    return gr.update(value="", visible=False)


def summary_text(problems: dict[str, str]) -> str:
    if not problems:
        return ""
    names = ", ".join(label_of(n) if n in FIELDS else n for n in problems)
    first = next(iter(problems.values()))
    more = f" ({len(problems)} fields need a change: {names})" if len(problems) > 1 else ""
    return f"⚠ {plain(first)}{more}"


def warn(message: str) -> None:
    """A one-line toast (gr.Warning renders HTML, so user text is escaped)."""
    gr.Warning(plain(message))


@dataclass
class ConfigTab:
    studio: Studio
    fields: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, Any] = field(default_factory=dict)
    cells: dict[str, Any] = field(default_factory=dict)  # each field's column (field + error), hidden when n/a
    groups: dict[str, Any] = field(default_factory=dict)
    summary: Any = None
    check_btn: Any = None
    reset_btn: Any = None
    preview_btn: Any = None
    preview: Any = None
    upload_data: Any = None
    upload_yaml: Any = None
    save_yaml: Any = None
    yaml_file: Any = None
    command_btn: Any = None
    command_gpus: Any = None
    command_nodes: Any = None
    commands: Any = None
    answers: dict[str, Any] = field(default_factory=dict)  # hidden holders of slow answers, by action (the API's)
    stamps: dict[str, Any] = field(default_factory=dict)  # the form each answer was computed for, by action
    saved: Any = None  # gr.BrowserState (made by the app, outside the tabs): a page reload keeps the settings

    # ----- what other tabs wire to
    @property
    def form(self) -> dict[str, Any]:
        """The form as gradio `inputs_kwargs`: handlers receive each field's value under its name."""
        return dict(self.fields)

    @property
    def inputs(self) -> list:
        """The form as a list in FIELD_NAMES order (to restore it from the browser's saved copy in one update)."""
        return [self.fields[n] for n in FIELD_NAMES]

    @property
    def error_outputs(self) -> list:
        """Where problems are shown: each field's error line, its cell (shown on error even where the field does not
        apply, so it can be fixed), the group accordions (opened on error), the summary."""
        cells = [self.cells[n] for n in FIELD_NAMES]
        return [self.errors[n] for n in FIELD_NAMES] + cells + list(self.groups.values()) + [self.summary]

    def problem_updates(self, problems: dict[str, str], ok_text: str = "") -> list:
        """Updates for `error_outputs`: errors beside their fields, groups with an error opened, a summary line."""
        updates = [error_update(problems.get(n)) for n in FIELD_NAMES]
        updates += [gr.update(visible=True) if n in problems else gr.update() for n in FIELD_NAMES]
        for fields_in_group in field_groups().values():
            bad = any(n in problems for n in fields_in_group)
            updates.append(gr.update(open=True) if bad else gr.update())
        updates.append(summary_text(problems) or ok_text)
        return updates

    def exception_updates(self, exc: BaseException, default_field: str = "config") -> list:
        """`problem_updates` for an error, beside the field it names (`finetune.studio.field_problem`)."""
        return self.problem_updates(field_problem(exc, default_field))

    def visibility(self, **values: Any) -> list:
        """Updates for every field's cell (FIELD_NAMES order): shown when it applies to these settings."""
        hidden = hidden_fields(values, vision=self.studio.takes_images(BASE, values))
        return [gr.update(visible=n not in hidden) for n in FIELD_NAMES]

    # ----- slow actions: pending first, the answer only while it is still for the form on the page
    @staticmethod
    def fresh(values: dict[str, Any], answer: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """(answer, stamp of the form it was computed for): the page keeps both until the answer is shown."""
        return answer, form_stamp(values)

    @staticmethod
    def is_current(answer: Any, stamp: Any, values: dict[str, Any]) -> bool:
        return isinstance(answer, dict) and stamp == form_stamp(values)

    # ----- handlers (plain functions of the form values; tests call them directly)
    @per_visitor
    def verify(self, request: gr.Request | None = None, **values: Any) -> tuple[dict[str, Any], str]:
        """Check settings as Start will (files exist, Hub ids resolve, columns are found, output_dir is free):
        ({problems}, form stamp)."""
        _, problems = self.studio.verify(values)
        return self.fresh(values, {"problems": problems})

    def show_verified(self, answer: Any, stamp: Any, **values: Any) -> list:
        """Updates for `error_outputs` from a Check answer; nothing but a note when the form changed meanwhile."""
        if not self.is_current(answer, stamp, values):
            return [gr.skip()] * (len(self.error_outputs) - 1) + [STALE.format(button="**Check settings**")]
        problems = answer["problems"]
        return self.problem_updates(problems, ok_text="✓ All settings are valid." if not problems else "")

    @per_visitor
    def check(self, request: gr.Request | None = None, **values: Any) -> list:
        """Check settings in one call (the API and tests): every check Start makes before a run exists."""
        return self.show_verified(*self.verify(**values), **values)

    @per_visitor
    def check_quiet(self, request: gr.Request | None = None, **values: Any) -> list:
        """The cheap check (no file or network access) after each edit, without the "all valid" line; also
        returns the form to keep in the browser's storage."""
        _, problems = self.studio.check(values)
        return [*self.problem_updates(problems), {n: values[n] for n in FIELD_NAMES if n in values}]

    def restore(self, saved: dict[str, Any] | None) -> list:
        """On page load: the settings kept in this browser (known fields only), else no change."""
        saved = saved if isinstance(saved, dict) else {}
        return [saved[n] if n in saved else gr.skip() for n in FIELD_NAMES]

    def reset(self) -> list:
        defaults = self.studio.default_values()
        return [defaults[n] for n in FIELD_NAMES] + self.problem_updates({})

    @per_visitor
    def make_preview(self, request: gr.Request | None = None, **values: Any) -> tuple[dict[str, Any], str]:
        """The first examples as the model sees them: ({html, problems}, form stamp)."""
        _, problems = self.studio.check(values)
        if problems:
            return self.fresh(values, {"html": "", "problems": problems})
        try:
            preview = self.studio.preview_data(values)
            html = preview_html(preview, thumbnails(preview))
        except Exception as exc:  # a missing file, a tokenizer that fails in an unforeseen way: one line
            return self.fresh(values, {"html": "", "problems": field_problem(exc, "dataset")})
        return self.fresh(values, {"html": html, "problems": {}})

    def show_preview_answer(self, answer: Any, stamp: Any, **values: Any) -> list:
        """[preview HTML, *error updates] from a Preview answer (dropped if the form changed meanwhile)."""
        if not self.is_current(answer, stamp, values):
            return ["<p>" + STALE.format(button="<b>Preview data</b>") + "</p>", *[gr.skip()] * len(self.error_outputs)]
        return [answer["html"], *self.problem_updates(answer["problems"])]

    @per_visitor
    def show_preview(self, request: gr.Request | None = None, **values: Any) -> list:
        """[preview HTML, *error updates] in one call (the API and tests)."""
        return self.show_preview_answer(*self.make_preview(**values), **values)

    @per_visitor
    def save(self, request: gr.Request | None = None, **values: Any) -> list:
        """[file update, *error updates]: the form as run.yaml, which the browser downloads at once."""
        config, problems = self.studio.check(values)
        if config is None:
            return [gr.update(value=None, visible=False), *self.problem_updates(problems)]
        try:
            path = self.studio.save_yaml(config)
        except OSError as exc:
            warn(f"Cannot write the YAML file: {one_line(exc)}")
            return [gr.update(value=None, visible=False), *self.problem_updates({})]
        return [
            gr.update(value=str(path), visible=True),
            *self.problem_updates({}, ok_text=f"Your settings are downloading as `{path.name}`."),
        ]

    def load(self, file: Any) -> list:
        """Fill the form from an uploaded YAML file (size- and type-checked); a bad file changes nothing."""
        keep = [gr.update() for _ in FIELD_NAMES]
        try:
            path = _upload_path(file, (".yaml", ".yml"), YAML_LIMIT_BYTES, "config file")
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise UserError(f"config file: {path.name} is not UTF-8 text") from None
            config = self.studio.config_from_yaml(text)
        except UserError as exc:
            warn(str(exc))
            return keep + self.exception_updates(exc)
        loaded = config.to_dict()
        return [loaded[n] for n in FIELD_NAMES] + self.problem_updates({}, ok_text=f"Loaded `{path.name}`.")

    @per_visitor
    def use_data_file(self, file: Any, request: gr.Request | None = None) -> tuple[Any, Any, str]:
        """Keep an uploaded data file (this visitor's, under a name of its own, within the operator's limits) and
        point the `dataset` field at it (`upload:NAME`). Several files (a data file and its images) or a .zip of
        them are kept together, so the data file's image paths find their images beside it."""
        try:
            files = [f for f in (file if isinstance(file, list) else [file]) if f is not None]
            if not files:
                raise UserError("dataset: no file was uploaded", "dataset")
            paths = [Path(getattr(f, "name", None) or str(f)) for f in files]
            target = self.studio.add_uploads([(p, p.name) for p in paths])
            path = paths[0] if len(paths) == 1 else Path(target.rsplit("/", 1)[-1])
        except UserError as exc:
            warn(str(exc))
            return gr.update(), error_update(str(exc)), ""
        except OSError as exc:
            message = f"dataset: cannot keep the uploaded file: {one_line(exc)}"
            warn(message)
            return gr.update(), error_update(message), ""
        return target, error_update(None), f"Using the uploaded file `{plain(path.name)}` as the dataset."

    @per_visitor
    def make_commands(
        self, command_gpus: Any = 2, command_nodes: Any = 1, request: gr.Request | None = None, **values: Any
    ) -> tuple[dict[str, Any], str]:
        """The CLI, torchrun and deepspeed commands for these settings: ({text, problems}, form stamp). The counts
        are the two boxes beside the button (named apart from the config's own `nodes`, a Slurm run's)."""
        gpus, nodes = command_gpus, command_nodes
        _, problems = self.studio.check(values)
        if not problems:
            problems = _count_problem(gpus, "command_gpus", "GPUs per machine") or _count_problem(
                nodes, "command_nodes", "Machines"
            )
        if problems:
            return self.fresh(values, {"text": "", "problems": problems})
        try:
            commands = self.studio.commands(values, gpus=int(gpus), nodes=int(nodes))
        except Exception as exc:  # a launcher that refuses these settings: one line beside its field
            return self.fresh(values, {"text": "", "problems": field_problem(exc)})
        intro = "# Save these settings with 'Download YAML' (run.yaml), then, in the folder that holds it, run one of:"
        text = "\n\n".join([intro] + [f"# {COMMAND_TITLES.get(k, k)}\n{c}" for k, c in commands.items()])
        return self.fresh(values, {"text": text, "problems": {}})

    def show_commands_answer(self, answer: Any, stamp: Any, **values: Any) -> list:
        """[code update, *error updates] from a Show-command answer (dropped if the form changed meanwhile)."""
        if not self.is_current(answer, stamp, values):
            stale = STALE.format(button="**Show command**")
            return [gr.update(visible=False), *[gr.skip()] * (len(self.error_outputs) - 1), stale]
        problems = answer["problems"]
        shown = {n: m for n, m in problems.items() if n in FIELDS}
        code = gr.update(value=answer["text"], visible=bool(answer["text"]))
        return [code, *self.problem_updates(shown or problems)]

    @per_visitor
    def show_commands(
        self, command_gpus: Any = 2, command_nodes: Any = 1, request: gr.Request | None = None, **values: Any
    ) -> list:
        """[code update, *error updates] in one call (the API and tests)."""
        return self.show_commands_answer(*self.make_commands(command_gpus, command_nodes, **values), **values)

    def remote_code_warning(self, enabled: bool) -> None:
        if enabled:
            gr.Warning(
                "trust_remote_code is on: the model repository's own Python code will run on this machine. "
                "Only use it with repositories you trust."
            )


THUMB_PIXELS = 96  # the longest side of a preview thumbnail


def thumbnails(preview: dict[str, Any]) -> dict[str, str]:
    """A small PNG data URL for each image file the preview's rows name (files the backend read and checked); one
    that cannot be read is left out (the preview then shows its name)."""
    import base64
    import io

    from PIL import Image

    out: dict[str, str] = {}
    for example in preview.get("examples") or []:
        for path in example.get("images") or []:
            if path in out or not isinstance(path, str):
                continue
            try:
                with Image.open(path) as image:
                    small = image.convert("RGB")
                    small.thumbnail((THUMB_PIXELS, THUMB_PIXELS))
                    buffer = io.BytesIO()
                    small.save(buffer, format="PNG")
            except (OSError, ValueError, Image.DecompressionBombError):
                continue
            out[path] = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    return out


def _count_problem(value: Any, field_name: str, label: str) -> dict[str, str]:
    """{field: message} unless `value` is a whole number ≥ 1."""
    if value is None or value == "":
        return {field_name: f"{label}: empty; give a number"}
    if not isinstance(value, (int, float)) or int(value) != value or value < 1:
        return {field_name: f"{label}: {value!r} must be a whole number ≥ 1"}
    return {}


def _upload_path(file: Any, suffixes: tuple[str, ...], limit: int, what: str) -> Path:
    """The path of an uploaded file after checking its type and size."""
    if file is None:
        raise UserError(f"{what}: no file was uploaded")
    path = Path(getattr(file, "name", None) or str(file))
    if path.suffix.lower() not in suffixes:
        raise UserError(f"{what}: {path.name} is not a {' / '.join(suffixes)} file")
    if not path.is_file():
        raise UserError(f"{what}: the upload of {path.name} did not arrive; try again")
    if path.stat().st_size > limit:
        raise UserError(f"{what}: {path.name} is larger than the {size(limit)} allowed")
    return path


# ----------------------------------------------------------------------------------------------- layout
def build(studio: Studio) -> ConfigTab:
    tab = ConfigTab(studio)
    defaults = studio.default_values()
    notes = public_notes(studio)
    hidden = hidden_fields(defaults, vision=studio.takes_images(BASE, defaults))
    gr.Markdown(
        "Every setting of a run, with what it does. **The defaults work as they are**: the embedded SmolLM2 model "
        "learns to answer like a pirate from the bundled dataset in a few minutes on a CPU. The grey line under "
        "each field says what it does (and its key in a YAML file); a problem with a value appears in red right "
        "under its field. Settings that do not apply to your choice of task, goal and method are hidden."
    )
    tab.summary = gr.Markdown("", elem_id="cfg-summary", elem_classes=["fs-summary"])
    with gr.Row():
        tab.check_btn = gr.Button("Check settings", variant="primary", elem_id="cfg-check", scale=1, min_width=120)
        tab.preview_btn = gr.Button("Preview data", elem_id="cfg-preview", scale=1, min_width=120)
        tab.command_btn = gr.Button("Show command", elem_id="cfg-command", scale=1, min_width=120)
        tab.save_yaml = gr.Button("Download YAML", elem_id="cfg-save", scale=1, min_width=120)
        tab.upload_yaml = gr.UploadButton(
            "Upload YAML", file_types=[".yaml", ".yml"], elem_id="cfg-upload", scale=1, min_width=120
        )
        tab.reset_btn = gr.Button("Reset to defaults", elem_id="cfg-reset", scale=1, min_width=120)
    tab.yaml_file = gr.File(label="Your settings (run.yaml)", visible=False, elem_id="cfg-yaml-file", interactive=False)
    with gr.Row(equal_height=False):
        tab.command_gpus = gr.Number(
            value=2, precision=0, label="GPUs per machine", elem_id="cfg-command-gpus", scale=0, min_width=150
        )
        tab.command_nodes = gr.Number(
            value=1, precision=0, label="Machines", elem_id="cfg-command-nodes", scale=0, min_width=150
        )
        tab.commands = gr.Code(
            label="Run the same settings from a terminal",
            language="shell",
            visible=False,
            elem_id="cfg-commands",
            interactive=False,
        )
    for action in ("check", "preview", "commands"):
        tab.answers[action] = gr.JSON(visible=False, elem_id=f"cfg-answer-{action}")
        tab.stamps[action] = gr.State("")
    for group, names in field_groups().items():
        with gr.Accordion(group, open=group in OPEN_GROUPS, elem_id=f"cfg-group-{_slug(group)}") as acc:
            tab.groups[group] = acc
            with gr.Row(equal_height=False, elem_classes=["fs-fields"]):
                for name in names:
                    with gr.Column(min_width=260, visible=name not in hidden, elem_id=f"cfg-cell-{name}") as cell:
                        tab.cells[name] = cell
                        tab.fields[name] = make_field(name, defaults[name], note=notes.get(name))
                        tab.errors[name] = field_error_md(name)
            if group == "Data":
                with gr.Row():
                    tab.upload_data = gr.UploadButton(
                        "Upload a data file (.jsonl, .json, .csv, .parquet), with its images or as a .zip",
                        file_types=list(DATA_UPLOAD_TYPES),
                        file_count="multiple",
                        elem_id="cfg-upload-data",
                        size="sm",
                        scale=0,
                        min_width=320,
                    )
                tab.preview = gr.HTML("", elem_id="cfg-preview-box")
    return tab


def _slug(text: str) -> str:
    return "".join(c.lower() if c.isalnum() else "-" for c in text).strip("-")


# ----------------------------------------------------------------------------------------------- events
# The browser saves the written run.yaml at once (one click), under that name.
DOWNLOAD_JS = """(file) => {
  if (!file || !file.url) return;
  const link = document.createElement("a");
  link.href = file.url;
  link.download = "run.yaml";
  document.body.appendChild(link);
  link.click();
  link.remove();
}"""


def wire_slow(
    tab: ConfigTab,
    action: str,
    trigger: Callable,
    pending: tuple[Any, Any],
    work: Callable,
    show: Callable,
    outputs: list,
    api_name: str,
    extra_inputs: list | None = None,
) -> None:
    """An action that waits: say it is pending at once, compute its answer for the form as it was, then show the
    answer only if the form still holds those values (the answer holder travels back in as the first input)."""
    holders = [tab.answers[action], tab.stamps[action]]
    quiet = {"show_progress": "hidden", "api_visibility": "private"}
    # Callable by API clients by name, but not in the documented API (ui/api.py) nor among the MCP tools.
    trigger(lambda: pending[1], None, pending[0], queue=False, **quiet).then(
        work,
        extra_inputs or None,
        holders,
        inputs_kwargs=tab.form,
        api_name=api_name,
        api_visibility="undocumented",
        show_progress="hidden",
    ).then(show, holders, outputs, inputs_kwargs=tab.form, **quiet)


def wire(tab: ConfigTab) -> None:
    form, problems = tab.form, tab.error_outputs
    inputs = tab.inputs
    quiet = {"show_progress": "hidden", "api_visibility": "undocumented", "queue": False}
    wire_slow(
        tab,
        "check",
        tab.check_btn.click,
        (tab.summary, "⏳ Checking the model and data as Start will…"),
        tab.verify,
        tab.show_verified,
        problems,
        "check",
    )
    for component in tab.fields.values():
        # Check as the user leaves a field or presses Enter in it (typing), or picks a value (dropdowns, checkboxes).
        typed = isinstance(component, (gr.Textbox, gr.Number))
        for trigger in (component.blur, component.submit) if typed else (component.input,):
            trigger(tab.check_quiet, None, [*problems, tab.saved], inputs_kwargs=form, **quiet)
    deciding = {n: tab.fields[n] for n in DECIDING_FIELDS}
    for name in DECIDING_FIELDS:  # also on programmatic changes: reset, YAML upload, a reload, Memory's Apply
        tab.fields[name].change(
            tab.visibility,
            None,
            [tab.cells[n] for n in FIELD_NAMES],
            inputs_kwargs=deciding,
            queue=False,
            show_progress="hidden",
            api_visibility="private",
        )
    tab.fields["trust_remote_code"].input(
        tab.remote_code_warning, tab.fields["trust_remote_code"], None, api_visibility="undocumented"
    )
    tab.reset_btn.click(tab.reset, None, inputs + problems, api_visibility="undocumented")
    wire_slow(
        tab,
        "preview",
        tab.preview_btn.click,
        (tab.preview, "<p>⏳ Reading the data and the model's tokenizer…</p>"),
        tab.make_preview,
        tab.show_preview_answer,
        [tab.preview, *problems],
        "preview_data",
    )
    tab.save_yaml.click(
        tab.save, None, [tab.yaml_file, *problems], inputs_kwargs=form, api_visibility="undocumented"
    ).then(None, tab.yaml_file, None, js=DOWNLOAD_JS)
    tab.upload_yaml.upload(tab.load, tab.upload_yaml, inputs + problems, api_visibility="undocumented")
    tab.upload_data.upload(
        tab.use_data_file,
        tab.upload_data,
        [tab.fields["dataset"], tab.errors["dataset"], tab.summary],
        api_visibility="undocumented",
    )
    wire_slow(
        tab,
        "commands",
        tab.command_btn.click,
        (tab.summary, "⏳ Building the commands…"),
        tab.make_commands,
        tab.show_commands_answer,
        [tab.commands, *problems],
        "commands",
        extra_inputs=[tab.command_gpus, tab.command_nodes],
    )
