"""Image data and vision-language models on the page: a data file uploaded with its images (several files, or one
.zip unpacked safely into the visitor's folder), the Configure preview's thumbnails, the vision settings shown only
for a vision-language model, and Chat with a picture.

The first tests call the upload store and the tab handlers directly (no browser). The browser story then drives the
app in headless Chromium on a tiny random SmolVLM built in code (tests/tiny.py): upload a few PNGs with their JSONL,
the preview shows their thumbnails, a 3-step run trains from the Train tab, and Chat answers a picture side by side
with the base model, word for word what the backend generated. Screenshots go to test-artifacts/ui-vlm/.

Run: .venv/bin/python -m pytest -p no:randomly tests/test_ui_vlm.py
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
import zipfile
from pathlib import Path

import pytest

from finetune.access.uploads import UploadLimits, Uploads
from finetune.config import FIELD_NAMES
from finetune.errors import UserError
from finetune.studio import BASE, Studio
from tests.test_ui_support import (
    app_page,
    browser_expect,
    browser_test,
    fill,
    letters,
    open_group,
    served_app,
    tab,
)
from tests.tiny import build_smolvlm, write_image_rows

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "ui-vlm"
STEPS = 3
REPLY_TOKENS = 6


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> Path:
    return build_smolvlm(tmp_path_factory.mktemp("tiny-smolvlm"))


@pytest.fixture(scope="module")
def image_set(tmp_path_factory) -> dict:
    """Four 64-pixel PNGs and the JSONL that asks for their colours (image paths relative to the JSONL)."""
    data = write_image_rows(tmp_path_factory.mktemp("image-set"), rows=4)
    return {"data": data, "images": sorted(data.parent.glob("*.png"))}


def zipped(path: Path, members: dict[str, bytes | Path]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content.read_bytes() if isinstance(content, Path) else content)
    return path


# ----------------------------------------------------------------------------------------------- the upload store
def test_a_data_file_and_its_images_are_kept_together_and_resolve_for_their_owner_only(tmp_path, image_set):
    store = Uploads(tmp_path / "uploads")
    sent = [(image_set["data"], "data.jsonl"), *((p, p.name) for p in image_set["images"])]
    value = store.add_set("alice", sent)
    assert value == "upload:data/data.jsonl"
    kept = store.resolve("alice", value)
    assert kept.read_text() == image_set["data"].read_text()
    assert sorted(p.name for p in kept.parent.glob("*.png")) == [p.name for p in image_set["images"]]
    assert store.resolve("bob", value) is None  # another identity: as for a name never uploaded
    for forged in ("upload:data/../data/data.jsonl", "upload:/etc/passwd", "upload:data/.hidden", "upload:data//x"):
        assert store.resolve("alice", forged) is None
    assert store.add_set("alice", sent) == "upload:data-2/data.jsonl"  # a second set never overwrites the first
    assert [store.name_of("alice", p) for p in store.files("alice")] == [value, "upload:data-2/data.jsonl"]
    assert len(store.entries("alice")) == 2  # a set counts as one upload against the limit


def test_a_zip_is_unpacked_into_the_visitors_folder_without_its_top_folder(tmp_path, image_set):
    store = Uploads(tmp_path / "uploads")
    members = {"shapes/data.jsonl": image_set["data"], "shapes/README.txt": b"left out", "__MACOSX/x.png": b""}
    members.update({f"shapes/{p.name}": p for p in image_set["images"]})
    value = store.add_set("alice", [(zipped(tmp_path / "shapes.zip", members), "shapes.zip")])
    kept = store.resolve("alice", value)
    assert value == "upload:data/data.jsonl" and kept.parent.parent == store.folder("alice")
    assert sorted(p.name for p in kept.parent.iterdir()) == sorted(
        ["data.jsonl", *(p.name for p in image_set["images"])]
    )


@pytest.mark.parametrize(
    ("members", "expected"),
    [
        ({"../evil.jsonl": b"{}"}, "a path outside its folder"),
        ({"/etc/evil.jsonl": b"{}"}, "a path outside its folder"),
        ({"a/../../evil.jsonl": b"{}"}, "a path outside its folder"),
        ({"data.jsonl": b"{}", "my picture.png": b"x"}, "is not a plain file name"),
        ({"picture.png": b"x"}, "no data file"),
        ({"data.jsonl": b"{}", "big.png": b"x" * 2048}, "more than the"),
    ],
)
def test_an_unsafe_or_oversized_zip_is_refused_in_one_line_keeping_nothing(tmp_path, members, expected):
    store = Uploads(tmp_path / "uploads", UploadLimits(file_mb=1024 / 1024**2))
    archive = zipped(tmp_path / "set.zip", members)
    with pytest.raises(UserError, match=expected) as refused:
        store.add_set("alice", [(archive, "set.zip")])
    assert refused.value.field == "dataset" and "\n" not in str(refused.value)
    assert not list(store.folder("alice").glob("*")) if store.folder("alice").exists() else True


def test_a_zip_link_and_a_set_past_the_total_are_refused(tmp_path, image_set):
    store = Uploads(tmp_path / "uploads", UploadLimits(total_mb=300 / 1024**2))
    link = zipfile.ZipInfo("data.jsonl")
    link.external_attr = 0o120777 << 16  # a symbolic link, as zip -y stores one
    with zipfile.ZipFile(tmp_path / "link.zip", "w") as archive:
        archive.writestr(link, "/etc/passwd")
    with pytest.raises(UserError, match="a link"):
        store.add_set("alice", [(tmp_path / "link.zip", "link.zip")])
    sent = [(image_set["data"], "data.jsonl"), *((p, p.name) for p in image_set["images"])]
    with pytest.raises(UserError, match="more than the 300 bytes allowed in all"):
        store.add_set("alice", sent)
    assert not store.entries("alice")


# ----------------------------------------------------------------------------------------------- handlers
@pytest.fixture()
def ui(studio_home):
    from ui.app import build_app

    return build_app(Studio(studio_home / "runs")).studio_ui


def test_upload_preview_fields_and_chat_handlers(ui, vlm_dir, image_set):
    """The Configure upload takes the data with its images; the preview has one thumbnail per row's image; the
    vision settings show for the VLM only; Chat's picture box likewise, and a picture sent to the base VLM is
    kept among the visitor's uploads and read back from the conversation on the next turn."""
    files = [str(image_set["data"]), *map(str, image_set["images"])]
    dataset, error, note = ui.config.use_data_file(files)
    assert dataset == "upload:data/data.jsonl" and not error["visible"] and "data.jsonl" in note
    values = {**ui.studio.default_values(), "model": str(vlm_dir), "dataset": dataset, "eval_split": ""}
    html = ui.config.show_preview(**values)[0]
    assert html.count('<img src="data:image/png;base64,') == 3  # three example rows, one picture each
    assert "img0_0.png" in html and 'class="fs-masked">&lt;|im_start|&gt;User:&lt;image&gt;' in html

    shown = {n: u.get("visible") for n, u in zip(FIELD_NAMES, ui.config.visibility(**values), strict=True)}
    assert shown["freeze_vision_tower"] and shown["image_longest_side"] and shown["freeze_projector"]
    text = dict(values, model=ui.studio.default_values()["model"])
    shown = {n: u.get("visible") for n, u in zip(FIELD_NAMES, ui.config.visibility(**text), strict=True)}
    assert not shown["freeze_vision_tower"] and not shown["image_longest_side"]
    assert ui.chat.image_box(BASE, **values)["visible"] and not ui.chat.image_box(BASE, **text)["visible"]

    picture = str(image_set["images"][1])
    *_, (_, history, _) = ui.chat.respond("What colour?", [], [], BASE, False, 4, 0.0, 1.0, "", picture, **values)
    turn = history[0]["content"]
    assert turn[0]["alt_text"] == "upload:img1_0.png" and turn[1] == {"type": "text", "text": "What colour?"}
    assert ui.studio.uploads.resolve(ui.studio.identity, "upload:img1_0.png").read_bytes() == Path(picture).read_bytes()
    assert history[1]["role"] == "assistant" and history[1]["content"].strip()
    asked = []
    real = ui.studio.chat

    def chat(source, messages, settings, base_values=None, images=None):
        asked.append((messages[-3]["content"], images))
        yield from real(source, messages, settings, base_values, images)

    ui.studio.chat = chat
    *_, (_, history, _) = ui.chat.respond("And now?", history, [], BASE, False, 4, 0.0, 1.0, "", **values)
    assert asked == [("<image>\nWhat colour?", ["upload:img1_0.png"])]  # the earlier picture, where it stood

    *_, (_, history, _) = ui.chat.respond("What colour?", [], [], BASE, False, 4, 0.0, 1.0, "", picture, **text)
    assert history[-1]["content"].startswith("⚠️ images: this model reads text only")


# ----------------------------------------------------------------------------------------------- the browser story
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app on a free port, served from this process, each chat reply recorded once its generation ended."""
    home = tmp_path_factory.mktemp("ui-vlm-home")
    studio = Studio(home / "runs")
    replies: queue.Queue = queue.Queue()
    real_pair = studio.chat_pair

    def chat_pair(source, messages, base_messages, settings, images=None):
        last = {}
        for side, text, error in real_pair(source, messages, base_messages, settings, images):
            last[side] = text if error is None else f"error: {error}"
            yield side, text, error
        replies.put({"images": images, "prompt": messages[-1]["content"], **last})

    studio.chat_pair = chat_pair
    with served_app(studio, home) as url:
        try:
            yield {"url": url, "studio": studio, "replies": replies}
        finally:
            for thread in threading.enumerate():  # a reply still generating: let it end before the interpreter
                if thread.name == "generate":
                    thread.join(timeout=60)


@pytest.fixture(scope="module")
def page(server):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with app_page(server["url"], viewport={"width": 1280, "height": 900}) as page:
        yield page


@browser_test
def test_upload_images_preview_thumbnails_train_and_chat_with_a_picture(page, server, vlm_dir, image_set):
    expect = browser_expect()
    tab(page, "Configure")
    expect(page.locator("#cfg-freeze_vision_tower")).to_be_hidden()  # the embedded text model: no image settings
    fill(page, "cfg-model", vlm_dir)
    expect(page.locator("#cfg-freeze_vision_tower")).to_be_visible()
    expect(page.locator("#cfg-image_longest_side")).to_be_visible()

    # The JSONL and its pictures in one upload: kept together, the dataset field names the kept JSONL.
    with page.expect_file_chooser() as chooser:
        page.locator("#cfg-upload-data").click()
    chooser.value.set_files([str(image_set["data"]), *map(str, image_set["images"])])
    expect(page.locator("#cfg-dataset").locator("input, textarea").first).to_have_value("upload:data/data.jsonl")
    fill(page, "cfg-eval_split", "")
    open_group(page, "Optimisation", "max_steps")
    for elem_id, value in (
        ("cfg-max_steps", STEPS),
        ("cfg-per_device_train_batch_size", 2),
        ("cfg-gradient_accumulation_steps", 1),
        ("cfg-learning_rate", 0.03),
        ("cfg-warmup_steps", 0),
    ):
        fill(page, elem_id, value)
    open_group(page, "Output", "save_steps")
    fill(page, "cfg-save_steps", STEPS)
    fill(page, "cfg-eval_steps", STEPS)

    page.locator("#cfg-preview").click()
    preview = page.locator("#cfg-preview-box")
    expect(preview).to_contain_text("4 training rows")
    thumbs = preview.locator(".fs-thumb img")
    expect(thumbs).to_have_count(3)
    expect(preview.locator(".fs-example").first.locator(".fs-masked").first).to_contain_text("<image>")
    expect(preview.locator(".fs-example").first.locator(".fs-trained")).to_contain_text("It is red.")
    decoded = thumbs.first.evaluate("img => img.complete && img.naturalWidth")
    assert decoded > 0, "the thumbnail did not decode as a picture"
    preview.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "01-preview.png"), full_page=True)

    tab(page, "Train")
    page.locator("#train-start").click()
    expect(page.locator("#train-message")).to_contain_text("Started run")
    progress = page.locator("#train-progress .fs-progress")
    expect(progress).to_have_attribute("data-status", "completed", timeout=180_000)
    expect(page.locator("#train-progress")).to_contain_text(f"step {STEPS} / {STEPS}")
    page.screenshot(path=str(ARTIFACTS / "02-trained.png"), full_page=True)

    tab(page, "Chat")
    expect(page.locator("#chat-source input").first).to_have_value(re.compile(r"\(tuned\)"))
    page.locator("#chat-compare input").check()
    page.locator("#chat-settings").get_by_text("Generation settings").click()
    tokens = page.locator("#chat-settings input[type=number]").first
    tokens.fill(str(REPLY_TOKENS))
    tokens.press("Enter")
    expect(page.locator("#chat-settings input[type=range]").first).to_have_value(str(REPLY_TOKENS))
    box = page.locator("#chat-image")
    expect(box).to_be_visible()
    box.locator("input[type=file]").set_input_files(str(image_set["images"][2]))
    expect(box.locator("img").first).to_be_visible()
    page.locator("#chat-input textarea").fill("What colour?")
    page.locator("#chat-send").click()
    reply = server["replies"].get(timeout=120)
    assert reply["images"] == ["upload:img2_0.png"] and reply["prompt"] == "<image>\nWhat colour?"
    for chatbot, side in (("chat-main", "run"), ("chat-base", "base")):
        assert not reply[side].startswith("error"), reply
        bot = page.locator(f"#{chatbot} .bot, #{chatbot} [data-testid='bot']").last
        page.wait_for_function(
            "([sel, want]) => { const b = [...document.querySelectorAll(sel)].pop();"
            " return b && b.innerText.replace(/[^0-9A-Za-z]/g, '') === want; }",
            arg=[f"#{chatbot} .bot, #{chatbot} [data-testid='bot']", letters(reply[side])],
        )
        assert letters(bot.inner_text()) == letters(reply[side])
        expect(page.locator(f"#{chatbot} img").first).to_be_visible()  # the picture in the conversation
    expect(box.locator("img")).to_have_count(0)  # the picture went with the message
    page.screenshot(path=str(ARTIFACTS / "03-chat.png"), full_page=True)


def test_the_chat_api_takes_a_picture_with_the_message(server, image_set, tiny_model_dir):
    """/chat through gradio_client with a picture (handle_file): the tuned run's reply is what the backend generates
    for that picture; the same call to a model that reads text only is refused in one line."""
    from gradio_client import handle_file

    from finetune.model.inference import GenerationSettings
    from tests.test_ui_support import api_client

    studio = server["studio"]
    run = next(r.run_id for r in studio.runs() if r.status == "completed")  # the browser story's run
    picture = image_set["images"][1]
    client = api_client(server["url"])
    reply = client.predict("What colour?", run, image=handle_file(str(picture)), max_new_tokens=4, api_name="/chat")
    asked = [{"role": "user", "content": "<image>\nWhat colour?"}]
    expected = list(studio.chat(run, asked, GenerationSettings(max_new_tokens=4), images=[str(picture)]))[-1]
    assert reply == expected
    kept = studio.upload_names()
    with pytest.raises(Exception, match="images: this model reads text only"):
        client.predict(
            "What colour?", "base", settings={"model": str(tiny_model_dir)}, image=handle_file(str(picture)),
            api_name="/chat",
        )  # fmt: skip
    assert studio.upload_names() == kept  # the refused picture was not kept


def test_on_a_public_app_the_preview_shows_only_the_visitors_own_pictures(studio_home, image_set):
    """A data file may name any path; where visitors may not name server files, a previewed image that is not among
    the visitor's uploads (another visitor's, a server file) refuses the preview in one line: its picture is never
    shown."""
    from finetune.access.policy import AccessPolicy

    alice = Studio(studio_home / "runs", policy=AccessPolicy(public=True)).as_visitor("alice")
    bob = alice.as_visitor("bob")
    value = alice.add_uploads([(image_set["data"], "data.jsonl"), *((p, p.name) for p in image_set["images"])])
    own = str(alice.uploads.resolve("alice", value).parent / "img0_0.png")
    alice._confine_images({"examples": [{"images": [own]}]})  # her own upload: shown
    members = {"data.jsonl": image_set["data"], **{f"pictures/{p.name}": p for p in image_set["images"]}}
    archive = zipped(studio_home / "set.zip", members)
    assert alice.add_uploads([(archive, "set.zip")]) == "upload:data-2/data.jsonl"  # one zip: a set too
    for elsewhere in (own, str(image_set["images"][0])):  # hers seen from bob's side; a file on the server
        with pytest.raises(UserError, match="is not among your uploads") as refused:
            bob._confine_images({"examples": [{"images": [elsewhere]}]})
        assert refused.value.field == "dataset"


def test_uploaded_data_reads_only_the_images_uploaded_with_it(studio_home, vlm_dir, image_set):
    """A visitor's data file that names another visitor's picture (`../`) or a server file (an absolute path) is
    refused in one line naming the row before anything trains: training would read the picture."""
    from finetune import data
    from finetune.access.policy import AccessPolicy
    from tests.helpers import write_jsonl
    from tests.test_vlm import vlm_config

    alice = Studio(studio_home / "runs", policy=AccessPolicy(public=True)).as_visitor("alice")
    bob = alice.as_visitor("bob")
    sent = [(image_set["data"], "data.jsonl"), *((p, p.name) for p in image_set["images"])]
    hers = alice.uploads.resolve("alice", alice.add_uploads(sent))
    own = bob.uploads.resolve("bob", bob.add_uploads(sent))
    row = json.loads(image_set["data"].read_text(encoding="utf-8").splitlines()[0])
    assert data.load_raw(vlm_config(vlm_dir, own))  # bob's own set reads (the model is not opened here)
    theirs = os.path.relpath(hers.parent / "img0_0.png", own.parent)
    for elsewhere in (theirs, str(image_set["images"][0])):
        forged = write_jsonl(own.parent / "forged.jsonl", [row, {**row, "images": [elsewhere]}])
        with pytest.raises(UserError) as caught:
            data.load_raw(vlm_config(vlm_dir, forged))
        assert caught.value.field == "dataset" and "row 2" in str(caught.value), caught.value
        assert "is not among the files uploaded with the data" in str(caught.value)
    # The same file outside the uploads (a local user's own data) may name pictures anywhere.
    anywhere = {**row, "images": [str(image_set["images"][0])]}
    local = write_jsonl(studio_home / "local.jsonl", [anywhere, anywhere])
    assert data.load_raw(vlm_config(vlm_dir, local))
