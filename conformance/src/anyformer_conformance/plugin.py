"""The conformance kit's pytest plugin: opt in with ``pytest_plugins = ["anyformer_conformance.plugin"]``.

It adds:

- the override guard: a subclass of :class:`~anyformer_conformance.BackendConformance` may override
  a kit test only to mark it ``@pytest.mark.xfail(reason="...")``; any other override is a
  collection error naming the test;
- the ``anyformer_io_spy`` fixture: records the files opened and the connections tried inside a
  ``with spy.watching():`` block, refusing every connection.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import inspect
import io
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from anyformer_conformance.base import BackendConformance

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


@dataclasses.dataclass
class IOSpy:
    """Records what code inside :meth:`watching` opens and where it tries to connect.

    Connections are refused (``OSError``) so a test never reaches the network; opens go through,
    so a missing file still raises ``FileNotFoundError`` as it would.
    """

    opened: list[str] = dataclasses.field(default_factory=list)
    connections: list[str] = dataclasses.field(default_factory=list)

    @contextlib.contextmanager
    def watching(self) -> Iterator[IOSpy]:
        """Spy on ``open``, ``io.open``, ``os.open`` and every socket connection inside the block."""
        real_open, real_os_open = builtins.open, os.open

        def spy_open(file: Any, *args: Any, **kwargs: Any) -> Any:
            self._record_path(file)
            return real_open(file, *args, **kwargs)

        def spy_os_open(path: Any, *args: Any, **kwargs: Any) -> Any:
            self._record_path(path)
            return real_os_open(path, *args, **kwargs)

        def refuse(target: str) -> OSError:
            self.connections.append(target)
            return OSError(f"the conformance kit blocks network access here (tried {target})")

        def spy_connect(sock: socket.socket, address: Any) -> None:
            raise refuse(repr(address))

        def spy_connect_ex(sock: socket.socket, address: Any) -> int:
            raise refuse(repr(address))

        def spy_create_connection(address: Any, *args: Any, **kwargs: Any) -> socket.socket:
            raise refuse(repr(address))

        def spy_getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
            raise refuse(f"{host}:{port}")

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(builtins, "open", spy_open)
            patch.setattr(io, "open", spy_open)
            patch.setattr(os, "open", spy_os_open)
            patch.setattr(socket.socket, "connect", spy_connect)
            patch.setattr(socket.socket, "connect_ex", spy_connect_ex)
            patch.setattr(socket, "create_connection", spy_create_connection)
            patch.setattr(socket, "getaddrinfo", spy_getaddrinfo)
            yield self

    def _record_path(self, file: Any) -> None:
        if isinstance(file, (str, bytes, os.PathLike)):
            self.opened.append(os.fsdecode(file))

    def opened_under(self, folder: str | os.PathLike[str]) -> list[str]:
        """The recorded opens of paths inside ``folder``."""
        root = os.path.abspath(os.fspath(folder))
        return [path for path in self.opened if os.path.abspath(path).startswith(root + os.sep)]


@pytest.fixture
def anyformer_io_spy() -> IOSpy:
    """An :class:`IOSpy`: ``with anyformer_io_spy.watching(): ...`` then read ``opened`` and ``connections``."""
    return IOSpy()
