"""A template-backend mutant whose module prints to stdout when it is imported."""

from __future__ import annotations

from kit_mutants import TemplateBackend

print("template backend ready")  # the mutation: output at import breaks `anyformer check --json`


class PrintsAtImport(TemplateBackend):
    """A correct backend, but importing its module prints a line."""
