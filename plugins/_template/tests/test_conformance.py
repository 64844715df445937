"""The anyformer conformance kit against the template backend, run as any third-party plugin runs it.

The backend comes from its installed entry point (``pip install -e .`` first, or ``tox``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import anyformer
from anyformer import Model, Refusal
from anyformer_conformance import BackendConformance, RefusalCase
from anyformer_template.sample import write_sample

pytest_plugins = ["anyformer_conformance.plugin"]

_NGRAM = {"name": "ngram.json", "size": 20_000}


class TestTemplateConformance(BackendConformance):
    """The template backend: text generation from an ``ngram.json``, no images, a store under ANYFORMER_HOME."""

    backend_id = "template"
    supports_images = False
    supports_store = True
    max_new_tokens_for_tests = 8

    refusal_cases = (
        RefusalCase(
            {"repo": "org/gguf-model", "files": [{"name": "model.gguf", "size": 4096}]}, {}, {}, Refusal.FORMAT
        ),
        RefusalCase({"repo": "org/ngram", "files": [_NGRAM]}, {}, {"task": "image-classification"}, Refusal.TASK),
        RefusalCase({"repo": "org/ngram", "task": "feature-extraction", "files": [_NGRAM]}, {}, {}, Refusal.TASK),
        RefusalCase({"repo": "org/ngram", "source": "hub", "files": [_NGRAM]}, {"store": False}, {}, Refusal.STORE),
        RefusalCase({"repo": "org/ngram", "files": [_NGRAM]}, {"ram_bytes": 1_000_000}, {}, Refusal.MEMORY),
    )

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tmp_path_factory: pytest.TempPathFactory) -> Model:
        """A folder holding an ``ngram.json`` trained on the sample text, described like any local model."""
        folder = tmp_path_factory.mktemp("ngram-sample")
        write_sample(folder)
        return anyformer.describe(folder)

    @pytest.fixture
    def stored_model(self, empty_anyformer_home: Path) -> Path:
        """A model kept in the template's store: ``ANYFORMER_HOME/template/sample/ngram.json``."""
        return write_sample(empty_anyformer_home / "template" / "sample")
