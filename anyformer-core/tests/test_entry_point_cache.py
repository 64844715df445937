"""The installed entry points are remembered between commands, and any install, removal or rewrite is seen at once."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import DistributionFolder

from anyformer import _entry_points
from anyformer._entry_points import EntryPointRecord, installed_entry_points
from anyformer._plugins import PluginManager

_MODULE = """
from anyformer import Verdict, hookimpl

@hookimpl
def can_run(model, caps, request):
    return Verdict.refuse("cached", "format", "a test plugin")
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ANYFORMER_PLUGIN_CACHE", raising=False)
    return tmp_path / "home"


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each real scan of the installed distributions, by group."""
    calls: list[str] = []
    real = _entry_points.scan

    def counted(group: str) -> list[EntryPointRecord]:
        calls.append(group)
        return real(group)

    monkeypatch.setattr(_entry_points, "scan", counted)
    return calls


def _names(records: list[EntryPointRecord]) -> dict[str, tuple[str, str | None, str | None]]:
    return {r.name: (r.value, r.distribution, r.version) for r in records}


def test_the_second_command_reads_the_cache_and_finds_what_importlib_metadata_finds(
    home: Path, scans: list[str], distributions: DistributionFolder
) -> None:
    distributions.add("aftest-cached", "1.2.0", {"cached": "aftest_cached_mod"}, {"aftest_cached_mod": _MODULE})
    first = installed_entry_points("anyformer")
    second = installed_entry_points("anyformer")
    assert scans == ["anyformer"]  # the second came from the cache file
    assert (home / "probe" / "entry_points.json").is_file()
    assert first == second
    expected = {
        ep.name: (ep.value, ep.dist.name if ep.dist else None, ep.dist.version if ep.dist else None)
        for ep in importlib.metadata.entry_points(group="anyformer")
    }
    assert _names(second) == expected
    assert _names(second)["cached"] == ("aftest_cached_mod", "aftest-cached", "1.2.0")


def test_an_installed_plugin_is_seen_at_once_and_a_removed_one_is_gone(
    home: Path, scans: list[str], distributions: DistributionFolder
) -> None:
    assert "late" not in _names(installed_entry_points("anyformer"))
    distributions.add("aftest-late", "0.1.0", {"late": "aftest_late_mod"}, {"aftest_late_mod": _MODULE})
    assert _names(installed_entry_points("anyformer"))["late"] == ("aftest_late_mod", "aftest-late", "0.1.0")
    manager = PluginManager()
    manager.load_entry_points()
    assert "late" in manager.backends()
    shutil.rmtree(distributions.root / "aftest_late-0.1.0.dist-info")
    assert "late" not in _names(installed_entry_points("anyformer"))
    assert len(scans) == 2  # the install was scanned; the removal brought back the first state, still cached


def test_an_entry_points_file_rewritten_in_place_is_read_again(home: Path, distributions: DistributionFolder) -> None:
    distributions.add("aftest-edit", "1.0.0", {"edited": "aftest_edit_mod:one"})
    assert _names(installed_entry_points("anyformer"))["edited"][0] == "aftest_edit_mod:one"
    (distributions.root / "aftest_edit-1.0.0.dist-info" / "entry_points.txt").write_text(
        "[anyformer]\nedited = aftest_edit_mod:a_longer_name\n"
    )
    assert _names(installed_entry_points("anyformer"))["edited"][0] == "aftest_edit_mod:a_longer_name"


def test_another_sys_path_is_another_key(
    home: Path, scans: list[str], distributions: DistributionFolder, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    installed_entry_points("anyformer")
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.syspath_prepend(str(other))
    installed_entry_points("anyformer")
    assert len(scans) == 2


def test_the_cache_is_off_with_anyformer_plugin_cache_0(
    home: Path, scans: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANYFORMER_PLUGIN_CACHE", "0")
    installed_entry_points("anyformer")
    installed_entry_points("anyformer")
    assert scans == ["anyformer", "anyformer"]
    assert not (home / "probe").exists()


def _plant(home: Path, rows: Any, mode: int = 0o600) -> Path:
    """A cache file holding ``rows`` under the current fingerprint."""
    path = home / "probe" / "entry_points.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({_entry_points.fingerprint("anyformer"): rows}))
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    "rows",
    [
        "not a list",
        [{"name": "x", "value": "os:system", "group": "other"}],
        [{"name": "x", "value": 5, "group": "anyformer"}],
        [{"name": "x", "value": "m", "group": "anyformer", "extra": 1}],
    ],
    ids=["not-a-list", "other-group", "value-not-text", "unknown-field"],
)
def test_a_cache_entry_not_as_written_is_scanned_again(home: Path, scans: list[str], rows: Any) -> None:
    _plant(home, rows)
    assert "x" not in _names(installed_entry_points("anyformer"))
    assert scans == ["anyformer"]


def test_a_cache_file_others_may_write_is_ignored(home: Path, scans: list[str]) -> None:
    planted = [{"name": "x", "value": "os:system", "group": "anyformer"}]
    _plant(home, planted, mode=0o666)
    assert "x" not in _names(installed_entry_points("anyformer"))
    assert scans == ["anyformer"]
    _plant(home, planted)  # the same file, ours: it is believed (the guard above is what kept it out)
    assert "x" in _names(installed_entry_points("anyformer"))


def test_a_record_loads_what_its_value_names() -> None:
    assert EntryPointRecord("j", "json:dumps", "anyformer").load() is json.dumps
    assert EntryPointRecord("j", "os.path : join [extra]", "anyformer").load() is os.path.join
    assert EntryPointRecord("j", "json", "anyformer").load() is json
    with pytest.raises(ValueError):
        EntryPointRecord("j", "not a value!", "anyformer").load()


def test_a_warm_command_imports_no_metadata_machinery(tmp_path: Path) -> None:
    """With the cache warm, finding and loading the plugins imports neither importlib.metadata nor jinja2."""
    code = (
        "import json, sys\n"
        "import anyformer.cli._main\n"
        "from anyformer._plugins import get_plugin_manager\n"
        "get_plugin_manager()\n"
        "print(json.dumps(sorted(m for m in ('importlib.metadata', 'email', 'jinja2', 'rich') if m in sys.modules)))\n"
    )
    env = {**os.environ, "ANYFORMER_HOME": str(tmp_path / "home")}
    env.pop("ANYFORMER_PLUGIN_CACHE", None)
    seen = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        seen.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert seen[0] == ["email", "importlib.metadata"]  # the first scan needs it: the guard can see it
    assert seen[1] == []
