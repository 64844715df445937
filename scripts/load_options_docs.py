"""Write each installed backend's load-options table into its docs/backends page, from its declared schema.

A page holds the table between two markers (the test suite checks that it matches the schema):

    <!-- load options: written by scripts/load_options_docs.py from the backend's LOAD_OPTIONS -->
    ...
    <!-- end of load options -->

    python scripts/load_options_docs.py            # rewrite the tables
    python scripts/load_options_docs.py --check    # exit 1 when a page's table is not the schema's
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "docs" / "backends"
BEGIN = "<!-- load options: written by scripts/load_options_docs.py from the backend's LOAD_OPTIONS -->"
END = "<!-- end of load options -->"


def with_table(text: str, table: str) -> str:
    """``text`` with the block between the markers replaced by ``table``; ValueError when a marker is missing."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError("the page lacks the load-options markers")
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main() -> int:
    """Rewrite (or with ``--check`` compare) the table of every installed backend that has a page."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a table differs from its schema")
    args = parser.parse_args()
    import anyformer

    manager = anyformer.get_plugin_manager()
    stale = []
    for backend in manager.backends():
        page = PAGES / f"{backend}.md"
        if not page.is_file():
            continue
        text = page.read_text(encoding="utf-8")
        wanted = with_table(text, manager.load_options(backend).markdown())
        if wanted == text:
            continue
        stale.append(str(page.relative_to(ROOT)))
        if not args.check:
            page.write_text(wanted, encoding="utf-8")
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run python scripts/load_options_docs.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
