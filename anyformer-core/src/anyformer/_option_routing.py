"""Which backend takes which load option: the core's one parse of ``Request.options``.

It runs before any backend is asked (and before any worker starts): a key that no backend in
play declares, or a value that every backend declaring its key refuses, is ``BAD_REQUEST`` naming
it and listing the options there are. A backend that lacks a key another one declares is refused
with ``option`` (it would drop a setting the caller asked for); every other backend is asked with
its own keys only, parsed to their types, defaults filled in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._load_options import LoadOptions
from anyformer.contract._request import Request
from anyformer.contract._verdict import Refusal, Verdict

#: Options that change no output, only how many requests one load serves at once: a backend that
#: does not declare one loads as if it were not given, and its handle says the streams it serves
#: (``parallel``), so a server can ask every backend for them.
THROUGHPUT_OPTIONS = frozenset({"parallel"})


@dataclasses.dataclass(frozen=True)
class OptionRouting:
    """Per backend: the request it is asked with (its options parsed) or its ``option`` refusal."""

    requests: dict[str, Request]
    refusals: dict[str, Verdict]


def route_options(schemas: Mapping[str, LoadOptions], request: Request) -> OptionRouting:
    """Parse ``request.options`` against each backend's schema (``schemas``: the backends in play).

    ``BAD_REQUEST`` for keys none of them declares (listing every backend's options) and for a value
    that every backend declaring its key refuses (the first one's message, naming the option).
    """
    given = request.options
    _refuse_undeclared(schemas, given)
    failures = {name: _failures(schema, given) for name, schema in schemas.items()}
    _refuse_ill_typed(schemas, given, failures)
    requests: dict[str, Request] = {}
    refusals: dict[str, Verdict] = {}
    for name, schema in schemas.items():
        lacking = sorted(key for key in given if key not in schema and key not in THROUGHPUT_OPTIONS)
        if lacking:
            takes = ", ".join(schema.names) or "none"
            refusals[name] = Verdict.refuse(
                name, Refusal.OPTION, f"takes no load option {', '.join(map(repr, lacking))} (its options: {takes})"
            )
        elif failures[name]:
            refusals[name] = Verdict.refuse(name, Refusal.OPTION, next(iter(failures[name].values())).message)
        else:
            mine = {key: value for key, value in given.items() if key in schema}
            requests[name] = dataclasses.replace(request, options=schema.parse(mine))
    return OptionRouting(requests, refusals)


def request_for(backend: str, schema: LoadOptions, request: Request) -> Request:
    """``request`` with ``backend``'s options parsed; ``BAD_REQUEST`` for any key it does not take."""
    routing = route_options({backend: schema}, request)
    return routing.requests[backend]  # route_options raised for anything else: one backend declares or fails


def _failures(schema: LoadOptions, given: Mapping[str, object]) -> dict[str, AnyformerError]:
    """The keys of ``given`` that ``schema`` declares but whose values it refuses, with its error."""
    failed: dict[str, AnyformerError] = {}
    for option in schema:
        if option.name not in given:
            continue
        try:
            option.parse(given[option.name])
        except AnyformerError as exc:
            failed[option.name] = exc
    return failed


def _refuse_undeclared(schemas: Mapping[str, LoadOptions], given: Mapping[str, object]) -> None:
    declared = {name for schema in schemas.values() for name in schema.names} | THROUGHPUT_OPTIONS
    unknown = sorted(key for key in given if key not in declared)
    if not unknown:
        return
    listed = "; ".join(f"{name}: {schema.summary()}" for name, schema in sorted(schemas.items())) or "no backend"
    plural = "s" if len(unknown) > 1 else ""
    raise AnyformerError(
        ErrorCode.BAD_REQUEST,
        f"unknown load option{plural} {', '.join(map(repr, unknown))}; the options backends take: {listed}",
    )


def _refuse_ill_typed(
    schemas: Mapping[str, LoadOptions], given: Mapping[str, object], failures: Mapping[str, dict[str, AnyformerError]]
) -> None:
    for key in given:
        declaring = [name for name, schema in sorted(schemas.items()) if key in schema]
        if declaring and all(key in failures[name] for name in declaring):
            first = failures[declaring[0]][key]
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{first.message} ({', '.join(declaring)})")
