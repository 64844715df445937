"""pytest fixtures that point the real ``huggingface_hub`` client at a :class:`FakeHub`.

Setting ``HF_ENDPOINT`` is not enough inside a test process: huggingface_hub 2.4.0 reads its
environment once, at import, into ``huggingface_hub.constants`` and a few module globals (the
module-level ``HfApi`` behind ``huggingface_hub.model_info``, ``scan_cache_dir``'s default cache,
the set of hosts whose redirects it follows). :func:`point_huggingface_hub_at` patches all of them
with ``monkeypatch``, so everything is restored when the test ends.

Test support for the core's tests: import ``fake_hub`` into a test module (or ``store_helpers``).
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from hub_server import FakeHub

__all__ = ["fake_hub", "point_huggingface_hub_at", "set_hf_offline"]

#: Environment variables that would leak a real token or a real offline switch into a test.
_UNSET = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_OIDC_RESOURCE",
    "HUGGINGFACE_HUB_CACHE",
    "HUGGINGFACE_ASSETS_CACHE",
    "HUGGINGFACE_CO_STAGING",
    "HF_XET_CACHE",
)


def point_huggingface_hub_at(monkeypatch: pytest.MonkeyPatch, url: str, home: pathlib.Path) -> None:
    """Make huggingface_hub talk to ``url`` and keep its cache, token and state under ``home``.

    Patches the environment (for subprocesses and code that re-reads it) and the values
    huggingface_hub computed from it at import time.
    """
    from huggingface_hub import constants, hf_api
    from huggingface_hub.utils import _cache_assets, _cache_manager, _detect_agent, _http

    url = url.rstrip("/")
    home = pathlib.Path(home)
    hub_cache = home / "hub"
    for name in _UNSET:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    # Header summaries are cached per commit under ANYFORMER_HOME and in the process: start from neither.
    monkeypatch.setenv("ANYFORMER_HOME", str(home / "anyformer-home"))
    from anyformer.store._gguf_facts import forget_gguf_facts

    forget_gguf_facts()

    patches = {
        "ENDPOINT": url,
        "HUGGINGFACE_CO_URL_TEMPLATE": url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_URL_HOSTS": constants.HF_URL_HOSTS | {urlsplit(url).hostname or "127.0.0.1"},
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(hub_cache),
        "HUGGINGFACE_HUB_CACHE": str(hub_cache),
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "HF_HUB_OFFLINE": False,
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
        "CHECK_FOR_UPDATE_DONE_PATH": str(home / ".check_for_update_done"),
    }
    for name, value in patches.items():
        monkeypatch.setattr(constants, name, value)
    # Bound at import: `huggingface_hub.model_info` & co. are methods of this HfApi instance.
    monkeypatch.setattr(hf_api.api, "endpoint", url)
    # `from ..constants import HF_HUB_CACHE` copies: scan_cache_dir() and the assets cache use these.
    monkeypatch.setattr(_cache_manager, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(_cache_assets, "HF_ASSETS_CACHE", str(home / "assets"))
    # Redirects are followed only to these origins (computed from ENDPOINT at import).
    monkeypatch.setattr(_http, "_HUB_ORIGINS", _http._HUB_ORIGINS | {_http._url_origin(url)})
    # The user-agent code fetches `{ENDPOINT}/api/agent-harnesses` once per process; an empty
    # registry keeps that request out of the server's log.
    monkeypatch.setattr(_detect_agent, "_registry", dict(_detect_agent._EMPTY_REGISTRY))
    # The shared httpx client pools keep-alive connections to earlier servers: start clean.
    _http.close_session()


def set_hf_offline(monkeypatch: pytest.MonkeyPatch, offline: bool = True) -> None:
    """Switch huggingface_hub's offline mode (``HF_HUB_OFFLINE``) on or off for this test."""
    from huggingface_hub import constants

    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)


@pytest.fixture
def fake_hub(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A started :class:`FakeHub` that huggingface_hub uses, with its cache under ``tmp_path/hf``.

    ``huggingface_hub.constants.HF_HUB_CACHE`` is the cache folder for this test.
    """
    from huggingface_hub.utils import _http

    hub = FakeHub()
    url = hub.start()
    home = tmp_path / "hf"
    home.mkdir()
    point_huggingface_hub_at(monkeypatch, url, home)
    try:
        yield hub
    finally:
        _http.close_session()
        hub.stop()
