"""JSON Schema -> the byte-level grammar of :mod:`lmlab.generate.grammar`.

:func:`compile_schema` turns a JSON Schema (a dict) into a tree of grammar nodes. Each node is a
small deterministic automaton over the UTF-8 bytes of its JSON value:

* ``initial`` - its state before the value's first byte;
* ``feed(state, byte)`` - a list of *actions* (several = nondeterminism, e.g. enum ``1`` vs ``12``):
  ``(OK, state')`` the byte was consumed; ``(CALL, state', child)`` push ``child`` and let it
  consume the byte, then resume in ``state'`` when the child is done; ``(POP,)`` the byte
  was consumed and the value is complete; ``(PASS,)`` the value was already complete and the
  byte belongs to the parent (how a number learns that it ended);
* ``finish_cost(state)`` - the fewest bytes that complete the value from ``state`` (0 = complete).

:mod:`lmlab.generate.constrained` runs a stack of ``(node, state)`` frames over the bytes of each
candidate token; the sum of ``finish_cost`` over the stack is the length of the shortest valid
completion, which lets generation force a finish before the token budget runs out.

What is generated (always valid against the schema, never the whole of JSON):

* objects: the schema's ``properties`` in their declared order, every ``required`` one present,
  optional ones present or skipped; no other keys (``additionalProperties`` false in effect);
* arrays of ``items`` with ``minItems``/``maxItems`` (default cap ``max_array_items``);
* strings: printable ASCII, any non-ASCII character as UTF-8, and the one-letter escapes
  (``\\n``, ``\\"``...); ``minLength``/``maxLength`` in characters (default cap ``max_string_length``);
* numbers without exponent, at most 15 integer and 6 fraction digits; integers without fraction;
  ``minimum``/``maximum``/``exclusiveMinimum``/``exclusiveMaximum`` are enforced digit by digit;
* ``enum``/``const`` (any JSON values, matched in their compact serialization), ``boolean``,
  ``null``, ``anyOf`` and type lists; a schema with no type (``{}``) is any scalar.
* whitespace: one space at most between tokens of JSON (so a document stays on one line).

Anything else (``pattern``, ``format``, ``$ref``, ``oneOf``...) is refused with a one-line
:class:`~lmlab.errors.LmlabError` naming the keyword and where it is.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any

from lmlab.errors import LmlabError
from lmlab.generate.grammar import AnyOf, Array, Literal, Node, Number, Object, Root, String, accepts

DEFAULT_MAX_STRING_LENGTH = 32
DEFAULT_MAX_ARRAY_ITEMS = 8

ANNOTATIONS = {"$schema", "$id", "$comment", "title", "description", "default", "examples",
               "readOnly", "writeOnly", "deprecated"}
KEYWORDS = {
    "any": {"type", "enum", "const", "anyOf"},
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "minItems", "maxItems"},
    "string": {"minLength", "maxLength"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
}
SUPPORTED = set().union(*KEYWORDS.values()) | ANNOTATIONS
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


# --------------------------------------------------------------------------- schema -> nodes
def compile_schema(schema: Any, *, max_string_length: int = DEFAULT_MAX_STRING_LENGTH,
                   max_array_items: int = DEFAULT_MAX_ARRAY_ITEMS) -> Root:
    """The grammar of the documents :mod:`lmlab.generate.constrained` may generate for ``schema``.

    ``max_string_length`` / ``max_array_items`` cap strings and arrays whose schema sets no
    ``maxLength`` / ``maxItems`` (an untrained model would otherwise write one endless string).
    Raises :class:`LmlabError` naming the first unsupported keyword or invalid value.
    """
    return Root(_Compiler(max_string_length, max_array_items).node(schema, "#"))


class _Compiler:
    def __init__(self, max_string_length: int, max_array_items: int):
        self.max_string_length, self.max_array_items = max_string_length, max_array_items

    def node(self, schema: Any, path: str) -> Node:
        if schema is True or schema == {}:
            return self.any_scalar()
        if schema is False:
            raise LmlabError(f"JSON Schema at {path} is false, which no value matches", "remove it")
        if not isinstance(schema, dict):
            raise LmlabError(f"JSON Schema at {path} must be an object or a boolean, "
                             f"got {type(schema).__name__}",
                             'write e.g. {"type": "string"}')
        for key in schema:
            if key not in SUPPORTED:
                supported = ", ".join(sorted(SUPPORTED - ANNOTATIONS))
                raise LmlabError(f"JSON Schema keyword {key!r} at {path} is not supported by constrained "
                                 "decoding", f"remove it; supported keywords: {supported}")
        if "const" in schema or "enum" in schema:
            return self.literal(schema, path)
        if "anyOf" in schema:
            options = schema["anyOf"]
            if not isinstance(options, list) or not options:
                raise LmlabError(f"anyOf at {path} must be a non-empty list of schemas", "fix the schema")
            base = {k: v for k, v in schema.items() if k != "anyOf"}
            if set(base) - ANNOTATIONS:
                raise LmlabError(f"anyOf at {path} is combined with sibling keywords "
                                 f"{sorted(set(base) - ANNOTATIONS)}",
                                 "move them into each anyOf branch")
            return AnyOf([self.node(s, f"{path}/anyOf/{i}") for i, s in enumerate(options)])
        types = self.types(schema, path)
        nodes = [self.typed(t, schema, path) for t in types]
        return nodes[0] if len(nodes) == 1 else AnyOf(nodes)

    def types(self, schema: dict, path: str) -> list[str]:
        t = schema.get("type")
        if t is None:       # infer from the keywords present
            inferred = [name for name in ("object", "array", "string", "number")
                        if any(k in schema for k in KEYWORDS[name])]
            return inferred or ["string", "number", "boolean", "null"]
        ts = t if isinstance(t, list) else [t]
        if not ts or any(x not in TYPES for x in ts):
            raise LmlabError(f"JSON Schema type {t!r} at {path} is not a JSON Schema type",
                             f"use one of {', '.join(TYPES)}")
        if "integer" in ts and "number" in ts:
            ts = [x for x in ts if x != "integer"]
        return list(dict.fromkeys(ts))

    def typed(self, t: str, schema: dict, path: str) -> Node:
        if t == "object":
            return self.object(schema, path)
        if t == "array":
            item_schema = schema.get("items", {})
            if isinstance(item_schema, list):
                raise LmlabError(f"tuple-form items (a list) at {path} is not supported",
                                 "give items one schema")
            lo = self.count(schema, "minItems", path, 0)
            hi = self.count(schema, "maxItems", path, max(self.max_array_items, lo))
            if lo > hi:
                raise LmlabError(f"minItems {lo} > maxItems {hi} at {path}", "fix the bounds")
            return Array(self.node(item_schema, f"{path}/items"), lo, hi)
        if t == "string":
            lo = self.count(schema, "minLength", path, 0)
            hi = self.count(schema, "maxLength", path, max(self.max_string_length, lo))
            if lo > hi:
                raise LmlabError(f"minLength {lo} > maxLength {hi} at {path}", "fix the bounds")
            return String(lo, hi)
        if t in ("number", "integer"):
            return self.number(t == "integer", schema, path)
        return Literal([b"true", b"false"] if t == "boolean" else [b"null"])

    def object(self, schema: dict, path: str) -> Object:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(props, dict):
            raise LmlabError(f"properties at {path} must be an object", 'e.g. {"name": {"type": "string"}}')
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise LmlabError(f"required at {path} must be a list of property names", 'e.g. ["name"]')
        extra = schema.get("additionalProperties", False)
        if not isinstance(extra, (bool, dict)):
            raise LmlabError(f"additionalProperties at {path} must be a boolean or a schema", "use false")
        items = [(k, self.node(v, f"{path}/properties/{k}")) for k, v in props.items()]
        for r in required:
            if r not in props:
                if extra is False:
                    raise LmlabError(f"required property {r!r} at {path} is not in properties and "
                                     "additionalProperties is false", "add it to properties")
                where = f"{path}/additionalProperties"
                value = self.any_scalar() if extra is True else self.node(extra, where)
                items.append((r, value))
        return Object(items, set(required))

    def number(self, integer: bool, schema: dict, path: str) -> Number:
        bounds = {}
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            v = schema.get(key)
            if v is None:
                continue
            if isinstance(v, bool) and key.startswith("exclusive"):  # draft 4's form
                raise LmlabError(f"{key} at {path} must be a number, got {json.dumps(v)} (draft 4's form)",
                                 f"use the draft-6+ numeric form, e.g. \"{key}\": 0")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                shown = "a number too large for a float" if isinstance(v, float) else json.dumps(v)
                raise LmlabError(f"{key} at {path} must be a finite number, got {shown}",
                                 f"write {key} as a number within about ±1.8e308, e.g. \"{key}\": 0")
            bounds[key] = Fraction(v)
        lo, lo_x = bounds.get("minimum"), False
        if "exclusiveMinimum" in bounds and (lo is None or bounds["exclusiveMinimum"] >= lo):
            lo, lo_x = bounds["exclusiveMinimum"], True
        hi, hi_x = bounds.get("maximum"), False
        if "exclusiveMaximum" in bounds and (hi is None or bounds["exclusiveMaximum"] <= hi):
            hi, hi_x = bounds["exclusiveMaximum"], True
        try:
            return Number(integer, lo, hi, lo_x, hi_x)
        except LmlabError:
            raise LmlabError(f"no {'integer' if integer else 'number'} at {path} satisfies the bounds "
                             f"(minimum/maximum)", "fix the bounds") from None

    def literal(self, schema: dict, path: str) -> Literal:
        if "const" in schema:
            values = [schema["const"]]
        else:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise LmlabError(f"enum at {path} must be a non-empty list", 'e.g. ["red", "green"]')
        rest = {k: v for k, v in schema.items() if k not in ("enum", "const")}
        check = self.node(rest, path) if set(rest) - ANNOTATIONS else None
        out = []
        for v in values:
            text = json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode()
            if check is None or accepts(check, text):
                out.append(text)
        if not out:
            raise LmlabError(f"no enum/const value at {path} satisfies the other keywords of its schema",
                             "fix the schema")
        return Literal(out)

    def count(self, schema: dict, key: str, path: str, default: int) -> int:
        v = schema.get(key, default)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise LmlabError(f"{key} at {path} must be a non-negative integer, got {v!r}",
                             f"e.g. \"{key}\": 3")
        return v

    def any_scalar(self) -> Node:
        return AnyOf([String(0, self.max_string_length), Number(False),
                      Literal([b"true", b"false", b"null"])])
