"""Load options as a backend declares them: a typed schema the core parses before any backend is asked.

A backend lists its options (``LOAD_OPTIONS = LoadOptions(LoadOption(...), ...)`` beside its hooks);
the core checks every key and value of ``Request.options`` against the schemas of the backends in
play before it asks any of them (docs/contract.md, "Load options"), and each backend then sees only
its own keys, parsed to their types, with the defaults filled in. One parser per type, so ``yes``,
``on`` and ``1`` mean the same to every backend.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._sizes import parse_size

#: The value types an option may have: ``size`` is bytes, written as a number or ``4GB``/``512MiB``.
OptionKind = Literal["bool", "int", "float", "str", "enum", "size"]
KINDS: tuple[str, ...] = ("bool", "int", "float", "str", "enum", "size")

#: Spellings of yes and no every backend accepts for a ``bool`` option (a CLI ``k=v`` sends text).
_YES = frozenset({"true", "yes", "on", "1"})
_NO = frozenset({"false", "no", "off", "0"})


def parse_yes_no(value: object, what: str = "the value") -> bool:
    """``value`` as a bool: True/False, 1/0, or ``true/false``, ``yes/no``, ``on/off``, ``1/0`` in any case.

    Anything else is ``BAD_REQUEST`` naming ``what``. The one yes/no reading of the project: the
    core uses it for every ``bool`` load option, and a backend may use it for a yes/no setting of its
    own.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _YES:
            return True
        if word in _NO:
            return False
    raise AnyformerError(
        ErrorCode.BAD_REQUEST, f"{what} must be true or false (yes/no, on/off, 1/0), got {value!r:.60}"
    )


@dataclasses.dataclass(frozen=True)
class LoadOption:
    """One load option: its name, type, default and a one-line help.

    ``choices`` are an ``enum`` option's values; ``minimum``/``maximum`` bound an ``int``, ``float``
    or ``size``; ``words`` are strings taken as themselves besides the type (``parallel``'s
    ``"auto"``). ``default`` None means "the backend decides" (the help says how); any other default
    must itself be a valid value.
    """

    name: str
    kind: OptionKind
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    words: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"a load option's name must be an identifier, not {self.name!r}")
        if self.kind not in KINDS:
            raise ValueError(f"load option {self.name!r}: kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if (self.kind == "enum") != bool(self.choices):
            raise ValueError(f"load option {self.name!r}: choices are for an enum option, and an enum needs them")
        if self.default is not None:
            try:
                self.parse(self.default)
            except AnyformerError as exc:
                raise ValueError(f"load option {self.name!r}: its default is not a valid value ({exc})") from exc

    def parse(self, value: object) -> Any:
        """``value`` as this option's type (None: the default), or ``BAD_REQUEST`` naming the option."""
        if value is None:
            return self.default
        if isinstance(value, str) and value in self.words:
            return value
        what = f"load option {self.name!r}"
        parsed = _PARSERS[self.kind](self, value, what)
        self._check_bounds(parsed, what)
        return parsed

    def _check_bounds(self, value: Any, what: str) -> None:
        if self.kind not in ("int", "float", "size"):
            return
        if self.minimum is not None and value < self.minimum:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"{what} must be at least {_plain(self.minimum)}, got {value!r}"
            )
        if self.maximum is not None and value > self.maximum:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{what} must be at most {_plain(self.maximum)}, got {value!r}")

    def type_text(self) -> str:
        """The type for people: ``bool``, ``int >= 1``, ``auto|cpu|gpu``, ``size``, with ``or auto`` words."""
        text = "|".join(self.choices) if self.kind == "enum" else self.kind
        if self.minimum is not None and self.maximum is not None:
            text += f" {_plain(self.minimum)}..{_plain(self.maximum)}"
        elif self.minimum is not None:
            text += f" >= {_plain(self.minimum)}"
        elif self.maximum is not None:
            text += f" <= {_plain(self.maximum)}"
        return " or ".join([text, *(repr(word) for word in self.words)])

    def to_dict(self) -> dict[str, Any]:
        """The option as JSON-ready data (``anyformer plugins --json``)."""
        return {"name": self.name, "type": self.type_text(), "default": self.default, "help": self.help}


def _plain(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def _as_bool(option: LoadOption, value: object, what: str) -> bool:
    return parse_yes_no(value, what)


def _as_int(option: LoadOption, value: object, what: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value.strip()) <= 20:
        return int(value.strip())
    raise AnyformerError(ErrorCode.BAD_REQUEST, f"{what} must be a whole number, got {value!r:.60}")


def _as_float(option: LoadOption, value: object, what: str) -> float:
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str) and len(value) <= 40:
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None or not math.isfinite(number):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{what} must be a finite number, got {value!r:.60}")
    return number


def _as_str(option: LoadOption, value: object, what: str) -> str:
    if not isinstance(value, str):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{what} must be a string, got {value!r:.60}")
    return value


def _as_enum(option: LoadOption, value: object, what: str) -> str:
    if isinstance(value, str) and value in option.choices:
        return value
    raise AnyformerError(ErrorCode.BAD_REQUEST, f"{what} must be one of {', '.join(option.choices)}, got {value!r:.60}")


def _as_size(option: LoadOption, value: object, what: str) -> int:
    if not isinstance(value, (int, str)) or isinstance(value, bool):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{what} must be a size (bytes, or 4GB, 512MiB), got {value!r:.60}")
    try:
        return parse_size(value)
    except AnyformerError as exc:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{what}: {exc.message}") from exc


_PARSERS = {
    "bool": _as_bool,
    "int": _as_int,
    "float": _as_float,
    "str": _as_str,
    "enum": _as_enum,
    "size": _as_size,
}


class LoadOptions:
    """A backend's load options: the schema the core parses ``Request.options`` with for it.

    ``parse`` gives every declared option, parsed, the defaults filled in; ``value`` reads one
    (a backend's code calls it, so a hook called directly, as the kit and tests do, reads the same
    typed value as one the core called).
    """

    def __init__(self, *options: LoadOption) -> None:
        names = [option.name for option in options]
        doubled = sorted({name for name in names if names.count(name) > 1})
        if doubled:
            raise ValueError(f"load options declared twice: {', '.join(doubled)}")
        if not all(isinstance(option, LoadOption) for option in options):
            raise TypeError("LoadOptions takes LoadOption items")
        self._options = {option.name: option for option in options}

    def __iter__(self) -> Iterator[LoadOption]:
        return iter(self._options.values())

    def __len__(self) -> int:
        return len(self._options)

    def __contains__(self, name: object) -> bool:
        return name in self._options

    def __repr__(self) -> str:
        return f"LoadOptions({', '.join(self._options)})"

    @property
    def names(self) -> tuple[str, ...]:
        """The declared names, in declaration order."""
        return tuple(self._options)

    def unknown(self, given: Mapping[str, Any]) -> list[str]:
        """The keys of ``given`` this schema does not declare, sorted."""
        return sorted(key for key in given if key not in self._options)

    def parse(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every declared option, parsed from ``given`` (absent: its default).

        ``BAD_REQUEST`` naming the keys it does not declare (and listing those it does), or the
        option whose value is not of its type.
        """
        unknown = self.unknown(given)
        if unknown:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"unknown load option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                f"the options: {self.summary()}",
            )
        return {name: option.parse(given.get(name)) for name, option in self._options.items()}

    def value(self, given: Mapping[str, Any], name: str) -> Any:
        """The option ``name``'s value in ``given``, parsed (absent or None: its default)."""
        return self._options[name].parse(given.get(name))

    def markdown(self) -> str:
        """The options as a Markdown table (``option | type | default | what``), as docs/backends pages show them."""
        if not self._options:
            return "None: the core refuses every load option for it (`BAD_REQUEST`; `option` where another takes it)."
        rows = ["| option | type | default | what |", "|---|---|---|---|"]
        for option in self:
            default = "—" if option.default is None else f"`{option.default}`"
            kind = option.type_text().replace("|", "\\|")
            rows.append(f"| `{option.name}` | {kind} | {default} | {option.help} |")
        return "\n".join(rows)

    def summary(self) -> str:
        """One line: each option's name and type (``device (auto|cpu|gpu), threads (int >= 1)``), or ``none``."""
        return ", ".join(f"{option.name} ({option.type_text()})" for option in self) or "none"


#: The schema of a backend that declares no load options.
NO_LOAD_OPTIONS = LoadOptions()

#: ``file``: the repo's weight file to load instead of the one the backend would choose. The core
#: checks that it names a weight file of the model; a backend that honours it declares this option.
FILE_OPTION = LoadOption(
    "file", "str", help="the repo's weight file to load (a split set's first shard); default: the backend's choice"
)
