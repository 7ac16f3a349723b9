"""Which grammar engine runs a JSON-schema constraint, so that every output is a whole document.

* ``"lmlab"`` - :class:`lmlab.generate.constrained.JsonSchemaConstraint`: every lmlab tokenizer,
  a schema subset, and a document that always ends within ``max_new_tokens``: it knows the
  shortest completion and forces it as the budget runs out (a schema whose shortest document
  cannot fit is refused before generating).
* ``"llguidance"`` - :class:`lmlab.generate.llguidance_json.LlguidanceJsonConstraint`: the
  maintained, faster engine (``pip install 'lmlab[grammar]'``), the larger schema vocabulary
  (``$ref``, ``pattern``, ``format``, ``oneOf``, ``allOf``...), for tokenizers whose tokens are
  fixed bytes; it knows no budget: a document unfinished at ``max_new_tokens`` is an error.
* ``"auto"`` (the default) keeps lmlab's promise - a whole document within ``max_new_tokens``,
  or a refusal before generating - and uses llguidance where that promise holds anyway: when
  every document llguidance can write for the schema fits in the budget
  (:func:`~lmlab.generate.llguidance_json.longest_document_bytes`) and every byte is a token of
  the tokenizer (byte-level BPE), so no row can run out of tokens or get stuck. Otherwise lmlab's
  engine; a schema beyond lmlab's engine whose longest document does not fit is refused.
"""

from __future__ import annotations

from typing import Any

from lmlab import values
from lmlab.arguments import number_argument, token_id_argument, tokenizer_argument
from lmlab.errors import LmlabError
from lmlab.generate.json_schema import DEFAULT_MAX_ARRAY_ITEMS, DEFAULT_MAX_STRING_LENGTH
from lmlab.generate.llguidance_json import (
    INSTALL,
    fixed_token_bytes,
    llguidance_grammar,
    llguidance_installed,
    longest_document_bytes,
)
from lmlab.setting_names import KEYWORDS, SettingNames

GRAMMAR_BACKENDS = ("auto", "llguidance", "lmlab")
def explicit_llguidance(names: SettingNames = KEYWORDS) -> str:
    """The way out that names llguidance itself, in the caller's words (``--grammar-backend``)."""
    return (f"pass {names.setting('backend', ['llguidance'])}, which supports it but does not force an "
            f"ending: a document unfinished at {names.to_set('max_new_tokens')} is an error")


def _check_name(backend: str) -> None:
    if backend not in GRAMMAR_BACKENDS:
        raise LmlabError(f"unknown grammar backend {backend!r}", f"use one of {', '.join(GRAMMAR_BACKENDS)}")


def resolve_backend(backend: str, tokenizer, schema: Any, *, max_new_tokens: int,
                    max_string_length: int | None = DEFAULT_MAX_STRING_LENGTH,
                    max_array_items: int | None = DEFAULT_MAX_ARRAY_ITEMS,
                    names: SettingNames = KEYWORDS) -> str:
    """The engine ``backend`` means for ``schema``, ``tokenizer`` and the budget: ``"llguidance"`` or
    ``"lmlab"``; for ``"auto"``, a one-line error when neither can keep the promise (module docstring)."""
    _check_name(backend)
    if backend != "auto":
        return backend
    caps = {"max_string_length": max_string_length, "max_array_items": max_array_items}
    tokens = llguidance_tokens_needed(schema, tokenizer, **caps)
    if tokens is not None and tokens <= max_new_tokens:
        return "llguidance"
    try:
        _compile_lmlab(schema, **caps)
    except LmlabError as e:
        if "is not supported by" not in e.problem or not llguidance_installed():
            raise
        raise _auto_refusal(_lmlab_named(e.problem), tokenizer, tokens, max_new_tokens, names) from None
    return "lmlab"


def llguidance_tokens_needed(schema: Any, tokenizer, **caps) -> int | None:
    """Tokens (EOS included) that every llguidance row fits in, for a tokenizer with every byte as a
    token; None when llguidance is not installed or refuses the schema, the tokenizer lacks a byte,
    or the documents have no known length bound."""
    if not llguidance_installed() or not _every_byte_is_a_token(tokenizer):
        return None
    longest = longest_document_bytes(schema, **caps)
    if longest is None:
        return None
    try:
        llguidance_grammar(schema, **caps)
    except LmlabError:
        return None
    return longest + 1


def _every_byte_is_a_token(tokenizer) -> bool:
    surfaces = fixed_token_bytes(tokenizer)
    return surfaces is not None and len({s for s in surfaces if s is not None and len(s) == 1}) == 256


# why the default engine can give llguidance a schema only lmlab's engine would otherwise refuse
def auto_rule(names: SettingNames = KEYWORDS) -> str:
    """Why the default engine can give llguidance a schema only lmlab's engine would otherwise
    refuse, naming the budget as the caller does (``--max-new-tokens`` on the command line)."""
    return ("the default engine (auto) hands such a schema to llguidance only with a byte-level BPE "
            f"tokenizer and when every document it allows fits in {names.to_set('max_new_tokens')}")

UNBOUNDED = ("this schema's documents have no length bound (every number must be an integer with a minimum "
             "and a maximum; no pattern, format, allOf or recursive $ref)")


def _auto_refusal(problem: str, tokenizer, tokens: int | None, max_new_tokens: int,
                  names: SettingNames = KEYWORDS) -> LmlabError:
    """Why ``auto`` takes a schema beyond lmlab's engine neither way, and the ways out."""
    more = ""
    if not _every_byte_is_a_token(tokenizer):
        why = f"the {getattr(tokenizer, 'algo', 'given')} tokenizer is not byte-level BPE"
    elif tokens is None:
        why = UNBOUNDED
    else:
        budget = names.setting("max_new_tokens", [max_new_tokens])
        why = f"its longest document needs {tokens} tokens, more than {budget}"
        more = f"use {names.to_set('max_new_tokens')} >= {tokens}, "
    return LmlabError(f"{problem}; {auto_rule(names)}, and {why}",
                      f"{more}remove the keyword, or {explicit_llguidance(names)}")


def check_json_schema(schema: Any, backend: str = "auto", names: SettingNames = KEYWORDS, **caps) -> None:
    """Refuse, before a model is loaded, a schema that ``backend`` cannot use (one-line errors).

    ``auto``: lmlab's engine takes it, or llguidance does and its documents have a length bound
    (whether they fit is decided with the tokenizer and the budget, by :func:`resolve_backend`).
    """
    _check_name(backend)
    if backend == "llguidance":
        llguidance_grammar(schema, **caps)
        return
    try:
        _compile_lmlab(schema, **caps)
    except LmlabError as e:
        if backend == "lmlab" or "is not supported by" not in e.problem or not llguidance_installed():
            raise
        llguidance_grammar(schema, **caps)          # invalid for llguidance too: its own error
        if longest_document_bytes(schema, **caps) is None:
            raise LmlabError(f"{_lmlab_named(e.problem)}; {auto_rule(names)}, and {UNBOUNDED}",
                             f"remove the keyword, or {explicit_llguidance(names)}") from None


def _lmlab_named(problem: str) -> str:
    return problem.replace("not supported by constrained decoding", "not supported by lmlab's grammar engine")


def _compile_lmlab(schema: Any, **options):
    from lmlab.generate.json_schema import compile_schema

    try:
        return compile_schema(schema, **options)
    except LmlabError as e:
        if "is not supported by" not in e.problem:
            raise
        how = "with" if llguidance_installed() else f"or {INSTALL} and use"
        raise LmlabError(e.problem, f"{e.fix}; {how} a byte-level or character BPE tokenizer: the "
                         "llguidance grammar backend supports it") from None


def json_schema_constraint(schema: Any, tokenizer, *, backend: str = "auto", prompt_len: int,
                           max_new_tokens: int, eos_token_id: int | None = None,
                           names: SettingNames = KEYWORDS, **options):
    """A logits processor keeping each generated row a document valid against ``schema``.

    ``options``: ``max_string_length`` / ``max_array_items`` (caps where the schema sets none).
    The result has ``.backend`` (``"llguidance"`` or ``"lmlab"``), ``.eos`` and ``.text(ids)``.
    With ``backend="auto"`` every row ends, valid, within ``max_new_tokens``, or this raises first.
    ``names``: how the caller names its settings in the errors (:class:`lmlab.config.rules.SettingNames`:
    ``max_new_tokens`` for Python, ``--max-new-tokens`` for ``lmlab generate``).
    """
    tokenizer = tokenizer_argument(tokenizer, "json_schema_constraint's tokenizer")
    number_argument(values.Size, prompt_len, "json_schema_constraint's prompt_len")
    number_argument(values.Count, max_new_tokens, "json_schema_constraint's max_new_tokens")
    if eos_token_id is not None:
        token_id_argument(eos_token_id, "json_schema_constraint's eos_token_id", tokenizer.vocab_size)
    chosen = resolve_backend(backend, tokenizer, schema, max_new_tokens=max_new_tokens, names=names,
                             **options)
    if chosen == "llguidance":
        from lmlab.generate.llguidance_json import LlguidanceJsonConstraint

        return LlguidanceJsonConstraint(schema, tokenizer, prompt_len=prompt_len,
                                        max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, names=names,
                                        **options)
    from lmlab.generate.constrained import JsonSchemaConstraint

    root = _compile_lmlab(schema, **options)
    return JsonSchemaConstraint(root, tokenizer, prompt_len=prompt_len, max_new_tokens=max_new_tokens,
                                eos_token_id=eos_token_id, names=names)
