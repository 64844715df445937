"""The conformance kit's pytest plugin: opt in with ``pytest_plugins = ["anyformer_conformance.plugin"]``.

It adds:

- the override guard: a subclass of :class:`~anyformer_conformance.BackendConformance` may override
  a kit test only to mark it ``@pytest.mark.xfail(reason="...")``; any other override is a
  collection error naming the test;
- the ``anyformer_io_spy`` fixture: records the files opened and the connections tried inside a
  ``with spy.watching():`` block, refusing every connection.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from anyformer_conformance.base import BackendConformance
from anyformer_conformance.io_spy import IOSpy

__all__ = ["IOSpy", "anyformer_io_spy", "kit_test_names", "override_violations"]


# ---- the override guard ---------------------------------------------------------------------------


def kit_test_names() -> frozenset[str]:
    """The names of the kit's standard tests."""
    return frozenset(name for name in vars(BackendConformance) if name.startswith("test"))


def _has_xfail_with_reason(function: Any) -> bool:
    for mark in getattr(function, "pytestmark", ()):
        if mark.name == "xfail" and isinstance(mark.kwargs.get("reason"), str) and mark.kwargs["reason"].strip():
            return True
    return False


def override_violations(cls: type) -> list[str]:
    """``Class.test_name`` for each kit test ``cls`` (or a base between it and the kit) overrides without xfail."""
    tests = kit_test_names()
    found = []
    for klass in cls.__mro__:
        if klass is BackendConformance:
            break
        for name, value in vars(klass).items():
            if name in tests and not _has_xfail_with_reason(value):
                found.append(f"{klass.__qualname__}.{name}")
    return sorted(found)


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> None:
    """Refuse to collect a conformance subclass that overrides a kit test without ``xfail(reason=...)``."""
    if not (inspect.isclass(obj) and issubclass(obj, BackendConformance) and obj is not BackendConformance):
        return None
    if not isinstance(collector, (pytest.Module, pytest.Class)) or not collector.istestclass(obj, name):
        return None
    violations = override_violations(obj)
    if violations:
        raise collector.CollectError(
            f"{', '.join(violations)} override{'s' if len(violations) == 1 else ''} a standard conformance test "
            "without @pytest.mark.xfail(reason=...). The kit's tests are the contract: fix the backend, or keep "
            "the override only to mark a known failure, e.g. "
            "@pytest.mark.xfail(reason='cancel needs engine support, issue #12')."
        )
    return None


# ---- watching file opens and connections ----------------------------------------------------------


@pytest.fixture
def anyformer_io_spy() -> IOSpy:
    """An :class:`IOSpy`: ``with anyformer_io_spy.watching(): ...`` then read ``opened`` and ``connections``."""
    return IOSpy()
