"""Raw completions and fill-in-the-middle against a running llama.cpp server (llama-server).

llama-server is built by scripts/build-llama-tools from the same llama.cpp source llama-cpp-python
vendors. Its ``/infill`` builds the fill-in-the-middle prompt itself; the test reads that prompt
back (the reply's ``prompt``, re-tokenized with the server's own ``/tokenize``) and compares it
with the sequence the backend builds, then compares the greedy text. ``/completion`` on SmolLM2 is
compared with ``generate(prompt=...)`` the same way. The server runs with the backend's batch
(512), which decides how a long prefix or suffix is cut.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rpc_processes import free_port, llama_server_binary
from tiny_gguf import write_tiny_llama

import anyformer

CONTEXT = 2048
BATCH = 512
FIM_PAIRS = [
    ("def add(a, b):\n    return", "\n\nprint(add(1, 2))"),
    ("x = 1\ny = ", "\nprint(x + y)"),
    ("", "tail only"),
    ("<|im_end|> stays text", "\n"),
]
PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "1, 2, 3, 4,"]


class LlamaServer:
    """llama-server on a loopback port for one GGUF."""

    def __init__(self, model: Path) -> None:
        self.port = free_port()
        command = [str(llama_server_binary()), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port)]
        command += ["-c", str(CONTEXT), "-b", str(BATCH), "-ub", str(BATCH), "-t", "2", "-np", "1", "--no-webui"]
        # anyformer loads with flash attention (the flash_attention option's default), as llama-server's
        # "auto" does on the CPU: said explicitly, so the same kernels run on both sides whatever "auto"
        # decides, or near-ties in the logits may break differently.
        command += ["--flash-attn", "on"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                _, err = self.process.communicate()
                raise RuntimeError(f"llama-server did not start: {err.decode(errors='replace')[-2000:]}")
            time.sleep(0.2)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as reply:
            return dict(json.loads(reply.read()))

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def fim_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama whose vocabulary has fill-in-the-middle and repo-level tokens, and asks for BOS."""
    return write_tiny_llama(
        tmp_path_factory.mktemp("fim") / "tiny-fim-F32.gguf",
        seed=5,
        chat_template=None,
        add_bos=True,
        fim=True,
        context=CONTEXT,
    )


def _serve(model: Path) -> Iterator[LlamaServer]:
    server = LlamaServer(model)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def fim_server(fim_gguf: Path) -> Iterator[LlamaServer]:
    yield from _serve(fim_gguf)


@pytest.fixture(scope="module")
def smollm2_server(smollm2_path: Path) -> Iterator[LlamaServer]:
    yield from _serve(smollm2_path)


def _server_tokens(server: LlamaServer, text: str) -> list[int]:
    reply = server.post("/tokenize", {"content": text, "add_special": False, "parse_special": True})
    return [int(t) for t in reply["tokens"]]


def _text(loaded: anyformer.Loaded, tokens: list[int]) -> str:
    llama = loaded.handle._llama  # type: ignore[attr-defined]
    return bytes(llama.detokenize(tokens, special=True)).decode("utf-8", "replace")


def test_infill_prompt_and_greedy_text_equal_llama_servers(fim_server: LlamaServer, fim_gguf: Path) -> None:
    with anyformer.load(fim_gguf, backend="llamacpp", context=CONTEXT) as ours:
        for prefix, suffix in FIM_PAIRS:
            reply = fim_server.post(
                "/infill",
                {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 12, "temperature": 0, "top_k": 1},
            )
            tokens = ours.handle.infill_tokens(prefix, suffix, 12)  # type: ignore[attr-defined]
            # The server returns its prompt as text with the special tokens written out.
            assert _text(ours, tokens) == reply["prompt"], (prefix, suffix)
            if "<|" not in prefix + suffix:
                # Re-tokenized, the text gives the token ids back, unless special-token text was typed
                # into the prefix (it stays plain text in the prompt and reads back as the special token).
                assert tokens == _server_tokens(fim_server, reply["prompt"]), (prefix, suffix)
            text = ours.complete(prompt=prefix, suffix=suffix, max_new_tokens=12).text
            assert text == reply["content"], (prefix, suffix)


def test_raw_greedy_continuation_equals_llama_servers_completion(
    smollm2_server: LlamaServer, smollm2_path: Path
) -> None:
    with anyformer.load(smollm2_path, backend="llamacpp", context=CONTEXT) as ours:
        for prompt in PROMPTS:
            reply = smollm2_server.post(
                "/completion", {"prompt": prompt, "n_predict": 24, "temperature": 0, "top_k": 1, "cache_prompt": False}
            )
            assert ours.complete(prompt=prompt, max_new_tokens=24).text == reply["content"], prompt
