"""Chat tab: talk to the base model, a finished run's adapter, or the running run's latest checkpoint; optionally
side by side with the base model, the same prompt sent to both. A sequence-classification run is offered as what it
is: a text (or a pair) in, its labels with their probabilities out.

A vision-language model (the form's, or a run of one) also takes a picture beside the message: it is kept among the
visitor's uploads, shown in the conversation, and stands as an `<image>` tag before the message's text (both sides
see it when side by side).

Runs are listed by their readable name (model · method · date), the newest finished run first chosen. Replies stream;
side by side, both replies stream at the same time. The first message to a model loads it (shown as "loading" in the
reply bubble); requests queue, one at a time.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from finetune.errors import UserError
from finetune.studio import BASE, BASE_OF, IMAGE_TAG, GenerationSettings, Studio
from ui.config_tab import ConfigTab, warn
from ui.formatting import STATUS_WORDS, one_line, plain, run_title
from ui.visitor import per_visitor

# Markers other code relies on (bench/ui_latency.py tells the loading bubble and errors from reply text by them).
LOADING = "⏳ Loading the model (first use of it takes a few seconds)…"
ERROR_PREFIX = "⚠️ "
EMPTY = "(the model answered with nothing: it ended its reply at once)"


@dataclass
class ChatTab:
    studio: Studio
    config: ConfigTab | None = None
    source: Any = None
    refresh_btn: Any = None
    compare: Any = None
    chatbot: Any = None
    base_chatbot: Any = None
    textbox: Any = None
    send_btn: Any = None
    clear_btn: Any = None
    max_new_tokens: Any = None
    temperature: Any = None
    top_p: Any = None
    system_prompt: Any = None
    chat_area: Any = None
    classify_area: Any = None
    classify_text: Any = None
    classify_pair: Any = None
    classify_btn: Any = None
    classify_result: Any = None
    picked: Any = None  # gr.State: the user chose the model themselves (a refresh keeps their choice)
    image: Any = None  # a picture to send with the next message (vision-language models only)

    @per_visitor
    def sources(self, current: str | None = None, picked: bool = False, request: gr.Request | None = None) -> dict:
        """The source choices by readable name (model · method · date), keeping the current one if it still exists
        and was picked by the user (`picked`) or is a run; else the newest finished run, else the base model."""
        choices = source_choices(self.studio.runs())
        values = [v for _, v in choices]
        if current not in values or (current == BASE and not picked):
            finished = [r.run_id for r in self.studio.runs() if r.final]
            current = finished[0] if finished else (current if current in values else BASE)
        return gr.update(choices=choices, value=current)

    @per_visitor
    def respond(
        self,
        message: str,
        history: list | None,
        base_history: list | None,
        source: str | None,
        compare: bool,
        max_new_tokens: float,
        chat_temperature: float,  # (not `temperature`: the form's GRPO setting reaches this handler by that name)
        top_p: float,
        system_prompt: str,
        chat_image: str | None = None,
        request: gr.Request | None = None,
        **form: Any,
    ) -> Iterator[list]:
        """Stream replies: yields [textbox, chatbot, base chatbot] as the text grows. `chat_image`: a picture's
        file (gradio's upload) sent with this message to a vision-language model."""
        history, base_history = list(history or []), list(base_history or [])
        message = (message or "").strip()
        if not message and not chat_image:
            yield [gr.skip(), gr.skip(), gr.skip()]
            return
        source = source or BASE
        targets = [(history, source, form)]
        if compare and source != BASE:
            # The comparison is with the model this run started from, whatever the form says now.
            targets.append((base_history, BASE_OF + source, form))
        try:  # bounded input: a clear one-line refusal up front, before the message joins the conversation
            settings = GenerationSettings(
                max_new_tokens=_whole(max_new_tokens, 128, "max new tokens"),
                temperature=_number(chat_temperature, 0.0, "temperature"),
                top_p=_number(top_p, 1.0, "top-p"),
                system_prompt=str(system_prompt or "").strip(),
            )
            said = (IMAGE_TAG + "\n" + message if message else IMAGE_TAG) if chat_image else message
            for target, _, _ in targets:
                self.studio.check_chat([*_conversation(target), {"role": "user", "content": said}], settings)
            turn = self._with_image(message, chat_image, source, form)
        except (UserError, OSError) as exc:  # OSError: the picture could not be kept (a full disk)
            line = str(exc) if isinstance(exc, UserError) else f"images: cannot keep the picture: {one_line(exc)}"
            warn(line)
            refusal = {"role": "assistant", "content": ERROR_PREFIX + plain(line)}
            yield [gr.skip(), [*history, refusal], gr.skip()]
            return
        for target, _, _ in targets:
            target.append(turn)
        if len(targets) == 2:
            yield from self._respond_pair(source, history, base_history, settings)
            return
        for target, which, base_values in targets:
            conversation, images = _conversation(target), _images(target)
            target.append({"role": "assistant", "content": LOADING})
            yield ["", [*history], [*base_history]]
            try:
                for text in self.studio.chat(which, conversation, settings, base_values, *([images] if images else [])):
                    target[-1] = {"role": "assistant", "content": text}
                    yield ["", [*history], [*base_history]]
            except UserError as exc:
                warn(str(exc))
                target[-1] = {"role": "assistant", "content": ERROR_PREFIX + plain(str(exc))}
                yield ["", [*history], [*base_history]]
                continue
            except Exception as exc:  # a model that fails to load or generate: one line, never a traceback
                target[-1] = {"role": "assistant", "content": ERROR_PREFIX + plain(one_line(exc))}
                yield ["", [*history], [*base_history]]
                continue
            if not str(target[-1]["content"]).strip() or target[-1]["content"] == LOADING:
                target[-1] = {"role": "assistant", "content": EMPTY}
                yield ["", [*history], [*base_history]]

    def _with_image(self, message: str, image: str | None, source: str, form: dict[str, Any]) -> dict[str, Any]:
        """The user's turn as the chat shows it: the text, after the picture when there is one (kept among this
        visitor's uploads; its `upload:NAME` travels as the picture's alt text). Refused in one line for a model that
        reads text only, or past the upload limits."""
        if not image:
            return {"role": "user", "content": message}
        path = Path(getattr(image, "name", None) or str(image))
        kept = self.studio.add_chat_image(source, form, path, path.name)
        mime = mimetypes.guess_type(path.name)[0] or "image/png"  # the chatbot shows a file as a picture by its type
        picture = {"path": str(path), "mime_type": mime}
        parts: list[dict[str, Any]] = [{"type": "file", "file": picture, "alt_text": kept}]
        if message:
            parts.append({"type": "text", "text": message})
        return {"role": "user", "content": parts}

    @per_visitor
    def image_box(self, source: str | None, request: gr.Request | None = None, **form: Any) -> Any:
        """The picture upload: shown only when the chosen model reads images."""
        return gr.update(visible=self.studio.takes_images(source or BASE, form))

    def _respond_pair(self, source: str, history: list, base_history: list, settings: Any) -> Iterator[list]:
        """Both replies at once, each streaming into its own column as it grows (the same pictures for both)."""
        targets = {"run": history, "base": base_history}
        conversations = {side: _conversation(target) for side, target in targets.items()}
        images = _images(history)
        for target in targets.values():
            target.append({"role": "assistant", "content": LOADING})
        yield ["", [*history], [*base_history]]
        try:
            for side, text, error in self.studio.chat_pair(
                source, conversations["run"], conversations["base"], settings, *([images] if images else [])
            ):
                if error is not None:
                    shown = str(error) if isinstance(error, UserError) else one_line(error)
                    text = ERROR_PREFIX + plain(shown)
                targets[side][-1] = {"role": "assistant", "content": text}
                yield ["", [*history], [*base_history]]
        except UserError as exc:  # refused before either model loaded
            warn(str(exc))
            for target in targets.values():
                target[-1] = {"role": "assistant", "content": ERROR_PREFIX + plain(str(exc))}
        for target in targets.values():
            if not str(target[-1]["content"]).strip() or target[-1]["content"] == LOADING:
                target[-1] = {"role": "assistant", "content": EMPTY}
        yield ["", [*history], [*base_history]]

    @per_visitor
    def mode(self, source: str | None, request: gr.Request | None = None) -> list:
        """[chat area, compare box, classifier area]: a classification run shows the classifier, others the chat."""
        classifier = self.studio.source_kind(source) == "classifier"
        return [gr.update(visible=not classifier), gr.update(visible=not classifier), gr.update(visible=classifier)]

    @per_visitor
    def classify(self, source: str | None, text: str, text_pair: str, request: gr.Request | None = None) -> Any:
        """The labels of a text, most likely first, with their probabilities (a gr.Label value)."""
        try:
            answer = self.studio.classify(source or "", text or "", text_pair or "")
        except UserError as exc:
            warn(str(exc))
            return gr.skip()
        except Exception as exc:  # a model that fails to load: one line, never a traceback
            warn(one_line(exc))
            return gr.skip()
        return {label: score for label, score in answer.scores}

    @per_visitor
    def toggle_compare(self, compare: bool, source: str | None, request: gr.Request | None = None) -> list:
        both = bool(compare) and (source or BASE) != BASE
        names = {value: label for label, value in source_choices(self.studio.runs())}
        return [gr.update(visible=both), gr.update(label=_label(source, both, names.get(source)))]


BASE_LABEL = "Base model: the run's model before tuning"


def source_choices(runs: list[Any]) -> list[tuple[str, str]]:
    """(label, value) for the base model, each finished run and each run's latest checkpoint, by readable name
    (model · method · date; the run's folder name added only where two names would read the same)."""
    usable = [r for r in runs if r.final or r.checkpoint_step is not None]
    titles = [run_title(r) for r in usable]
    choices = [("Base model", BASE)]
    for run, title in zip(usable, titles, strict=True):
        name = f"{title} · {run.run_id}" if titles.count(title) > 1 else title
        status = STATUS_WORDS.get(run.status, (run.status,))[0].lower()
        what = "tuned" if run.final else f"checkpoint {run.checkpoint_step}, {status}"
        choices.append((f"{name} ({what})", run.run_id))
    return choices


def _label(source: str | None, both: bool, name: str | None = None) -> str:
    if (source or BASE) == BASE:
        return "Base model"
    return f"Tuned: {name or source}" if both else f"Chat with {name or source}"


def _number(value: Any, default: float, label: str) -> float:
    try:
        return float(default if value is None or value == "" else value)
    except (TypeError, ValueError):
        raise UserError(f"{label}: not a number", field=label) from None


def _whole(value: Any, default: int, label: str) -> int:
    number = _number(value, default, label)
    if number != number or number in (float("inf"), float("-inf")) or not float(number).is_integer():
        raise UserError(f"{label}: not a whole number", field=label)
    return int(number)


def _conversation(messages: list) -> list[dict[str, str]]:
    """The chat so far as the model reads it: plain-text messages (a picture as an `<image>` tag where it stood),
    without this tab's error and loading bubbles."""
    out = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        text = _text(m.get("content"))
        if m.get("role") == "assistant" and (text.startswith(ERROR_PREFIX) or text == LOADING):
            continue
        out.append({"role": str(m.get("role", "user")), "content": text})
    return out


def _images(messages: list) -> list[str]:
    """The pictures of the chat so far, in order, as the `upload:NAME` values they were kept under (each picture's
    alt text; else its file's name: the backend resolves either among this visitor's uploads only)."""
    found = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) and m.get("role") == "user" else None
        for part in content if isinstance(content, list) else [content]:
            if isinstance(part, dict) and (part.get("type") == "file" or "file" in part):
                alt = str(part.get("alt_text") or "")
                name = Path(str((part.get("file") or {}).get("path") or "")).name
                found.append(alt if alt.startswith("upload:") else "upload:" + name)
    return found


def _text(content: Any) -> str:
    """Chatbot messages may come back as a list of parts; the model needs plain text (a picture: an image tag)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(p) for p in content)
    if isinstance(content, dict) and (content.get("type") == "file" or "file" in content):
        return IMAGE_TAG
    if isinstance(content, dict):
        return str(content.get("text", ""))
    return str(content)


# ----------------------------------------------------------------------------------------------- layout
def build(studio: Studio) -> ChatTab:
    tab = ChatTab(studio)
    gr.Markdown(
        "Talk to a model. **Base model** is the model set in *Configure*, untuned; each finished run adds its tuned "
        "version, and a running run offers its latest checkpoint. Tick *side by side* to send the same message to "
        "the run's model before tuning as well."
    )
    with gr.Row():
        tab.source = gr.Dropdown(
            choices=[("Base model", BASE)],
            value=BASE,
            allow_custom_value=True,  # an API client may name any run by its id; the backend confines it
            label="Model",
            elem_id="chat-source",
            scale=3,
        )
        tab.refresh_btn = gr.Button("Refresh list", elem_id="chat-refresh", scale=0, min_width=130)
        tab.compare = gr.Checkbox(
            value=False, label="Side by side with the base model", elem_id="chat-compare", scale=1
        )
    tab.picked = gr.State(False)
    with gr.Column(elem_id="chat-area") as tab.chat_area:
        _build_chat(tab)
    with gr.Column(visible=False, elem_id="classify-area") as tab.classify_area:
        gr.Markdown("This run is a classifier: it reads a text and answers with a label and how sure it is.")
        with gr.Row():
            tab.classify_text = gr.Textbox(label="Text", lines=3, elem_id="classify-text", scale=3)
            tab.classify_pair = gr.Textbox(
                label="Second text (pair tasks only)", lines=3, elem_id="classify-pair", scale=2
            )
        tab.classify_btn = gr.Button("Classify", variant="primary", elem_id="classify-btn")
        tab.classify_result = gr.Label(label="Labels", num_top_classes=5, elem_id="classify-result")
    return tab


def _build_chat(tab: ChatTab) -> None:
    with gr.Row(equal_height=True):
        tab.chatbot = gr.Chatbot(
            label="Base model",
            elem_id="chat-main",
            height=380,
            buttons=["copy"],
            placeholder="Ask anything, e.g. *What is the capital of Japan?*",
        )
        tab.base_chatbot = gr.Chatbot(
            label=BASE_LABEL, elem_id="chat-base", height=380, visible=False, buttons=["copy"]
        )
    with gr.Row():
        tab.image = gr.Image(
            type="filepath",
            sources=["upload", "clipboard"],
            label="Picture (sent with the message)",
            height=120,
            scale=1,
            min_width=140,
            visible=False,
            elem_id="chat-image",
        )
        tab.textbox = gr.Textbox(
            placeholder="Type a message and press Enter",
            show_label=False,
            scale=5,
            elem_id="chat-input",
            autofocus=False,
        )
        tab.send_btn = gr.Button("Send", variant="primary", elem_id="chat-send", scale=0, min_width=100)
        tab.clear_btn = gr.Button("Clear", elem_id="chat-clear", scale=0, min_width=100)
    with gr.Accordion("Generation settings", open=False, elem_id="chat-settings"):
        with gr.Row():
            tab.max_new_tokens = gr.Slider(
                1, 1024, value=128, step=1, label="max new tokens", info="Longest reply, in tokens."
            )
            tab.temperature = gr.Slider(
                0.0,
                2.0,
                value=0.0,
                step=0.05,
                label="temperature",
                info="0 = always the most likely word (same answer every time).",
            )
            tab.top_p = gr.Slider(
                0.05,
                1.0,
                value=1.0,
                step=0.05,
                label="top-p",
                info="With temperature > 0: sample only from the most likely words.",
            )
        tab.system_prompt = gr.Textbox(
            value="", label="system prompt", placeholder="e.g. You are a concise assistant.", lines=2
        )


# ----------------------------------------------------------------------------------------------- events
def wire(tab: ChatTab, config: ConfigTab, demo: gr.Blocks, chat_tab: Any) -> None:
    tab.config = config
    inputs = [
        tab.textbox,
        tab.chatbot,
        tab.base_chatbot,
        tab.source,
        tab.compare,
        tab.max_new_tokens,
        tab.temperature,
        tab.top_p,
        tab.system_prompt,
    ]
    outputs = [tab.textbox, tab.chatbot, tab.base_chatbot]
    streaming = {"show_progress": "minimal", "concurrency_id": "chat", "concurrency_limit": 1}
    # The Configure form reaches `respond` by field name (the base model is the form's model).
    named = {**config.form, "chat_image": tab.image}
    for trigger in (tab.send_btn.click, tab.textbox.submit):  # API clients use /chat (ui/api.py)
        trigger(tab.respond, inputs, outputs, inputs_kwargs=named, api_visibility="private", **streaming).then(
            lambda: None, None, tab.image, queue=False, api_visibility="private", show_progress="hidden"
        )
    tab.clear_btn.click(
        lambda: [[], []], None, [tab.chatbot, tab.base_chatbot], queue=False, api_visibility="undocumented"
    )
    listed = {"api_visibility": "undocumented", "show_progress": "hidden"}
    for trigger in (tab.refresh_btn.click, chat_tab.select):
        trigger(tab.sources, [tab.source, tab.picked], tab.source, **listed)
    # A choice the user made stays; until then the newest finished run is offered first.
    tab.source.input(lambda: True, None, tab.picked, queue=False, **listed)
    for trigger in (tab.compare.change, tab.source.change):
        trigger(
            tab.toggle_compare,
            [tab.compare, tab.source],
            [tab.base_chatbot, tab.chatbot],
            api_visibility="undocumented",
            show_progress="hidden",
            queue=False,
        )
    for trigger in (tab.source.change, chat_tab.select):  # the base model is the form's: it may change meanwhile
        trigger(
            tab.image_box,
            tab.source,
            tab.image,
            inputs_kwargs=config.form,
            api_visibility="private",
            show_progress="hidden",
        )
    tab.source.change(
        tab.mode,
        tab.source,
        [tab.chat_area, tab.compare, tab.classify_area],
        api_visibility="undocumented",
        show_progress="hidden",
    )
    classify_io = ([tab.source, tab.classify_text, tab.classify_pair], tab.classify_result)
    queued = {"concurrency_id": "chat", "concurrency_limit": 1}  # one model at work at a time, as for chat
    for trigger in (tab.classify_btn.click, tab.classify_text.submit):  # API clients use /classify (ui/api.py)
        trigger(tab.classify, *classify_io, api_visibility="private", **queued)
    demo.load(tab.sources, [tab.source, tab.picked], tab.source, **listed)
