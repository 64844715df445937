"""``anyformer ls``: the models on this machine, from every plugin and from the Hub cache (docs/contract.md).

The Hub cache is read with huggingface_hub's ``scan_cache_dir``; a revision is listed when some
installed backend could run it (its cached snapshot is described offline and every backend is
asked, on a machine with no limits, so that only format, task and model refusals count), whoever
downloaded it: anyformer, transformers or ``hf download``. A repo ``scan_cache_dir`` calls corrupted
is looked at revision by revision, and each broken one is listed with a ``corrupted: …`` state
(SAFETY D9). Listing never raises for what it finds on disk.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from anyformer._plugins import PluginManager, get_plugin_manager
from anyformer._selection import select
from anyformer.contract._caps import Caps
from anyformer.contract._errors import AnyformerError
from anyformer.contract._model import Model
from anyformer.contract._request import Request
from anyformer.contract._store_entry import StoreEntry
from anyformer.contract._verdict import Refusal
from anyformer.store._cache_layout import bytes_on_disk

#: Refusals about this machine, not about the model: the backend reads the model, somewhere.
_MACHINE_REFUSALS = frozenset(
    {Refusal.GPU, Refusal.F16, Refusal.SUBGROUPS, Refusal.STORE, Refusal.BUDGET, Refusal.MEMORY}
)
_PLENTY = 2**62
#: The backend named for a corrupted entry no backend could be asked about.
UNKNOWN_BACKEND = "unknown"


@dataclasses.dataclass(frozen=True)
class _Revision:
    """One cached revision of a repo as found on disk."""

    commit: str | None
    refs: tuple[str, ...]
    bytes: int
    path: Path
    state: str = "ok"

    @property
    def name(self) -> str | None:
        return ",".join(self.refs) if self.refs else self.commit


def list_store(plugins: PluginManager | None = None) -> tuple[list[StoreEntry], list[str]]:
    """Every stored model: each plugin's ``store_list`` and the runnable Hub cache revisions; and problems."""
    manager = plugins or get_plugin_manager()
    entries, problems = manager.store_list()
    entries = list(entries) + hub_cache_entries(manager, problems)
    return sorted(entries, key=lambda e: (e.repo, e.revision or "", e.backend)), problems


def hub_cache_entries(manager: PluginManager, problems: list[str]) -> list[StoreEntry]:
    """The Hub cache's model revisions some backend can run, and every corrupted one."""
    from anyformer.store._cache_layout import hub_cache_dir, repo_id_of_folder

    cache_dir = hub_cache_dir()
    try:
        folders = sorted(p for p in cache_dir.iterdir() if repo_id_of_folder(p.name) is not None)
    except OSError:
        return []  # no cache yet
    healthy = _scan(cache_dir, problems)
    entries: list[StoreEntry] = []
    for folder in folders:
        repo_id = repo_id_of_folder(folder.name)
        assert repo_id is not None
        revisions = healthy.get(folder.resolve())
        for revision in revisions if revisions is not None else _diagnose(folder):
            entry = _entry(manager, repo_id, revision)
            if entry is not None:
                entries.append(entry)
    return entries


def _scan(cache_dir: Path, problems: list[str]) -> dict[Path, list[_Revision]]:
    """The repos ``scan_cache_dir`` finds sound, by folder; the rest are diagnosed by hand."""
    from huggingface_hub import scan_cache_dir

    try:
        info = scan_cache_dir(cache_dir)
    except Exception as exc:  # it reads whatever is on disk: a binary ref file breaks it
        problems.append(f"huggingface_hub could not scan {cache_dir}: {type(exc).__name__}: {exc}")
        return {}
    found: dict[Path, list[_Revision]] = {}
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        found[Path(repo.repo_path).resolve()] = [
            _Revision(rev.commit_hash, tuple(sorted(rev.refs)), rev.size_on_disk, Path(rev.snapshot_path))
            for rev in sorted(repo.revisions, key=lambda r: r.commit_hash)
        ]
    return found


def _diagnose(folder: Path) -> list[_Revision]:
    """Each revision of a repo folder ``scan_cache_dir`` refused, with what is wrong with it."""
    refs = _read_refs(folder / "refs")
    snapshots = folder / "snapshots"
    if not snapshots.is_dir():
        return [_Revision(None, tuple(refs), bytes_on_disk(folder), folder, "corrupted: no snapshots folder")]
    revisions: list[_Revision] = []
    commits: set[str] = set()
    for snapshot in sorted(snapshots.iterdir()):
        if not snapshot.is_dir():
            revisions.append(_Revision(None, (), 0, snapshot, "corrupted: a file where a snapshot folder belongs"))
            continue
        commits.add(snapshot.name)
        names = tuple(sorted(ref for ref, commit in refs.items() if commit == snapshot.name))
        missing, size = _snapshot_state(snapshot)
        state = f"corrupted: {len(missing)} file(s) without their blob ({missing[0]})" if missing else "ok"
        revisions.append(_Revision(snapshot.name, names, size, snapshot, state))
    for ref, commit in sorted(refs.items()):
        if commit not in commits:
            why = f"ref {ref} points at {commit or 'nothing'}, which has no snapshot"
            revisions.append(_Revision(commit or None, (ref,), 0, folder / "refs" / ref, f"corrupted: {why}"))
    return revisions


def _read_refs(refs: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    if not refs.is_dir():
        return found
    for path in sorted(refs.rglob("*")):
        if path.is_dir():
            continue
        try:
            found[path.relative_to(refs).as_posix()] = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            found[path.relative_to(refs).as_posix()] = ""
    return found


def _snapshot_state(snapshot: Path) -> tuple[list[str], int]:
    """(files whose blob is missing, bytes of the blobs present) of one snapshot folder."""
    missing: list[str] = []
    blobs: dict[str, int] = {}
    for root, _dirs, names in os.walk(snapshot):
        for name in sorted(names):
            path = Path(root) / name
            try:
                stat = path.stat()
            except OSError:
                missing.append(path.relative_to(snapshot).as_posix())
                continue
            blobs[os.path.realpath(path)] = stat.st_size
    return missing, sum(blobs.values())


def _entry(manager: PluginManager, repo_id: str, revision: _Revision) -> StoreEntry | None:
    backend, why = _backend_for(manager, repo_id, revision)
    state = revision.state
    if state == "ok" and why is not None:
        state = f"corrupted: {why}"
    if backend is None:
        if state == "ok":
            return None  # a model no installed backend runs: another tool's business
        backend = UNKNOWN_BACKEND
    return StoreEntry(
        backend=backend,
        repo=repo_id,
        revision=revision.name,
        path=str(revision.path),
        bytes=revision.bytes,
        state=state,
    )


def _backend_for(manager: PluginManager, repo_id: str, revision: _Revision) -> tuple[str | None, str | None]:
    """(the backend that would run this cached revision or None, why it could not be described or None)."""
    from anyformer.store._hub import describe_cached

    if revision.commit is None or not revision.path.is_dir():
        return None, None
    try:
        model = describe_cached(repo_id, revision.commit)
    except AnyformerError as exc:
        return None, f"{exc.code.value}: {exc.message}"
    except Exception as exc:  # whatever is on disk, ls lists it and goes on
        return None, f"{type(exc).__name__}: {exc}"
    return backend_that_runs(manager, model), None


def backend_that_runs(manager: PluginManager, model: Model) -> str | None:
    """The backend that would run ``model`` on a machine with no limits (or refuses it only for the machine)."""
    caps = Caps(
        gpu=True,
        f16=True,
        subgroups=True,
        gpu_bytes=_PLENTY,
        ram_bytes=_PLENTY,
        store=True,
        disk_free_bytes=_PLENTY,
        cpu_count=os.cpu_count() or 1,
        gpu_note="ls: what-if machine with no limits",
    )
    verdicts = manager.can_run(model, caps, Request(budget=_PLENTY))
    selection = select(verdicts)
    if selection.chosen is not None:
        return selection.chosen.backend
    for verdict in selection.verdicts:
        if verdict.code in _MACHINE_REFUSALS:
            return verdict.backend
    return None
