"""Special tokens: the default set, the conventional role of each, and their checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lmlab import budget, values
from lmlab.values import Text

#: The default special tokens of every trained tokenizer, in id order (ids 0..6).
DEFAULT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>", "</s>"]

#: Conventional names -> role, so a user-supplied list of specials gets its roles automatically.
ROLE_OF_TOKEN = {
    "[PAD]": "pad",
    "<pad>": "pad",
    "[UNK]": "unk",
    "<unk>": "unk",
    "[CLS]": "cls",
    "[SEP]": "sep",
    "[MASK]": "mask",
    "<mask>": "mask",
    "<s>": "bos",
    "<|startoftext|>": "bos",
    "</s>": "eos",
    "<|endoftext|>": "eos",
}
ROLES = ("pad", "unk", "cls", "sep", "mask", "bos", "eos")


def check_special_tokens(tokens: Sequence[str]) -> list[str]:
    """``tokens`` as a list, each non-empty text (an empty special token would match between every
    two characters of every text), or a one-line error naming the first that is not."""
    return values.check(list[Text], list(tokens), "special tokens",
                        "give every special token some text, e.g. [PAD] or <extra_id_0>")


def check_sentinel_count(n, name: str = "the sentinel count") -> None:
    """The one check of a number of T5 sentinels (``name``: the flag or setting that gave it): a
    whole number >= 0 whose tokens fit this machine and a tokenizer (:mod:`lmlab.budget`), before
    their list is made."""
    from lmlab.arguments import number_argument

    number_argument(values.Size, n, name)  # T5 uses 100
    budget.require_special_tokens_fit(n, f"{n:,} sentinel tokens", f"lower {name} (T5 uses 100)")


def sentinel_tokens(n: int, name: str = "the sentinel count") -> list[str]:
    """T5-style sentinel tokens ``<extra_id_0>`` ... ``<extra_id_{n-1}>`` (``n`` checked first:
    :func:`check_sentinel_count`)."""
    check_sentinel_count(n, name)
    return [f"<extra_id_{i}>" for i in range(n)]


def roles_from_config(config: dict[str, Any]) -> dict[str, str]:
    """Special-token roles named in a tokenizer_config.json: ``"cls_token": "[CLS]"`` or the
    ``{"content": "[CLS]", ...}`` form transformers also writes."""
    roles = {}
    for role in ROLES:
        v = config.get(f"{role}_token")
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            roles[role] = v
    return roles
