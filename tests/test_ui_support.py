"""Helpers the UI tests share (this module holds no tests).

- `RunGate`: holds a run of this process at a chosen step until the test releases it, or fails it there. A test
  that needs "a run that is still going" (stop, reload, busy, chat with a running run) gets one for as long as it
  needs, on any hardware, instead of hoping the run is slow enough.
- `greedy_reply`: what a model answers to one prompt with greedy decoding, computed with transformers and PEFT
  directly (not through the app's code), for checking what the Chat tab shows.
- `standin_hub`: the stand-in Hugging Face Hub (tests/hub_standin.py) with HF_ENDPOINT pointing at it.
- `wait_for`: a condition polled until a deadline, then asserted.
- `open_app` / `browser_expect` / `api_client`: the app's own readiness, waited for with generous ceilings on a
  machine under load (Playwright's default is 5 s, httpx's too): every browser and API test goes through them;
  `app_page`: a chromium page with the app open.
- `record_chat_replies`: each chat reply the studio gives, put on a queue once its generation has ended.
"""

from __future__ import annotations

import queue
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.hub_standin import HubStandin

CHROMIUM = "/usr/bin/chromium"  # Debian's chromium (`playwright install` cannot download its own browser here)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
GOOD_TOKEN = "hf_" + secrets.token_hex(16)  # alice's write token on the stand-in Hub (random per session)
BAD_TOKEN = "hf_" + secrets.token_hex(16)  # a token the stand-in Hub does not know
HOLD_LIMIT_S = 300  # a held run goes on by itself after this long, so a test that forgets it cannot hang the suite
APP_READY_S = 180  # loading the page until the app shows, past gradio's "Loading..." (a second suite may run beside)
STATE_S = 60  # the default ceiling for a state the page or the API is expected to reach (instead of 5 s)


class RunGate:
    """Hold or fail the runs of this process at a step, from inside the engine's per-step progress hook.

    Installed over `Progress.on_step` (called at the end of every optimizer step by both engines, before the stop
    flag is read): after the real hook has recorded step N, the run thread waits for `release()` when N is
    `hold_at`, or raises `fail_with` when N is `fail_at`. While held, the run is "running" at step N for real."""

    def __init__(self) -> None:
        self.hold_at: int | None = None
        self.fail_at: int | None = None
        self.fail_with: BaseException | None = None
        self.held = threading.Event()
        self._release = threading.Event()

    def install(self, monkeypatch: Any, root: Path) -> RunGate:
        """Patch the hook for the runs under `root` (a studio's runs folder); runs elsewhere go on untouched."""
        from finetune.runs.progress import Progress

        real = Progress.on_step
        gate = self
        root = Path(root).resolve()

        def on_step(progress: Any, step: int, *args: Any, **kwargs: Any) -> None:
            real(progress, step, *args, **kwargs)
            if Path(progress.run.path).resolve().parent != root:
                return
            if step == gate.fail_at and gate.fail_with is not None:
                raise gate.fail_with
            if step == gate.hold_at:
                gate.held.set()
                gate._release.wait(HOLD_LIMIT_S)

        monkeypatch.setattr(Progress, "on_step", on_step)
        return self

    def wait_held(self, timeout: float = 180) -> None:
        """Block until a run is held at `hold_at`; fail the test if none gets there in time."""
        assert self.held.wait(timeout), f"no run reached step {self.hold_at} within {timeout} s"

    def release(self) -> None:
        self._release.set()


def wait_for(condition: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    """Poll `condition` until it returns something true (returned) or the deadline passes (assertion error)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(every)


def browser_expect() -> Any:
    """Playwright's `expect` with STATE_S as its default ceiling (for this whole process) instead of its own 5 s."""
    from playwright.sync_api import expect

    expect.set_options(timeout=STATE_S * 1000)
    return expect


def open_app(page: Any, url: str | None = None, ready_text: str | None = None) -> None:
    """Load `url` into `page` (None: reload it) and wait, up to APP_READY_S, until the app is ready to use: gradio's
    "Loading..." has given way to the app's header and tab bar (or to `ready_text`: the login page's message).
    Later waits on the page get STATE_S."""
    from ui.app import TAB_NAMES

    expect, ceiling = browser_expect(), APP_READY_S * 1000
    page.set_default_timeout(STATE_S * 1000)
    if url is None:
        page.reload(timeout=ceiling)
    else:
        page.goto(url, timeout=ceiling)
    if ready_text is not None:
        expect(page.get_by_text(ready_text)).to_be_visible(timeout=ceiling)
        return
    expect(page.locator("#fs-header")).to_contain_text("How it works", timeout=ceiling)
    expect(page.get_by_role("tab", name=TAB_NAMES[0], exact=True)).to_be_visible(timeout=ceiling)


@contextmanager
def app_page(url: str, ready_text: str | None = None, viewport: dict[str, int] | None = None) -> Iterator[Any]:
    """A page of Debian's chromium (CHROMIUM, CHROMIUM_ARGS) with the app at `url` loaded and ready (`open_app`);
    the browser closes when the block ends. `viewport`: {"width": ..., "height": ...}, else Playwright's default."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=viewport) if viewport else browser.new_page()
            open_app(page, url, ready_text=ready_text)
            yield page
        finally:
            browser.close()


@contextmanager
def served_app(studio: Any, home: Path) -> Iterator[str]:
    """The app of `studio` on a free port, served from this process, with FINETUNE_STUDIO_HOME at `home` while it
    serves (its threads read the home from the environment: a proposal or a run can outlive the test that started
    it); yields its URL, and at the end stops any run and waits for it."""
    import pytest

    from finetune.engines.world import free_port
    from ui.app import build_app, launch

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FINETUNE_STUDIO_HOME", str(home))
        demo = build_app(studio)
        port = free_port()
        launch(demo, port=port, block=False, quiet=True)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            studio.stop()
            demo.close()
            studio.manager.wait(timeout=60)


def record_chat_replies(studio: Any) -> queue.Queue:
    """Pass the studio's chat through unchanged, and put each reply on the returned queue once its generation has
    ended ({"source", "prompt", "text"}): a test waits for the queue, not for the page's text to stop changing."""
    replies: queue.Queue = queue.Queue()
    real_chat = studio.chat

    def chat(source, messages, settings, *args, **kwargs):
        text = None
        for text in real_chat(source, messages, settings, *args, **kwargs):
            yield text
        said = {"source": source, "prompt": messages[-1]["content"], "text": text}
        replies.put({**said, "tokens": settings.max_new_tokens})

    studio.chat = chat
    return replies


def set_reply_tokens(page: Any, tokens: int) -> None:
    """Type the Chat tab's "max new tokens" and wait until the slider holds it: the number box commits on Enter, and
    a message sent before that (a loaded machine) would generate the default length."""
    page.locator("#chat-settings").get_by_text("Generation settings").click()
    box = page.locator("#chat-settings input[type=number]").first
    box.fill(str(tokens))
    box.press("Enter")
    browser_expect()(page.locator("#chat-settings input[type=range]").first).to_have_value(str(tokens))


def api_client(url: str, **kwargs: Any) -> Any:
    """gradio_client's `Client` for the app at `url`, each request given STATE_S (httpx's default is 5 s)."""
    from gradio_client import Client

    return Client(url, verbose=False, httpx_kwargs={"timeout": STATE_S}, **kwargs)


def wait_run_ended(studio: Any, timeout: float = 180) -> Any:
    """Join the studio's run thread; fail the test if the run is still going at the deadline. Returns its state."""
    studio.manager.wait(timeout=timeout)
    state = studio.state()
    assert not studio.manager.is_active(), f"the run is still going after {timeout} s: {state}"
    return state


_models: dict[tuple[str, str], Any] = {}


def greedy_reply(
    base_model_dir: Path, weights_dir: Path | None, prompt: str, max_new_tokens: int, system: str = ""
) -> str:
    """The greedy reply of the base model (with the LoRA adapter in `weights_dir`, if given) to one user message
    (after a system prompt, if given), decoded without special tokens: built from transformers + PEFT, independently
    of finetune/model/inference.py."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # The app's chat runs in float32 on a CPU, in bfloat16 (else float16) on a GPU: the same here, so the greedy
    # reply is the one the app must give on this machine.
    cuda = torch.cuda.is_available()
    dtype = (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16) if cuda else torch.float32
    key = (str(base_model_dir), str(weights_dir))
    if key not in _models:
        tokenizer = AutoTokenizer.from_pretrained(str(base_model_dir))
        model = AutoModelForCausalLM.from_pretrained(str(base_model_dir), dtype=dtype)
        if weights_dir is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(weights_dir))
        _models.clear()  # one model at a time: they are cheap to load, and a run's weights change between tests
        _models[key] = (model.to("cuda" if cuda else "cpu").eval(), tokenizer)
    model, tokenizer = _models[key]
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = tokenizer(text, add_special_tokens=False, return_tensors="pt").to(model.device)
    with torch.no_grad():
        out = model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def human(n: float) -> str:
    """Bytes as the page writes them: GiB with 2 decimals from 1 GiB up, else whole MiB."""
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.0f} MiB"


def letters(text: str) -> str:
    """Only the letters and digits of a text: what stays the same however the page renders it (Markdown, spacing)."""
    return re.sub(r"[^0-9A-Za-z]", "", text)


@contextmanager
def standin_hub(monkeypatch: Any) -> Iterator[HubStandin]:
    """A stand-in Hub that knows alice's token; HF_ENDPOINT points at it, the client's default does not."""
    from huggingface_hub import constants

    from finetune.publish import hub as hubmod

    with HubStandin(tokens={GOOD_TOKEN: "alice"}) as standin:
        monkeypatch.setenv("HF_ENDPOINT", standin.url)
        monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # only HF_ENDPOINT reaches the stand-in
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # conftest sets HF_HUB_OFFLINE=1 for everything else
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setattr(hubmod, "_stored_token", lambda: None)  # ignore any `hf auth login` on this machine
        yield standin


def pushed_files_hold_no_secret(standin: HubStandin, secret: str) -> bool:
    """The secret is in no file of any repo and in no request body the stand-in received."""
    blobs = [data for repo in standin.repos.values() for data in repo.files.values()]
    return all(secret.encode() not in blob for blob in blobs) and secret.encode() not in standin.recorded_bytes()


# ----------------------------------------------------------------------------------------------- page actions
def tab(page: Any, name: str) -> None:
    """Open a tab of the app by its name."""
    page.get_by_role("tab", name=name, exact=True).click()


def fill(page: Any, elem_id: str, value: Any) -> None:
    """Type into a textbox or number field and leave it with Tab, as a person does (the field is checked then).

    A field that has just appeared (an accordion opening) can be redrawn right after a fast fill, resetting it; so
    the value is typed again until the field holds it, and then it must hold it."""
    expect = browser_expect()
    box = page.locator(f"#{elem_id}").locator("input, textarea").first
    expect(box).to_be_editable()
    for _ in range(3):
        box.fill(str(value))
        box.press("Tab")
        try:
            expect(box).to_have_value(str(value), timeout=2_000)
            break
        except AssertionError:
            continue
    expect(box).to_have_value(str(value))


def open_group(page: Any, group: str, field: str) -> None:
    """Open a Configure accordion (Optimisation, Output ...) unless `field` is already showing."""
    if not page.locator(f"#cfg-{field}").is_visible():
        page.locator(f"#cfg-group-{group.lower()}").get_by_text(group, exact=True).first.click()
        browser_expect()(page.locator(f"#cfg-{field}").locator("input, textarea").first).to_be_editable()


def choose(page: Any, elem_id: str, option: str) -> None:
    """Pick an option of a gradio Dropdown by (part of) its label."""
    page.locator(f"#{elem_id} input").first.click()
    page.get_by_role("option", name=re.compile(re.escape(option))).first.click()


def browser_test(test: Callable) -> Callable:
    """A test that drives the app in Chromium (skipped with the reason where Chromium is missing)."""
    import os

    import pytest

    test = pytest.mark.browser(test)
    return pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (apt-get install chromium)")(
        test
    )
