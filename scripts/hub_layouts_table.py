"""Write docs/hub-layouts.md: every real Hub layout's ``anyformer check`` verdict per installed backend.

The layouts are anyformer-core/tests/data/hub_layouts/*.json; each is served by the test suite's Hub
stand-in at its real sizes with tiny stand-in headers, and checked on the machines its ``checks``
name. A cell is what the backend answered (``ok`` and the first file of its estimate, or the refusal
code); where it differs from what issue 26 expects, the expectation follows it (``≠ expected``), with
the branch it waits for when the data marks it pending. Nothing is downloaded but configs.

    python scripts/hub_layouts_table.py            # rewrite docs/hub-layouts.md
    python scripts/hub_layouts_table.py --check    # exit 1 when the file is not what it would write
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "anyformer-core" / "tests"
OUTPUT = ROOT / "docs" / "hub-layouts.md"


def cell(verdict: Any, expected: dict[str, str] | None) -> str:
    """A verdict as a table cell, with the issue's expectation where the answer differs from it."""
    got = f"ok `{verdict.estimate.files[0]}`" if verdict.ok and verdict.estimate.files else "ok"
    if not verdict.ok:
        got = verdict.code.value
    if expected is None:
        return got
    want = f"ok `{expected['file']}`" if "file" in expected else expected["refusal"]
    if want == got:
        return f"**{got}**"
    waits = f" (waits for {expected['pending'].split(':')[0]})" if "pending" in expected else ""
    return f"{got} ≠ expected {want}{waits}"


def table(home: Path) -> str:
    """The whole document."""
    import pytest

    sys.path.insert(0, str(TESTS))
    from hub_fixtures import point_huggingface_hub_at
    from hub_layouts import load_layouts, serve_layout
    from hub_server import FakeHub
    from test_hub_layouts import machine_caps

    from anyformer import check
    from anyformer._plugins import get_plugin_manager

    backends = sorted(get_plugin_manager().backends())
    layouts = load_layouts()
    constructed = sum(layout.repo.startswith("anyformer-layouts/") for layout in layouts)
    lines = [
        "# Real Hub layouts: every backend's verdict and file",
        "",
        "<!-- Written by scripts/hub_layouts_table.py; do not edit by hand. -->",
        "",
        f"{len(layouts) - constructed} real repo listings and {constructed} constructed ones (text-diffusion "
        "ONNX exports, under the made-up owner `anyformer-layouts`: no public listing was found) in "
        "`anyformer-core/tests/data/hub_layouts/`, each citing its sources and saying which sizes are real, "
        "served by the test suite's Hub stand-in at their "
        "real sizes with tiny stand-in headers, and asked `anyformer check` on the machine each row names. "
        "A cell is the backend's answer: `ok` and the file its estimate names first, or the refusal code. "
        "**Bold** is what issue 26 expects; `≠ expected` shows the expectation where the answer differs, and "
        "the branch it waits for (`tests/test_hub_layouts.py` marks those strict xfail). `—` is no expectation.",
        "",
        "Machines: `cpu` is `--caps store` (no GPU), `gpu` is `--caps gpu,f16,subgroups,store` with an 8 GB adapter; "
        "the RAM and budget are in the row's name.",
        "",
        "| repo | sizes | machine | " + " | ".join(backends) + " | chosen |",
        "|---|---|---|" + "---|" * len(backends) + "---|",
    ]
    with pytest.MonkeyPatch.context() as patch, FakeHub() as hub:
        point_huggingface_hub_at(patch, hub.url, home / "hf")
        patch.setenv("ANYFORMER_HOME", str(home / "anyformer"))
        for layout in layouts:
            sizes = layout.sizes.split(":")[0].split(",")[0]
            for entry in layout.checks:
                # A revision per check: each answers as a fresh `anyformer check` process would.
                serve_layout(hub, layout, revision=entry.name)
                caps = machine_caps(entry.machine, home / "store")
                _, selection = check(f"{layout.repo}@{entry.name}", caps=caps, budget=entry.machine.get("budget"))
                by_backend = {v.backend: v for v in selection.verdicts}
                cells = []
                for backend in backends:
                    verdict = by_backend.get(backend)
                    expected = entry.verdicts.get(backend)
                    cells.append("—" if verdict is None else cell(verdict, expected).replace("|", "\\|"))
                chosen = selection.chosen_backend or "none"
                if chosen == (entry.chosen or "none"):
                    chosen = f"**{chosen}**"
                else:
                    waits = f" (waits for {entry.chosen_pending.split(':')[0]})" if entry.chosen_pending else ""
                    chosen = f"{chosen} ≠ expected {entry.chosen or 'none'}{waits}"
                lines.append(f"| `{layout.repo}` | {sizes} | {entry.name} | " + " | ".join(cells) + f" | {chosen} |")
    lines += ["", "Sources and per-file notes are in each layout's JSON file.", ""]
    return "\n".join(lines)


def main() -> int:
    """Write (or with ``--check`` compare) docs/hub-layouts.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/hub-layouts.md is out of date")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        text = table(Path(home))
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run python scripts/hub_layouts_table.py")
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
