"""``caps`` calls the store usable only when ANYFORMER_HOME is (or can become) a folder it may write in."""

from __future__ import annotations

from pathlib import Path

import pytest

import anyformer


@pytest.mark.parametrize("where", ["home", "home/below"], ids=["a file at the home", "a file on the way"])
def test_a_file_where_the_store_should_be_is_no_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    (tmp_path / "home").write_text("not a folder")
    monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path / where))
    assert anyformer.probe(gpu=False, refresh=True).store is False
    monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path / "fresh" / "home"))
    assert anyformer.probe(gpu=False, refresh=True).store is True
