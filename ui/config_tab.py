"""Configure tab: every `TrainConfig` field, grouped, with its help text and its error beside it; data preview;
YAML upload / download; "Show command".

The field components built here are the one form the whole app shares: Memory reads and writes some of them, Train
starts a run from them, Chat uses their model as the base. Handlers take the form as `*values` in `FIELD_NAMES` order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from finetune.config import FIELD_NAMES, FIELDS, MAX_YAML_BYTES, field_groups
from finetune.errors import UserError
from finetune.studio import Studio
from ui.formatting import one_line, plain, preview_html, size

YAML_LIMIT_BYTES = MAX_YAML_BYTES  # the backend parser's own bound: a larger file is not read at all
DATA_LIMIT_BYTES = 200 * 1024**2
DATA_TYPES = (".jsonl", ".json", ".csv", ".parquet")  # finetune.data.FILE_TYPES (not imported: it pulls in datasets)
OPEN_GROUPS = ("Model", "Data", "Method")
COMMAND_TITLES = {
    "single": "one GPU (or the CPU)",
    "torchrun": "several GPUs on this machine (torchrun)",
    "deepspeed": "several GPUs on this machine (deepspeed launcher)",
    "multinode": "several machines",
    "multinode_torchrun": "several machines with torchrun (run on every node with its NODE_RANK)",
}


# ----------------------------------------------------------------------------------------------- the form
def kind_of(name: str) -> str:
    f = FIELDS[name]
    return f.type if isinstance(f.type, str) else f.type.__name__


def label_of(name: str) -> str:
    return name


def help_of(name: str) -> str:
    return FIELDS[name].metadata["help"].replace("`", "")


def make_field(name: str, value: Any, prefix: str = "cfg", note: str | None = None) -> gr.components.Component:
    """The component for one config field: checkbox, dropdown, number or textbox, with the help text as info.

    Numbers carry no minimum/maximum: the config validates them, so a bad value gets our one-line error beside the
    field instead of a generic one. `note` replaces the help text (what a public app allows); a note on a checkbox
    also locks it (the backend refuses the value anyway).
    """
    meta, kind = FIELDS[name].metadata, kind_of(name)
    common = {"label": label_of(name), "info": note or help_of(name), "elem_id": f"{prefix}-{name}"}
    if note and kind == "bool":
        common["interactive"] = False
    if kind == "bool":
        return gr.Checkbox(value=bool(value), **common)
    if meta.get("choices"):
        return gr.Dropdown(choices=list(meta["choices"]), value=value, **common)
    if kind == "int":
        return gr.Number(value=value, precision=0, **common)
    if kind == "float":
        return gr.Number(value=value, **common)
    return gr.Textbox(value=value, **common)


def form_values(values: tuple | list) -> dict[str, Any]:
    """The form as a dict; blank numbers become None (the config then says what is allowed)."""
    return dict(zip(FIELD_NAMES, values, strict=True))


def public_notes(studio: Studio) -> dict[str, str]:
    """{field: what this public app allows}, shown instead of the help text; empty for the local app."""
    policy = getattr(studio, "policy", None)
    if policy is None or not policy.public:
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
    names = ", ".join(f"`{n}`" for n in problems)
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
    commands: Any = None
    saved: Any = None  # gr.BrowserState (made by the app, outside the tabs): a page reload keeps the settings

    # ----- what other tabs wire to
    @property
    def inputs(self) -> list:
        """The form, in FIELD_NAMES order."""
        return [self.fields[n] for n in FIELD_NAMES]

    @property
    def error_outputs(self) -> list:
        """Where problems are shown: each field's error line, the group accordions (opened on error), the summary."""
        return [self.errors[n] for n in FIELD_NAMES] + list(self.groups.values()) + [self.summary]

    def problem_updates(self, problems: dict[str, str], ok_text: str = "") -> list:
        """Updates for `error_outputs`: errors beside their fields, groups with an error opened, a summary line."""
        updates = [error_update(problems.get(n)) for n in FIELD_NAMES]
        for fields_in_group in field_groups().values():
            bad = any(n in problems for n in fields_in_group)
            updates.append(gr.update(open=True) if bad else gr.update())
        updates.append(summary_text(problems) or ok_text)
        return updates

    # ----- handlers (plain functions of the form values; tests call them directly)
    def check(self, *values: Any) -> list:
        """Check settings: every check Start makes before a run exists (the data file reads, output_dir is free,
        ...), so ✓ here means Start will not refuse these settings."""
        _, problems = self.studio.verify(form_values(values))
        return self.problem_updates(problems, ok_text="✓ All settings are valid." if not problems else "")

    def check_quiet(self, *values: Any) -> list:
        """As `check`, without the "all valid" line (runs after each edit); also returns the form to keep in the
        browser's storage."""
        form = form_values(values)
        _, problems = self.studio.check(form)
        return [*self.problem_updates(problems), form]

    def restore(self, saved: dict[str, Any] | None) -> list:
        """On page load: the settings kept in this browser (known fields only), else no change."""
        saved = saved if isinstance(saved, dict) else {}
        return [saved[n] if n in saved else gr.skip() for n in FIELD_NAMES]

    def reset(self) -> list:
        defaults = self.studio.default_values()
        return [defaults[n] for n in FIELD_NAMES] + self.problem_updates({})

    def show_preview(self, *values: Any) -> list:
        """[preview HTML, *error updates]: the first examples as the model sees them."""
        form = form_values(values)
        _, problems = self.studio.check(form)
        if problems:
            return ["", *self.problem_updates(problems)]
        try:
            preview = self.studio.preview_data(form)
        except UserError as exc:
            field_name = getattr(exc, "field", None)
            problems = {field_name if field_name in FIELDS else "dataset": str(exc)}
            return ["", *self.problem_updates(problems)]
        except Exception as exc:  # a tokenizer or file that fails in an unforeseen way: one line
            return ["", *self.problem_updates({"dataset": f"dataset: cannot preview: {one_line(exc)}"})]
        return [preview_html(preview), *self.problem_updates({})]

    def save(self, *values: Any) -> list:
        """[file update, *error updates]: the form as a YAML file the browser downloads (no folder per download)."""
        config, problems = self.studio.check(form_values(values))
        if config is None:
            return [gr.update(value=None, visible=False), *self.problem_updates(problems)]
        try:
            path = self.studio.save_yaml(config)
        except OSError as exc:
            warn(f"Cannot write the YAML file: {one_line(exc)}")
            return [gr.update(value=None, visible=False), *self.problem_updates({})]
        return [
            gr.update(value=str(path), visible=True),
            *self.problem_updates({}, ok_text=f"Your settings are ready to download as `{path.name}`."),
        ]

    def load(self, file: Any, *values: Any) -> list:
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
            field_name = getattr(exc, "field", None)
            return keep + self.problem_updates({field_name if field_name in FIELDS else "config": str(exc)})
        loaded = config.to_dict()
        return [loaded[n] for n in FIELD_NAMES] + self.problem_updates({}, ok_text=f"Loaded `{path.name}`.")

    def use_data_file(self, file: Any) -> tuple[Any, Any, str]:
        """Keep an uploaded data file (under a name of its own) and point the `dataset` field at it."""
        try:
            path = _upload_path(file, DATA_TYPES, DATA_LIMIT_BYTES, "dataset")
            target = self.studio.add_upload(path, path.name)
        except UserError as exc:
            warn(str(exc))
            return gr.update(), error_update(str(exc)), ""
        except OSError as exc:
            message = f"dataset: cannot keep the uploaded file: {one_line(exc)}"
            warn(message)
            return gr.update(), error_update(message), ""
        return target, error_update(None), f"Using the uploaded file `{plain(path.name)}` as the dataset."

    def show_commands(self, *values: Any) -> list:
        """[code update, *error updates]: the CLI, torchrun and deepspeed commands for these settings."""
        form = form_values(values)
        _, problems = self.studio.check(form)
        if problems:
            return [gr.update(visible=False), *self.problem_updates(problems)]
        try:
            commands = self.studio.commands(form)
        except ImportError:
            text = "# The launch commands are not available in this build (finetune.launch is missing)."
            return [gr.update(value=text, visible=True), *self.problem_updates({})]
        except UserError as exc:
            field_name = getattr(exc, "field", None)
            problem = {field_name if field_name in FIELDS else "config": str(exc)}
            return [gr.update(visible=False), *self.problem_updates(problem)]
        except Exception as exc:
            warn(f"Cannot build the commands: {one_line(exc)}")
            return [gr.update(visible=False), *self.problem_updates({})]
        intro = "# Save these settings with 'Download YAML' as run.yaml, then run one of:"
        text = "\n\n".join([intro] + [f"# {COMMAND_TITLES.get(k, k)}\n{c}" for k, c in commands.items()])
        return [gr.update(value=text, visible=True), *self.problem_updates({})]

    def remote_code_warning(self, enabled: bool) -> None:
        if enabled:
            gr.Warning(
                "trust_remote_code is on: the model repository's own Python code will run on this machine. "
                "Only use it with repositories you trust."
            )


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
    gr.Markdown(
        "Every setting of a run, with what it does. **The defaults work as they are**: the embedded SmolLM2 model "
        "learns to answer like a pirate from the bundled dataset in a few minutes on a CPU. The grey line under "
        "each field says what it does; a problem with a value appears in red right under its field."
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
    tab.yaml_file = gr.File(label="Your settings as YAML", visible=False, elem_id="cfg-yaml-file", interactive=False)
    tab.commands = gr.Code(
        label="Run the same settings from a terminal",
        language="shell",
        visible=False,
        elem_id="cfg-commands",
        interactive=False,
    )
    for group, names in field_groups().items():
        with gr.Accordion(group, open=group in OPEN_GROUPS, elem_id=f"cfg-group-{_slug(group)}") as acc:
            tab.groups[group] = acc
            for row in _chunks(names, 3):
                with gr.Row(equal_height=False):
                    for name in row:
                        with gr.Column(min_width=260):
                            tab.fields[name] = make_field(name, defaults[name], note=notes.get(name))
                            tab.errors[name] = field_error_md(name)
            if group == "Data":
                with gr.Row():
                    tab.upload_data = gr.UploadButton(
                        "Upload a data file (.jsonl, .json, .csv, .parquet)",
                        file_types=list(DATA_TYPES),
                        elem_id="cfg-upload-data",
                        size="sm",
                        scale=0,
                        min_width=320,
                    )
                tab.preview = gr.HTML("", elem_id="cfg-preview-box")
    return tab


def _chunks(items: list, n: int) -> list[list]:
    return [items[i : i + n] for i in range(0, len(items), n)]


def _slug(text: str) -> str:
    return "".join(c.lower() if c.isalnum() else "-" for c in text).strip("-")


# ----------------------------------------------------------------------------------------------- events
def wire(tab: ConfigTab) -> None:
    form, problems = tab.inputs, tab.error_outputs
    quiet = {"show_progress": "hidden", "api_visibility": "undocumented", "queue": False}
    tab.check_btn.click(tab.check, form, problems, api_name="check")
    for component in tab.fields.values():
        # Check as the user leaves a field or presses Enter in it (typing), or picks a value (dropdowns, checkboxes).
        typed = isinstance(component, (gr.Textbox, gr.Number))
        for trigger in (component.blur, component.submit) if typed else (component.input,):
            trigger(tab.check_quiet, form, [*problems, tab.saved], **quiet)
    tab.fields["trust_remote_code"].input(
        tab.remote_code_warning, tab.fields["trust_remote_code"], None, api_visibility="undocumented"
    )
    tab.reset_btn.click(tab.reset, None, form + problems, api_visibility="undocumented")
    tab.preview_btn.click(tab.show_preview, form, [tab.preview, *problems], api_name="preview_data")
    tab.save_yaml.click(tab.save, form, [tab.yaml_file, *problems], api_visibility="undocumented")
    tab.upload_yaml.upload(tab.load, [tab.upload_yaml, *form], form + problems, api_visibility="undocumented")
    tab.upload_data.upload(
        tab.use_data_file,
        tab.upload_data,
        [tab.fields["dataset"], tab.errors["dataset"], tab.summary],
        api_visibility="undocumented",
    )
    tab.command_btn.click(tab.show_commands, form, [tab.commands, *problems], api_name="commands")
