"""Structured output: what a reply must match, as ``generate(constraint=...)`` and the server pass it.

A :class:`Constraint` is data only: the core never compiles it. A backend that declares
``"constraint"`` in its ``honours`` compiles it against its tokenizer's vocabulary (llama.cpp does
so with llguidance) and masks every token that would leave the language; the others refuse it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode

#: The kinds of constraint: a JSON schema, a regular expression, a Lark grammar, a GBNF grammar.
KINDS = ("json_schema", "regex", "lark", "gbnf")
#: The longest constraint text (a schema's JSON, a regex, a grammar), in characters.
MAX_CONSTRAINT_CHARS = 256 * 1024

#: What ``json_object`` means: any JSON object.
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def _bad(why: str) -> AnyformerError:
    return AnyformerError(ErrorCode.BAD_REQUEST, f"constraint: {why}")


@dataclasses.dataclass(frozen=True)
class Constraint:
    """What the reply must match: ``kind`` (one of :data:`KINDS`) and its ``source``.

    ``source`` is the schema's JSON text for ``json_schema`` (its keys in the order given: a model
    writes an object's properties in the schema's order), else the regex or grammar text as given.
    A reply under a ``json_schema`` constraint is one JSON value that validates against it, and
    nothing after it.
    """

    kind: str
    source: str

    @property
    def schema(self) -> dict[str, Any]:
        """The JSON schema of a ``json_schema`` constraint (``BAD_REQUEST`` for other kinds)."""
        if self.kind != "json_schema":
            raise _bad(f"a {self.kind} constraint has no schema")
        value: dict[str, Any] = json.loads(self.source)
        return value

    def to_dict(self) -> dict[str, Any]:
        """The constraint as JSON-ready data, the shape :meth:`build` reads back."""
        if self.kind == "json_schema":
            return {"type": "json_schema", "schema": self.schema}
        return {"type": self.kind, self.kind: self.source}

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any]) -> Constraint:
        """A reply that is one JSON value valid against ``schema``."""
        if not isinstance(schema, Mapping):
            raise _bad(f"a JSON schema must be an object, got {type(schema).__name__}")
        try:
            text = json.dumps(schema, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise _bad(f"the schema is not JSON data ({exc})") from None
        return cls._sized("json_schema", text)

    @classmethod
    def _sized(cls, kind: str, source: Any) -> Constraint:
        if not isinstance(source, str) or not source:
            raise _bad(f"a {kind} constraint needs a non-empty string")
        if len(source) > MAX_CONSTRAINT_CHARS:
            raise _bad(f"the {kind} is {len(source):,} characters; at most {MAX_CONSTRAINT_CHARS:,}")
        return cls(kind, source)

    @classmethod
    def build(cls, value: Any) -> Constraint:
        """A constraint from a :class:`Constraint` or a dict; anything malformed raises ``BAD_REQUEST``.

        The dicts: ``{"type": "json_object"}``, ``{"type": "json_schema", "schema": {...}}`` (also
        OpenAI's ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``),
        ``{"type": "regex", "regex": "..."}``, ``{"type": "lark", "lark": "..."}``,
        ``{"type": "gbnf", "gbnf": "..."}`` (llama.cpp's grammar format).
        """
        if isinstance(value, Constraint):
            return value
        if not isinstance(value, Mapping):
            raise _bad(f"give a Constraint or a dict with a 'type', got {type(value).__name__}")
        kind = value.get("type")
        if kind == "json_object":
            return cls.json_schema(value.get("schema") or ANY_OBJECT)
        if kind == "json_schema":
            wrapped = value.get("json_schema")
            if isinstance(wrapped, Mapping):  # OpenAI's response_format shape
                schema = wrapped.get("schema", ANY_OBJECT)
            else:
                schema = value.get("schema")
            if schema is None:
                raise _bad("a json_schema constraint needs its 'schema'")
            return cls.json_schema(schema)
        if kind in ("regex", "lark", "gbnf"):
            return cls._sized(kind, value.get(kind))
        raise _bad(f"unknown type {kind!r} (json_object, json_schema, regex, lark or gbnf)")
