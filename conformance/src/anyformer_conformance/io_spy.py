"""Watching what a piece of code opens and where it tries to connect: :class:`IOSpy`.

The kit wraps every ``can_run`` call in :meth:`IOSpy.watching` (a verdict comes from the
description alone), in the test process and in the fresh interpreter of the first-call probe.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import io
import os
import socket
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

__all__ = ["IOSpy"]


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

    def opened_of(self, paths: Iterable[str | os.PathLike[str]]) -> list[str]:
        """The recorded opens of any of ``paths`` (compared after resolving links and ``..``)."""
        wanted = {os.path.realpath(os.fspath(p)) for p in paths}
        return [path for path in self.opened if os.path.realpath(path) in wanted]

    def clear(self) -> None:
        """Forget what was recorded, to watch the next call on its own."""
        self.opened.clear()
        self.connections.clear()
