"""Test setup for the conformance kit's own tests (the kit is installed as a package)."""

from anyformer_conformance.hub_fixtures import fake_hub  # noqa: F401 - the fixture, for these tests

# The kit's self-tests (test_kit.py) run throwaway test files through pytest's own `pytester`.
pytest_plugins = ["pytester"]
