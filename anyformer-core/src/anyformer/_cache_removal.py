"""``anyformer rm``: what removing a model frees, and removing it.

Hub cache revisions go with huggingface_hub's own delete strategy (``scan_cache_dir().delete_revisions``:
refs and snapshot links before blobs, a blob kept while another revision still links it). A repo
folder the scan calls corrupted is removed whole. Backend-derived files are the plugins' store
entries for the repo, and ``ANYFORMER_HOME/<backend>/<org>/<name>``; nothing outside
``ANYFORMER_HOME`` is touched there. A local model (a file or folder path) is never removed itself:
``rm PATH`` removes only what backends derived from it (store entries whose repo is that path or a
file inside that folder).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

from anyformer._plugins import PluginManager, get_plugin_manager
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.store._cache_layout import bytes_on_disk
from anyformer.store._paths import anyformer_home


@dataclasses.dataclass(frozen=True)
class Removal:
    """A planned removal: what goes, and the bytes it frees. Nothing is deleted until :meth:`execute`."""

    repo: str
    revision: str | None
    #: The Hub cache revisions (commit ids) and the folders that go with them.
    commits: tuple[str, ...]
    paths: tuple[Path, ...]
    bytes: int
    _strategy: Any = None
    _whole_folders: tuple[Path, ...] = ()

    @property
    def empty(self) -> bool:
        """True when there is nothing to remove."""
        return not self.paths

    def execute(self) -> int:
        """Delete everything planned; return the bytes freed."""
        if self._strategy is not None:
            self._strategy.execute()
        for path in self._whole_folders:
            _delete(path)
        return self.bytes


def plan_removal(ref: str, plugins: PluginManager | None = None) -> Removal:
    """What ``anyformer rm REF`` would delete: ``org/name`` (every revision), ``org/name@revision``, or the files
    backends derived from a local model at the path ``REF`` (never the local model's own files)."""
    from anyformer.store._cache_layout import RepoCache
    from anyformer.store._hub import check_repo_id, looks_like_repo_id

    repo_id, _, revision = ref.partition("@")
    if os.path.exists(ref) and not (looks_like_repo_id(ref) and RepoCache.of(ref).root.is_dir()):
        return _plan_local_removal(ref, plugins or get_plugin_manager())
    check_repo_id(repo_id)
    revision_or_none = revision or None
    cache = RepoCache.of(repo_id)
    commits: tuple[str, ...] = ()
    paths: list[Path] = []
    folders: list[Path] = []
    freed = 0
    strategy = None
    if cache.root.is_dir():
        found = _hub_strategy(cache.root, repo_id, revision_or_none)
        if found is not None:
            strategy, commits, freed = found
            paths.extend(Path(p) for p in (*strategy.repos, *strategy.snapshots))
            if strategy.repos:
                folders.append(cache.root.parent / ".locks" / cache.root.name)
        elif revision_or_none is None:
            folders += [cache.root, cache.root.parent / ".locks" / cache.root.name]
            paths.append(cache.root)
            freed += bytes_on_disk(cache.root)
        else:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"the cache entry of {repo_id} is corrupted; remove all of it with `anyformer rm {repo_id}`",
            )
    for derived in _derived_paths(repo_id, revision_or_none, plugins or get_plugin_manager()):
        if derived not in folders:
            folders.append(derived)
            paths.append(derived)
            freed += bytes_on_disk(derived)
    if not paths:
        raise AnyformerError(ErrorCode.MODEL_NOT_FOUND, f"{ref} is not in the store (`anyformer ls` lists what is)")
    return Removal(repo_id, revision_or_none, commits, tuple(paths), freed, strategy, tuple(folders))


def _hub_strategy(root: Path, repo_id: str, revision: str | None) -> tuple[Any, tuple[str, ...], int] | None:
    """huggingface_hub's delete strategy for the repo's revisions, or None when its scan refuses the repo."""
    from huggingface_hub import scan_cache_dir

    try:
        info = scan_cache_dir(root.parent)
    except Exception:  # a cache huggingface_hub cannot read: the repo folder goes whole
        return None
    repo = next((r for r in info.repos if r.repo_type == "model" and r.repo_id == repo_id), None)
    if repo is None:
        return None
    chosen = [r for r in repo.revisions if revision is None or revision == r.commit_hash or revision in r.refs]
    if not chosen:
        raise AnyformerError(
            ErrorCode.MODEL_NOT_FOUND,
            f"{repo_id} has no revision {revision} in the cache; it holds "
            + ", ".join(sorted(",".join(sorted(r.refs)) or r.commit_hash for r in repo.revisions)),
        )
    commits = tuple(sorted(r.commit_hash for r in chosen))
    strategy = info.delete_revisions(*commits)
    freed = strategy.expected_freed_size
    if strategy.repos:  # the whole folder goes, partial downloads with it
        freed += sum(f.size_on_disk for f in info.incomplete_files if Path(f.file_path).parent.parent == repo.repo_path)
    return strategy, commits, freed


def _plan_local_removal(path: str, manager: PluginManager) -> Removal:
    """What backends derived from the local model at ``path`` (store entries naming it, or a file inside it)."""
    source = Path(os.path.abspath(path))
    home = anyformer_home().resolve()
    entries, _problems = manager.store_list()
    folders: list[Path] = []
    for entry in entries:
        # Only entries that name a local path: a Hub id is relative and never matches a folder by accident.
        if not os.path.isabs(entry.repo):
            continue
        named = Path(os.path.abspath(entry.repo))
        target = Path(os.path.abspath(entry.path))
        if (named == source or source in named.parents) and home in target.parents and os.path.lexists(target):
            if target not in folders:
                folders.append(target)
    if not folders:
        raise AnyformerError(
            ErrorCode.MODEL_NOT_FOUND,
            f"no files derived from the local model {path!r:.200} are stored (`anyformer ls` lists what is; "
            "rm never removes a local model's own files)",
        )
    freed = sum(bytes_on_disk(folder) for folder in folders)
    return Removal(str(source), None, (), tuple(folders), freed, None, tuple(folders))


def _derived_paths(repo_id: str, revision: str | None, manager: PluginManager) -> list[Path]:
    """Backend-derived files of the repo under ``ANYFORMER_HOME``: store entries and the conventional folders."""
    home = anyformer_home().resolve()
    found: list[Path] = []
    entries, _problems = manager.store_list()
    for entry in entries:
        if entry.repo == repo_id and (revision is None or entry.revision in (None, revision)):
            found.append(Path(entry.path))
    if revision is None:
        found += [home / backend / Path(*repo_id.split("/")) for backend in manager.backends()]
    inside: list[Path] = []
    for path in found:
        absolute = Path(os.path.abspath(path))
        if home in absolute.parents and os.path.lexists(absolute) and absolute not in inside:
            inside.append(absolute)
    return inside


def _delete(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
