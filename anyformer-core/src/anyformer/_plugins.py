"""The plugin host: finds backends through entry points and calls each one on its own.

Load order is explicit (as tox's manager does it): names blocked by the environment first, then
each entry point loaded inside its own guard, then ``check_pending`` for that plugin alone, so
one broken plugin is reported by name and never stops the others (SAFETY.md L1–L4).
"""

from __future__ import annotations

import dataclasses
import os
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import pluggy

from anyformer import hookspecs
from anyformer._backend import BackendModel, features_of
from anyformer._entry_points import installed_entry_points
from anyformer._old_hooks import old_hook_problems
from anyformer.contract._caps import Caps
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._model import Model
from anyformer.contract._progress import ProgressCallback
from anyformer.contract._request import Request
from anyformer.contract._store_entry import StoreEntry
from anyformer.contract._verdict import Refusal, Verdict

#: The entry-point group backends register under; the entry point's name is the backend id.
ENTRY_POINT_GROUP = hookspecs.PROJECT


class EntryPoint(Protocol):
    """What the host reads of an entry point: an ``importlib.metadata.EntryPoint`` or a cached record."""

    @property
    def name(self) -> str: ...

    @property
    def value(self) -> str: ...

    def load(self) -> Any: ...


@dataclasses.dataclass
class PluginInfo:
    """One plugin as ``anyformer plugins`` shows it: its id, distribution, version, and state."""

    name: str
    distribution: str | None = None
    version: str | None = None
    value: str | None = None
    ok: bool = True
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plugin as JSON-ready data; ``backends`` lists the ids it answers for."""
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "entry_point": self.value,
            "backends": [self.name] if self.ok else [],
            "ok": self.ok,
            "error": self.error,
        }


def _names_from_env(variable: str) -> set[str] | None:
    raw = os.environ.get(variable)
    if raw is None:
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


def describe_exception(exc: BaseException) -> str:
    """One line for an exception a plugin raised: its type, first line and where (never a traceback)."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r}) while loading"
    text = str(exc).strip().splitlines()
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" at {os.path.basename(where.filename)}:{where.lineno}" if where else ""
    return f"{type(exc).__name__}: {text[0] if text else ''}{at}".strip()


class PluginManager:
    """The anyformer plugin host: typed wrappers over the three hooks, one plugin at a time."""

    def __init__(self) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._infos: dict[str, PluginInfo] = {}
        # Installed plugins the environment's filters skipped (``error`` says which variable), by id.
        self._disabled: dict[str, PluginInfo] = {}
        # Names in ANYFORMER_PLUGINS / ANYFORMER_DISABLE_PLUGINS that no installed plugin has, by variable.
        self._unknown_filter_names: dict[str, list[str]] = {}
        # Where each backend loaded from an entry point came from: an isolated worker loads it again.
        self._entry_points: dict[str, str] = {}

    # ---- loading --------------------------------------------------------------------------------

    def load_entry_points(self, entry_points: Iterable[EntryPoint] | None = None) -> None:
        """Load every backend entry point (or the given ones), honouring the environment's filters.

        ``ANYFORMER_PLUGINS=a,b`` loads only those; ``ANYFORMER_DISABLE_PLUGINS=a`` skips them. The
        installed entry points come from a cache that any install or removal invalidates (``_entry_points``).
        """
        only = _names_from_env("ANYFORMER_PLUGINS")
        disabled = _names_from_env("ANYFORMER_DISABLE_PLUGINS") or set()
        if entry_points is None:
            entry_points = installed_entry_points(ENTRY_POINT_GROUP)
        entry_points = sorted(entry_points, key=lambda ep: ep.name)
        for entry_point in entry_points:
            if entry_point.name in disabled or (only is not None and entry_point.name not in only):
                why = (
                    "disabled by ANYFORMER_DISABLE_PLUGINS"
                    if entry_point.name in disabled
                    else "not named in ANYFORMER_PLUGINS"
                )
                self._disabled[entry_point.name] = self._info_of(entry_point, ok=False, error=why)
                continue
            self._load_one(entry_point)
        names = {ep.name for ep in entry_points}
        for variable, wanted in (("ANYFORMER_PLUGINS", only or set()), ("ANYFORMER_DISABLE_PLUGINS", disabled)):
            if wanted - names:
                self._unknown_filter_names[variable] = sorted(wanted - names)

    def load_entry_point(self, entry_point: EntryPoint) -> None:
        """Load one entry point whatever the environment's filters say; ``PLUGIN_ERROR`` when it fails.

        An isolated worker loads exactly the backend its parent chose this way.
        """
        self._load_one(entry_point)
        info = self._infos.get(entry_point.name)
        if info is None or not info.ok:
            why = info.error if info is not None else "not loaded"
            raise AnyformerError(ErrorCode.PLUGIN_ERROR, f"backend {entry_point.name!r} failed to load: {why}")

    def entry_point(self, backend: str) -> str | None:
        """The entry point (``module:attr``) ``backend`` was loaded from; None for in-process registrations."""
        return self._entry_points.get(backend) if backend in self.backends() else None

    @staticmethod
    def _info_of(entry_point: Any, *, ok: bool = True, error: str | None = None) -> PluginInfo:
        dist = getattr(entry_point, "dist", None)  # importlib.metadata's; a cached record names its own
        return PluginInfo(
            name=entry_point.name,
            distribution=dist.name if dist is not None else getattr(entry_point, "distribution", None),
            version=dist.version if dist is not None else getattr(entry_point, "version", None),
            value=entry_point.value,
            ok=ok,
            error=error,
        )

    def _load_one(self, entry_point: EntryPoint) -> None:
        info = self._info_of(entry_point)
        if entry_point.name in self._infos:
            info.ok, info.error = False, f"a second plugin named {entry_point.name!r}; the first one is kept"
            self._infos[f"{entry_point.name} ({info.distribution})"] = info
            return
        self._infos[entry_point.name] = info
        try:
            plugin = entry_point.load()
        except (Exception, SystemExit) as exc:  # a plugin's import may do anything, sys.exit included
            info.ok, info.error = False, describe_exception(exc)
            return
        self._register_checked(plugin, info)
        if info.ok:
            self._entry_points[entry_point.name] = entry_point.value

    def register(self, plugin: Any, name: str, *, distribution: str | None = None, version: str | None = None) -> None:
        """Register an in-process plugin object under a backend id (tests, notebooks, embedding apps).

        A name already taken keeps its first plugin: the second is listed as broken (under
        ``"name (second)"``) and never asked anything.
        """
        info = PluginInfo(name=name, distribution=distribution, version=version, value=repr(plugin))
        if name in self._infos:
            info.ok, info.error = False, f"a second plugin named {name!r}; the first one is kept"
            self._infos[f"{name} (second)"] = info
            return
        self._infos[name] = info
        self._register_checked(plugin, info)

    def _register_checked(self, plugin: Any, info: PluginInfo) -> None:
        outdated = old_hook_problems(plugin)
        if outdated is not None:  # before pluggy, whose own words would be "unknown hook 'generate'"
            info.ok, info.error = False, outdated
            return
        try:
            self._pm.register(plugin, name=info.name)
        except pluggy.PluginValidationError as exc:  # its whole text says which argument is wrong
            info.ok, info.error = False, f"invalid plugin: {' '.join(str(exc).split())}"
            return
        except (Exception, SystemExit) as exc:
            info.ok, info.error = False, f"invalid plugin: {describe_exception(exc)}"
            return
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self._pm.unregister(name=info.name)
            info.ok, info.error = False, f"invalid plugin: {' '.join(str(exc).split())}"

    # ---- what is installed ----------------------------------------------------------------------

    def plugins(self) -> list[PluginInfo]:
        """Every plugin seen, loaded or not, sorted by name."""
        return sorted(self._infos.values(), key=lambda info: info.name)

    def backends(self) -> list[str]:
        """The ids of the backends that loaded."""
        return [info.name for info in self.plugins() if info.ok]

    def disabled(self) -> list[PluginInfo]:
        """Installed plugins that ``ANYFORMER_PLUGINS`` / ``ANYFORMER_DISABLE_PLUGINS`` kept from loading."""
        return sorted(self._disabled.values(), key=lambda info: info.name)

    def unknown_filter_names(self) -> dict[str, list[str]]:
        """Names the plugin filters give that no installed plugin has, by environment variable."""
        return dict(self._unknown_filter_names)

    def why_no_backend(self, install_hint: str = "") -> str:
        """Why no backend answers at all: none installed, every one disabled (and by what), or none loaded.

        ``install_hint`` names the distributions that read the model's format, for the "none installed" case.
        """
        failed = [info for info in self.plugins() if not info.ok]
        skipped = self.disabled()
        if failed:
            what = "; ".join(f"{info.name}: {info.error}" for info in failed)
            return f"no backend plugin loaded ({what}); see `anyformer plugins`"
        if skipped:
            reasons = "; ".join(sorted({info.error or "" for info in skipped}))
            names = ", ".join(info.name for info in skipped)
            return f"every installed backend is disabled ({names}: {reasons}); see `anyformer plugins`"
        install = install_hint or "pip install anyformer-llamacpp"
        return f"no backend plugin is installed: {install} (see `anyformer plugins`)"

    def _impls(self, hook_name: str) -> Iterator[tuple[str, Any]]:
        # Only plugins that loaded and passed validation are asked: a broken one is listed, never called.
        ok = set(self.backends())
        caller = getattr(self._pm.hook, hook_name)
        by_name = {self._pm.get_name(impl.plugin): impl for impl in caller.get_hookimpls()}
        for name in sorted(n for n in by_name if n in ok):
            yield name, by_name[name]

    def _impl_for(self, hook_name: str, backend: str) -> Any | None:
        return dict(self._impls(hook_name)).get(backend)

    @staticmethod
    def _call(impl: Any, arguments: Mapping[str, Any]) -> Any:
        return impl.function(*(arguments[name] for name in impl.argnames))

    def require_backend(self, backend: str) -> None:
        """Raise ``BAD_REQUEST`` naming what is installed when ``backend`` is not a loaded backend."""
        if backend in self.backends():
            return
        broken = self._infos.get(backend)
        if broken is not None and not broken.ok:
            raise AnyformerError(ErrorCode.PLUGIN_ERROR, f"backend {backend!r} failed to load: {broken.error}")
        skipped = self._disabled.get(backend)
        if skipped is not None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"backend {backend!r} is installed but {skipped.error}")
        installed = ", ".join(self.backends()) or "none"
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"unknown backend {backend!r}; installed: {installed}")

    # ---- the hooks ------------------------------------------------------------------------------

    def can_run(self, model: Model, caps: Caps, request: Request, *, only: str | None = None) -> list[Verdict]:
        """Ask every backend (or ``only`` one) whether it can run ``model``; one verdict each."""
        arguments = {"model": model, "caps": caps, "request": request}
        verdicts = []
        for name, impl in self._impls("can_run"):
            if only is not None and name != only:
                continue
            try:
                result = self._call(impl, arguments)
            except AnyformerError as exc:
                verdicts.append(Verdict.refuse(name, Refusal.RUNTIME, f"can_run raised {exc}"))
                continue
            except (Exception, SystemExit) as exc:  # a broken plugin must not break the others (SAFETY L2)
                verdicts.append(Verdict.refuse(name, Refusal.RUNTIME, f"can_run raised {describe_exception(exc)}"))
                continue
            if result is not None:  # None: a plugin that runs no models (hookspecs.can_run)
                verdicts.append(self._checked_verdict(name, result, caps, request))
        return verdicts

    @staticmethod
    def _checked_verdict(name: str, result: Any, caps: Caps, request: Request) -> Verdict:
        """``result`` if it is a valid verdict for ``name`` under what was offered, else a ``runtime`` refusal."""
        if not isinstance(result, Verdict):
            why = f"can_run returned {type(result).__name__}, not an anyformer.Verdict"
        elif result.backend != name:
            why = f"can_run returned a verdict for {result.backend!r}, not for its own id {name!r}"
        else:
            problem = _overreach(result, caps, request)
            if problem is None:
                return result
            why = problem
        return Verdict.refuse(name, Refusal.RUNTIME, f"plugin error: {why}")

    def load(self, backend: str, model: Model, request: Request, progress: ProgressCallback) -> BackendModel:
        """Call ``backend``'s load hook; anything but a :class:`BackendModel` of its own is a ``PLUGIN_ERROR``."""
        self.require_backend(backend)
        impl = self._impl_for("load", backend)
        if impl is None:
            raise AnyformerError(ErrorCode.PLUGIN_ERROR, f"backend {backend!r} implements no load hook")
        arguments = {"model": model, "request": request, "progress": progress}
        try:
            handle = self._call(impl, arguments)
        except AnyformerError:
            raise
        except MemoryError as exc:
            raise AnyformerError(ErrorCode.OUT_OF_MEMORY, f"{backend}: out of memory while loading", cause=exc) from exc
        except (Exception, SystemExit) as exc:
            raise AnyformerError(
                ErrorCode.PLUGIN_ERROR, f"{backend}: load raised {describe_exception(exc)}", cause=exc
            ) from exc
        if not isinstance(handle, BackendModel) or getattr(handle, "backend", None) != backend:
            raise AnyformerError(
                ErrorCode.PLUGIN_ERROR,
                f"{backend}: load returned {type(handle).__name__}, "
                f"not an anyformer.plugin.BackendModel with backend={backend!r}",
            )
        try:
            features_of(handle)  # a wrong record is the plugin's bug: said now, not at the first call
        except AnyformerError:
            handle.dispose()
            raise
        return handle

    def store_list(self) -> tuple[list[StoreEntry], list[str]]:
        """Every plugin's stored models, and one line per plugin whose ``store_list`` failed."""
        entries: list[StoreEntry] = []
        problems: list[str] = []
        for name, impl in self._impls("store_list"):
            try:
                result: Sequence[StoreEntry] | None = self._call(impl, {})
            except (Exception, SystemExit) as exc:
                problems.append(f"{name}: store_list raised {describe_exception(exc)}")
                continue
            for entry in result or ():
                if isinstance(entry, StoreEntry) and entry.backend != name:
                    problems.append(f"{name}: store_list returned an entry for {entry.backend!r}, not for {name!r}")
                elif isinstance(entry, StoreEntry):
                    entries.append(entry)
                else:
                    problems.append(f"{name}: store_list returned {type(entry).__name__}, not a StoreEntry")
        return entries, problems


def _overreach(verdict: Verdict, caps: Caps, request: Request) -> str | None:
    """Why ``verdict`` contradicts what was offered (the accelerator budget, host memory), or None.

    An ok verdict must fit what it was offered, and a ``budget`` or ``memory`` refusal must need
    more than that: anything else is a bug in the plugin, and the selection policy must not act on it.
    """
    # No budget asked and no GPU memory known: there is nothing to hold the estimate against.
    gpu_offered = request.budget if request.budget is not None else caps.gpu_bytes
    if verdict.ok:
        estimate = verdict.estimate
        if estimate is None:
            return None
        if gpu_offered is not None and estimate.gpu_bytes > gpu_offered:
            return (
                f"an ok verdict estimating {estimate.gpu_bytes} bytes of accelerator memory, "
                f"more than the {gpu_offered} bytes budget offered"
            )
        if estimate.ram_bytes > caps.ram_bytes:
            return (
                f"an ok verdict estimating {estimate.ram_bytes} bytes of host memory, "
                f"more than the {caps.ram_bytes} bytes available (caps.ram_bytes)"
            )
        return None
    offered = {Refusal.BUDGET: request.budget_or(caps.gpu_bytes), Refusal.MEMORY: caps.ram_bytes}.get(
        Refusal(verdict.code)
    )
    if offered is None or verdict.need is None or verdict.need > offered:
        return None
    return f"a '{verdict.code}' refusal must need more than the {offered} bytes offered, not {verdict.need}"


_default: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, loading the installed entry points on first use."""
    global _default
    if _default is None:
        manager = PluginManager()
        manager.load_entry_points()
        _default = manager
    return _default


def reset_plugin_manager(manager: PluginManager | None = None) -> None:
    """Forget the process-wide manager (or install ``manager``): the next call reloads the entry points."""
    global _default
    _default = manager
