"""`python app.py --auth user:password` really asks for a login (SECURITY.md).

The app is started as a user starts it, in a subprocess on a free port. Without the login, the page's config, the
API description and every event (start a run, chat ...) are refused, a wrong password is refused, and no run is
started; the browser shows the login page. With the right login, the app opens.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from finetune.engines.world import free_port
from tests.test_ui_support import APP_READY_S, CHROMIUM, STATE_S, app_page, browser_expect, wait_for

ROOT = Path(__file__).resolve().parents[1]
USER, PASSWORD = "ann", "pw-" + secrets.token_hex(6)
REFUSED = "Not authenticated"


def _listening(url: str) -> bool:
    try:
        httpx.get(url + "/", timeout=STATE_S)
        return True
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """`python app.py --auth ann:PASSWORD --port P`, its studio home in a temporary folder; stopped afterwards."""
    home = tmp_path_factory.mktemp("auth-home")
    log = home / "app.log"
    env = {**os.environ, "FINETUNE_STUDIO_HOME": str(home), "GRADIO_ANALYTICS_ENABLED": "False"}
    for name in ("FINETUNE_AUTH", "GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT", "SPACE_ID"):
        env.pop(name, None)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(
            [sys.executable, "app.py", "--auth", f"{USER}:{PASSWORD}", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: process.poll() is not None or _listening(url), timeout=APP_READY_S, what="the app to listen")
        assert process.poll() is None, f"the app exited: {log.read_text()[-2000:]}"
        yield {"url": url, "home": home}
    finally:
        process.terminate()
        try:
            process.wait(timeout=STATE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STATE_S)


def test_without_the_login_nothing_but_the_login_is_served(app):
    url = app["url"]
    for path in ("/config", "/gradio_api/info"):
        response = httpx.get(url + path, timeout=STATE_S)
        assert response.status_code == 401 and REFUSED in response.text, (path, response.status_code)
    for api_name, data in (("start", []), ("status", ["", None]), ("chat", ["Hi"])):
        response = httpx.post(f"{url}/gradio_api/call/{api_name}", json={"data": data}, timeout=STATE_S)
        assert response.status_code == 401 and REFUSED in response.text, (api_name, response.status_code)
    response = httpx.post(url + "/login", data={"username": USER, "password": PASSWORD + "x"}, timeout=STATE_S)
    assert response.status_code == 400 and "Incorrect credentials" in response.text
    response = httpx.post(url + "/login", data={"username": "bob", "password": PASSWORD}, timeout=STATE_S)
    assert response.status_code == 400
    runs = app["home"] / "runs"
    assert not runs.exists() or not any(runs.iterdir())  # nothing was started


def test_the_right_login_opens_the_app_and_its_api(app):
    url = app["url"]
    with httpx.Client(timeout=STATE_S) as client:
        response = client.post(url + "/login", data={"username": USER, "password": PASSWORD})
        assert response.status_code == 200 and response.json() == {"success": True}
        config = client.get(url + "/config")
        assert config.status_code == 200 and config.json()["title"] == "Finetune Studio"
        info = client.get(url + "/gradio_api/info")
        assert info.status_code == 200 and "/start" in info.json()["named_endpoints"]


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (apt-get install chromium)")
def test_the_browser_shows_the_login_page_and_then_the_app(app):
    pytest.importorskip("playwright.sync_api", reason="pip package playwright is not installed")
    expect = browser_expect()
    with app_page(app["url"], ready_text="log in with the user and password you were given") as page:
        expect(page.get_by_role("tab", name="Train", exact=True)).to_have_count(0)
        password = page.locator("input[type=password]")
        expect(password).to_have_count(1)
        page.get_by_role("textbox", name="username").fill(USER)
        password.fill(PASSWORD + "x")
        page.get_by_role("button", name="Login").click()
        expect(page.get_by_text("Incorrect Credentials")).to_be_visible()
        expect(page.get_by_role("tab", name="Train", exact=True)).to_have_count(0)
        page.get_by_role("textbox", name="username").fill(USER)  # the failed attempt emptied the form
        password.fill(PASSWORD)
        page.get_by_role("button", name="Login").click()
        expect(page.get_by_role("tab", name="Train", exact=True)).to_be_visible(timeout=APP_READY_S * 1000)
        expect(page.locator("#fs-header")).to_contain_text("How it works")
