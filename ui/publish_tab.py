"""Publish tab: push a finished run's adapter (or the merged model) to the Hugging Face Hub with a model card.

The token is the visitor's own: one pasted here (used for this one push and cleared from the page afterwards; never
stored or shown), else their Hugging Face sign-in on a Space (gradio's OAuth: `gr.OAuthToken`, or an API client's
`Client(..., oauth_token=...)`). The server's own token is used only where the backend's access policy lends it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from finetune.errors import UserError
from finetune.studio import Studio
from ui.config_tab import warn
from ui.formatting import plain, run_title
from ui.visitor import per_visitor

NO_GGUF = "no"  # the GGUF choice that pushes none


@dataclass
class PublishTab:
    studio: Studio
    run: Any = None
    repo_id: Any = None
    token: Any = None
    private: Any = None
    merged: Any = None
    gguf: Any = None
    push_btn: Any = None
    result: Any = None
    export_format: Any = None
    export_quant: Any = None
    export_btn: Any = None
    export_result: Any = None
    export_files: Any = None  # the exported files, to download (on a Space the export folder is out of reach)

    @per_visitor
    def runs(self, current: str | None = None, request: gr.Request | None = None) -> dict:
        """Finished runs first (they can be pushed), newest first."""
        runs = sorted(self.studio.runs(), key=lambda r: r.status != "completed")  # stable: newest first within each
        choices = [(f"{run_title(r)} · {r.status} · {r.run_id}", r.run_id) for r in runs]
        ids = [v for _, v in choices]
        return gr.update(choices=choices, value=current if current in ids else (ids[0] if ids else None))

    @per_visitor
    def push(
        self,
        run_id: str | None,
        repo_id: str,
        token: str,
        private: bool,
        merged: bool,
        oauth_token: gr.OAuthToken | None = None,
        gguf: str = NO_GGUF,
        request: gr.Request | None = None,
    ) -> list:
        """[result message, token box]: the token box is emptied whatever happens. A pasted token wins over the
        Hugging Face sign-in (`oauth_token`, filled in by gradio on a Space)."""
        if not run_id:
            return ["⚠ Pick a finished run first (train one in the *Train* tab).", ""]
        own = (token or "").strip() or (getattr(oauth_token, "token", None) or "").strip() or None
        try:
            also = None if not gguf or gguf == NO_GGUF else gguf
            url = self.studio.push(run_id, (repo_id or "").strip(), own, bool(private), bool(merged), gguf=also)
        except UserError as exc:
            warn(str(exc))
            return [f"⚠ {plain(str(exc))}", ""]
        except Exception as exc:  # the message of an unforeseen error could quote the request: name the type only
            return [f"⚠ The push failed ({type(exc).__name__}); nothing was published.", ""]
        what = ("merged model" if merged else "adapter") + (f" and a {also} GGUF" if also else "")
        return [f"✓ Pushed the {what} of `{run_id}` to [{plain(url)}]({plain(url)}).", ""]

    @per_visitor
    def export(
        self,
        run_id: str | None,
        fmt: str,
        quant: str,
        progress: gr.Progress = gr.Progress(),  # noqa: B008
        request: gr.Request | None = None,
    ) -> list:
        """[status line, download files]: what was written in the run's exports/ folder and its size, and the files
        to download (the .gguf and its Modelfile, or the merged model's files). While it runs, gradio's progress bar
        shows each stage (merging, tokenizer, weights, Modelfile)."""
        none = gr.update(value=None, visible=False)
        if not run_id:
            return ["⚠ Pick a finished run first (train one in the *Train* tab).", none]
        try:
            stages = lambda message: progress(None, desc=message)  # noqa: E731
            result = self.studio.export(run_id, fmt, quant if fmt.startswith("gguf") else None, progress=stages)
        except UserError as exc:
            warn(str(exc))
            return [f"⚠ {plain(str(exc))}", none]
        except Exception as exc:  # never a server path or traceback on the page
            return [f"⚠ The export failed ({type(exc).__name__}); nothing was written.", none]
        written = f"exports/{result.folder.name}/" + (result.main.name if result.main != result.folder else "")
        extra = {
            "gguf": " with an Ollama `Modelfile` beside it",
            "gguf-lora": " (load it over a GGUF of the base model: `llama-cli -m BASE.gguf --lora FILE`)",
        }.get(fmt, "")
        warning = "".join(f"\n\n⚠ {plain(w)}" for w in result.warnings)
        files = download_files(result)
        where = " Download it below." if files else ""
        status = f"✓ Wrote `{written}` ({result.size}) in run `{run_id}`{extra}.{where}{warning}"
        return [status, gr.update(value=files or None, visible=bool(files))]


def download_files(result: Any) -> list[str]:
    """The exported files to offer for download, served from the export folder itself (no copy: a GGUF can be
    many GB): the folder is made one of gradio's static paths, this export only."""
    files = sorted(str(p) for p in result.folder.iterdir() if p.is_file())
    if files:
        gr.set_static_paths([str(result.folder)])
    return files


def token_placeholder(studio: Studio) -> str:
    """What an empty token field means in this app."""
    policy = getattr(studio, "policy", None)
    if policy is None or policy.lend_server_token:
        return "hf_… (or leave empty to use the HF_TOKEN environment variable)"
    if policy.space:
        return "hf_… (or leave empty to use your Hugging Face sign-in)"
    return "hf_… (required: this app does not lend the server's token)"


def build(studio: Studio) -> PublishTab:
    tab = PublishTab(studio)
    gr.Markdown(
        "Share a finished run on the Hugging Face Hub: its LoRA adapter (small) or the base model with the adapter "
        "merged in, plus a model card with the settings, loss curve and sample answers so anyone can reproduce and "
        "use it. You need a Hub token with *write* access (huggingface.co/settings/tokens)"
        + (
            ", or sign in with Hugging Face at the top of the page."
            if getattr(getattr(studio, "policy", None), "space", False)
            else "."
        )
    )
    with gr.Row():
        tab.run = gr.Dropdown(
            choices=[],
            allow_custom_value=True,  # an API client may name any run by its id; the backend confines it
            label="Run",
            elem_id="pub-run",
            scale=2,
        )
        tab.repo_id = gr.Textbox(
            label="Repository",
            placeholder="your-name/smollm2-pirate-lora",
            elem_id="pub-repo",
            scale=2,
            info="owner/name; created if it does not exist.",
        )
    with gr.Row():
        tab.token = gr.Textbox(
            label="Hub token",
            type="password",
            elem_id="pub-token",
            scale=2,
            placeholder=token_placeholder(studio),
            info="Used for this push only; never saved, logged or shown.",
        )
        with gr.Column(scale=1):
            tab.private = gr.Checkbox(value=True, label="Private repository", elem_id="pub-private")
            tab.merged = gr.Checkbox(
                value=False, label="Push the merged model instead of the adapter", elem_id="pub-merged"
            )
            tab.gguf = gr.Dropdown(
                choices=[NO_GGUF, "f16", "q8_0"],
                value=NO_GGUF,
                label="Also push a GGUF (llama.cpp, Ollama)",
                elem_id="pub-gguf",
            )
    tab.push_btn = gr.Button("Push to the Hub", variant="primary", elem_id="pub-push")
    tab.result = gr.Markdown("", elem_id="pub-result")
    with gr.Accordion("Export to run it anywhere (llama.cpp, Ollama, LM Studio, vLLM)", open=False):
        gr.Markdown(
            "Writes into the run's `exports/` folder: **merged** is a standalone Transformers model (adapter merged "
            "in, for vLLM or `from_pretrained`); **gguf** is one file with the weights, tokenizer and chat template "
            "for llama.cpp / LM Studio, with an Ollama `Modelfile` beside it; **gguf-lora** is the LoRA adapter alone "
            "as a llama.cpp LoRA file, applied over a GGUF of the base model (`llama-cli --lora`)."
        )
        with gr.Row():
            tab.export_format = gr.Radio(
                list(Studio.export_formats()), value="gguf", label="Format", elem_id="pub-export-format"
            )
            tab.export_quant = gr.Radio(
                ["f16", "q8_0"],
                value="q8_0",
                label="GGUF weights",
                elem_id="pub-export-quant",
                info="q8_0: about half the size of f16, nearly the same answers.",
            )
        tab.export_btn = gr.Button("Export", elem_id="pub-export")
        tab.export_result = gr.Markdown("", elem_id="pub-export-result")
        tab.export_files = gr.File(
            label="Download the export",
            file_count="multiple",
            interactive=False,
            visible=False,
            elem_id="pub-export-files",
        )
    return tab


def wire(tab: PublishTab, demo: gr.Blocks, publish_tab: Any) -> None:
    tab.push_btn.click(
        tab.push,
        [tab.run, tab.repo_id, tab.token, tab.private, tab.merged, tab.gguf],
        [tab.result, tab.token],
        api_visibility="private",  # API clients use /publish (ui/api.py)
    )
    tab.export_btn.click(
        tab.export,
        [tab.run, tab.export_format, tab.export_quant],
        [tab.export_result, tab.export_files],
        api_visibility="private",  # API clients use /export (ui/api.py)
    )
    for trigger in (demo.load, publish_tab.select):
        trigger(tab.runs, tab.run, tab.run, api_visibility="undocumented", show_progress="hidden")
