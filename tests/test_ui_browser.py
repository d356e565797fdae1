"""The app end to end in a real browser: Playwright drives Debian's chromium against the app served in-process.

One story, in order (each test continues from the previous one on the same page): open the app → Memory estimates →
Configure loads a tiny test model and tiny data, shows a bad value's error beside its field, previews the data →
Train starts, progress advances, a page reload mid-run re-attaches, the loss plot fills, the run finishes → Chat
answers with the trained adapter. Screenshots go to test-artifacts/ui/ (gitignored); look at them.

Run: .venv/bin/python -m pytest -m browser tests/test_ui_browser.py
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "ui"
STEPS = 120  # with 2 micro batches a step, long enough (~30 s on a CPU) to reload the page mid-run

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="pip package playwright is not installed")
expect = sync_api.expect


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Tiny prompt/completion training and evaluation files."""
    folder = tmp_path_factory.mktemp("ui-data")
    train, val = folder / "pirate-train.jsonl", folder / "pirate-val.jsonl"
    train.write_text(
        "".join(
            json.dumps({"prompt": f"Question {i}?", "completion": "Arr, matey! Yo-ho-ho!"}) + "\n" for i in range(48)
        ),
        encoding="utf-8",
    )
    val.write_text(
        "".join(
            json.dumps({"prompt": f"What be {i}?", "completion": "Arr, matey! Yo-ho-ho!"}) + "\n" for i in range(4)
        ),
        encoding="utf-8",
    )
    return {"train": train, "val": val}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app on a free 127.0.0.1 port, served from this process (so the tiny test model is on its disk)."""
    from finetune.studio import Studio
    from ui.app import build_app, launch

    home = tmp_path_factory.mktemp("ui-home")
    studio = Studio(home / "runs")
    try:
        import finetune.memory  # noqa: F401
    except ImportError:  # the estimator is another module's job; without it the tab is exercised on a stand-in
        from tests.test_ui_wiring import FakeEstimate

        studio.estimate = lambda values, **kw: FakeEstimate()
    demo = build_app(studio)
    port = free_port()
    launch(demo, port=port, block=False, quiet=True)
    yield {"url": f"http://127.0.0.1:{port}", "studio": studio}
    demo.close()
    studio.manager.wait(timeout=60)
    # Let a reply still generating finish: a thread inside torch at interpreter exit can abort the process.
    for thread in threading.enumerate():
        if thread.name == "generate":
            thread.join(timeout=60)


@pytest.fixture(scope="module")
def page(server):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):  # only this run's screenshots
        old.unlink()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(30_000)
        page.goto(server["url"])
        yield page
        browser.close()


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def tab(page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).click()


def fill(page, elem_id: str, value) -> None:
    """Type into a textbox or number field and leave it with Tab, as a person does (the field is checked then).

    A field that has just appeared (an accordion opening) can be redrawn right after a fast fill, resetting it;
    so the value is filled again until it holds before focus moves on."""
    box = page.locator(f"#{elem_id}").locator("input, textarea").first
    for _ in range(5):
        box.fill(str(value))
        page.wait_for_timeout(200)
        if box.input_value() == str(value):
            break
    box.press("Tab")


def open_group(page, group: str, field: str) -> None:
    """Open a Configure accordion (Optimisation, Output ...) unless `field` is already showing."""
    if not page.locator(f"#cfg-{field}").is_visible():
        page.locator(f"#cfg-group-{group.lower()}").get_by_text(group, exact=True).first.click()
        expect(page.locator(f"#cfg-{field}")).to_be_visible()
        page.wait_for_timeout(300)  # let the group finish drawing its fields


def text_of(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id}").inner_text()


def value_of(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id}").locator("input, textarea").first.input_value()


def choose(page, elem_id: str, option: str) -> None:
    """Pick an option of a gradio Dropdown by (part of) its label."""
    page.locator(f"#{elem_id} input").first.click()
    page.get_by_role("option", name=re.compile(re.escape(option))).first.click()


def wait_reply(page, chatbot_id: str, timeout_s: float = 120) -> str:
    """The last reply of a chatbot once it has finished streaming (its text stops changing)."""
    script = (
        "(id) => { const b = [...document.querySelectorAll(`#${id} .bot, #${id} [data-testid='bot']`)].pop();"
        " return b ? b.innerText.trim() : ''; }"
    )
    deadline, last, stable = time.time() + timeout_s, None, 0
    while time.time() < deadline:
        text = page.evaluate(script, chatbot_id)
        stable = stable + 1 if text and text == last and "Loading the model" not in text else 0
        if stable >= 3:
            return text
        last = text
        page.wait_for_timeout(500)
    raise AssertionError(f"#{chatbot_id} gave no finished reply within {timeout_s} s (last text: {last!r})")


def progress_step(page) -> int:
    return int(page.locator("#train-progress .fs-progress").get_attribute("data-step") or 0)


def progress_status(page) -> str:
    return page.locator("#train-progress .fs-progress").get_attribute("data-status") or ""


# ----------------------------------------------------------------------------------------------- the story
def test_open_the_app(page):
    expect(page.locator("#fs-header")).to_contain_text("How it works")
    for name in ("Memory", "Configure", "Train", "Chat", "Publish"):
        expect(page.get_by_role("tab", name=name, exact=True)).to_be_visible()
    assert page.title() == "Finetune Studio"
    shot(page, "01-open")


def test_memory_shows_an_estimate(page, tiny_model_dir):
    tab(page, "Memory")
    fill(page, "mem-model", tiny_model_dir)  # the same field as Configure's: the edit is mirrored there
    page.locator("#mem-estimate").click()
    expect(page.locator("#mem-verdict")).to_contain_text(
        re.compile(r"Fits|Does not fit|Estimated peak"), timeout=60_000
    )
    expect(page.locator("#mem-table")).to_contain_text(re.compile(r"weights.*\d+ (GiB|MiB|KiB)", re.S))
    shot(page, "02-memory-estimate")
    tab(page, "Configure")
    assert value_of(page, "cfg-model") == str(tiny_model_dir)


def test_configure_shows_a_bad_value_beside_its_field(page):
    tab(page, "Configure")
    open_group(page, "Optimisation", "max_steps")
    fill(page, "cfg-max_steps", -5)
    expect(page.locator("#cfg-err-max_steps")).to_contain_text("max_steps: -5 is out of range")
    shot(page, "03-configure-error")
    fill(page, "cfg-max_steps", STEPS)
    expect(page.locator("#cfg-err-max_steps")).to_be_hidden()


def test_configure_loads_tiny_data_and_previews_it(page, files):
    fill(page, "cfg-dataset", files["train"])
    fill(page, "cfg-eval_split", files["val"])
    fill(page, "cfg-max_seq_length", 48)
    open_group(page, "Output", "eval_steps")
    for elem_id, value in (
        ("cfg-learning_rate", 0.03),
        ("cfg-warmup_steps", 0),
        ("cfg-eval_steps", 40),
        ("cfg-save_steps", 40),
        ("cfg-gradient_accumulation_steps", 2),
    ):
        fill(page, elem_id, value)
    page.locator("#cfg-check").click()
    expect(page.locator("#cfg-summary")).to_contain_text("All settings are valid")
    page.locator("#cfg-preview").click()
    preview = page.locator("#cfg-preview-box")
    expect(preview).to_contain_text("48 training rows", timeout=60_000)
    expect(preview).to_contain_text("4 evaluation rows")
    expect(preview.locator(".fs-example .fs-trained").first).to_contain_text("Arr, matey!")
    preview.scroll_into_view_if_needed()
    shot(page, "04-configure-preview")


def test_train_starts_and_progress_advances(page):
    tab(page, "Train")
    page.locator("#train-start").click()
    expect(page.locator("#train-message")).to_contain_text("Started run", timeout=30_000)
    page.wait_for_function(
        "() => +(document.querySelector('#train-progress .fs-progress')?.dataset.step || 0) >= 3", timeout=120_000
    )
    assert progress_status(page) == "running"
    shot(page, "05-train-running")


def test_a_reload_mid_run_reattaches(page, server):
    before = progress_step(page)
    run_id = server["studio"].state().run_id
    page.reload()
    tab(page, "Train")
    progress = page.locator("#train-progress .fs-progress")
    expect(progress).to_contain_text(run_id, timeout=30_000)
    assert progress_status(page) == "running"  # still mid-run: the page re-attached to it
    page.wait_for_function(
        f"() => +(document.querySelector('#train-progress .fs-progress')?.dataset.step || 0) > {before}",
        timeout=60_000,
    )
    shot(page, "06-train-after-reload")
    # The settings typed before the reload were kept by the browser.
    tab(page, "Configure")
    open_group(page, "Optimisation", "max_steps")
    assert value_of(page, "cfg-max_steps") == str(STEPS) and value_of(page, "cfg-dataset").endswith("train.jsonl")
    tab(page, "Train")


def test_the_run_finishes_with_a_loss_curve_and_answers(page):
    page.wait_for_function(
        "() => document.querySelector('#train-progress .fs-progress')?.dataset.status === 'completed'",
        timeout=180_000,
    )
    expect(page.locator("#train-progress")).to_contain_text(f"step {STEPS} / {STEPS}")
    # The plot has drawn marks (vega renders the line as SVG paths or onto a canvas).
    plot = page.locator("#train-plot")
    expect(plot.locator("canvas, svg path[d]").first).to_be_attached()
    expect(plot).not_to_contain_text("No data")
    expect(page.locator("#train-samples")).to_contain_text("Answer before training (step 0)")
    expect(page.locator("#train-samples")).to_contain_text(f"Answer at step {STEPS}")
    expect(page.locator("#train-log textarea")).to_have_value(re.compile("status → completed"))
    expect(page.locator("#train-runs-table")).to_contain_text("completed")
    shot(page, "07-train-finished")


def test_chat_answers_with_the_trained_adapter(page, server):
    run_id = server["studio"].runs()[0]["run_id"]
    tab(page, "Chat")
    page.locator("#chat-refresh").click()
    choose(page, "chat-source", run_id)
    expect(page.locator("#chat-main")).to_contain_text(f"Chat with {run_id}")
    box = page.locator("#chat-input textarea, #chat-input input").first
    box.fill("What be the capital of France?")
    box.press("Enter")
    reply = wait_reply(page, "chat-main")
    assert reply and "⚠" not in reply
    shot(page, "08-chat-tuned")


def test_chat_side_by_side_with_the_base_model(page, server):
    page.locator("#chat-compare input").check()
    expect(page.locator("#chat-base")).to_be_visible()
    box = page.locator("#chat-input textarea, #chat-input input").first
    box.fill("Who be ye?")
    box.press("Enter")
    assert "⚠" not in wait_reply(page, "chat-base")
    expect(page.locator("#chat-base")).to_contain_text("Who be ye?")
    expect(page.locator("#chat-main")).to_contain_text("Who be ye?")
    shot(page, "09-chat-side-by-side")


def test_publish_tab_lists_the_finished_run(page, server):
    run_id = server["studio"].runs()[0]["run_id"]
    tab(page, "Publish")
    expect(page.locator("#pub-run input")).to_have_value(re.compile(re.escape(run_id)), timeout=30_000)
    page.locator("#pub-push").click()
    expect(page.locator("#pub-result")).to_contain_text("repo", timeout=30_000)  # no repo id given: one-line error
    shot(page, "10-publish")
