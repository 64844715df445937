"""The chat page's features in headless Chromium, under the server's Content-Security-Policy: markdown with
copyable code, a hostile reply that never reaches the DOM as markup, conversations kept in the browser,
settings that reach the model, regenerate, speed under each reply, and image attachments."""

from __future__ import annotations

import base64
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest

from anyformer import Chunk, hookimpl

from .server_support import PacedBackend, plain_request
from .test_server_chat_page import browser  # noqa: F401 (the fixture)

sync_api = pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.slow

#: A reply that tries every way into the page: raw HTML, script, event handlers, javascript: links, an image.
HOSTILE_REPLY = (
    'Hello <img src="x" onerror="window.__pwned = 1"> there.\n\n'
    "<script>window.__pwned = 2</script>\n\n"
    '<svg onload="window.__pwned = 3"></svg><iframe src="javascript:window.__pwned = 4"></iframe>\n\n'
    '[click me](javascript:window.__pwned=5) and <a href="javascript:window.__pwned=6">this</a>\n\n'
    "![tracker](http://127.0.0.1:9/track.png)\n\n"
    "[fine link](https://example.org/docs)"
)
MARKDOWN_REPLY = "Here is **bold** and `inline`.\n\n```python\nprint('hi')\n```\n\n- one\n- two"
#: A 1x1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


class ScriptedBackend(PacedBackend):
    """Replies with ``replies`` in turn (the last one again when they run out), in a few chunks,
    and records the messages and options of every generation."""

    def __init__(self, *replies: str) -> None:
        super().__init__()
        self.replies = list(replies)
        self.calls: list[tuple[Any, Any]] = []

    def generate_on(self, loaded: Any, messages: Any, options: Any) -> Iterator[Chunk]:
        self.calls.append((messages, options))
        text = self.replies[min(len(self.calls), len(self.replies)) - 1]
        return self._pieces(text)

    @hookimpl
    def load(self, model: Any, request: Any) -> Any:
        handle = super().load(model, request)
        # It takes the audio blocks the page sends (and records them).
        handle.features = dataclasses.replace(handle.features, audio_input=True)
        return handle

    def _pieces(self, text: str) -> Iterator[Chunk]:
        step = max(1, len(text) // 4)
        pieces = [text[i : i + step] for i in range(0, len(text), step)]
        for count, piece in enumerate(pieces, 1):
            time.sleep(0.02)
            last = count == len(pieces)
            yield Chunk(delta=piece, tokens=count, finish_reason="stop" if last else None)


@pytest.fixture
def chat_page(browser: Any, paced_server: Any, model_folders: Any) -> Any:  # noqa: F811
    """``chat_page(*replies) -> (page, backend, url)``: the page on a server whose model says ``replies``;
    CSP violations and page errors are collected in ``page.problems``."""
    pages: list[Any] = []

    def open_page(*replies: str) -> tuple[Any, ScriptedBackend, str]:
        backend = ScriptedBackend(*replies)
        url, _backend, _pool = paced_server(backend=backend)
        context = browser.new_context()
        page = context.new_page()
        page.problems = []
        page.on("console", lambda m: page.problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: page.problems.append(str(e)))
        page.goto(url + "/")
        page.fill("#model", model_folders("scripted-model"))
        pages.append(page)
        return page, backend, url

    yield open_page
    for page in pages:
        page.context.close()


def say(page: Any, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    sync_api.expect(page.locator("#send")).to_be_enabled(timeout=15_000)


def test_the_page_runs_under_a_strict_csp_with_no_violation(chat_page: Any) -> None:
    page, _backend, url = chat_page(MARKDOWN_REPLY)
    policy = plain_request("GET", url + "/").headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy and "unsafe-inline" not in policy
    say(page, "Show me code")
    sync_api.expect(page.locator(".msg.assistant strong")).to_have_text("bold")
    assert page.problems == []


def test_markdown_renders_and_code_blocks_copy(chat_page: Any) -> None:
    page, _backend, _url = chat_page(MARKDOWN_REPLY)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    say(page, "Show me code")
    reply = page.locator(".msg.assistant").last
    sync_api.expect(reply.locator("strong")).to_have_text("bold")
    sync_api.expect(reply.locator("li")).to_have_count(2)
    sync_api.expect(reply.locator("pre code")).to_have_text("print('hi')\n")
    reply.locator("pre .copy").click()
    sync_api.expect(reply.locator("pre .copy")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == "print('hi')\n"


def test_a_hostile_reply_is_shown_as_text_and_never_runs(chat_page: Any) -> None:
    page, _backend, _url = chat_page(HOSTILE_REPLY)
    fetched: list[str] = []
    page.on("request", lambda r: fetched.append(r.url))
    say(page, "Say something nasty")
    reply = page.locator(".msg.assistant").last
    sync_api.expect(reply.locator(".meta")).to_contain_text("stop")
    body = reply.locator(".body")
    for tag in ("img", "script", "svg", "iframe", "object", "embed", "style"):
        assert body.locator(tag).count() == 0, f"a <{tag}> from the model reached the DOM"
    assert body.locator("[onerror], [onload], [onclick]").count() == 0
    hrefs = body.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    # The markdown javascript: link loses its target; the raw <a> is text; the https link stays.
    assert hrefs == [None, "https://example.org/docs"], hrefs
    body.locator("a").first.click()
    text = body.inner_text()
    assert '<img src="x" onerror="window.__pwned = 1">' in text and "<script>" in text
    assert '<a href="javascript:window.__pwned=6">this</a>' in text
    assert "![tracker](http://127.0.0.1:9/track.png)" in text
    assert page.evaluate("window.__pwned") is None
    assert not [u for u in fetched if "track.png" in u or u.rstrip("/").endswith("/x")], fetched


def test_conversations_survive_a_reload_and_are_listed(chat_page: Any) -> None:
    page, _backend, _url = chat_page("First answer", "Second answer")
    say(page, "First question")
    page.reload()
    sync_api.expect(page.locator(".msg.user")).to_have_text(["First question"])
    sync_api.expect(page.locator(".msg.assistant .body")).to_have_text(["First answer"])
    page.click("#clear")
    sync_api.expect(page.locator(".msg")).to_have_count(0)
    say(page, "Second question")
    sync_api.expect(page.locator("#conversations li")).to_have_count(2)
    page.locator("#conversations li .title", has_text="First question").click()
    sync_api.expect(page.locator(".msg.user")).to_have_text(["First question"])
    page.locator("#conversations li", has_text="First question").locator(".delete").click()
    sync_api.expect(page.locator("#conversations li")).to_have_text(["Second question×"])


def test_system_prompt_temperature_and_max_tokens_reach_the_model(chat_page: Any) -> None:
    page, backend, _url = chat_page("ok")
    page.click("#settings summary")
    page.fill("#system", "Answer in French.")
    page.fill("#temperature", "0.7")
    page.fill("#max-tokens", "33")
    say(page, "Hello")
    [(messages, options)] = backend.calls
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == "Answer in French."
    assert options.temperature == pytest.approx(0.7) and options.max_new_tokens == 33


def test_regenerate_replaces_the_last_reply(chat_page: Any) -> None:
    page, backend, _url = chat_page("reply one", "reply two")
    say(page, "Hello")
    page.locator(".msg.assistant .regenerate").click()
    sync_api.expect(page.locator(".msg.assistant .body")).to_have_text(["reply two"])
    sync_api.expect(page.locator("#send")).to_be_enabled()
    assert len(backend.calls) == 2
    assert backend.calls[1][0] == backend.calls[0][0], "regenerate must send the same conversation again"
    page.reload()
    sync_api.expect(page.locator(".msg.assistant .body")).to_have_text(["reply two"])


def test_each_reply_shows_its_time_to_first_token_and_speed(chat_page: Any) -> None:
    page, _backend, _url = chat_page("a reply in four pieces")
    say(page, "Hello")
    stats = page.locator(".msg.assistant .stats").inner_text()
    assert "TTFT" in stats and " ms" in stats and "tok/s" in stats, stats


def test_an_attached_image_reaches_the_model_as_its_bytes(chat_page: Any) -> None:
    page, backend, _url = chat_page("a dot")
    page.set_input_files("#attach", files=[{"name": "dot.png", "mimeType": "image/png", "buffer": PNG}])
    sync_api.expect(page.locator("#attachments .chip")).to_have_text("image: dot.png")
    say(page, "What is this?")
    [(messages, _options)] = backend.calls
    blocks = messages[-1]["content"]
    assert blocks[0] == {"type": "text", "text": "What is this?"}
    assert blocks[1]["type"] == "image" and bytes(blocks[1]["image"]) == PNG
    sync_api.expect(page.locator(".msg.user img.attachment")).to_have_count(1)
    sync_api.expect(page.locator("#attachments .chip")).to_have_count(0)


def wav_bytes(seconds: float = 0.1, rate: int = 16_000) -> bytes:
    import io
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(b"\x00\x01" * int(seconds * rate))
    return out.getvalue()


def test_an_attached_wav_reaches_the_model_as_an_audio_block(chat_page: Any) -> None:
    page, backend, _url = chat_page("I hear it")
    clip = wav_bytes()
    page.set_input_files("#attach", files=[{"name": "clip.wav", "mimeType": "audio/wav", "buffer": clip}])
    sync_api.expect(page.locator("#attachments .chip")).to_have_text("audio: clip.wav")
    say(page, "What do you hear?")
    [(messages, _options)] = backend.calls
    blocks = messages[-1]["content"]
    assert blocks[1]["type"] == "audio" and bytes(blocks[1]["audio"]) == clip
    sync_api.expect(page.locator(".msg.user audio")).to_have_count(1)


def test_when_storage_is_full_the_conversation_is_kept_without_its_attachments(chat_page: Any) -> None:
    page, _backend, _url = chat_page("a dot")
    # A tiny quota: a conversation with the image's data URL does not fit, one without it does.
    page.add_init_script(
        """
        const setItem = Storage.prototype.setItem;
        Storage.prototype.setItem = function (key, value) {
          if (String(value).length > 3000) throw new DOMException("full", "QuotaExceededError");
          return setItem.call(this, key, value);
        };
        """
    )
    model = page.locator("#model").input_value()
    page.reload()
    page.fill("#model", model)
    big = PNG + bytes(4000)
    page.set_input_files("#attach", files=[{"name": "dot.png", "mimeType": "image/png", "buffer": big}])
    say(page, "Keep this")
    sync_api.expect(page.locator("#storage-note")).to_contain_text("attachments are not kept")
    page.reload()
    sync_api.expect(page.locator(".msg.user .body")).to_have_text(["Keep this"])
    sync_api.expect(page.locator(".msg.user")).to_contain_text("[dot.png: not kept]")
    sync_api.expect(page.locator(".msg.assistant .body")).to_have_text(["a dot"])
