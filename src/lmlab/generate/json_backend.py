"""Which grammar engine runs a JSON-schema constraint: llguidance where it can, lmlab's own elsewhere.

* ``"llguidance"`` - :class:`lmlab.generate.llguidance_json.LlguidanceJsonConstraint`: the
  maintained engine (``pip install 'lmlab[grammar]'``), the larger schema vocabulary (``$ref``,
  ``pattern``, ``format``, ``oneOf``, ``allOf``...), for tokenizers whose tokens are fixed bytes
  (byte-level and character BPE); no forced ending within the token budget.
* ``"lmlab"`` - :class:`lmlab.generate.constrained.JsonSchemaConstraint`: every lmlab tokenizer,
  a schema subset, and a document that always ends within ``max_new_tokens``.
* ``"auto"`` (the default) - llguidance when it is installed and the tokenizer's tokens are fixed
  bytes, else lmlab.
"""

from __future__ import annotations

from typing import Any

from lmlab.errors import LmlabError
from lmlab.generate.llguidance_json import INSTALL, llguidance_grammar, llguidance_installed

GRAMMAR_BACKENDS = ("auto", "llguidance", "lmlab")


def _check_name(backend: str) -> None:
    if backend not in GRAMMAR_BACKENDS:
        raise LmlabError(f"unknown grammar backend {backend!r}", f"use one of {', '.join(GRAMMAR_BACKENDS)}")


def resolve_backend(backend: str, tokenizer) -> str:
    """The engine ``backend`` means for ``tokenizer``: ``"llguidance"`` or ``"lmlab"``."""
    _check_name(backend)
    if backend == "auto":
        ok = llguidance_installed() and getattr(tokenizer, "algo", "") in ("bytelevel", "bpe")
        return "llguidance" if ok else "lmlab"
    return backend


def check_json_schema(schema: Any, backend: str = "auto") -> None:
    """Refuse, before a model is loaded, a schema that ``backend`` cannot use (one-line errors).

    ``auto`` checks with llguidance when installed (the tokenizer is not known yet; a tokenizer
    llguidance cannot take is checked against lmlab's engine when the constraint is built).
    """
    _check_name(backend)
    if backend == "lmlab" or (backend == "auto" and not llguidance_installed()):
        _compile_lmlab(schema)
    else:
        llguidance_grammar(schema)


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
                           max_new_tokens: int, eos_token_id: int | None = None, **options):
    """A logits processor keeping each generated row a document valid against ``schema``.

    ``options``: ``max_string_length`` / ``max_array_items`` (caps where the schema sets none).
    The result has ``.backend`` (``"llguidance"`` or ``"lmlab"``), ``.eos`` and ``.text(ids)``.
    """
    chosen = resolve_backend(backend, tokenizer)
    if chosen == "llguidance":
        from lmlab.generate.llguidance_json import LlguidanceJsonConstraint

        return LlguidanceJsonConstraint(schema, tokenizer, prompt_len=prompt_len,
                                        max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, **options)
    from lmlab.generate.constrained import JsonSchemaConstraint

    root = _compile_lmlab(schema, **options)
    return JsonSchemaConstraint(root, tokenizer, prompt_len=prompt_len, max_new_tokens=max_new_tokens,
                                eos_token_id=eos_token_id)
