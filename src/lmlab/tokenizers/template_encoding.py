"""Encoding with the special-token template: one text or a pair, with segment ids, offsets,
truncation and padding into a batch (the part of :class:`lmlab.tokenizers.base.Tokenizer` that
sits above the algorithm's segmenter)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lmlab.errors import LmlabError


@dataclass
class Encoding:
    """One encoded sequence (or pair), before padding."""

    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    type_ids: list[int]
    special_tokens_mask: list[int]
    attention_mask: list[int] = field(default_factory=list)

    def __post_init__(self):
        if not self.attention_mask:
            self.attention_mask = [1] * len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


class TemplateEncoding:
    """Mixin of :class:`~lmlab.tokenizers.base.Tokenizer`: the special-token template and the
    encodings built with it (``encode_plus``, ``encode_batch``)."""

    def _template(self, n_a: int, n_b: int | None) -> tuple[list[str | None], list[int]]:
        """Layout of special tokens around one or two sequences.

        Returns a list where None stands for "the next content token" and strings are specials,
        plus the segment id of each position. BERT style ``[CLS] A [SEP] (B [SEP])`` when the
        tokenizer has cls and sep tokens, else ``<s> A </s> (B </s>)`` with bos/eos, else none.
        """
        cls, sep = self.roles.get("cls"), self.roles.get("sep")
        if cls and sep:
            first, mid, last = [cls], [sep], [sep]
        else:
            bos, eos = self.roles.get("bos"), self.roles.get("eos")
            first, mid, last = ([bos] if bos else []), ([eos] if eos else []), ([eos] if eos else [])
        layout: list[str | None] = first + [None] * n_a + mid
        types = [0] * len(layout)
        if n_b is not None:
            layout += [None] * n_b + last
            types += [1] * (n_b + len(last))
        return layout, types

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        layout, _ = self._template(0, 0 if pair else None)
        return len(layout)

    def encode_plus(
        self,
        text: str,
        pair: str | None = None,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: bool = False,
    ) -> Encoding:
        """Encode one text or a pair, with segment ids, offsets and the special-token template.

        With ``truncation`` and ``max_length``, the longer of the two sequences is cut first
        (longest-first), so the result including specials fits ``max_length``.
        """
        a = self.tokenize_with_offsets(text)
        b = self.tokenize_with_offsets(pair) if pair is not None else None
        extra = self.num_special_tokens_to_add(b is not None) if add_special_tokens else 0
        if truncation and max_length is not None:
            budget = max_length - extra
            if budget < 0:
                raise LmlabError(
                    f"max_length {max_length} leaves no room for the {extra} special tokens",
                    f"use max_length >= {extra + 1}",
                )
            if b is None:
                del a[budget:]
            elif len(a) + len(b) > budget:
                # as Hugging Face: the shorter keeps min(its length, budget // 2) (a on ties),
                # the longer one the rest
                if len(a) <= len(b):
                    keep_a = min(len(a), budget // 2)
                    keep_b = budget - keep_a
                else:
                    keep_b = min(len(b), budget // 2)
                    keep_a = budget - keep_b
                del a[keep_a:], b[keep_b:]
        if add_special_tokens:
            layout, types = self._template(len(a), None if b is None else len(b))
        else:
            layout = [None] * (len(a) + (len(b) if b else 0))
            types = [0] * len(a) + [1] * (len(b) if b else 0)
        content = iter(a + (b or []))
        ids, tokens, offsets, special = [], [], [], []
        for slot in layout:
            if slot is None:
                t, s, e = next(content)
                ids.append(self.id_of(t))
                tokens.append(t)
                offsets.append((s, e))
                special.append(int(t in self.token_to_id and self.token_to_id[t] in self._special_ids))
            else:
                ids.append(self.token_to_id[slot])
                tokens.append(slot)
                offsets.append((0, 0))
                special.append(1)
        return Encoding(ids, tokens, offsets, types, special)

    def encode_batch(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        add_special_tokens: bool = True,
        padding: bool | str = "longest",
        truncation: bool = False,
        max_length: int | None = None,
        return_tensors: str | None = None,
    ) -> dict[str, Any]:
        """Encode many texts (or pairs) into a padded batch.

        Returns a dict with ``input_ids``, ``attention_mask``, ``token_type_ids``,
        ``special_tokens_mask`` and ``offsets``. ``padding`` is ``"longest"`` (default, or True),
        ``"max_length"`` (pad to ``max_length``) or False (ragged lists). ``return_tensors`` may be
        ``"pt"`` (torch) or ``"np"`` (numpy) for the integer fields.
        """
        if isinstance(texts, str):
            raise LmlabError("encode_batch takes a list of texts, not one string", "wrap it: [text]")
        if pairs is not None and len(pairs) != len(texts):
            raise LmlabError(f"{len(texts)} texts but {len(pairs)} pairs", "pass one pair text per text")
        encs = [
            self.encode_plus(
                t, None if pairs is None else pairs[i], add_special_tokens, max_length, truncation
            )
            for i, t in enumerate(texts)
        ]
        if padding is True:
            padding = "longest"
        if padding not in (False, "longest", "max_length"):
            raise LmlabError(f"unknown padding {padding!r}", "use 'longest', 'max_length' or False")
        if padding:
            if self.pad_id is None:
                raise LmlabError(
                    "padding needs a [PAD] special token", "train with a [PAD] token or padding=False"
                )
            if padding == "max_length":
                if max_length is None:
                    raise LmlabError("padding='max_length' needs max_length", "pass max_length=N")
                target = max_length
            else:
                target = max((len(e) for e in encs), default=0)
            for e in encs:
                n = target - len(e)
                if n > 0:
                    e.ids += [self.pad_id] * n
                    e.tokens += [self.roles["pad"]] * n
                    e.offsets += [(0, 0)] * n
                    e.type_ids += [0] * n
                    e.special_tokens_mask += [1] * n
                    e.attention_mask += [0] * n
        batch: dict[str, Any] = {
            "input_ids": [e.ids for e in encs],
            "attention_mask": [e.attention_mask for e in encs],
            "token_type_ids": [e.type_ids for e in encs],
            "special_tokens_mask": [e.special_tokens_mask for e in encs],
            "offsets": [e.offsets for e in encs],
        }
        if return_tensors:
            if not padding:
                raise LmlabError("return_tensors needs equal lengths", "pass padding='longest'")
            if return_tensors == "pt":
                import torch

                conv = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
            elif return_tensors == "np":
                import numpy as np

                conv = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
            else:
                raise LmlabError(f"unknown return_tensors {return_tensors!r}", "use 'pt' or 'np'")
            for k in ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask"):
                batch[k] = conv(batch[k])
        return batch

    __call__ = encode_batch
