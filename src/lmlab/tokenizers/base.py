"""What every lmlab tokenizer shares: vocabulary, special tokens, encoding API, save/load.

A tokenizer algorithm (``bpe.py``, ``bytelevel.py``, ``wordpiece.py``, ``unigram.py``) subclasses
:class:`Tokenizer` and supplies only what is specific to it:

* ``train(texts, vocab_size, special_tokens, **options)`` - the token learner (classmethod);
* ``_segment(text)`` - the token segmenter: ``[(token, start, end), ...]`` with character
  offsets into ``text`` (``text`` never contains special tokens: they are split off first);
* ``_decode_tokens(tokens)`` - tokens back to text;
* ``_hf_parts()`` / ``_from_hf(data, config)`` - the algorithm's part of the Hugging Face
  ``tokenizer.json`` (normalizer, pre_tokenizer, model, decoder) and the reverse.

Everything else - special-token handling, pair encoding with segment ids, batch encoding with
padding/truncation/attention masks, offsets, id validation, save/load - lives here once.

On-disk format (stable, and the one users already know): a directory with

* ``tokenizer.json`` - the Hugging Face ``tokenizers`` format; ``tokenizers.Tokenizer.from_file``
  and ``transformers.PreTrainedTokenizerFast`` load it and give the same ids as lmlab;
* ``tokenizer_config.json`` - special-token roles (``cls_token``, ``pad_token``...), the lmlab
  algorithm name and its options, and ``lmlab_format_version``.
"""

from __future__ import annotations

import numbers
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, ClassVar

import regex

from lmlab import values
from lmlab.errors import LmlabError
from lmlab.fileio import atomic_dir, write_json
from lmlab.tokenizers.ids_cache import IdsCache
from lmlab.values import Text

FORMAT_VERSION = 1

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


def sentinel_tokens(n: int) -> list[str]:
    """T5-style sentinel tokens ``<extra_id_0>`` ... ``<extra_id_{n-1}>``."""
    return [f"<extra_id_{i}>" for i in range(n)]


def hf_vocab_by_id(data: dict[str, Any], kind: str) -> list[str]:
    """Tokens in id order from a tokenizer.json whose model maps ``{token: id}`` (BPE, WordPiece),
    added tokens included; a one-line error when the vocabulary is missing or has gaps."""
    raw = data["model"].get("vocab")
    if not isinstance(raw, dict) or not raw:
        raise LmlabError(f"tokenizer.json {kind} model has no vocabulary", "re-save the tokenizer")
    by_id = dict(sorted((i, t) for t, i in raw.items()))
    for t in data.get("added_tokens") or []:
        by_id.setdefault(t["id"], t["content"])
    if list(by_id) != list(range(len(by_id))):
        raise LmlabError(
            "tokenizer.json vocabulary ids are not 0..N-1 without gaps",
            "re-save the tokenizer with contiguous ids",
        )
    return list(by_id.values())


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


def hf_special_tokens(data: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """The special tokens of a saved tokenizer: lmlab's list, else tokenizer.json's special added tokens."""
    specials = config.get("lmlab_special_tokens")
    if specials is None:
        specials = [t["content"] for t in data.get("added_tokens") or [] if t.get("special")]
    return specials


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


class Tokenizer(ABC):
    """Base class of all lmlab tokenizers. See the module docstring for the subclass contract."""

    algo: ClassVar[str] = ""
    #: The characters (a regular-expression character-class body) with which the ``fast_split``
    #: given to :meth:`_cached_ids` might cut a text differently from its exact ``split``.
    _fast_split_unsafe: ClassVar[str] = ""

    def __init__(self, vocab: Sequence[str], special_tokens: Sequence[str] = (), roles: dict | None = None):
        self.vocab: list[str] = list(vocab)
        self.token_to_id: dict[str, int] = {t: i for i, t in enumerate(self.vocab)}
        if len(self.token_to_id) != len(self.vocab):
            dup = next(t for i, t in enumerate(self.vocab) if self.token_to_id[t] != i)
            raise LmlabError(f"vocabulary lists token {dup!r} twice", "remove the duplicate")
        special_tokens = check_special_tokens(special_tokens)
        missing = [t for t in special_tokens if t not in self.token_to_id]
        if missing:
            raise LmlabError(
                f"special tokens {missing} are not in the vocabulary", "add them to the vocabulary"
            )
        self.special_tokens: list[str] = list(dict.fromkeys(special_tokens))
        self.roles: dict[str, str] = {}
        for t in self.special_tokens:
            role = ROLE_OF_TOKEN.get(t)
            if role and role not in self.roles:
                self.roles[role] = t
        for role, tok in (roles or {}).items():
            if tok is not None:
                if role not in ROLES:
                    raise LmlabError(f"unknown special-token role {role!r}", f"use one of {', '.join(ROLES)}")
                self.roles[role] = tok
                if tok not in self.special_tokens and tok in self.token_to_id:
                    self.special_tokens.append(tok)
        self._special_ids = {self.token_to_id[t] for t in self.special_tokens}
        self._special_re = None
        if self.special_tokens:
            alts = sorted(self.special_tokens, key=len, reverse=True)
            self._special_re = regex.compile("|".join(regex.escape(t) for t in alts))
        # a text with none of these characters holds no special token and may take the fast split
        unsafe = re.escape("".join(sorted({t[:1] for t in self.special_tokens}))) + self._fast_split_unsafe
        self._slow_path_char = re.compile(f"[{unsafe}]").search if unsafe else None

    # ----------------------------------------------------------------- subclass contract
    @classmethod
    @abstractmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int | None, special_tokens: Sequence[str], **options
    ) -> Tokenizer:
        """Learn a vocabulary from ``texts`` (an iterable of strings, streamed once or more)."""

    @abstractmethod
    def _segment(self, text: str) -> list[tuple[str, int, int]]:
        """Segment ``text`` (free of special tokens) into ``(token, start, end)`` triples."""

    @abstractmethod
    def _decode_tokens(self, tokens: list[str]) -> str:
        """Join non-special tokens back into text."""

    @abstractmethod
    def _hf_parts(self) -> dict[str, Any]:
        """The algorithm's ``normalizer``, ``pre_tokenizer``, ``model`` and ``decoder`` (tokenizer.json)."""

    @classmethod
    @abstractmethod
    def _from_hf(cls, data: dict[str, Any], config: dict[str, Any]) -> Tokenizer:
        """Rebuild from a parsed tokenizer.json (``data``) and tokenizer_config.json (``config``)."""

    def _options(self) -> dict[str, Any]:
        """Algorithm options stored in tokenizer_config.json under ``lmlab_options``."""
        return {}

    # ----------------------------------------------------------------- vocabulary
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    def role_id(self, role: str) -> int | None:
        """Id of the special token playing ``role`` (``pad``, ``unk``, ``cls``...), or None."""
        tok = self.roles.get(role)
        return None if tok is None else self.token_to_id[tok]

    pad_id = property(lambda self: self.role_id("pad"))
    unk_id = property(lambda self: self.role_id("unk"))
    cls_id = property(lambda self: self.role_id("cls"))
    sep_id = property(lambda self: self.role_id("sep"))
    mask_id = property(lambda self: self.role_id("mask"))
    bos_id = property(lambda self: self.role_id("bos"))
    eos_id = property(lambda self: self.role_id("eos"))

    @property
    def special_ids(self) -> set[int]:
        return set(self._special_ids)

    def add_special_tokens(self, tokens: Sequence[str]) -> list[int]:
        """Append special tokens (sentinels, ``<summarize>``...) not yet in the vocabulary; return ids."""
        for t in tokens:
            if t not in self.token_to_id:
                self.token_to_id[t] = len(self.vocab)
                self.vocab.append(t)
        Tokenizer.__init__(self, self.vocab, self.special_tokens + list(tokens), roles=self.roles)
        return [self.token_to_id[t] for t in tokens]

    def id_of(self, token: str) -> int:
        """Id of ``token``; unknown tokens map to the ``unk`` id (error if there is none)."""
        i = self.token_to_id.get(token)
        if i is not None:
            return i
        if self.unk_id is None:
            raise LmlabError(
                f"token {token!r} is not in the vocabulary and the tokenizer has no unknown token",
                "train with an [UNK] special token or a byte-level tokenizer",
            )
        return self.unk_id

    # ----------------------------------------------------------------- encoding
    def _token_ids(self, tokens: list[str]) -> list[int]:
        """Ids of ``tokens`` as :meth:`id_of` gives them (one C lookup each unless one is unknown)."""
        ids = list(map(self.token_to_id.get, tokens))
        return [self.id_of(t) for t in tokens] if None in ids else ids

    def _split_specials(self, text: str) -> list[tuple[str, int, bool]]:
        """Split text into (piece, start, is_special) around special tokens written literally."""
        if not self._special_re or not text:
            return [(text, 0, False)] if text else []
        out, pos = [], 0
        for m in self._special_re.finditer(text):
            if m.start() > pos:
                out.append((text[pos : m.start()], pos, False))
            out.append((m.group(), m.start(), True))
            pos = m.end()
        if pos < len(text):
            out.append((text[pos:], pos, False))
        return out

    def __getstate__(self) -> dict:
        """Pickled (``encode_many``'s spawned workers) without its per-word caches (every
        ``..._cache`` dict, emptied; an :class:`IdsCache` pickles empty by itself): a warm tokenizer
        would otherwise ship up to hundreds of thousands of cached words to every worker."""
        state = self.__dict__.copy()
        for name, value in state.items():
            if name.endswith("_cache") and isinstance(value, dict) and not isinstance(value, IdsCache):
                state[name] = {}
        return state

    def _cached_ids(self, text: str, split: Callable[[str], Iterable[str]],
                    fast_split: Callable[[str], Iterable[str]] | None = None) -> list[int]:
        """Ids of ``text`` with no offsets (the fast path of ``encode``): special tokens by id, the
        rest cut into words by ``split``, each word's ids from ``self._ids_cache`` (an
        :class:`IdsCache`, which computes and stores the words it lacks).

        A text without any character that starts a special token or is in ``_fast_split_unsafe``
        (one cheap search) is cut by ``fast_split`` (default ``split``) in one go, and its ids are
        gathered from the cache at C speed."""
        words = self._ids_cache.__getitem__
        find = self._slow_path_char
        try:
            fast = find is None or find(text) is None
        except TypeError:
            raise LmlabError(f"encode takes a string, got {type(text).__name__}",
                             "pass the text as str (decode bytes first)") from None
        if fast:
            return list(chain.from_iterable(map(words, (fast_split or split)(text))))
        ids: list[int] = []
        for piece, _, special in self._split_specials(text):
            if special:
                ids.append(self.token_to_id[piece])
            else:
                ids += chain.from_iterable(map(words, split(piece)))
        return ids

    def tokenize_with_offsets(self, text: str) -> list[tuple[str, int, int]]:
        """``(token, start, end)`` for every token of ``text``, special tokens included where written."""
        out: list[tuple[str, int, int]] = []
        for piece, start, special in self._split_specials(text):
            if special:
                out.append((piece, start, start + len(piece)))
            else:
                out.extend((t, s + start, e + start) for t, s, e in self._segment(piece))
        return out

    def tokenize(self, text: str) -> list[str]:
        """Text -> token strings (no special tokens added)."""
        return [t for t, _, _ in self.tokenize_with_offsets(text)]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Text -> ids. With ``add_special_tokens`` the template adds e.g. ``[CLS] ... [SEP]``."""
        if add_special_tokens:
            return self.encode_plus(text).ids
        return [self.id_of(t) for t in self.tokenize(text)]

    def encode_many(
        self, texts: Sequence[str], workers: int | None = None, chunk_size: int = 2000
    ) -> list[list[int]]:
        """Encode many texts (no special tokens added), on ``workers`` processes.

        ``workers`` defaults to the CPUs this process may use; inputs of at most one chunk
        (``chunk_size`` texts) stay in-process. Every process, this one included, encodes its own
        contiguous share of the chunks, then takes chunks left in the others' shares; on Linux the
        workers are forked copies of this process (see :mod:`lmlab.tokenizers.bulk`). The cyclic
        garbage collector is paused for the call. The result equals
        ``[self.encode(t) for t in texts]``.
        """
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise LmlabError(f"chunk_size must be a positive integer, got {chunk_size!r}",
                             "pass e.g. chunk_size=2000")
        if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool)):
            raise LmlabError(f"workers must be an integer or None, got {workers!r}",
                             "pass e.g. workers=2 (None: the CPUs this process may use)")
        texts = texts if isinstance(texts, list) else list(texts)
        if workers is None:
            workers = (
                len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            )
        workers = max(1, min(workers, -(-len(texts) // chunk_size)))
        from multiprocessing import current_process

        from lmlab.tokenizers.bulk import encode_parallel
        from lmlab.tokenizers.gc_pause import gc_paused

        if workers == 1 or current_process().daemon:  # a pool's worker may not start processes
            with gc_paused():
                return [self.encode(t) for t in texts]
        return encode_parallel(self, texts, workers, chunk_size)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        ids = list(ids)
        n = len(self.vocab)
        for i in ids:
            if not isinstance(i, numbers.Integral) or not 0 <= int(i) < n:
                raise LmlabError(
                    f"token id {i!r} is out of range for a vocabulary of {n}",
                    f"pass ids between 0 and {n - 1} (was this produced by another tokenizer?)",
                )
        return [self.vocab[int(i)] for i in ids]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Ids -> text. Special tokens are written as themselves unless skipped."""
        tokens = self.convert_ids_to_tokens(ids)
        out, run = [], []
        for t in tokens:
            if t in self.token_to_id and self.token_to_id[t] in self._special_ids:
                if run:
                    out.append(self._decode_tokens(run))
                    run = []
                if not skip_special_tokens:
                    out.append(t)
            else:
                run.append(t)
        if run:
            out.append(self._decode_tokens(run))
        return "".join(out)

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

    # ----------------------------------------------------------------- save / export
    def fingerprint(self) -> str:
        """SHA-256 of what the tokenizer does (vocabulary, merges, specials, normalisation), the
        same for equal tokenizers however they were saved: a model records the one it was trained
        with, so a tokenizer swapped for another of the same size is caught."""
        import hashlib
        import json

        config = {k: v for k, v in self.tokenizer_config().items() if k != "lmlab_format_version"}
        canon = json.dumps({"hf": self.to_hf_json(), "config": config}, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(canon.encode("utf-8")).hexdigest()

    def to_hf_json(self) -> dict[str, Any]:
        """The whole Hugging Face ``tokenizer.json`` document for this tokenizer."""
        parts = self._hf_parts()
        added = [
            {
                "id": self.token_to_id[t],
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for t in self.special_tokens
        ]
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": parts.get("normalizer"),
            "pre_tokenizer": parts.get("pre_tokenizer"),
            "post_processor": self._hf_post_processor(),
            "decoder": parts.get("decoder"),
            "model": parts["model"],
        }

    def _hf_post_processor(self) -> dict[str, Any] | None:
        single, _ = self._template(1, None)
        if len(single) == 1:
            return None

        def piece(slot, type_id, seq):
            if slot is None:
                return {"Sequence": {"id": seq, "type_id": type_id}}
            return {"SpecialToken": {"id": slot, "type_id": type_id}}

        pair, pair_types = self._template(1, 1)
        single_t = [piece(s, 0, "A") for s in single]
        seen_a = False
        pair_t = []
        for s, ty in zip(pair, pair_types):
            seq = "A"
            if s is None:
                seq = "B" if seen_a else "A"
                seen_a = True
            pair_t.append(piece(s, ty, seq))
        used = list(dict.fromkeys(s for s in single + pair if s is not None))  # ordered: deterministic file
        return {
            "type": "TemplateProcessing",
            "single": single_t,
            "pair": pair_t,
            "special_tokens": {t: {"id": t, "ids": [self.token_to_id[t]], "tokens": [t]} for t in used},
        }

    def tokenizer_config(self) -> dict[str, Any]:
        """Contents of tokenizer_config.json (roles in the names transformers uses)."""
        cfg: dict[str, Any] = {f"{role}_token": tok for role, tok in self.roles.items()}
        cfg.update(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "lmlab_algo": self.algo,
                "lmlab_format_version": FORMAT_VERSION,
                "lmlab_special_tokens": self.special_tokens,
                "lmlab_options": self._options(),
            }
        )
        return cfg

    def _extra_files(self) -> dict[str, str]:
        """Additional text files to write on save (e.g. WordPiece's vocab.txt)."""
        return {}

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory`` atomically."""
        directory = Path(directory)
        with atomic_dir(directory, marker="tokenizer.json", what="tokenizer") as tmp:
            write_json(tmp / "tokenizer.json", self.to_hf_json(), indent=None)
            write_json(tmp / "tokenizer_config.json", self.tokenizer_config())
            for name, text in self._extra_files().items():
                (tmp / name).write_text(text, encoding="utf-8")
        return directory

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, special_tokens={self.special_tokens})"
