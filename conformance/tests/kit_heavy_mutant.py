"""A template-backend mutant whose module imports an engine at import time (wgpu: installed and quick to import)."""

from __future__ import annotations

import wgpu  # noqa: F401 - the mutation: a heavy engine imported when the plugin module is
from kit_mutants import TemplateBackend


class HeavyImport(TemplateBackend):
    """A correct backend, but importing its module imports wgpu."""
