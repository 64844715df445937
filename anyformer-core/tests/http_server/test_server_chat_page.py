"""The chat page in headless Chromium (Debian's chromium, driven by Playwright): a reply streams in, Stop stops it."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .server_support import DRAFT_PROMPT

sync_api = pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.slow

#: Debian's chromium; Playwright's own browser downloads are never used.
CHROMIUM = os.environ.get("ANYFORMER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: Where the screenshot of a streamed reply is left for people to look at.
SCREENSHOT = Path(os.environ.get("ANYFORMER_SCREENSHOT_DIR", "/tmp")) / "anyformer-chat-page.png"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        message = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: .ci/run installs it, so CI must have it", pytrace=False)
        pytest.skip(message)
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield launched
        launched.close()


def test_a_reply_streams_in_and_stop_stops_it(browser: Any, paced_server: Any, model_folders: Any) -> None:
    url, backend, _pool = paced_server()
    model = model_folders("paced-model")
    page = browser.new_page()
    page.goto(url + "/")
    page.fill("#model", model)
    page.click("#check")
    sync_api.expect(page.locator("#verdicts")).to_contain_text("paced")
    page.fill("#prompt", "Tell me everything.")
    page.click("#send")
    reply = page.locator(".msg.assistant").last
    sync_api.expect(reply).to_contain_text("w3 ")
    sync_api.expect(page.locator("#stop")).to_be_enabled()
    grown = len(reply.inner_text())
    time.sleep(0.3)
    assert len(reply.inner_text()) > grown, "the reply should keep growing while it streams"
    page.click("#stop")
    sync_api.expect(reply.locator(".meta")).to_have_text("stopped")
    sync_api.expect(page.locator("#send")).to_be_enabled()
    stopped_at = reply.inner_text()
    time.sleep(0.3)
    assert reply.inner_text() == stopped_at, "nothing may arrive after Stop"
    deadline = time.monotonic() + 5
    while backend.finished != ["cancelled"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert backend.finished == ["cancelled"], "Stop must cancel the generation on the server"
    page.close()


def test_a_short_reply_finishes_and_the_conversation_goes_on(
    browser: Any, paced_server: Any, model_folders: Any
) -> None:
    url, backend, _pool = paced_server()
    model = model_folders("paced-model")
    page = browser.new_page(viewport={"width": 1000, "height": 640})
    page.goto(url + "/")
    page.fill("#model", model)
    page.click("#check")
    page.fill("#max-tokens", "12")
    for text in ("Hello there", "And again"):
        page.fill("#prompt", text)
        page.press("#prompt", "Enter")
        sync_api.expect(page.locator("#send")).to_be_enabled(timeout=15_000)
    replies = page.locator(".msg.assistant")
    sync_api.expect(replies).to_have_count(2)
    assert "length" in replies.last.locator(".meta").inner_text()
    assert backend.finished == ["length", "length"]
    page.screenshot(path=str(SCREENSHOT))
    page.close()


def test_a_draft_shows_greyed_while_the_reply_settles(browser: Any, paced_server: Any, model_folders: Any) -> None:
    """A backend that refines its answer in place (a text-diffusion model) sends previews; the page shows them."""
    url, _backend, _pool = paced_server()
    page = browser.new_page()
    page.goto(url + "/")
    page.fill("#model", model_folders("paced-model"))
    page.fill("#max-tokens", "60")
    page.fill("#prompt", DRAFT_PROMPT)
    page.click("#send")
    reply = page.locator(".msg.assistant").last
    sync_api.expect(reply.locator(".draft")).to_contain_text("\u2591")
    sync_api.expect(page.locator("#send")).to_be_enabled(timeout=15_000)
    sync_api.expect(reply.locator(".draft")).to_have_count(0)
    assert reply.inner_text().startswith("w1 w2 ") and "\u2591" not in reply.inner_text()
    page.close()
