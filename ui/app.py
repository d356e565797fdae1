"""The whole page: a title, one line on how it works, and seven tabs (Start, Memory, Configure, Train, Chat, Evaluate,
Publish).

`build_app(studio)` only builds the Blocks (tests use it without launching); `launch(...)` starts the server.
Each tab module builds its components, then its `wire` connects its events; the Configure form is the one form the
tabs share. The page's events are the page's own; API clients (and MCP clients, with `--mcp`) use the documented
endpoints of ui/api.py, which act through the same studio for the same visitor.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from finetune.studio import Studio
from ui import api as api_module
from ui import chat_tab, config_tab, evaluate_tab, memory_tab, publish_tab, start_tab, train_tab
from ui.visitor import for_visitor

TITLE = "Finetune Studio"
TAB_NAMES = ("Start", "Memory", "Configure", "Train", "Chat", "Evaluate", "Publish")
HEADER = (
    "# Finetune Studio\n"
    "Fine-tune a language model in your browser. **How it works:** on **Start**, pick a model, data, a goal and "
    "your hardware, and take the configuration proposed (the defaults work: a small model learns to talk like a "
    "pirate) → **Train** and watch the loss fall → **Chat** with the tuned model beside the original → **Evaluate** "
    "it against the original on held-out data → **Publish** it to the Hugging Face Hub. **Memory** and "
    "**Configure** hold every setting, for experts."
)
UPLOAD_SLACK_BYTES = 1024**2  # gradio refuses uploads this much past the operator's limit (the backend says why below)
SPACE_NOTE = (
    "Sign in with Hugging Face to publish to your own repositories: this app uses your sign-in, never the "
    "server's token."
)
PUBLIC_NOTE = (
    "This app is reachable from other machines: your runs and uploads are yours alone (sign in to upload and train). "
    "Models and data come from the Hub, the bundled set or files you upload here; files on the server and "
    "trust_remote_code are off unless the operator turned them on."
)

CSS = """
.fs-field-error, .fs-field-error p { color: #dc2626 !important; font-size: 0.9em; margin-top: -4px; }
.fs-summary p { color: #b91c1c; font-weight: 600; }
.fs-problem p { color: #b91c1c; }
.fs-note p { color: #6b7280; font-size: 0.9em; }
#fs-login { max-width: 320px; }
.fs-progress { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 10px 14px; }
.fs-progress-head { display: flex; justify-content: space-between; gap: 12px; flex-wrap: wrap; }
.fs-status { font-weight: 700; font-size: 1.1em; }
.fs-run { color: var(--body-text-color-subdued); font-size: 0.9em; }
.fs-bar { height: 14px; background: var(--background-fill-secondary); border-radius: 7px; overflow: hidden;
          margin: 8px 0; }
.fs-bar-fill { height: 100%; border-radius: 7px; transition: width 0.4s ease; }
.fs-bar-loading { opacity: 0.35; animation: fs-pulse 1.2s ease-in-out infinite; }
@keyframes fs-pulse { 50% { opacity: 0.1; } }
.fs-facts { font-variant-numeric: tabular-nums; }
.fs-message { color: var(--body-text-color-subdued); font-size: 0.9em; margin-top: 4px; }
.fs-preview .fs-example { border: 1px solid var(--border-color-primary); border-radius: 6px; margin: 8px 0;
                          padding: 6px 10px; }
.fs-example-head { font-size: 0.85em; color: var(--body-text-color-subdued); }
.fs-example-text { white-space: pre-wrap; font-size: 0.9em; margin: 4px 0; background: none; }
.fs-trained { background: #fde68a; color: #111827; border-radius: 3px; }
.fs-masked { color: #9ca3af; }
.fs-example-row { display: flex; gap: 10px; align-items: flex-start; }
.fs-thumbs { display: flex; flex-wrap: wrap; gap: 6px; flex: 0 0 auto; max-width: 40%; }
.fs-thumb { margin: 0; text-align: center; font-size: 0.75em; color: var(--body-text-color-subdued); }
.fs-thumb img { width: 72px; height: 72px; object-fit: contain; border: 1px solid var(--border-color-primary);
  border-radius: 4px; background: #fff; }
.fs-plan { border-left: 4px solid var(--color-accent); padding-left: 10px; }
.fs-prefs { font-variant-numeric: tabular-nums; margin: 6px 0; }
/* Narrow screens: tables scroll sideways instead of breaking words letter by letter. */
.fs-table .table-wrap, .fs-table .table-container { overflow-x: auto; }
.fs-table td, .fs-table th { word-break: normal !important; overflow-wrap: normal !important; }
.fs-table.fs-nowrap td { white-space: nowrap; }
@media (max-width: 640px) {
  #fs-tabs button[role="tab"] { padding-left: 8px; padding-right: 8px; }
}
"""


@dataclass
class AppUI:
    """The tabs' component bundles and handlers (tests call the handlers directly)."""

    studio: Studio
    memory: memory_tab.MemoryTab
    config: config_tab.ConfigTab
    train: train_tab.TrainTab
    chat: chat_tab.ChatTab
    publish: publish_tab.PublishTab
    tabs: dict[str, Any]
    login: Any = None  # the "Sign in with Hugging Face" button (on a Space only)
    start: start_tab.StartTab | None = None  # the first screen
    api: api_module.StudioAPI | None = None  # the documented endpoints
    evaluate: evaluate_tab.EvaluateTab | None = None


def build_app(studio: Studio | None = None) -> gr.Blocks:
    """The Blocks for one backend `Studio` (a default one when not given). `demo.studio_ui` holds the tabs."""
    if studio is None:
        studio = Studio()
    tabs: dict[str, Any] = {}
    policy = getattr(studio, "policy", None)
    space, public = bool(getattr(policy, "space", False)), bool(getattr(policy, "public", False))
    login = None
    # gradio's own copies of uploads and downloads are deleted after an hour (and all of them at a restart)
    with gr.Blocks(title=TITLE, delete_cache=(3600, 3600)) as demo:
        api = api_module.build(studio)  # first: the documented endpoints take their names before the page's events
        gr.Markdown(HEADER, elem_id="fs-header")
        if space:
            # Gradio's Hugging Face OAuth: handlers that take a gr.OAuthToken get the signed-in visitor's token.
            with gr.Row():
                login = gr.LoginButton(elem_id="fs-login", scale=0, min_width=260)
                gr.Markdown(SPACE_NOTE, elem_classes=["fs-note"])
        if public:
            gr.Markdown(PUBLIC_NOTE, elem_id="fs-public-note", elem_classes=["fs-note"])
        # The form as kept in this browser; outside the tabs, so the page reads it on load whichever tab is open.
        saved = gr.BrowserState({}, storage_key="finetune-studio-form")
        # After a reload: a run that is training is named here, with a way to it (the page opens on Start).
        with gr.Row(visible=False, elem_id="fs-running-row", equal_height=True) as running_row:
            running = gr.Markdown("", elem_id="fs-running")
            follow_btn = gr.Button("Follow it on Train", elem_id="fs-running-open", scale=0, min_width=180)
        # "wrap": on a narrow screen every tab stays in view (the default "menu" hides the last ones behind "⋯")
        with gr.Tabs(elem_id="fs-tabs", selected="start", overflow_behavior="wrap") as tab_bar:
            with gr.Tab("Start", id="start", elem_id="tab-start") as tabs["Start"]:
                start = start_tab.build(studio)
            with gr.Tab("Memory", id="memory", elem_id="tab-memory") as tabs["Memory"]:
                memory = memory_tab.build(studio)
            with gr.Tab("Configure", id="configure", elem_id="tab-configure") as tabs["Configure"]:
                config = config_tab.build(studio)
            with gr.Tab("Train", id="train", elem_id="tab-train") as tabs["Train"]:
                train = train_tab.build(studio)
            with gr.Tab("Chat", id="chat", elem_id="tab-chat") as tabs["Chat"]:
                chat = chat_tab.build(studio)
            with gr.Tab("Evaluate", id="evaluate", elem_id="tab-evaluate") as tabs["Evaluate"]:
                evaluate = evaluate_tab.build(studio)
            with gr.Tab("Publish", id="publish", elem_id="tab-publish") as tabs["Publish"]:
                publish = publish_tab.build(studio)
        config.saved = saved
        config_tab.wire(config)
        memory_tab.wire(memory, config, demo)
        train_tab.wire(train, config, demo, tabs["Train"])
        chat_tab.wire(chat, config, demo, tabs["Chat"])
        evaluate_tab.wire(evaluate, demo, tabs["Evaluate"])
        publish_tab.wire(publish, demo, tabs["Publish"])
        start_tab.wire(start, config, train, tab_bar, tabs["Start"], demo)
        quiet = {"api_visibility": "private", "show_progress": "hidden"}

        def notice(request: gr.Request) -> list:
            return running_notice(for_visitor(studio, request))  # only a run this visitor may see

        def follow(request: gr.Request) -> list:
            return follow_running(for_visitor(studio, request))

        demo.load(notice, None, [running_row, running], **quiet)
        follow_btn.click(follow, None, [tab_bar, train.viewing, train.shown, running_row], queue=False, **quiet)
    demo.studio_ui = AppUI(studio, memory, config, train, chat, publish, tabs, login, start, api, evaluate)
    return demo


def follow_running(studio: Studio) -> list:
    """[tab bar, Train's viewed run, its shown key, the notice row]: the Train tab, following the run training now."""
    state = studio.state()
    return [gr.Tabs(selected="train"), state.run_id if state else "", None, gr.update(visible=False)]


def running_notice(studio: Studio) -> list:
    """[row, text]: the run training now (this process's or another's), named, shown when the page (re)loads."""
    from ui.formatting import plain, run_title

    state = studio.state()
    if state is None or not state.active:
        return [gr.update(visible=False), ""]
    run = studio.run(state.run_id)
    name = run_title(run) if run is not None else state.run_id
    steps = f" (step {state.step} of {state.max_steps})" if state.max_steps else ""
    owner = f", started by {plain(state.owner)}" if state.owner else ""
    text = f"▶ A run is training: **{plain(name)}**{steps}{owner}. Its progress, loss and Stop are on **Train**."
    return [gr.update(visible=True), text]


def launch(
    demo: gr.Blocks,
    host: str = "127.0.0.1",
    port: int = 7860,
    auth: tuple[str, str] | list[tuple[str, str]] | None = None,
    block: bool = True,
    mcp: bool = False,
    **kwargs: Any,
) -> Any:
    """Start the server with a queue (chat requests wait their turn; status polls never wait behind them); `auth`:
    one (user, password) or a list, each user an identity; `mcp`: also serve the API as MCP tools."""
    demo.queue(default_concurrency_limit=1)
    studio = getattr(getattr(demo, "studio_ui", None), "studio", None)
    upload_limit = 200 * 1024**2
    if studio is not None:  # the Download YAML files live there (only those: it holds nothing else)
        kwargs.setdefault("allowed_paths", [str(Path(studio.downloads_dir).resolve())])
        upload_limit = studio.policy.uploads.file_bytes
    return demo.launch(
        server_name=host,
        server_port=port,
        auth=auth,
        auth_message="Finetune Studio on a shared machine: log in with the user and password you were given."
        if auth
        else None,
        max_file_size=upload_limit + UPLOAD_SLACK_BYTES,
        mcp_server=mcp,
        theme=gr.themes.Soft(primary_hue="orange"),
        css=CSS,
        prevent_thread_lock=not block,
        footer_links=["api", "gradio"],
        **kwargs,
    )
