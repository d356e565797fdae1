"""The app end to end in a real browser: Playwright drives Debian's chromium against the app served in-process.

One story, in order (each test continues from the previous one on the same page): open the app → Memory shows the
estimator's figure → Configure loads a tiny test model and tiny data, shows a bad value's error beside its field,
previews the data → Train starts; the run is held at step HOLD (tests/test_ui_support.py RunGate), so a page reload
certainly happens mid-run and re-attaches; released, the loss plot fills and the run finishes → Chat answers with
the trained adapter, word for word what greedy decoding of its weights gives, beside the base model's different
answer → Publish pushes the trained run to the stand-in Hub through a password field. Screenshots go to
test-artifacts/ui/ (gitignored); look at them.

Waits are on states with deadlines (Playwright's `expect`, `wait_for_function`), followed by assertions. A chat reply
counts as finished when the backend's generation has ended (recorded by a pass-through wrapper around
`Studio.chat`) and the page shows that text.

Run: .venv/bin/python -m pytest -m browser tests/test_ui_browser.py
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
from pathlib import Path

import pytest

from finetune.engines.world import free_port
from finetune.studio import BASE_OF
from tests.test_ui_support import (
    CHROMIUM,
    GOOD_TOKEN,
    STATE_S,
    RunGate,
    app_page,
    browser_expect,
    choose,
    fill,
    greedy_reply,
    human,
    letters,
    open_app,
    open_group,
    pushed_files_hold_no_secret,
    record_chat_replies,
    set_reply_tokens,
    standin_hub,
    tab,
)
from ui.formatting import run_title

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "ui"
STEPS = 30  # the tuned model answers like a pirate after this; eval and checkpoints at 15 and 30
HOLD = 5  # the run waits at this step until the reload test has seen it there
REPLY_TOKENS = 12  # "max new tokens" set in the Chat tab: short replies, quick to generate and compare

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="pip package playwright is not installed")
expect = browser_expect()  # Playwright's expect, with a generous default ceiling instead of 5 s


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
    """The app on a free 127.0.0.1 port, served from this process (so the tiny test model is on its disk), with
    its runs held at step HOLD until released, chat replies recorded when they finish, and the stand-in Hub."""
    from finetune.studio import Studio
    from ui.app import build_app, launch

    home = tmp_path_factory.mktemp("ui-home")
    studio = Studio(home / "runs")
    replies = record_chat_replies(studio)
    real_pair = studio.chat_pair

    def chat_pair(source, messages, base_messages, settings):
        """The real side-by-side chat; when both generations have ended, each side's reply is recorded."""
        last = {}
        for side, text, error in real_pair(source, messages, base_messages, settings):
            last[side] = text if error is None else None
            yield side, text, error
        for side, which in (("run", source), ("base", BASE_OF + source)):
            said = {"source": which, "prompt": messages[-1]["content"], "text": last.get(side)}
            replies.put({**said, "tokens": settings.max_new_tokens})

    studio.chat_pair = chat_pair
    with pytest.MonkeyPatch.context() as monkeypatch, standin_hub(monkeypatch) as hub:
        # The server's threads read the studio home from the environment: between tests (each sets its own) it is
        # this one, never ~/.cache (a run or an estimate can outlive the test that started it).
        monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(home))
        gate = RunGate().install(monkeypatch, studio.manager.root)
        gate.hold_at = HOLD
        demo = build_app(studio)
        port = free_port()
        launch(demo, port=port, block=False, quiet=True)
        try:
            yield {"url": f"http://127.0.0.1:{port}", "studio": studio, "gate": gate, "replies": replies, "hub": hub}
        finally:
            studio.stop()
            gate.release()
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
    with app_page(server["url"], viewport={"width": 1280, "height": 900}) as page:
        yield page


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def text_of(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id}").inner_text()


def value_of(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id}").locator("input, textarea").first.input_value()


BOT_TEXT = (
    "(id) => { const b = [...document.querySelectorAll(`#${id} .bot, #${id} [data-testid='bot']`)].pop();"
    " return b ? b.innerText.trim() : ''; }"
)


def finished_reply(server, timeout_s: float = 120) -> dict:
    """The next chat reply whose generation ended in the backend: {source, prompt, text}."""
    try:
        return server["replies"].get(timeout=timeout_s)
    except queue.Empty:
        raise AssertionError(f"no chat reply finished within {timeout_s} s") from None


def expect_reply(page, chatbot_id: str, text: str, timeout_s: float = STATE_S) -> str:
    """Wait until the last reply of a chatbot shows `text` (its letters and digits: Markdown and spacing aside), then
    assert it does; returns what the page shows."""
    want = letters(text)
    script = f"([id, want]) => {{ const t = ({BOT_TEXT})(id); return t.replace(/[^0-9A-Za-z]/g, '') === want; }}"
    try:
        page.wait_for_function(script, arg=[chatbot_id, want], timeout=timeout_s * 1000)
    except sync_api.TimeoutError:
        pass  # the assertion below says what the page shows instead
    shown = page.evaluate(BOT_TEXT, chatbot_id)
    assert letters(shown) == want, f"#{chatbot_id} shows {shown!r}; the backend replied {text!r}"
    return shown


def run_of(server) -> tuple[str, Path]:
    studio = server["studio"]
    run = next(r for r in studio.runs() if r.objective == "sft" and r.final)  # the story's run
    return run.run_id, studio.manager.root / run.run_id


def progress_step(page) -> int:
    return int(page.locator("#train-progress .fs-progress").get_attribute("data-step") or 0)


def progress_status(page) -> str:
    return page.locator("#train-progress .fs-progress").get_attribute("data-status") or ""


# ----------------------------------------------------------------------------------------------- the story
def test_open_the_app(page):
    expect(page.locator("#fs-header")).to_contain_text("How it works")
    for name in ("Memory", "Configure", "Train", "Chat", "Evaluate", "Publish"):
        expect(page.get_by_role("tab", name=name, exact=True)).to_be_visible()
    assert page.title() == "Finetune Studio"
    shot(page, "01-open")


def test_memory_shows_the_estimators_figure(page, tiny_model_dir):
    from finetune import memory
    from finetune.config import TrainConfig
    from finetune.plan import plan_for
    from ui.memory_tab import default_card

    card = default_card(memory.GPU_CARDS)
    config = TrainConfig.from_dict({**TrainConfig().to_dict(), "model": str(tiny_model_dir)})
    expected = memory.estimate(plan_for(config, "cuda"), gpu_gib=memory.GPU_CARDS[card])
    tab(page, "Memory")
    fill(page, "mem-model", tiny_model_dir)  # the same field as Configure's: the edit is mirrored there
    page.locator("#mem-estimate").click()
    verdict = page.locator("#mem-verdict")
    expect(verdict).to_contain_text(f"Fits on {card}")
    expect(verdict).to_contain_text(f"Needs about {human(expected.total_bytes)}")
    expect(page.locator("#mem-table")).to_contain_text(re.compile(r"activations.*\d+ (MiB|KiB)", re.S))
    shot(page, "02-memory-estimate")
    tab(page, "Configure")
    assert value_of(page, "cfg-model") == str(tiny_model_dir)


def test_configure_shows_a_bad_value_beside_its_field(page):
    tab(page, "Configure")
    open_group(page, "Optimisation", "max_steps")
    # Plain words, with the YAML key as a hint.
    expect(page.locator("#cfg-max_steps")).to_contain_text("Training steps")
    expect(page.locator("#cfg-max_steps")).to_contain_text("YAML key: max_steps")
    fill(page, "cfg-max_steps", -5)
    expect(page.locator("#cfg-err-max_steps")).to_contain_text("max_steps: -5 is out of range")
    shot(page, "03-configure-error")
    fill(page, "cfg-max_steps", STEPS)
    expect(page.locator("#cfg-err-max_steps")).to_be_hidden()
    fill(page, "cfg-learning_rate", "")  # an emptied number: the field named, no "None is not a number"
    expect(page.locator("#cfg-err-learning_rate")).to_have_text("⚠ Learning rate: empty; give a number")
    fill(page, "cfg-learning_rate", 0.03)
    expect(page.locator("#cfg-err-learning_rate")).to_be_hidden()
    # Fields that do not apply are hidden: LoRA's rank for full fine-tuning, the DPO loss unless the goal is DPO.
    expect(page.locator("#cfg-lora_r")).to_be_visible()
    expect(page.locator("#cfg-loss_type")).to_be_hidden()
    choose(page, "cfg-method", "full")
    expect(page.locator("#cfg-lora_r")).to_be_hidden()
    choose(page, "cfg-method", "lora")
    expect(page.locator("#cfg-lora_r")).to_be_visible()


def test_check_says_it_is_pending_and_drops_an_answer_for_changed_settings(page, server):
    """Check waits on the backend (held here): the page says so at once; the settings change meanwhile, so the late
    answer is dropped with a note instead of being shown under the new value."""
    studio, entered, release = server["studio"], threading.Event(), threading.Event()
    real = studio.verify

    def held(values):
        entered.set()
        release.wait(60)
        return real(values)

    studio.verify = held
    try:
        page.locator("#cfg-check").click()
        expect(page.locator("#cfg-summary")).to_contain_text("⏳ Checking the model and data as Start will")
        assert entered.wait(30)
        fill(page, "cfg-max_seq_length", 40)
        release.set()
        expect(page.locator("#cfg-summary")).to_contain_text("The settings changed while this was running")
    finally:
        release.set()
        studio.verify = real


def test_configure_loads_tiny_data_and_previews_it(page, files):
    fill(page, "cfg-dataset", files["train"])
    fill(page, "cfg-eval_split", files["val"])
    fill(page, "cfg-max_seq_length", 48)
    open_group(page, "Output", "eval_steps")
    for elem_id, value in (
        ("cfg-learning_rate", 0.03),
        ("cfg-warmup_steps", 0),
        ("cfg-eval_steps", 15),
        ("cfg-save_steps", 15),
        ("cfg-gradient_accumulation_steps", 2),
    ):
        fill(page, elem_id, value)
    page.locator("#cfg-check").click()
    expect(page.locator("#cfg-summary")).to_contain_text("All settings are valid")
    page.locator("#cfg-preview").click()
    preview = page.locator("#cfg-preview-box")
    expect(preview).to_contain_text("48 training rows")
    expect(preview).to_contain_text("4 evaluation rows")
    expect(preview.locator(".fs-example .fs-trained").first).to_contain_text("Arr, matey!")
    preview.scroll_into_view_if_needed()
    shot(page, "04-configure-preview")
    with page.expect_download() as download:  # one click saves the settings as run.yaml
        page.locator("#cfg-save").click()
    assert download.value.suggested_filename == "run.yaml"
    assert f"max_steps: {STEPS}\n" in Path(download.value.path()).read_text(encoding="utf-8")


def test_train_starts_and_progress_advances(page, server, tiny_model_dir):
    tab(page, "Train")
    plan = page.locator("#train-plan")  # what Start will run, before Start
    expect(plan).to_contain_text("Start will train")
    expect(plan).to_contain_text(str(tiny_model_dir))
    expect(plan).to_contain_text(f"{STEPS} steps")
    expect(plan).to_contain_text("at the peak")
    page.locator("#train-start").click()
    expect(page.locator("#train-message")).to_contain_text("Started run")
    server["gate"].wait_held()  # the run is at step HOLD and waits there
    progress = page.locator("#train-progress .fs-progress")
    expect(progress).to_have_attribute("data-step", str(HOLD))
    expect(progress).to_have_attribute("data-status", "running")
    expect(page.locator("#train-plot")).not_to_contain_text("No data")
    runs = page.locator("#train-runs-table")  # the live step, by a readable name
    expect(runs).to_contain_text(f"{HOLD} / {STEPS}")
    expect(runs).to_contain_text("Training")
    expect(runs).to_contain_text(" · LoRA · ")
    expect(page.locator("#train-resume")).to_be_disabled()
    shot(page, "05-train-running")


def test_a_reload_mid_run_reattaches(page, server):
    run_id = server["studio"].state().run_id
    assert server["studio"].state().status == "running"  # still held at HOLD: certainly mid-run
    try:
        open_app(page)  # reload, and wait until the app is there again
        # The page opens on Start and says a run is training, with the way to it.
        notice = page.locator("#fs-running")
        expect(notice).to_contain_text("A run is training")
        expect(notice).to_contain_text(run_title(server["studio"].run(run_id)))
        page.locator("#fs-running-open").click()
        expect(page.get_by_role("tab", name="Train", exact=True)).to_have_attribute("aria-selected", "true")
        progress = page.locator("#train-progress .fs-progress")
        expect(progress).to_contain_text(run_id)
        expect(progress).to_have_attribute("data-status", "running")
        expect(progress).to_have_attribute("data-step", str(HOLD))
        expect(page.locator("#train-stop")).to_be_enabled()
        shot(page, "06-train-after-reload")
        # The settings typed before the reload were kept by the browser.
        tab(page, "Configure")
        open_group(page, "Optimisation", "max_steps")
        assert value_of(page, "cfg-max_steps") == str(STEPS)
        assert value_of(page, "cfg-dataset").endswith("train.jsonl")
    finally:
        server["gate"].release()  # the page follows the run on from there (and the story goes on if this failed)
    tab(page, "Train")
    page.wait_for_function(
        f"() => +(document.querySelector('#train-progress .fs-progress')?.dataset.step || 0) > {HOLD}",
        timeout=60_000,
    )
    assert progress_step(page) > HOLD


def test_the_run_finishes_with_a_loss_curve_and_answers(page):
    tab(page, "Train")
    progress = page.locator("#train-progress .fs-progress")
    expect(progress).to_have_attribute("data-status", "completed", timeout=180_000)
    expect(page.locator("#train-progress")).to_contain_text(f"step {STEPS} / {STEPS}")
    # The plot has drawn marks (vega renders the line as SVG paths or onto a canvas).
    plot = page.locator("#train-plot")
    expect(plot.locator("canvas, svg path[d]").first).to_be_attached()
    expect(plot).not_to_contain_text("No data")
    expect(page.locator("#train-samples")).to_contain_text("Answer before training (step 0)")
    expect(page.locator("#train-samples")).to_contain_text(f"Answer at step {STEPS}")
    expect(page.locator("#train-log textarea")).to_have_value(re.compile("status → completed"))
    expect(page.locator("#train-runs-table")).to_contain_text("Finished")
    expect(page.locator("#train-resume")).to_be_disabled()  # a completed run cannot resume
    expect(page.locator("#train-message")).not_to_contain_text("Started run")  # the line went with the run
    shot(page, "07-train-finished")


def test_chat_answers_with_the_trained_adapter(page, server, tiny_model_dir):
    """The reply on the page is word for word the greedy reply of the run's weights, and it talks like a pirate."""
    run_id, run_dir = run_of(server)
    tab(page, "Chat")
    page.locator("#chat-refresh").click()
    name = run_title(server["studio"].run(run_id))  # listed by readable name, the newest finished run chosen
    expect(page.locator("#chat-source input").first).to_have_value(f"{name} (tuned)")
    choose(page, "chat-source", name)
    expect(page.locator("#chat-main")).to_contain_text(f"Chat with {name}")
    set_reply_tokens(page, REPLY_TOKENS)
    box = page.locator("#chat-input textarea, #chat-input input").first
    box.fill("Question 7?")
    box.press("Enter")
    reply = finished_reply(server)
    # The reference generates as many tokens as the server was asked for: on CI (three workers on two cores) the
    # server twice received the slider's default although the page showed the typed value (not reproduced here).
    expected = greedy_reply(tiny_model_dir, run_dir, "Question 7?", reply["tokens"])
    assert (reply["source"], reply["prompt"], reply["text"]) == (run_id, "Question 7?", expected)
    assert expected.startswith("Arr")  # what a user notices: the tuned model talks like a pirate
    expect_reply(page, "chat-main", expected)
    shot(page, "08-chat-tuned")


def test_chat_side_by_side_with_the_base_model(page, server, tiny_model_dir):
    """The same message goes to the run and to the model it started from; each column shows its own greedy reply,
    and they differ."""
    run_id, run_dir = run_of(server)
    page.locator("#chat-clear").click()  # a new conversation: one message, as greedy_reply sends
    expect(page.locator("#chat-main")).not_to_contain_text("Question 7?")
    page.locator("#chat-compare input").check()
    expect(page.locator("#chat-base")).to_be_visible()
    box = page.locator("#chat-input textarea, #chat-input input").first
    box.fill("Question 3?")
    box.press("Enter")
    replies = {r["source"]: r for r in (finished_reply(server), finished_reply(server))}  # streamed together
    tuned, base = replies[run_id], replies[BASE_OF + run_id]
    assert tuned["text"] == greedy_reply(tiny_model_dir, run_dir, "Question 3?", tuned["tokens"])
    assert base["text"] == greedy_reply(tiny_model_dir, None, "Question 3?", base["tokens"])
    assert letters(tuned["text"]) != letters(base["text"])
    expect_reply(page, "chat-main", tuned["text"])
    expect_reply(page, "chat-base", base["text"])
    expect(page.locator("#chat-base")).to_contain_text("Question 3?")
    shot(page, "09-chat-side-by-side")


def test_publish_pushes_the_trained_run_through_a_password_field(page, server):
    run_id, run_dir = run_of(server)
    hub = server["hub"]
    tab(page, "Publish")
    expect(page.locator("#pub-run input")).to_have_value(re.compile(re.escape(run_id)))
    page.locator("#pub-push").click()
    expect(page.locator("#pub-result")).to_contain_text("repo")  # no repo id given: one-line error
    assert hub.repos == {}
    token = page.locator("#pub-token").locator("input, textarea").first
    assert token.get_attribute("type") == "password"  # the token is never shown
    fill(page, "pub-repo", "alice/pirate-lora")
    token.fill(GOOD_TOKEN)
    page.locator("#pub-push").click()
    expect(page.locator("#pub-result")).to_contain_text(f"Pushed the adapter of {run_id}")
    expect(token).to_have_value("")  # cleared after the push
    repo = hub.repos["alice/pirate-lora"]
    assert repo.private
    assert repo.files["adapter_model.safetensors"] == (run_dir / "adapter_model.safetensors").read_bytes()
    assert pushed_files_hold_no_secret(hub, GOOD_TOKEN) and GOOD_TOKEN not in page.content()
    shot(page, "10-publish")


def test_export_offers_the_files_for_download(page, server):
    """The exported files are links on the page (on a Space the run's folder is out of reach): the browser downloads
    the very bytes written in the run's exports/ folder. (A merged model: the tiny test tokenizer has no llama.cpp
    pre-tokenizer, so its GGUF is refused.)"""
    run_id, run_dir = run_of(server)
    tab(page, "Publish")
    page.get_by_text("Export to run it anywhere").click()
    page.locator("#pub-export-format").get_by_text("merged", exact=True).click()
    page.locator("#pub-export").click()
    expect(page.locator("#pub-export-result")).to_contain_text("Download it below", timeout=120_000)
    weights = run_dir / "exports" / "merged" / "model.safetensors"
    link = page.locator('#pub-export-files a[download="model.safetensors"]')
    expect(link).to_be_visible()
    expect(page.locator('#pub-export-files a[download="config.json"]')).to_be_visible()
    with page.expect_download() as download:
        link.click()
    assert Path(download.value.path()).read_bytes() == weights.read_bytes()
    shot(page, "11-export-download")


# ----------------------------------------------------------------------------------------------- after the story
# How many lines a table cell's text takes on the screen (an inline text box has one client rect per line).
LINES_OF = "e => (e.querySelector('span.text') || e).getClientRects().length"


def test_a_narrow_screen_keeps_every_tab_reachable(page, server):
    """At 420 px every tab stays in view (no "⋯" menu hiding Chat and Publish), and tables scroll instead of breaking
    words letter by letter."""
    narrow = page.context.browser.new_page(viewport={"width": 420, "height": 900})
    try:
        open_app(narrow, server["url"])
        for name in ("Start", "Memory", "Configure", "Train", "Chat", "Evaluate", "Publish"):
            expect(narrow.get_by_role("tab", name=name, exact=True)).to_be_visible()
        narrow.get_by_role("tab", name="Publish", exact=True).click()
        expect(narrow.locator("#pub-push")).to_be_visible()
        narrow.get_by_role("tab", name="Train", exact=True).click()
        cell = narrow.locator("#train-runs-table").get_by_role("gridcell", name=re.compile(" · LoRA · ")).first
        expect(cell).to_be_visible()
        assert cell.evaluate(LINES_OF) == 1  # the run's name stays on one line; the table scrolls sideways instead
        scroller = narrow.locator("#train-runs-table .table-container").first
        assert scroller.evaluate("e => getComputedStyle(e).overflowX") == "auto"
        shot(narrow, "11-narrow-train")
    finally:
        narrow.close()


def pairs_file(folder: Path) -> Path:
    """Tiny preference pairs: a pirate answer preferred to a plain one."""
    path = folder / "pairs.jsonl"
    rows = [{"prompt": f"Question {i}?", "chosen": "Arr, matey!", "rejected": "Hello there."} for i in range(16)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def set_field(page, group: str, field: str, value) -> None:
    open_group(page, group, field)
    fill(page, f"cfg-{field}", value)


def test_a_dpo_run_from_the_form_shows_its_rewards(page, server, files):
    """Goal DPO in the form, tiny pairs, a few steps: the Train tab shows the reward margin beside the loss."""
    tab(page, "Configure")
    choose(page, "cfg-objective", "dpo")
    expect(page.locator("#cfg-beta")).to_be_visible()
    expect(page.locator("#cfg-loss_type")).to_be_visible()
    fill(page, "cfg-dataset", pairs_file(files["train"].parent))
    fill(page, "cfg-eval_split", "")
    set_field(page, "Optimisation", "max_steps", 4)
    tab(page, "Train")
    expect(page.locator("#train-plan")).to_contain_text("preferences (DPO)")
    page.locator("#train-start").click()
    expect(page.locator("#train-message")).to_contain_text("Started run")
    progress = page.locator("#train-progress .fs-progress")
    expect(progress).to_have_attribute("data-status", "completed", timeout=120_000)
    expect(page.locator("#train-prefs")).to_contain_text("reward margin")
    expect(page.locator("#train-prefs-plot")).to_be_visible()
    expect(page.locator("#train-runs-table")).to_contain_text("DPO")
    shot(page, "12-train-dpo")


def test_a_grpo_run_from_the_form_shows_its_reward_curve(page, server, files, tiny_model_dir):
    """Goal rewards in the form (objective grpo, contains:d on tiny prompts), a few steps: the Train tab shows the
    mean reward and each reward's curve, and the last step's sampled answers with their rewards."""
    prompts = files["train"].parent / "prompts.jsonl"
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(16)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tab(page, "Configure")
    choose(page, "cfg-objective", "grpo")
    expect(page.locator("#cfg-rewards")).to_be_visible()
    expect(page.locator("#cfg-chosen_column")).to_be_hidden()
    fill(page, "cfg-rewards", "contains:d")
    fill(page, "cfg-max_completion_length", 8)
    fill(page, "cfg-model", tiny_model_dir)
    fill(page, "cfg-dataset", prompts)
    fill(page, "cfg-eval_split", "")
    set_field(page, "Optimisation", "max_steps", 3)
    tab(page, "Train")
    expect(page.locator("#train-plan")).to_contain_text("rewards (GRPO)", timeout=60_000)
    page.locator("#train-start").click()
    expect(page.locator("#train-message")).to_contain_text("Started run", timeout=30_000)
    run_id = re.search(r"Started run\W*([\w.-]+)", page.locator("#train-message").inner_text()).group(1)
    progress = page.locator("#train-progress .fs-progress", has=page.locator(".fs-run", has_text=run_id))
    expect(progress).to_have_attribute("data-status", "completed", timeout=180_000)
    expect(page.locator("#train-prefs")).to_contain_text("mean reward")
    expect(page.locator("#train-prefs")).to_contain_text("reward: contains")
    expect(page.locator("#train-prefs-plot")).to_be_visible()
    expect(page.locator("#train-prefs-plot")).to_contain_text("Rewards")
    expect(page.locator("#train-completions")).to_be_visible()
    expect(page.locator("#train-completions")).to_contain_text("Sampled answers at step 3")
    expect(page.locator("#train-runs-table")).to_contain_text("GRPO")
    shot(page, "12b-train-grpo")


def test_evaluate_scores_the_run_against_its_base_and_compare_puts_runs_side_by_side(page, server):
    """Evaluate: the story's run against its base, the scores as a table and a chart; the Train tab then shows the
    evaluation. Compare: the story's run and the DPO run, loss curves overlaid and scores side by side."""
    studio = server["studio"]
    run_id, _ = run_of(server)
    dpo = next(r.run_id for r in studio.runs() if r.objective == "dpo")
    tab(page, "Evaluate")
    page.locator("#eval-refresh").click()
    choose(page, "eval-source", f"{run_id} (final)")
    fill(page, "eval-limit", 3)
    fill(page, "eval-tokens", 8)
    page.locator("#eval-run").click()
    expect(page.locator("#eval-message")).to_contain_text("saved as", timeout=180_000)
    view = studio.evaluation(run_id)
    rouge = next(row for row in view.table if row[0] == "ROUGE-L")
    expect(page.locator("#eval-table")).to_contain_text("ROUGE-L")
    expect(page.locator("#eval-table")).to_contain_text(rouge[2])  # the tuned score the backend stored
    expect(page.locator("#eval-chart").locator("canvas, svg path[d]").first).to_be_attached()
    expect(page.locator("#eval-answers")).to_contain_text(view.answers[0][0])
    shot(page, "14-evaluate")
    choose(page, "compare-runs", run_id)
    choose(page, "compare-runs", dpo)
    page.locator("#compare-run").click()
    expect(page.locator("#compare-table")).to_contain_text(dpo, timeout=60_000)
    expect(page.locator("#compare-table")).to_contain_text(run_id)
    expect(page.locator("#compare-curves").locator("canvas, svg path[d]").first).to_be_attached()
    expect(page.locator("#compare-message")).to_contain_text(f"{dpo} has no evaluation yet")
    page.locator("#eval-compare").scroll_into_view_if_needed()
    shot(page, "15-compare")
    tab(page, "Train")
    choose(page, "train-run-pick", run_id)
    expect(page.locator("#train-evaluation")).to_contain_text("Latest evaluation", timeout=30_000)


def test_a_two_process_run_starts_from_the_train_tab(page, server, files):
    from ui.train_tab import max_processes

    if max_processes(server["studio"]) < 2:
        pytest.skip("this machine offers one process only (one GPU or one CPU core)")
    tab(page, "Configure")
    choose(page, "cfg-objective", "sft")
    fill(page, "cfg-dataset", files["train"])
    set_field(page, "Optimisation", "max_steps", 2)
    tab(page, "Train")
    choose(page, "train-processes", "2")
    page.locator("#train-start").click()
    expect(page.locator("#train-message")).to_contain_text("Started run")
    run_id = re.search(r"Started run\W*([\w.-]+)", page.locator("#train-message").inner_text()).group(1)
    # The box may still show the previous test's finished run for a moment: wait for this run's own end.
    progress = page.locator("#train-progress .fs-progress", has=page.locator(".fs-run", has_text=run_id))
    expect(progress).to_have_attribute("data-status", "completed", timeout=180_000)
    run = server["studio"].run(run_id)
    assert run is not None and run.status == "completed" and run.step == 2, run
    shot(page, "13-train-two-processes")
