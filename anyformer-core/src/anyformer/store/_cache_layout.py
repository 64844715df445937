"""huggingface_hub's cache layout: where a repo's blobs, snapshot links, refs and locks live.

A repo ``org/name`` is ``<HF_HUB_CACHE>/models--org--name/`` holding ``blobs/<etag>`` (the bytes,
named by the Hub's ETag: the sha256 of an LFS file, the git blob sha1 of a regular one),
``snapshots/<commit>/<file>`` (relative symlinks into ``blobs/``) and ``refs/<branch or tag>``
(the commit it points at). Locks are ``<HF_HUB_CACHE>/.locks/models--org--name/<etag>.lock``, the
same files huggingface_hub locks, so its downloads and ours exclude each other. Everything written
here is written atomically (a temporary name, then a rename), never a partial file under a final name.
"""

from __future__ import annotations

import dataclasses
import os
import re
import uuid
from pathlib import Path

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._model import check_file_name

#: A commit id, and the two ETag shapes a blob may be named by (git sha1, LFS sha256).
COMMIT = re.compile(r"^[0-9a-f]{40}\Z")
ETAG = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})\Z")
_REF = re.compile(r"^[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*\Z")


def hub_cache_dir() -> Path:
    """The huggingface_hub cache folder (``HF_HUB_CACHE``), as huggingface_hub resolved it."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


def repo_folder_name(repo_id: str) -> str:
    """``models--org--name``: the folder of a model repo in the cache."""
    from huggingface_hub import constants

    return constants.REPO_ID_SEPARATOR.join(["models", *repo_id.split("/")])


def repo_id_of_folder(folder_name: str) -> str | None:
    """``org/name`` for a folder named ``models--org--name``, or None for anything else."""
    prefix = "models--"
    if not folder_name.startswith(prefix) or len(folder_name) == len(prefix):
        return None
    return folder_name[len(prefix) :].replace("--", "/")


@dataclasses.dataclass(frozen=True)
class RepoCache:
    """The cache folders of one model repo."""

    repo_id: str
    root: Path

    @classmethod
    def of(cls, repo_id: str, cache_dir: Path | None = None) -> RepoCache:
        """The cache folders of ``repo_id`` under ``cache_dir`` (default: huggingface_hub's cache)."""
        base = cache_dir if cache_dir is not None else hub_cache_dir()
        return cls(repo_id, base / repo_folder_name(repo_id))

    @property
    def blobs(self) -> Path:
        """The folder of the repo's blobs."""
        return self.root / "blobs"

    def blob(self, etag: str) -> Path:
        """The blob named by ``etag``; a name that is not a hex digest is refused (it could climb out)."""
        if not ETAG.match(etag):
            raise AnyformerError(ErrorCode.DOWNLOAD_FAILED, f"the Hub gave an ETag that is not a digest: {etag!r}")
        return self.blobs / etag

    def incomplete(self, etag: str) -> Path:
        """The resumable partial download of a blob, kept between attempts and runs."""
        return self.blobs / f"{etag}.incomplete"

    def lock(self, etag: str) -> Path:
        """The lock file guarding one blob's download (shared with huggingface_hub)."""
        return self.root.parent / ".locks" / self.root.name / f"{etag}.lock"

    def snapshot(self, commit: str) -> Path:
        """The snapshot folder of one commit."""
        if not COMMIT.match(commit):
            raise AnyformerError(ErrorCode.DOWNLOAD_FAILED, f"{commit!r} is not a commit id")
        return self.root / "snapshots" / commit

    def pointer(self, commit: str, name: str) -> Path:
        """Where file ``name`` of ``commit`` appears: a link in the snapshot folder."""
        return self.snapshot(commit) / check_file_name(name)

    def ref_file(self, ref: str) -> Path:
        """The file holding the commit a branch or tag points at."""
        if not _REF.match(ref) or ".." in ref.split("/"):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{ref!r} is not a branch or tag name")
        return self.root / "refs" / ref

    def read_ref(self, ref: str) -> str | None:
        """The commit ``ref`` points at in the cache, or None when the ref is missing or not a commit."""
        try:
            commit = self.ref_file(ref).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return commit if COMMIT.match(commit) else None

    def commit_for(self, revision: str | None) -> str | None:
        """The commit a revision names: itself when it is a commit id, else what its ref holds."""
        wanted = revision or "main"
        return wanted if COMMIT.match(wanted) else self.read_ref(wanted)

    def cached_file(self, commit: str, name: str) -> Path | None:
        """The snapshot path of ``name`` at ``commit`` when its blob is present, else None."""
        pointer = self.pointer(commit, name)
        return pointer if pointer.is_file() else None  # is_file follows the link: False when dangling

    def write_ref(self, ref: str | None, commit: str) -> None:
        """Point branch or tag ``ref`` at ``commit`` (nothing to do when ``ref`` is a commit id or None)."""
        if not ref or COMMIT.match(ref) or self.read_ref(ref) == commit:
            return
        path = self.ref_file(ref)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        temporary.write_text(commit, encoding="utf-8")
        os.replace(temporary, path)

    def link(self, commit: str, name: str, etag: str) -> Path:
        """Make ``snapshots/<commit>/<name>`` a relative link to ``blobs/<etag>``, atomically; return it."""
        pointer = self.pointer(commit, name)
        blob = self.blob(etag)
        pointer.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(blob, pointer.parent)
        if pointer.is_symlink() and os.readlink(pointer) == target:
            return pointer
        temporary = pointer.with_name(f".{pointer.name}.{uuid.uuid4().hex[:8]}.tmp")
        os.symlink(target, temporary)
        try:
            os.replace(temporary, pointer)
        except OSError:
            temporary.unlink(missing_ok=True)
            raise
        return pointer


def bytes_on_disk(path: Path) -> int:
    """Bytes a file, a link or a folder takes, links counted as links (blobs are not counted twice)."""
    if path.is_symlink() or path.is_file():
        return os.lstat(path).st_size
    total = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass  # removed while we walked: it takes no room
    return total
