"""Documentation guards (as datasette's ``test_docs.py``): what the code defines, docs/ must describe."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from anyformer import ErrorCode, Refusal, hookspecs

DOCS = Path(__file__).resolve().parents[2] / "docs"
HOOKS_DOC = DOCS / "hooks.md"
ERRORS_DOC = DOCS / "refusals-and-errors.md"


def hookspec_names() -> list[str]:
    """Every function ``anyformer.hookspecs`` marks as a hookspec."""
    marker = f"{hookspecs.PROJECT}_spec"
    return sorted(name for name, value in vars(hookspecs).items() if callable(value) and hasattr(value, marker))


def _headings(path: Path) -> set[str]:
    return set(re.findall(r"^##\s+`?([A-Za-z_][A-Za-z0-9_]*)`?\s*$", path.read_text(encoding="utf-8"), re.MULTILINE))


def _table_codes(path: Path) -> set[str]:
    """The codes in the first cell of every markdown table row: ``| `budget` | … |``."""
    return set(re.findall(r"^\|\s*`([^`]+)`\s*\|", path.read_text(encoding="utf-8"), re.MULTILINE))


def test_there_are_hookspecs_to_document() -> None:
    assert hookspec_names() == ["can_run", "load", "store_list"]


@pytest.mark.parametrize("hook", hookspec_names())
def test_hookspec_has_a_section_in_hooks_md(hook: str) -> None:
    assert hook in _headings(HOOKS_DOC), f"docs/hooks.md has no '## {hook}' section"


@pytest.mark.parametrize("hook", hookspec_names())
def test_hooks_md_section_shows_the_signature_and_an_example(hook: str) -> None:
    text = HOOKS_DOC.read_text(encoding="utf-8")
    section = text.split(f"\n## {hook}\n", 1)[1].split("\n## ", 1)[0]
    assert f"def {hook}(" in section, f"the {hook} section shows no signature"
    assert "@hookimpl" in section, f"the {hook} section has no example hookimpl"
    assert "first-result" in section.lower() or "first result" in section.lower()


def test_hooks_md_documents_no_hook_that_does_not_exist() -> None:
    documented = _headings(HOOKS_DOC) - {"Hooks"}
    assert documented <= set(hookspec_names()), f"docs/hooks.md documents {documented - set(hookspec_names())}"


@pytest.mark.parametrize("refusal", list(Refusal), ids=lambda r: r.value)
def test_refusal_is_documented(refusal: Refusal) -> None:
    assert refusal.value in _table_codes(ERRORS_DOC), f"docs/refusals-and-errors.md lacks a row for `{refusal.value}`"


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.value)
def test_error_code_is_documented(code: ErrorCode) -> None:
    assert code.value in _table_codes(ERRORS_DOC), f"docs/refusals-and-errors.md lacks a row for `{code.value}`"


def test_errors_doc_names_no_code_that_does_not_exist() -> None:
    known = {r.value for r in Refusal} | {c.value for c in ErrorCode} | {"0", "1", "2", "3", "130"}
    assert _table_codes(ERRORS_DOC) <= known, f"unknown codes documented: {_table_codes(ERRORS_DOC) - known}"


@pytest.mark.parametrize("status", ["0", "1", "2", "3", "130"])
def test_cli_exit_code_is_documented(status: str) -> None:
    assert status in _table_codes(ERRORS_DOC), f"docs/refusals-and-errors.md lacks exit code {status}"


CONTRACT_DOC = DOCS / "contract.md"


def test_the_contract_lists_every_refusal_code_and_error_code() -> None:
    text = CONTRACT_DOC.read_text(encoding="utf-8")
    assert {code.value for code in Refusal} <= _table_codes(CONTRACT_DOC)
    assert [code.value for code in ErrorCode if f"`{code.value}`" not in text] == []


def _description_section() -> str:
    return CONTRACT_DOC.read_text(encoding="utf-8").split("### The description as JSON", 1)[1].split("\n## ", 1)[0]


def test_the_contract_s_description_example_is_read_as_written() -> None:
    from anyformer import Model

    example = json.loads(re.search(r"```json\n(.*?)```", _description_section(), re.DOTALL).group(1))  # type: ignore[union-attr]
    data = Model.from_dict(example).to_dict()
    assert {key: data[key] for key in example} == example


def test_every_key_the_contract_lists_is_checked_by_name() -> None:
    from anyformer import AnyformerError, Model

    rows = re.findall(r"^\| (`[^|]+) \|", _description_section(), re.MULTILINE)
    keys = [key for row in rows for key in re.findall(r"`(\w+)`", row)]
    assert keys == ["repo", "revision", "architecture", "task", "tags", "files", "source", "metadata", "config"]
    for key in keys:
        with pytest.raises(AnyformerError) as caught:
            Model.from_dict({"repo": "org/x", key: 5} if key != "repo" else {key: 5})
        assert caught.value.code is ErrorCode.BAD_REQUEST and f"'{key}'" in caught.value.message
    assert Model.from_dict({"repo": "org/x", "unknown": 1}).repo == "org/x", "other keys are ignored, as documented"


#: Citations of the design notes third parties never have (built from parts, so this file does not cite them).
PRIVATE_NOTES = "|".join([r"CONTRACT §\d", "shared" + r"/CONTRACT\.md", r"\.\./" + "shared/"])


def test_no_doc_or_source_cites_the_private_design_notes() -> None:
    root = DOCS.parent
    offenders = [
        str(path.relative_to(root))
        for pattern in (
            "docs/**/*.md",
            "*.md",
            "*/src/**/*.py",
            "plugins/*/src/**/*.py",
            "*/tests/*.py",
            "plugins/*/tests/*.py",
            "*/README.md",
            "plugins/*/README.md",
        )
        for path in root.glob(pattern)
        if re.search(PRIVATE_NOTES, path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "cite docs/contract.md instead"
