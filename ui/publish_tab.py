"""Publish tab: push a finished run's adapter (or the merged model) to the Hugging Face Hub with a model card.

The token is used for this one push and cleared from the page afterwards; it is never stored or shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from finetune.errors import UserError
from ui.config_tab import warn
from ui.formatting import plain


@dataclass
class PublishTab:
    studio: Any
    run: Any = None
    repo_id: Any = None
    token: Any = None
    private: Any = None
    merged: Any = None
    push_btn: Any = None
    result: Any = None

    def runs(self, current: str | None = None) -> dict:
        """Finished runs first (they can be pushed), newest first."""
        runs = self.studio.runs()
        runs = sorted(runs, key=lambda r: r.get("status") != "completed")  # stable: newest first within each
        choices = [(f"{r['run_id']} · {r.get('status')}", r["run_id"]) for r in runs]
        ids = [v for _, v in choices]
        return gr.update(choices=choices, value=current if current in ids else (ids[0] if ids else None))

    def push(self, run_id: str | None, repo_id: str, token: str, private: bool, merged: bool) -> list:
        """[result message, token box]: the token box is emptied whatever happens."""
        if not run_id:
            return ["⚠ Pick a finished run first (train one in the *Train* tab).", ""]
        try:
            url = self.studio.push(
                run_id, (repo_id or "").strip(), (token or "").strip() or None, bool(private), bool(merged)
            )
        except UserError as exc:
            warn(str(exc))
            return [f"⚠ {plain(str(exc))}", ""]
        except Exception as exc:  # the message of an unforeseen error could quote the request: name the type only
            return [f"⚠ The push failed ({type(exc).__name__}); nothing was published.", ""]
        what = "merged model" if merged else "adapter"
        return [f"✓ Pushed the {what} of `{run_id}` to [{plain(url)}]({plain(url)}).", ""]


def build(studio: Any) -> PublishTab:
    tab = PublishTab(studio)
    gr.Markdown(
        "Share a finished run on the Hugging Face Hub: its LoRA adapter (small) or the base model with the adapter "
        "merged in, plus a model card with the settings, loss curve and sample answers so anyone can reproduce and "
        "use it. You need a Hub token with *write* access (huggingface.co/settings/tokens)."
    )
    with gr.Row():
        tab.run = gr.Dropdown(choices=[], label="Run", elem_id="pub-run", scale=2)
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
            placeholder="hf_… (or leave empty to use the HF_TOKEN environment variable)",
            info="Used for this push only; never saved, logged or shown.",
        )
        with gr.Column(scale=1):
            tab.private = gr.Checkbox(value=True, label="Private repository", elem_id="pub-private")
            tab.merged = gr.Checkbox(
                value=False, label="Push the merged model instead of the adapter", elem_id="pub-merged"
            )
    tab.push_btn = gr.Button("Push to the Hub", variant="primary", elem_id="pub-push")
    tab.result = gr.Markdown("", elem_id="pub-result")
    return tab


def wire(tab: PublishTab, demo: gr.Blocks, publish_tab: Any) -> None:
    tab.push_btn.click(
        tab.push,
        [tab.run, tab.repo_id, tab.token, tab.private, tab.merged],
        [tab.result, tab.token],
        api_visibility="private",
    )
    for trigger in (demo.load, publish_tab.select):
        trigger(tab.runs, tab.run, tab.run, api_visibility="undocumented", show_progress="hidden")
