"""Byte-level BPE, GPT-2 style (Radford et al. 2019).

Text is cut into chunks by GPT-2's pre-tokenization regex (contractions, letters, digits, other
symbols, whitespace; see :mod:`lmlab.tokenizers.pretokenize`), each chunk's UTF-8 bytes are
written as printable characters (``BYTE_ENCODER``: space -> ``Ġ``), and BPE merges are learned
and applied inside chunks. The base vocabulary is all 256 bytes, so there is never an unknown
token and ``decode(encode(s)) == s`` for every string.

Learner: count chunks (streamed, first-seen order), then the string merge learner
(:func:`~lmlab.tokenizers.char_merge_learner.learn_char_merges`: one character per byte, so each
chunk is a string of symbols) until ``vocab_size`` = specials + 256 bytes + merges.
Segmenter: merges in rank order within each chunk, with a per-chunk cache (text -> ids), which
makes encoding real text mostly a regex scan plus dictionary lookups.
Offsets are in characters of the original text; a token holding part of a multi-byte character
covers that whole character (as in Hugging Face ``tokenizers``).

Hugging Face export: ``ByteLevel`` pre-tokenizer (``add_prefix_space=false``, ``use_regex=true``),
a ``BPE`` model with the merges, ``ByteLevel`` decoder - the same ids in ``tokenizers``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from lmlab.errors import LmlabError
from lmlab.tokenizers.base import Tokenizer
from lmlab.tokenizers.bpe import bpe_segment, parse_hf_bpe
from lmlab.tokenizers.char_merge_learner import learn_char_merges
from lmlab.tokenizers.counting import count_chunks, refine_counts
from lmlab.tokenizers.ids_cache import IdsCache
from lmlab.tokenizers.pretokenize import (
    BYTE_ENCODER,
    from_byte_symbols,
    gpt2_ascii_regex,
    gpt2_pieces,
    gpt2_regex,
    gpt2_split,
    to_byte_symbols,
)
from lmlab.values import Size, Workers

_CACHE_LIMIT = 1_000_000


class ByteLevelBPETokenizer(Tokenizer):
    """GPT-2 style byte-level BPE: no unknown token, exact round trip of any text."""

    algo = "bytelevel"
    #: the fast split (:func:`gpt2_ascii_regex`) is GPT-2's only on ASCII text
    _fast_split_unsafe = r"\x80-\U0010ffff"

    def __init__(self, vocab: Sequence[str], merges: Sequence[tuple[str, str]],
                 special_tokens: Sequence[str] = (), roles: dict | None = None, ignore_merges: bool = False):
        super().__init__(vocab, special_tokens, roles)
        self.merges: list[tuple[str, str]] = [tuple(m) for m in merges]
        self.ranks: dict[tuple[str, str], int] = {}
        for r, m in enumerate(self.merges):
            self.ranks.setdefault(m, r)
        #: Hugging Face option: a chunk that is itself in the vocabulary is one token, merges or not.
        self.ignore_merges = ignore_merges
        self._cache: dict[str, tuple[list[str], list[int]]] = {}
        self._ids_cache = IdsCache(self._chunk_ids)

    # ------------------------------------------------------------------ learner
    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int | None, special_tokens: Sequence[str],
              progress: bool = False, min_frequency: Size = 1, workers: Workers = 1) -> ByteLevelBPETokenizer:
        """Learn merges until the vocabulary (specials + 256 bytes + merges) has ``vocab_size`` tokens."""
        base = list(dict.fromkeys([*special_tokens, *BYTE_ENCODER]))
        cls.check_train_options(vocab_size, special_tokens, {})
        counts = refine_counts(count_chunks(texts, gpt2_pieces, workers=workers), gpt2_split)
        word_counts = {to_byte_symbols(chunk): n for chunk, n in counts.items()}
        del counts
        new = vocab_size - len(base)
        merges = learn_char_merges(word_counts, new, min_count=min_frequency, progress=progress,
                                   max_new_symbols=new)
        vocab = list(dict.fromkeys([*base, *(a + b for a, b in merges)]))
        return cls(vocab, merges, special_tokens)

    @classmethod
    def min_vocab_size(cls, special_tokens: Sequence[str], options: dict[str, Any]) -> int:
        """The special tokens and the 256 bytes (no merge at all)."""
        return len(dict.fromkeys([*special_tokens, *BYTE_ENCODER]))

    # ------------------------------------------------------------------ segmenter
    def _chunk(self, chunk: str) -> tuple[list[str], list[int]]:
        """Tokens and ids of one pre-token (cached)."""
        hit = self._cache.get(chunk)
        if hit is not None:
            return hit
        toks = self._chunk_tokens(chunk)
        hit = (toks, self._token_ids(toks))
        if len(self._cache) < _CACHE_LIMIT:
            self._cache[chunk] = hit
        return hit

    def _chunk_tokens(self, chunk: str) -> list[str]:
        """Tokens of one pre-token (not cached)."""
        symbols = to_byte_symbols(chunk)
        if self.ignore_merges and symbols in self.token_to_id:
            return [symbols]
        return bpe_segment(list(symbols), self.ranks)

    def _segment(self, text: str) -> list[tuple[str, int, int]]:
        out = []
        for m in gpt2_regex().finditer(text):
            chunk = m.group()
            start = m.start()
            toks, _ = self._chunk(chunk)
            if len(toks) == 1:
                out.append((toks[0], start, m.end()))
                continue
            if chunk.isascii():
                for t in toks:
                    out.append((t, start, start + len(t)))
                    start += len(t)
                continue
            # byte position -> index of the character it belongs to
            char_of_byte = []
            for i, ch in enumerate(chunk):
                char_of_byte.extend([i] * len(ch.encode("utf-8")))
            b = 0
            for t in toks:
                first, last = char_of_byte[b], char_of_byte[b + len(t) - 1]
                out.append((t, start + first, start + last + 1))
                b += len(t)
        return out

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Text -> ids; the fast path when no template is added: GPT-2 chunks (found by the
        quicker :func:`gpt2_ascii_regex` in ASCII text), each chunk's ids cached."""
        if add_special_tokens:
            return self.encode_plus(text).ids
        return self._cached_ids(text, gpt2_regex().findall, gpt2_ascii_regex().findall)

    def _chunk_ids(self, chunk: str) -> list[int]:
        """Ids of one pre-token (what the ids cache stores)."""
        return self._token_ids(self._chunk_tokens(chunk))

    def _decode_tokens(self, tokens: list[str]) -> str:
        return from_byte_symbols("".join(tokens)).decode("utf-8", errors="replace")

    # ------------------------------------------------------------------ tokenizer.json
    def _hf_parts(self) -> dict[str, Any]:
        return {
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": True},
            "model": {
                "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                "ignore_merges": self.ignore_merges,
                "vocab": dict(self.token_to_id), "merges": [list(m) for m in self.merges],
            },
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
        }

    def _options(self) -> dict[str, Any]:
        return {"ignore_merges": self.ignore_merges}

    @classmethod
    def _from_hf(cls, data: dict[str, Any], config: dict[str, Any]) -> ByteLevelBPETokenizer:
        model = data["model"]
        if model.get("type") != "BPE":
            raise LmlabError(f"tokenizer.json holds a {model.get('type')} model, not BPE",
                             "load it with the matching algorithm")
        pre = data.get("pre_tokenizer") or {}
        if pre.get("type") == "Sequence":
            pre = next((p for p in pre.get("pretokenizers", []) if p.get("type") == "ByteLevel"), pre)
        if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or pre.get("use_regex") is False:
            raise LmlabError("this tokenizer.json is not a plain GPT-2 style byte-level BPE (lmlab reads a "
                             "ByteLevel pre-tokenizer with add_prefix_space=false and use_regex=true)",
                             "use it with the Hugging Face tokenizers library")
        if data.get("normalizer"):
            kind = data["normalizer"].get("type")
            raise LmlabError(f"this byte-level tokenizer.json has a {kind} normalizer, which lmlab does "
                             "not apply",
                             "use it with the Hugging Face tokenizers library")
        vocab, merges, specials, roles = parse_hf_bpe(data, config)
        options = config.get("lmlab_options") or {}
        ignore = bool(options.get("ignore_merges", model.get("ignore_merges", False)))
        return cls(vocab, merges, specials, roles=roles, ignore_merges=ignore)
