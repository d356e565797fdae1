"""The first screen (Start tab) in a real browser, from an empty home to a finished run and a chat answer.

One story on one page: the app opens on Start → the tiny test model and tiny data are picked there (typed, as a
person types a Hub id), with the data's token-length statistics and preview → the proposal for this CPU appears
with the backend's own reasons, and the Configure tab shows it (one form) → an expert edit in Configure shows in
the Start summary → Start switches to the Train tab, where the run finishes → Chat answers with the run's adapter.
Without a browser: an answer for choices changed since it was asked is dropped. Screenshots go to
test-artifacts/first-screen/ (gitignored).

Run: .venv/bin/python -m pytest tests/test_ui_first_screen.py
"""

from __future__ import annotations

import json
import os
import queue
from pathlib import Path

import pytest

from tests.test_ui_support import CHROMIUM, CHROMIUM_ARGS, greedy_reply, letters

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "first-screen"
STEPS = 12  # set in Configure after the proposal: a short run, and an expert edit the summary must show
REPLY_TOKENS = 12


def browser_test(test):
    """A test that drives the app in Chromium (skipped where Chromium or Playwright is missing)."""
    test = pytest.mark.browser(test)
    return pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing")(test)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("first-screen-data") / "pirate-train.jsonl"
    rows = [{"prompt": f"Question {i}?", "completion": "Arr, matey! Yo-ho-ho!"} for i in range(48)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app on a free port, served from this process (the tiny model is on its disk), in an empty home; chat
    replies are recorded when their generation ends."""
    from finetune.studio import Studio
    from tests.test_ui_browser import free_port
    from ui.app import build_app, launch

    studio = Studio(tmp_path_factory.mktemp("first-screen-home") / "runs")
    replies: queue.Queue = queue.Queue()
    real_chat = studio.chat

    def chat(source, messages, settings, *args, **kwargs):
        text = None
        for text in real_chat(source, messages, settings, *args, **kwargs):
            yield text
        replies.put({"source": source, "prompt": messages[-1]["content"], "text": text})

    studio.chat = chat
    demo = build_app(studio)
    port = free_port()
    launch(demo, port=port, block=False, quiet=True)
    try:
        yield {"url": f"http://127.0.0.1:{port}", "studio": studio, "replies": replies}
    finally:
        studio.stop()
        demo.close()
        studio.manager.wait(timeout=60)


@pytest.fixture(scope="module")
def page(server):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip package playwright is not installed")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(30_000)
        page.goto(server["url"])
        yield page
        chromium.close()


def expect(locator):
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def type_choice(page, elem_id: str, value: str) -> None:
    """Type a value of one's own into a dropdown (a Hub id, a path) and press Enter, as a person does."""
    box = page.locator(f"#{elem_id} input").first
    box.click()
    box.fill(value)
    box.press("Enter")
    expect(box).to_have_value(value)


def proposal_form(studio, model: Path, data: Path) -> dict:
    return {**studio.default_values(), "model": str(model), "dataset": str(data)}


# ----------------------------------------------------------------------------------------------- the story
@browser_test
def test_the_app_opens_on_the_first_screen(page):
    expect(page.get_by_role("tab", name="Start", exact=True)).to_have_attribute("aria-selected", "true")
    expect(page.locator("#start-summary")).to_contain_text("What Start will run")
    expect(page.locator("#start-go")).to_be_visible()
    shot(page, "01-start")


@browser_test
def test_the_first_screen_picks_model_and_data_and_proposes(page, server, tiny_model_dir, data_file):
    studio = server["studio"]
    type_choice(page, "start-model", str(tiny_model_dir))
    type_choice(page, "start-data", str(data_file))
    page.locator("#start-hardware").get_by_text("CPU").click()
    info = page.locator("#start-data-info")
    expect(info).to_contain_text("48 training rows", timeout=60_000)
    expect(info.locator(".fs-example .fs-trained").first).to_contain_text("Arr, matey!")
    stats = studio.data_stats(proposal_form(studio, tiny_model_dir, data_file))
    expect(info).to_contain_text(f"p99 {stats.p99}")
    expected = studio.propose(proposal_form(studio, tiny_model_dir, data_file), device="cpu", gpus=1, gpu_gib=None)
    proposal = page.locator("#start-proposal")
    expect(proposal).to_contain_text("Proposed for this computer's CPU", timeout=60_000)
    shown = letters(proposal.inner_text())
    assert expected.reasons and all(letters(reason) in shown for reason in expected.reasons), shown
    shot(page, "02-start-proposal")
    # One form: the Configure tab holds the choices and the proposal.
    page.get_by_role("tab", name="Configure", exact=True).click()
    assert field_value(page, "cfg-model") == str(tiny_model_dir)
    assert field_value(page, "cfg-dataset") == str(data_file)
    assert field_value(page, "cfg-max_seq_length") == str(expected.values["max_seq_length"])


@browser_test
def test_an_expert_edit_shows_in_the_start_summary(page):
    from tests.test_ui_browser import fill, open_group

    page.get_by_role("tab", name="Configure", exact=True).click()
    open_group(page, "Optimisation", "max_steps")
    fill(page, "cfg-max_steps", STEPS)
    page.get_by_role("tab", name="Start", exact=True).click()
    summary = page.locator("#start-summary")
    expect(summary).to_contain_text(f"{STEPS} steps")
    expect(summary).to_contain_text("Changed since the proposal")
    expect(summary).to_contain_text("Training steps")


@browser_test
def test_start_trains_on_the_train_tab(page, server):
    page.locator("#start-go").click()
    expect(page.get_by_role("tab", name="Train", exact=True)).to_have_attribute("aria-selected", "true")
    progress = page.locator("#train-progress .fs-progress")
    expect(progress).to_have_attribute("data-status", "completed", timeout=120_000)
    expect(page.locator("#train-progress")).to_contain_text(f"step {STEPS} / {STEPS}")
    run = server["studio"].runs()[0]
    expect(progress).to_contain_text(run_id_of(run))
    shot(page, "03-train-finished")


@browser_test
def test_chat_answers_with_the_run(page, server, tiny_model_dir):
    from tests.test_ui_browser import choose, expect_reply

    run_id = run_id_of(server["studio"].runs()[0])
    run_dir = server["studio"].manager.root / run_id
    page.get_by_role("tab", name="Chat", exact=True).click()
    page.locator("#chat-refresh").click()
    choose(page, "chat-source", run_id)
    page.locator("#chat-settings").get_by_text("Generation settings").click()
    tokens = page.locator("#chat-settings input[type=number]").first
    tokens.fill(str(REPLY_TOKENS))
    tokens.press("Enter")
    box = page.locator("#chat-input textarea, #chat-input input").first
    box.fill("Question 7?")
    box.press("Enter")
    reply = server["replies"].get(timeout=120)
    assert reply["source"] == run_id and reply["text"]
    assert reply["text"] == greedy_reply(tiny_model_dir, run_dir, "Question 7?", REPLY_TOKENS)
    expect_reply(page, "chat-main", reply["text"])
    shot(page, "04-chat")


@browser_test
def test_the_first_screen_works_at_420_px(page):
    """On a phone-sized screen every tab stays reachable and the choices and Start are there."""
    page.set_viewport_size({"width": 420, "height": 900})
    try:
        page.get_by_role("tab", name="Start", exact=True).click()
        for name in ("Start", "Memory", "Configure", "Train", "Chat", "Publish"):
            expect(page.get_by_role("tab", name=name, exact=True)).to_be_visible()
        for elem_id in ("start-model", "start-data", "start-goal", "start-hardware", "start-go"):
            page.locator(f"#{elem_id}").scroll_into_view_if_needed()
            expect(page.locator(f"#{elem_id}")).to_be_in_viewport()
        shot(page, "05-start-420")
    finally:
        page.set_viewport_size({"width": 1280, "height": 900})


# ----------------------------------------------------------------------------------------------- stale answers
def test_an_answer_for_changed_choices_is_dropped(studio_home, tiny_model_dir, data_file):
    """A request made stale before it starts is skipped; one whose choices change while it is worked out is
    dropped when it ends (it would overwrite the newer choices' settings); the newest one is shown."""
    from finetune.studio import Studio
    from ui.app import build_app

    ui = build_app(Studio(studio_home / "runs")).studio_ui
    tab = ui.start
    page = {tab.config.fields[n]: v for n, v in ui.studio.default_values().items()}
    page.update({tab.model: str(tiny_model_dir), tab.data: str(data_file), tab.goal: "sft", tab.hardware: "cpu"})
    page.update({tab.card: None, tab.gpus: 1, tab.proposed: None, tab.proposal_ticket: 0, tab.data_ticket: 0})

    def choose() -> dict:
        answer = tab.choose(page)
        assert answer[tab.proposal].startswith("⏳") and answer[tab.data_info].startswith("⏳")  # shown as pending
        page.update({c: v for c, v in answer.items() if c in page and not isinstance(v, dict)})
        return answer

    first = choose()
    old = dict(page)  # the page as the first request saw it
    second = choose()
    assert second[tab.proposal_ticket] == first[tab.proposal_ticket] + 1
    assert all(_skipped(v) for v in tab.propose(old).values())  # stale before it started
    assert all(_skipped(v) for v in tab.look_at_data(old).values())

    real_propose = ui.studio.propose

    def propose_while_the_user_changes_a_choice(*args, **kwargs):
        choose()
        return real_propose(*args, **kwargs)

    ui.studio.propose = propose_while_the_user_changes_a_choice
    current = dict(page)
    dropped = tab.propose(current)
    assert dropped and all(_skipped(v) for v in dropped.values())
    ui.studio.propose = real_propose
    fresh = tab.propose(page)
    assert "Proposed for this computer's CPU" in fresh[tab.proposal]
    assert "What Start will run" in fresh[tab.summary] and fresh[tab.proposed]["values"]["model"] == str(tiny_model_dir)
    assert "48" in tab.look_at_data(page)[tab.data_info]


def _skipped(value) -> bool:
    import gradio as gr

    return value == gr.skip()


def run_id_of(run) -> str:
    return run["run_id"] if isinstance(run, dict) else run.run_id


def field_value(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id}").locator("input, textarea").first.input_value()


@pytest.mark.gpu
def test_the_first_screen_offers_this_machines_gpu():
    """On a GPU machine the hardware choice names the card and its memory as torch reports them."""
    import torch

    from finetune.studio import Studio

    name, gib = Studio.detected_gpu()
    props = torch.cuda.get_device_properties(0)
    assert name == props.name and abs(gib - props.total_memory / 2**30) < 0.1


def test_the_first_screen_offers_popular_models_and_takes_an_upload(studio_home, data_file, tmp_path):
    """The model list holds the embedded model first and every popular model; an uploaded file is kept by the app's
    upload rules and becomes the data; a file of the wrong kind is refused in one line."""
    from finetune.config import EMBEDDED_MODEL
    from finetune.studio import Studio
    from ui.app import build_app

    ui = build_app(Studio(studio_home / "runs")).studio_ui
    tab = ui.start
    offered = [value for _, value in tab.model.choices]
    assert offered[0] == EMBEDDED_MODEL and set(ui.studio.popular_models()) <= set(offered)
    kept = tab.use_upload(str(data_file))
    assert kept[tab.data]["value"] == "upload:pirate-train.jsonl"  # the file's name, never a server path
    target = ui.studio.uploads.resolve(ui.studio.identity, kept[tab.data]["value"])
    assert target.parent == ui.studio.uploads_dir and target.read_bytes() == data_file.read_bytes()
    assert "pirate-train.jsonl" in kept[tab.message]
    wrong = tmp_path / "notes.txt"
    wrong.write_text("hello", encoding="utf-8")
    refused = tab.use_upload(str(wrong))
    assert tab.data not in refused and refused[tab.message].startswith("⚠ dataset: notes.txt is not a")


def test_the_preferences_goal_takes_the_bundled_pairs(studio_home):
    """Choosing preferences on the bundled pirate set switches to its preference pairs and the DPO objective, and
    back to the answers for style; the Configure form gets the same."""
    from finetune.studio import Studio
    from ui.app import build_app

    ui = build_app(Studio(studio_home / "runs")).studio_ui
    tab, fields = ui.start, ui.start.config.fields
    page = {fields[n]: v for n, v in ui.studio.default_values().items()}
    page.update({tab.model: page[fields["model"]], tab.data: "bundled:pirate", tab.goal: "dpo", tab.hardware: "cpu"})
    answer = tab.choose(page)
    assert answer[fields["dataset"]] == "bundled:pirate-pairs" and answer[tab.data]["value"] == "bundled:pirate-pairs"
    assert (answer[fields["task"]], answer[fields["objective"]]) == ("causal_lm", "dpo")
    page.update({tab.data: "bundled:pirate-pairs", tab.goal: "classify", fields["objective"]: "dpo"})
    answer = tab.choose(page)
    assert answer[fields["dataset"]] == "bundled:pirate"
    assert (answer[fields["task"]], answer[fields["objective"]]) == ("sequence_classification", "sft")
