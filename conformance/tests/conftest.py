"""Test setup for the conformance kit until it is installed as a package: import it from src/."""

import pathlib
import sys

_SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
if str(_SRC) not in sys.path:
    sys.path.insert(0, str(_SRC))

from anyformer_conformance.hub_fixtures import fake_hub  # noqa: F401 - the fixture, for these tests

# The kit's self-tests (test_kit.py) run throwaway test files through pytest's own `pytester`.
pytest_plugins = ["pytester"]
