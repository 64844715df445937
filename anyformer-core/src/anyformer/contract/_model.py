"""The model description (docs/contract.md): what a backend needs to decide, without the weights."""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode

#: File suffixes and the format each means. Pickle formats are listed so that describe can name them;
#: no backend ever unpickles them (``UNSAFE_FORMAT``).
FORMAT_SUFFIXES: dict[str, str] = {
    ".gguf": "gguf",
    ".onnx": "onnx",
    ".safetensors": "safetensors",
    ".bin": "pickle",
    ".pt": "pickle",
    ".pth": "pickle",
    ".ckpt": "pickle",
    ".pkl": "pickle",
}


def format_of(name: str) -> str | None:
    """The weight format a file name means (``gguf``, ``onnx``, ``safetensors``, ``pickle``), or None."""
    lower = name.lower()
    for suffix, fmt in FORMAT_SUFFIXES.items():
        if lower.endswith(suffix):
            return fmt
    return None


def first_language_model_gguf(files: Iterable[ModelFile]) -> ModelFile | None:
    """The first GGUF in listing order that is not a vision projector (``mmproj``), or None."""
    return next((f for f in files if f.format == "gguf" and "mmproj" not in f.name.rsplit("/", 1)[-1].lower()), None)


def check_file_name(name: str) -> str:
    """Return ``name`` if it is a safe relative POSIX path inside a repo, else raise BAD_MODEL.

    Repo listings come from servers we do not control: a name must not climb out of the store.
    """
    if not isinstance(name, str) or not name or "\x00" in name or "\\" in name:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"unsafe file name in the repo listing: {name!r}")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise AnyformerError(ErrorCode.BAD_MODEL, f"absolute file name in the repo listing: {name!r}")
    if any(part in ("", ".", "..") for part in name.split("/")) or posixpath.normpath(name) != name:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"file name escapes the repo: {name!r}")
    return name


@dataclasses.dataclass(frozen=True)
class ModelFile:
    """One file of a model: its repo-relative name, size in bytes, LFS sha256 and local path when known."""

    name: str
    size: int | None = None
    sha256: str | None = None
    path: str | None = None

    @property
    def format(self) -> str | None:
        """The weight format this file's name means, or None for configs and tokenizers."""
        return format_of(self.name)

    def to_dict(self) -> dict[str, Any]:
        """The file as JSON-ready data, leaving out unknown fields."""
        data: dict[str, Any] = {"name": self.name, "size": self.size}
        if self.sha256:
            data["sha256"] = self.sha256
        if self.path:
            data["path"] = self.path
        return data


@dataclasses.dataclass(frozen=True)
class Model:
    """A model as the backends see it: where it comes from, what it is, and its files.

    ``source`` is ``hub`` (files are fetched through the store), ``local`` (files have a ``path``)
    or ``description`` (a what-if built from JSON, nothing to load). ``metadata`` holds facts read
    from headers (for a GGUF: architecture, block count, context length, head counts);
    ``config`` is config.json when the repo has one.
    """

    repo: str
    revision: str | None = None
    architecture: str | None = None
    task: str | None = None
    tags: tuple[str, ...] = ()
    files: tuple[ModelFile, ...] = ()
    source: str = "description"
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def formats(self) -> tuple[str, ...]:
        """The weight formats present, derived from the file names, in a stable order."""
        seen = {f.format for f in self.files} - {None}
        return tuple(fmt for fmt in ("gguf", "onnx", "safetensors", "pickle") if fmt in seen)

    def files_of(self, fmt: str) -> tuple[ModelFile, ...]:
        """The files of one format, in listing order."""
        return tuple(f for f in self.files if f.format == fmt)

    def file(self, name: str) -> ModelFile | None:
        """The file with this repo-relative name, or None."""
        return next((f for f in self.files if f.name == name), None)

    @property
    def is_local(self) -> bool:
        """True when every file has a local path (a folder or a single file)."""
        return self.source == "local"

    @property
    def ref(self) -> str:
        """The reference a person would type: ``org/name@revision`` or the local path."""
        if self.revision and self.source == "hub":
            return f"{self.repo}@{self.revision}"
        return self.repo

    def to_dict(self) -> dict[str, Any]:
        """The description as the JSON of docs/contract.md ("Model description"), plus ``formats`` and ``source``."""
        data: dict[str, Any] = {
            "repo": self.repo,
            "revision": self.revision,
            "architecture": self.architecture,
            "task": self.task,
            "tags": list(self.tags),
            "formats": list(self.formats),
            "source": self.source,
            "files": [f.to_dict() for f in self.files],
        }
        if self.metadata:
            data["metadata"] = dict(self.metadata)
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Model:
        """Build a description from JSON data; a malformed one raises ``BAD_REQUEST`` naming the field."""
        if not isinstance(data, Mapping):
            raise AnyformerError(ErrorCode.BAD_REQUEST, "a model description must be a JSON object")
        repo = data.get("repo")
        if not isinstance(repo, str) or not repo.strip():
            raise AnyformerError(ErrorCode.BAD_REQUEST, "a model description needs a non-empty string 'repo'")
        for key in ("revision", "architecture", "task"):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise AnyformerError(ErrorCode.BAD_REQUEST, f"'{key}' must be a string, got {type(data[key]).__name__}")
        tags = data.get("tags") or []
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise AnyformerError(ErrorCode.BAD_REQUEST, "'tags' must be a list of strings")
        metadata = data.get("metadata") or {}
        if not isinstance(metadata, Mapping):
            raise AnyformerError(ErrorCode.BAD_REQUEST, "'metadata' must be an object")
        # config.json's content, for what-ifs about repos whose backends read it (a safetensors checkpoint).
        config = data.get("config") or {}
        if not isinstance(config, Mapping):
            raise AnyformerError(ErrorCode.BAD_REQUEST, "'config' must be an object (config.json's content)")
        source = data.get("source") or "description"
        if source not in ("description", "hub", "local"):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"'source' must be description, hub or local, got {source!r}")
        return cls(
            repo=repo,
            revision=data.get("revision"),
            architecture=data.get("architecture"),
            task=data.get("task"),
            tags=tuple(tags),
            files=tuple(_file_from_dict(f, i) for i, f in enumerate(_list(data.get("files", []), "files"))),
            source=source,
            metadata=dict(metadata),
            config=dict(config),
        )

    @classmethod
    def from_json_file(cls, path: str | Path) -> Model:
        """Read a description from a JSON file; unreadable or invalid JSON raises ``BAD_REQUEST``."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise AnyformerError(ErrorCode.MODEL_NOT_FOUND, f"no description file at {path}", cause=exc) from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"cannot read {path}: {exc}", cause=exc) from exc
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: arrays nested thousands deep
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{path} is not valid JSON: {exc}", cause=exc) from exc
        return cls.from_dict(data)


def _list(value: Any, name: str) -> Iterable[Any]:
    if not isinstance(value, list):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"'{name}' must be a list")
    return value


def _file_from_dict(data: Any, index: int) -> ModelFile:
    if isinstance(data, str):
        data = {"name": data}
    if not isinstance(data, Mapping):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"files[{index}] must be an object with 'name' and 'size'")
    name = data.get("name")
    if not isinstance(name, str):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"files[{index}] needs a string 'name'")
    try:
        check_file_name(name)
    except AnyformerError as exc:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"files[{index}]: {exc.message}") from None
    size = data.get("size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"files[{index}] ({name}): 'size' must be a non-negative integer")
    sha = data.get("sha256")
    if sha is not None and not isinstance(sha, str):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"files[{index}] ({name}): 'sha256' must be a string")
    path = data.get("path")
    if path is not None and not isinstance(path, str):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"files[{index}] ({name}): 'path' must be a string")
    return ModelFile(name=name, size=size, sha256=sha, path=path)
