"""anyformer-conformance: the standard tests every anyformer backend plugin passes.

Opt in from your plugin's tests (there is no auto-loading ``pytest11`` entry point)::

    pytest_plugins = ["anyformer_conformance.plugin"]

    from anyformer_conformance import BackendConformance

    class TestMyBackend(BackendConformance):
        backend_id = "mybackend"

See README.md for the fixtures and capability properties.
"""

import pytest

# Before the kit's modules are imported, so pytest rewrites their asserts into readable messages.
pytest.register_assert_rewrite("anyformer_conformance.base", "anyformer_conformance.checks")

from anyformer_conformance.base import BackendConformance, RefusalCase  # noqa: E402

__version__ = "0.1.0"

__all__ = ["BackendConformance", "RefusalCase", "__version__"]
