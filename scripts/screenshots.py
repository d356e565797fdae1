"""Screenshots of every tab at 1400 px and 420 px wide for the README (docs/<tab>-<width>.png).

The app runs in this process with its runs in a temporary folder (no run of yours is shown or touched), on the
embedded default model unless --model names another. Playwright drives Debian's chromium. On the Start tab a proposal
is asked for first, so the picture shows one; with --steps N a short run of the defaults is trained first, so Train,
Chat, Evaluate and Publish have a run to show (Chat answers one question with it; Evaluate scores it against its base
on five rows). Pictures are cut at a height limit and saved
as palette PNGs to stay small (about 300 KB at most).

    .venv/bin/python scripts/screenshots.py [--model PATH_OR_ID] [--steps N] [--out docs]
"""

from __future__ import annotations

import argparse
import io
import os
import socket
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WIDTHS = (1400, 420)
MAX_HEIGHT = {1400: 1800, 420: 2600}  # px: the top of a long tab is what a reader needs to see
MAX_BYTES = 300 * 1024
TABS = ("Start", "Memory", "Configure", "Train", "Chat", "Evaluate", "Publish")
QUESTION = "What is the capital of Japan?"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="base model (Hub id or folder); default: the app's default (embedded)")
    parser.add_argument("--steps", type=int, default=0, help="train a short run of the defaults first (0: none)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the PNGs (default: docs/)")
    return parser.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def small_png(png: bytes) -> bytes:
    """The screenshot as a palette PNG: fewer colours until it is under MAX_BYTES (UI pictures have few colours)."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    for colours in (256, 128, 64, 32):
        out = io.BytesIO()
        image.quantize(colors=colours, method=Image.Quantize.MEDIANCUT).save(out, format="PNG", optimize=True)
        if out.tell() <= MAX_BYTES:
            break
    return out.getvalue()


def train_short_run(studio, steps: int) -> str:
    """Train the defaults for a few steps (the same start the Train tab makes) and wait for the end; its run id."""
    values = {**studio.default_values(), "max_steps": steps, "eval_steps": steps, "save_steps": steps}
    state = studio.start(values, owner="the screenshots script")
    studio.manager.wait(timeout=3600)
    print(f"run {state.run_id}: {studio.state().status}", file=sys.stderr)
    return state.run_id


def ask_for_proposal(page) -> None:
    page.get_by_role("tab", name="Start", exact=True).click()
    page.locator("#start-propose").click()
    try:
        page.wait_for_function(
            "() => { const t = document.querySelector('#start-proposal')?.innerText || '';"
            " return t.includes('Proposed') || t.includes('⚠'); }",
            timeout=180_000,
        )
    except Exception as exc:  # the picture is still worth taking
        print(f"no proposal shown: {exc}", file=sys.stderr)


def chat_once(page, run_id: str) -> None:
    """Ask the tuned run one question and wait for the reply to finish."""
    page.get_by_role("tab", name="Chat", exact=True).click()
    page.locator("#chat-refresh").click()
    page.locator("#chat-source input").first.click()
    page.get_by_role("option", name=run_id).first.click()
    box = page.locator("#chat-input textarea, #chat-input input").first
    box.fill(QUESTION)
    box.press("Enter")
    try:
        page.wait_for_function(
            "() => { const b = [...document.querySelectorAll('#chat-main .bot, #chat-main [data-testid=bot]')].pop();"
            " return b && b.innerText.trim().length > 0; }",
            timeout=180_000,
        )
        page.wait_for_function(  # the streamed reply has stopped growing
            "() => new Promise(done => { const text = () => [...document.querySelectorAll('#chat-main .bot')]"
            ".map(b => b.innerText).join(); const before = text(); setTimeout(() => done(text() === before), 3000); })",
            timeout=180_000,
        )
    except Exception as exc:
        print(f"no chat reply shown: {exc}", file=sys.stderr)


def evaluate_once(page, run_id: str) -> None:
    """Score the run against its base on five rows and wait for the result."""
    page.get_by_role("tab", name="Evaluate", exact=True).click()
    page.locator("#eval-refresh").click()
    page.locator("#eval-source input").first.click()
    page.get_by_role("option", name=f"{run_id} (final)").first.click()
    limit = page.locator("#eval-limit input").first
    limit.fill("5")
    limit.press("Tab")
    page.locator("#eval-run").click()
    try:
        page.locator("#eval-message").get_by_text("saved as").wait_for(timeout=600_000)
    except Exception as exc:
        print(f"no evaluation shown: {exc}", file=sys.stderr)


def shoot(page, out: Path, width: int) -> None:
    """Every tab at this width, saved as out/<tab>-<width>.png."""
    page.set_viewport_size({"width": width, "height": 900})
    for name in TABS:
        page.get_by_role("tab", name=name, exact=True).click()
        page.wait_for_timeout(1500)  # the tab's own loading (plots, tables)
        height = min(page.evaluate("() => document.documentElement.scrollHeight"), MAX_HEIGHT[width])
        png = page.screenshot(full_page=True, clip={"x": 0, "y": 0, "width": width, "height": height})
        path = out / f"{name.lower()}-{width}.png"
        path.write_bytes(small_png(png))
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {path.stat().st_size // 1024} KB")


def main(argv: list[str] | None = None) -> int:
    """Start the app in a temporary home, take the pictures, stop it."""
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    if args.model:
        os.environ["FINETUNE_DEFAULT_MODEL"] = args.model  # the form's default model (read when the config loads)
    sys.path.insert(0, str(ROOT))
    from playwright.sync_api import sync_playwright

    from finetune.studio import Studio
    from ui.app import build_app, launch

    # Runs (and uploads) in an empty temporary folder: the pictures show no run of yours; the converted embedded
    # model is still read from the usual cache.
    studio = Studio(Path(tempfile.mkdtemp(prefix="finetune-screenshots-")) / "runs")
    run_id = train_short_run(studio, args.steps) if args.steps > 0 else None
    demo = build_app(studio)
    port = free_port()
    launch(demo, port=port, block=False, quiet=True)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": WIDTHS[0], "height": 900})
            page.set_default_timeout(60_000)
            page.goto(f"http://127.0.0.1:{port}")
            ask_for_proposal(page)
            if run_id:
                chat_once(page, run_id)
                evaluate_once(page, run_id)
            for width in WIDTHS:
                shoot(page, args.out, width)
            browser.close()
    finally:
        demo.close()
        for thread in threading.enumerate():  # a reply still generating must end before the interpreter does
            if thread.name == "generate":
                thread.join(timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
