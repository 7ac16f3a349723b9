"""JSON-schema constrained decoding through llguidance, the grammar engine of Microsoft's Guidance.

llguidance (``pip install 'lmlab[grammar]'``) compiles a JSON Schema into a grammar and gives,
per step, the set of tokens that keep the text a prefix of a valid document. It needs every token
as one fixed byte string, which lmlab's byte-level BPE (raw bytes) and character BPE (the
end-of-word marker is a space) have; WordPiece and unigram tokens change their text with their
position, so :mod:`lmlab.generate.json_backend` gives those to lmlab's own engine.

The schema is compiled with lmlab's conventions, so both engines write the same documents where
both support the schema (checked token by token in tests/generate/test_grammar_backends.py):

* at most one space between JSON tokens and around the document, no newlines, so a document
  fits on one line;
* strings: the one-letter escapes, no ``\\u`` (llguidance has no ``\\/``, which lmlab allows);
* strings and arrays without ``maxLength`` / ``maxItems`` get ``max_string_length`` (32) /
  ``max_array_items`` (8), and objects without ``additionalProperties`` get ``false`` - the caps
  lmlab's engine applies, without which an untrained model may never close a string.

What llguidance adds: ``$ref``/``$defs``, ``pattern``, ``format`` (date, time, date-time,
duration, email, hostname, ipv4, ipv6, uuid, uri), ``oneOf``, ``allOf``, ``multipleOf``,
``patternProperties``, ``additionalProperties`` schemas, ``prefixItems``, ``minProperties``...
What it lacks: a budget. Nothing forces a document to end within ``max_new_tokens``; a row that
has not finished by then is an error in :meth:`LlguidanceJsonConstraint.text`. So the default
backend (:mod:`lmlab.generate.json_backend`, ``auto``) gives llguidance a schema only when
:func:`longest_document_bytes` shows that every document it allows fits in the budget.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from lmlab.errors import LmlabError
from lmlab.generate.json_schema import ANNOTATIONS, DEFAULT_MAX_ARRAY_ITEMS, DEFAULT_MAX_STRING_LENGTH
from lmlab.setting_names import KEYWORDS, SettingNames

INSTALL = "pip install 'lmlab[grammar]'"
# lmlab's JSON text conventions, as llguidance compile options (see the module docstring)
JSON_OPTIONS = {"whitespace_pattern": " ?", "json_allowed_escapes": '"\\bfnrt'}
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = ("items", "additionalProperties", "contains", "not", "if", "then", "else", "propertyNames",
               "additionalItems", "unevaluatedProperties", "unevaluatedItems")


def llguidance_module():
    """The llguidance package, or a one-line error naming the extra that installs it."""
    try:
        import llguidance
    except ImportError:
        raise LmlabError("the llguidance grammar backend needs the llguidance package",
                         INSTALL) from None
    return llguidance


def llguidance_installed() -> bool:
    try:
        import llguidance  # noqa: F401
    except ImportError:
        return False
    return True


def fixed_token_bytes(tokenizer) -> list[bytes | None] | None:
    """Each token's bytes in the decoded text (None for special tokens), when that never depends on
    the token's position: byte-level BPE and character BPE. None for any other tokenizer."""
    from lmlab.generate.constrained import token_surfaces

    if getattr(tokenizer, "algo", "") not in ("bytelevel", "bpe"):
        return None
    return token_surfaces(tokenizer)[1]


def bounded_schema(schema: Any, max_string_length: int | None, max_array_items: int | None) -> Any:
    """``schema`` with lmlab's default caps where it sets none (a copy; the input is not changed)."""
    if isinstance(schema, list):
        return [bounded_schema(s, max_string_length, max_array_items) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = bounded_schema(out[key], max_string_length, max_array_items)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: bounded_schema(v, max_string_length, max_array_items) for k, v in out[key].items()}
    for key in _SCHEMA_ONE:
        if isinstance(out.get(key), (dict, list)):
            out[key] = bounded_schema(out[key], max_string_length, max_array_items)
    types = out.get("type")
    types = set(types) if isinstance(types, list) else {types}
    if "enum" in out or "const" in out:
        return out
    if max_string_length is not None and "string" in types and "maxLength" not in out:
        out["maxLength"] = max(max_string_length, _int(out.get("minLength")))
    if max_array_items is not None and "array" in types and "maxItems" not in out:
        out["maxItems"] = max(max_array_items, _int(out.get("minItems")), len(out.get("prefixItems") or []))
    if ("object" in types or "properties" in out) and "additionalProperties" not in out \
            and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def _int(v) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


# --------------------------------------------------------------------------- the longest document
# keywords whose documents :func:`longest_document_bytes` can bound (anything else: no bound)
_BOUNDABLE = {"type", "enum", "const", "anyOf", "oneOf", "$ref", "properties", "required",
              "additionalProperties", "items", "minItems", "maxItems", "minLength", "maxLength",
              "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
_CONTAINERS = {"$defs", "definitions", "x-guidance"}
_BYTES_PER_CHAR = 4             # a string character: UTF-8 up to 4 bytes, a one-letter escape 2
_STRUCTURAL = 3                 # { } [ ] : , with at most one space on each side


def longest_document_bytes(schema: Any, *, max_string_length: int | None = DEFAULT_MAX_STRING_LENGTH,
                           max_array_items: int | None = DEFAULT_MAX_ARRAY_ITEMS) -> int | None:
    """An upper bound on the bytes of any text llguidance lets through for ``schema`` (the space
    before and after the document included), or None when we cannot bound it.

    A bound exists when every string and array is bounded (``maxLength``/``maxItems`` or the
    default caps), every number is an integer with a minimum and a maximum, enum/const values are
    strings, integers, booleans or null, and the schema uses only ``type``, ``properties``/
    ``required`` (no other keys), ``items``, ``anyOf``/``oneOf``, local ``$ref`` without recursion
    and the bounds keywords. Generous by design: 4 bytes per string character, a space on both
    sides of every ``{ } [ ] : ,``. Since a token holds at least one byte, a document through
    llguidance never takes more tokens than this, whatever the model writes.
    """
    bounded = bounded_schema(schema, max_string_length, max_array_items)
    n = _Longest(bounded).of(bounded, ())
    return None if n is None else n + 2


class _Longest:
    """The longest-document bound of each subschema of ``root`` (None: unbounded or unknown)."""

    def __init__(self, root: Any):
        self.root = root

    def of(self, schema: Any, refs: tuple) -> int | None:
        if not isinstance(schema, dict):
            return None                              # true/false: any value, or none
        keys = set(schema) - ANNOTATIONS - _CONTAINERS
        if not keys or keys - _BOUNDABLE:
            return None
        if "enum" in schema or "const" in schema:
            return _longest_literal(schema)
        for key in ("$ref", "anyOf", "oneOf"):
            if key in schema:
                if keys != {key}:                    # merged with siblings: not bounded here
                    return None
                if key == "$ref":
                    return self.ref(schema["$ref"], refs)
                options = schema[key]
                return _max([self.of(o, refs) for o in options]) if isinstance(options, list) else None
        types = schema.get("type")
        types = types if isinstance(types, list) else [types]
        return _max([self.typed(t, schema, refs) for t in types])

    def ref(self, ref: Any, refs: tuple) -> int | None:
        if not isinstance(ref, str) or not ref.startswith("#") or ref in refs:
            return None                              # not local, or recursive
        target = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                return None
            target = target[part]
        return self.of(target, refs + (ref,))

    def typed(self, t: Any, schema: dict, refs: tuple) -> int | None:
        if t == "string":
            n = schema.get("maxLength")
            return 2 + _BYTES_PER_CHAR * n if _count(n) else None
        if t == "integer":
            return _longest_integer(schema)
        if t in ("boolean", "null"):
            return 5 if t == "boolean" else 4
        if t == "array":
            n, items = schema.get("maxItems"), schema.get("items")
            if not _count(n) or not isinstance(items, dict):
                return None
            item = self.of(items, refs) if n else 0
            return None if item is None else n * item + _STRUCTURAL * (n + 1)
        if t == "object":
            return self.object(schema, refs)
        return None                                  # number: digits without end; a missing type

    def object(self, schema: dict, refs: tuple) -> int | None:
        props, required = schema.get("properties", {}), schema.get("required", [])
        if schema.get("additionalProperties") is not False or not isinstance(props, dict) \
                or not isinstance(required, list) or not set(required) <= set(props):
            return None
        values = [self.of(v, refs) for v in props.values()]
        if None in values:
            return None
        keys = sum(len(json.dumps(k, ensure_ascii=False).encode()) for k in props)
        return keys + sum(values) + _STRUCTURAL * max(2 * len(props) + 1, 2)


def _max(parts: list) -> int | None:
    return None if not parts or None in parts else max(parts)


def _count(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def _longest_literal(schema: dict) -> int | None:
    values = [schema["const"]] if "const" in schema else schema["enum"]
    if not isinstance(values, list) or not values:
        return None
    if not all(v is None or isinstance(v, (str, bool, int)) for v in values):
        return None                                  # a float or a structure: spelt more than one way
    return max(len(json.dumps(v, ensure_ascii=False).encode()) for v in values)


def _longest_integer(schema: dict) -> int | None:
    bounds = {k: schema.get(k) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")}
    if any(v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v))
           for v in bounds.values()):
        return None
    lows = [math.ceil(bounds["minimum"])] if bounds["minimum"] is not None else []
    lows += [math.floor(bounds["exclusiveMinimum"]) + 1] if bounds["exclusiveMinimum"] is not None else []
    highs = [math.floor(bounds["maximum"])] if bounds["maximum"] is not None else []
    highs += [math.ceil(bounds["exclusiveMaximum"]) - 1] if bounds["exclusiveMaximum"] is not None else []
    if not lows or not highs:
        return None
    return max(len(str(max(lows))), len(str(min(highs))))


def llguidance_grammar(schema: Any, *, max_string_length: int | None = DEFAULT_MAX_STRING_LENGTH,
                       max_array_items: int | None = DEFAULT_MAX_ARRAY_ITEMS) -> str:
    """The llguidance grammar of ``schema`` (checked: an unsupported or invalid schema is a one-line error).

    The document may have one space before and after it, as with lmlab's engine.
    """
    llg = llguidance_module()
    if not isinstance(schema, (dict, bool)):
        raise LmlabError(f"a JSON Schema must be an object or a boolean, got {type(schema).__name__}",
                         'write e.g. {"type": "string"}')
    bounded = bounded_schema(schema, max_string_length, max_array_items)
    if isinstance(bounded, dict):
        bounded = {**bounded, "x-guidance": {**bounded.get("x-guidance", {}), **JSON_OPTIONS}}
    lark = ('%llguidance {"no_forcing": true}\n'      # every tokenization, not only the canonical one
            'start: " "? document " "?\ndocument: %json ') + json.dumps(bounded, ensure_ascii=False)
    grammar = llg.LLMatcher.grammar_from_lark(lark)
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise LmlabError(f"llguidance cannot use this JSON Schema: {_first_line(messages[0])}",
                         "fix the schema (docs/structured-output.md lists what each backend supports)")
    return grammar


def _first_line(message: str) -> str:
    """llguidance's error as one line: without the grammar listing it appends, whitespace collapsed."""
    kept = []
    for line in message.strip().splitlines():
        if re.match(r"\s*\d+ \|", line):          # "   3 | document: %json {...}": the grammar itself
            break
        kept.append(line.strip())
    text = " ".join(x for x in kept if x) or "unknown error"
    text = re.sub(r"^at \d+\(\d+\): ", "", text).replace("failed to compile JSON schema: ", "")
    return text[:300]


def llguidance_tokenizer(tokenizer, surfaces: Sequence[bytes | None], eos: int):
    """An ``llguidance.LLTokenizer`` whose token ``i`` is ``surfaces[i]`` (None = a special token)."""
    llg = llguidance_module()
    vocab = tokenizer.vocab
    specials = sorted({i for i, s in enumerate(surfaces) if s is None} | {eos})

    class _Source:      # what llguidance.TokenizerWrapper reads
        eos_token_id = eos
        bos_token_id = getattr(tokenizer, "bos_id", None)
        tokens = [s if s is not None else f"<special {i}: {vocab[i]}>".encode()
                  for i, s in enumerate(surfaces)]
        special_token_ids = specials

        def __call__(self, text: bytes) -> list[int]:
            return tokenizer.encode(text.decode("utf-8", "replace"))

    return llg.LLTokenizer(llg.TokenizerWrapper(_Source()), n_vocab=len(surfaces), eos_token=eos)


class LlguidanceJsonConstraint:
    """Logits processor ``(sequences [N, T], scores [N, V]) -> scores`` backed by llguidance.

    The same interface as :class:`lmlab.generate.constrained.JsonSchemaConstraint` (``eos``,
    :meth:`text`), for tokenizers with fixed token bytes (:func:`fixed_token_bytes`). One
    ``LLMatcher`` per distinct generated prefix; a row's matcher follows it from step to step.
    """

    backend = "llguidance"

    def __init__(self, schema, tokenizer, *, prompt_len: int, max_new_tokens: int,
                 eos_token_id: int | None = None, max_string_length: int | None = DEFAULT_MAX_STRING_LENGTH,
                 max_array_items: int | None = DEFAULT_MAX_ARRAY_ITEMS, names: SettingNames = KEYWORDS):
        llg = llguidance_module()
        self.names = names
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_id if eos_token_id is None else eos_token_id
        if self.eos is None:
            raise LmlabError("constrained decoding needs an end-of-sequence token and the tokenizer has none",
                             "use a tokenizer trained with an EOS special token (e.g. </s>)")
        surfaces = fixed_token_bytes(tokenizer)
        if surfaces is None:
            raise LmlabError(f"the llguidance backend needs every token as fixed bytes, which a "
                             f"{getattr(tokenizer, 'algo', 'this')} tokenizer does not give",
                             "use the lmlab backend (auto picks it for it), or a byte-level or "
                             "character BPE tokenizer")
        self.prompt_len, self.max_new_tokens = prompt_len, max_new_tokens
        self.vocab_size = len(surfaces)
        self.grammar = llguidance_grammar(schema, max_string_length=max_string_length,
                                          max_array_items=max_array_items)
        self.lltokenizer = llguidance_tokenizer(tokenizer, surfaces, self.eos)
        self._start = llg.LLMatcher(self.lltokenizer, self.grammar, log_level=0)
        if self._start.is_error():
            problem = _first_line(self._start.get_error())
            raise LmlabError(f"llguidance cannot use this JSON Schema: {problem}", "fix the schema")
        self._rows: dict[tuple, Any] = {(): self._start.deep_copy()}
        self._bit = 1 << torch.arange(8, dtype=torch.uint8)

    # ----------------------------------------------------------------- per-row matchers
    def matcher(self, generated: Sequence[int]):
        """The matcher after ``generated`` (cut at EOS): reused from the last step, else replayed."""
        key = self._cut(generated)
        hit = self._rows.get(key)
        if hit is not None:
            return hit
        m = self._start.deep_copy()
        self._consume(m, key)
        return m

    def _cut(self, generated: Sequence[int]) -> tuple:
        gen = tuple(generated)
        return gen[:gen.index(self.eos) + 1] if self.eos in gen else gen

    def _consume(self, m, tokens: Sequence[int]) -> None:
        for t in tokens:
            if t == self.eos and m.is_accepting():     # the row is done (a stopped matcher may refuse EOS)
                return
            if not m.consume_token(t):
                break
        else:
            return
        raise LmlabError(f"internal error: llguidance refused a token it allowed ({m.get_error()})",
                         "please report it with the schema and the tokenizer")

    def __call__(self, sequences: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        keys = [self._cut(row) for row in sequences[:, self.prompt_len:].tolist()]
        parents = Counter(k[:-1] for k in set(keys) if k and k[:-1] in self._rows and k not in self._rows)
        rows: dict[tuple, Any] = {}
        for key in keys:
            if key in rows:
                continue
            m = self._rows.get(key)
            if m is None and key and key[:-1] in self._rows:
                parent = self._rows[key[:-1]]
                m = parent if parents[key[:-1]] == 1 else parent.deep_copy()
                self._consume(m, key[-1:])
            elif m is None:
                m = self.matcher(key)
            rows[key] = m
        self._rows = rows
        allowed = torch.zeros(scores.shape, dtype=torch.bool)
        for r, key in enumerate(keys):
            m = rows[key]
            if key and key[-1] == self.eos:       # finished: only EOS, as padding
                allowed[r, self.eos] = True
                continue
            allowed[r, :self.vocab_size] = self._mask(m)
            if not bool(allowed[r].any()):
                raise LmlabError(f"constrained decoding is stuck after {self._text(key)!r}: no token "
                                 "continues it within the schema", "use a tokenizer whose vocabulary has "
                                 "the single characters JSON needs (byte-level BPE always has)")
        return scores.masked_fill(~allowed.to(scores.device), float("-inf"))

    def _mask(self, m) -> torch.Tensor:
        """The allowed-token mask of matcher ``m`` as ``[vocab_size]`` booleans (EOS when accepting)."""
        raw = torch.frombuffer(bytearray(m.compute_bitmask()), dtype=torch.uint8)
        return ((raw.unsqueeze(-1) & self._bit) != 0).flatten()[:self.vocab_size]

    def _text(self, key: Sequence[int]) -> str:
        return self.tokenizer.decode([t for t in key if t != self.eos], skip_special_tokens=True)

    def text(self, generated: Sequence[int]) -> str:
        """The document written by ``generated`` (cut at EOS); an error if it never finished."""
        key = self._cut(generated)
        if not key or key[-1] != self.eos:
            budget = self.names.setting("max_new_tokens", [self.max_new_tokens])
            raise LmlabError(f"the JSON document did not finish within {budget} "
                             f"(llguidance does not force an ending): {self._text(key)[:60]!r}...",
                             f"raise {self.names.to_set('max_new_tokens')}, bound the schema (maxLength, "
                             "maxItems, maximum), or use "
                             "the lmlab grammar backend, which always ends within the budget")
        return self._text(key).strip()
