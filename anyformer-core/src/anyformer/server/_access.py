"""Which models the server serves: the operator decides, a client only picks among them.

By default a request may name a model the operator listed (``--model``, ``--preload``) or one the
store already holds (``anyformer ls``). A local path from a client is served only with
``allow_paths``, and only inside those folders once links are resolved; a Hub id the store lacks
is downloaded only with ``allow_pull``. Everything else is ``MODEL_NOT_FOUND`` (404) with the same
words whether or not such a file exists, so a client learns nothing about the server's disk.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode

#: Seconds a listing of the store is reused: a request must not rescan the cache each time.
STORE_LISTING_SECONDS = 5.0


def _absolute(ref: str) -> str | None:
    """``ref`` as a normalised absolute path when it is written as one (``/x``, ``~/x``), else None."""
    if not ref.startswith(("/", "~")) and not (len(ref) > 2 and ref[1] == ":" and ref[2] in "\\/"):
        return None
    return os.path.normpath(os.path.expanduser(ref))


def _real(path: str) -> str | None:
    """The path with every link resolved, or None when it cannot be looked up."""
    try:
        return os.path.realpath(path, strict=True)
    except (OSError, ValueError):
        return None


def _inside(path: str, folder: str) -> bool:
    try:
        return os.path.commonpath([path, folder]) == folder
    except ValueError:  # different drives
        return False


def loadable(ref: str) -> str:
    """What the pool loads for an operator's ``ref``: the embedded model's file for ``default`` or ``smollm2``."""
    from anyformer._default_model import default_model_path, is_default_model_name

    return str(default_model_path()) if is_default_model_name(ref) else ref


class ModelAccess:
    """The operator's rules for what clients may name; :meth:`resolve` applies them.

    ``models``: references the operator named (any spelling ``anyformer run`` takes); ``stored``:
    a function listing the store's entries as dicts with ``repo`` and ``revision``;
    ``allow_paths``: folders under which clients may name local files or folders; ``allow_pull``:
    whether a client may name any Hub id (the server then downloads it).
    """

    def __init__(
        self,
        models: Sequence[str] = (),
        *,
        stored: Callable[[], list[dict[str, Any]]] | None = None,
        allow_paths: Sequence[str | os.PathLike[str]] = (),
        allow_pull: bool = False,
    ) -> None:
        self._models: list[str] = []
        self._by_path: dict[str, str] = {}
        self._stored = stored
        self._listing: tuple[float, list[dict[str, Any]]] | None = None
        self._lock = threading.Lock()
        self.allow_pull = allow_pull
        self.folders = [real for real in (_real(os.path.expanduser(os.fspath(f))) for f in allow_paths) if real]
        missing = [os.fspath(f) for f in allow_paths if _real(os.path.expanduser(os.fspath(f))) is None]
        if missing:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"--allow-paths: no such folder: {', '.join(missing)}")
        for ref in models:
            self.add(ref)

    def add(self, ref: str) -> None:
        """Serve ``ref`` (an operator's model: preloaded, or named at start-up)."""
        if ref in self._models:
            return
        self._models.append(ref)
        path = _absolute(ref) or (os.path.abspath(ref) if os.path.exists(ref) else None)
        if path is not None:
            self._by_path[path] = ref
            real = _real(path)
            if real is not None:
                self._by_path.setdefault(real, ref)

    @property
    def models(self) -> list[str]:
        """The operator's models, as the operator wrote them."""
        return list(self._models)

    def stored(self) -> list[dict[str, Any]]:
        """The store's entries (reused for :data:`STORE_LISTING_SECONDS`); a failing listing is empty."""
        if self._stored is None:
            return []
        with self._lock:
            now = time.monotonic()
            if self._listing is None or now - self._listing[0] > STORE_LISTING_SECONDS:
                try:
                    entries = self._stored()
                except Exception:
                    entries = []
                self._listing = (now, entries)
            return self._listing[1]

    def resolve(self, ref: str) -> str:
        """The reference to load for a client's ``ref``; ``MODEL_NOT_FOUND`` when the server does not serve it.

        Blocking (it may list the store and look at the disk): call it in a thread.
        """
        if ref in self._models:
            return loadable(ref)
        path = _absolute(ref)
        if path is not None:
            return self._resolve_path(ref, path)
        repo, _, revision = ref.partition("@")
        for entry in self.stored():
            if entry.get("repo") == repo and (not revision or revision == entry.get("revision")):
                return ref
        if self.allow_pull and "/" in repo and _is_repo_id(repo, revision or None):
            return ref
        raise self.not_served(ref)

    def removed(self, ref: str) -> bool:
        """Whether a loaded ``ref`` is gone: a path that no longer exists, or a repo id the store no longer holds.

        Blocking (it may list the store): call it in a thread.
        """
        path = _absolute(ref)
        if path is not None:
            return not os.path.exists(path)
        repo = ref.partition("@")[0]
        if os.path.exists(ref) or "/" not in repo:
            return False
        return all(entry.get("repo") != repo for entry in self.stored())

    def _resolve_path(self, ref: str, path: str) -> str:
        if path in self._by_path:
            return self._by_path[path]
        real = _real(path)
        if real is not None and real in self._by_path:
            return self._by_path[real]
        if real is not None and any(_inside(real, folder) for folder in self.folders):
            if not os.path.isdir(real) or _links_stay_inside(real, self.folders):
                return real
        raise self.not_served(ref)

    @staticmethod
    def not_served(ref: str) -> AnyformerError:
        """The one answer for every model the server does not serve, whether or not it exists."""
        return AnyformerError(
            ErrorCode.MODEL_NOT_FOUND,
            f"{ref!r:.120} is not a model this server serves; GET /v1/models lists the ones it does",
        )


#: The most entries a client's folder may hold before it is refused (describe lists at most as many files).
_MAX_FOLDER_ENTRIES = 10_000


def _links_stay_inside(folder: str, allowed: Sequence[str]) -> bool:
    """Whether every link under ``folder`` resolves inside one of the ``allowed`` folders.

    ``describe`` reads headers of the files a folder lists, following links: a link to a file
    outside the operator's folders would let a client read it through the folder. Bounded: a folder
    with more entries than ``describe`` lists is refused rather than walked for ever.
    """
    seen = 0
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in (*dirs, *files):
            seen += 1
            if seen > _MAX_FOLDER_ENTRIES:
                return False
            path = os.path.join(root, name)
            if os.path.islink(path):
                real = _real(path)
                if real is None or not any(_inside(real, f) for f in allowed):
                    return False
    return True


def _is_repo_id(repo: str, revision: str | None) -> bool:
    from anyformer.store._hub import _check_revision, check_repo_id

    try:
        check_repo_id(repo)
        _check_revision(revision)
    except AnyformerError:
        return False
    return True
