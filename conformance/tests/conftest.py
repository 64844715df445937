"""Test setup for the conformance kit's own tests (the kit is installed as a package)."""

# The kit's self-tests (test_kit.py) run throwaway test files through pytest's own `pytester`.
pytest_plugins = ["pytester"]
