"""Character-level BPE with an end-of-word symbol, exactly as in the lecture.

Token learner (Sennrich et al. 2016; lecture "BYTE-PAIR ENCODING(C, k)"): split the corpus on
whitespace, write each word as its characters followed by the end-of-word symbol ``_``
(``low`` -> ``l o w _``), then k times merge the most frequent adjacent pair (ties: the pair
seen first in the corpus), see :mod:`lmlab.tokenizers.char_merge_learner` (words kept as strings,
one character per symbol; the same merges as the general learner in ``merge_trainer``).

Token segmenter: split a word into characters + ``_`` and apply the learned merges in the order
they were learned ("first merge all adjacent er, then all adjacent er_, ..."): repeatedly merge
the adjacent pair with the lowest merge rank. Segmented words are cached.

Example (the lecture's corpus, k = 8): merges ``(e,r) (er,_) (n,e) (ne,w) (l,o) (lo,w)
(new,er_) (low,_)``; ``newer`` -> ``newer_``; the unseen ``lower`` -> ``low er_``.

Characters never seen in training become the unknown token. A literal ``_`` in the text is the
same symbol as the end-of-word marker, so it decodes as a space.

Hugging Face export: a ``Replace`` normalizer inserts ``_`` after every word (a zero-width regex
match), ``WhitespaceSplit`` cuts words, and a plain ``BPE`` model splits ``low_`` into
``l o w _`` and applies the merges by rank: the same ids as here. ``BPEDecoder(suffix="_")``
decodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any

from lmlab.errors import LmlabError
from lmlab.tokenizers.base import Tokenizer, hf_special_tokens, hf_vocab_by_id, roles_from_config
from lmlab.tokenizers.char_merge_learner import learn_char_merges
from lmlab.tokenizers.counting import count_chunks
from lmlab.tokenizers.ids_cache import IdsCache
from lmlab.tokenizers.pretokenize import WORD_RE, whitespace_split
from lmlab.values import Size, Workers

END_OF_WORD = "_"
#: Zero-width match after the last character of every word (Oniguruma and ``regex`` agree on ``\S``).
_WORD_END_PATTERN = r"(?<=\S)(?!\S)"


#: Rank of a pair that no merge joins (above every real rank).
_NO_MERGE = 1 << 62


def bpe_segment(symbols: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Apply merges to ``symbols`` in rank order: repeatedly merge the lowest-ranked adjacent pair
    (the leftmost of equal ones), as Hugging Face's BPE model does.

    The ranks of the adjacent pairs are kept in a list that each merge updates in place (only the
    two pairs around the new symbol change); ``min`` and ``index`` find the next merge in C. A
    rank belongs to one pair and a merge never re-forms its own pair, so when every merge ranks
    below the merges that use its result (as the learner makes them) this merges every
    occurrence of a pair, left to right, before the next pair: the lecture's algorithm."""
    parts = list(symbols)
    rank_of = ranks.get
    pair_ranks = list(map(rank_of, zip(parts, parts[1:]), repeat(_NO_MERGE)))
    while pair_ranks:
        best = min(pair_ranks)
        if best == _NO_MERGE:
            break
        i = pair_ranks.index(best)
        merged = parts[i] + parts.pop(i + 1)
        parts[i] = merged
        del pair_ranks[i]
        if i:
            pair_ranks[i - 1] = rank_of((parts[i - 1], merged), _NO_MERGE)
        if i < len(pair_ranks):
            pair_ranks[i] = rank_of((merged, parts[i + 1]), _NO_MERGE)
    return parts


class CharBPETokenizer(Tokenizer):
    """Character BPE with end-of-word ``_`` (lecture / Sennrich et al. 2016)."""

    algo = "bpe"
    #: ``str.split`` cuts words also at U+001C..U+001F, which are no Unicode White_Space.
    _fast_split_unsafe = r"\x1c-\x1f"

    def __init__(self, vocab: Sequence[str], merges: Sequence[tuple[str, str]],
                 special_tokens: Sequence[str] = (), roles: dict | None = None):
        super().__init__(vocab, special_tokens, roles)
        self.merges: list[tuple[str, str]] = [tuple(m) for m in merges]
        self.ranks: dict[tuple[str, str], int] = {}
        for r, m in enumerate(self.merges):
            self.ranks.setdefault(m, r)
        self._cache: dict[str, list[str]] = {}
        self._ids_cache = IdsCache(self._word_ids)

    def add_special_tokens(self, tokens: Sequence[str]) -> list[int]:
        ids = super().add_special_tokens(tokens)
        self._ids_cache.clear()  # a token that was unknown may now have an id
        return ids

    # ------------------------------------------------------------------ learner
    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int | None, special_tokens: Sequence[str],
              num_merges: Size | None = None, progress: bool = False, min_frequency: Size = 1,
              workers: Workers = 1) -> CharBPETokenizer:
        """Learn ``num_merges`` merges, or as many as fill ``vocab_size`` (specials + alphabet + merges).

        ``min_frequency`` stops early when no pair occurs that often. ``workers`` > 1 counts
        words in that many processes.
        """
        cls.check_train_options(vocab_size, special_tokens, {"num_merges": num_merges})
        from lmlab import values
        from lmlab.arguments import optional_number

        optional_number(values.Size, num_merges, "num_merges")
        counts = count_chunks(texts, whitespace_split, workers=workers)
        alphabet = sorted(set("".join(counts)) | {END_OF_WORD})
        base = list(dict.fromkeys([*special_tokens, *alphabet]))
        max_new = None
        if vocab_size is not None:
            if vocab_size < len(base):
                raise LmlabError(f"vocab_size {vocab_size} is too small: the {len(special_tokens)} special "
                                 f"tokens and {len(alphabet)} characters of the corpus already need "
                                 f"{len(base)}",
                                 f"use vocab_size >= {len(base)}")
            max_new = vocab_size - len(base)
        limit = num_merges if num_merges is not None else max_new
        merges = learn_char_merges(counts, limit, end=END_OF_WORD, min_count=min_frequency,
                                   progress=progress, max_new_symbols=max_new)
        vocab = list(dict.fromkeys([*base, *(a + b for a, b in merges)]))
        return cls(vocab, merges, special_tokens)

    @classmethod
    def min_vocab_size(cls, special_tokens: Sequence[str], options: dict[str, Any]) -> int:
        """The special tokens, the end-of-word symbol and one character of the text."""
        return len(dict.fromkeys([*special_tokens, END_OF_WORD])) + 1

    @classmethod
    def check_train_options(cls, vocab_size: int | None, special_tokens: Sequence[str],
                            options: dict[str, Any], where: str = "") -> None:
        """A vocabulary size or a number of merges (``num_merges``), not both (the merges would
        stop at whichever comes first, so the size asked for is not what is made)."""
        if vocab_size is not None and options.get("num_merges") is not None:
            raise LmlabError(f"{where}num_merges cannot be combined with {where}vocab_size: each sets the "
                             "vocabulary size", f"give {where}vocab_size or {where}num_merges, not both")
        if vocab_size is None and options.get("num_merges") is None:
            raise LmlabError(f"{where}vocab_size is missing: BPE training needs vocab_size or num_merges",
                             f"set {where}vocab_size (e.g. 8000) or {where}num_merges (e.g. 8)")
        if vocab_size is not None:
            super().check_train_options(vocab_size, special_tokens, options, where)

    # ------------------------------------------------------------------ segmenter
    def segment_word(self, word: str) -> list[str]:
        """Tokens of one whitespace-free word (its last token ends with ``_``)."""
        toks = self._cache.get(word)
        if toks is None:
            toks = bpe_segment([*word, END_OF_WORD], self.ranks)
            if len(self._cache) < 1_000_000:
                self._cache[word] = toks
        return toks

    def _segment(self, text: str) -> list[tuple[str, int, int]]:
        out = []
        vocab = self.token_to_id
        unk = self.roles.get("unk")
        for m in WORD_RE.finditer(text):
            pos = m.start()
            end = m.end()
            for tok in self.segment_word(m.group()):
                # The end-of-word symbol is no character of the text; a token that is only the
                # end-of-word symbol gets the word's last character (as in Hugging Face).
                n = len(tok) - (1 if tok.endswith(END_OF_WORD) and pos + len(tok) > end else 0)
                span = (pos, pos + n) if n else (end - 1, end)
                out.append((tok if tok in vocab or unk is None else unk, *span))
                pos += n
        return out

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Text -> ids; the same ids as the base class, with the ids of each word cached (bounded)."""
        if add_special_tokens:
            return super().encode(text, add_special_tokens=True)
        return self._cached_ids(text, WORD_RE.findall, str.split)

    def _word_ids(self, word: str) -> list[int]:
        """Ids of one whitespace-free word (as ``_segment`` + ``id_of``: unknown tokens -> unk)."""
        return self._token_ids(bpe_segment([*word, END_OF_WORD], self.ranks))

    def _decode_tokens(self, tokens: list[str]) -> str:
        """Tokens joined; each ``_`` becomes a space, except that the text does not end with one."""
        text = "".join(tokens).replace(END_OF_WORD, " ")
        return text[:-1] if tokens and tokens[-1].endswith(END_OF_WORD) else text

    # ------------------------------------------------------------------ tokenizer.json
    def _hf_parts(self) -> dict[str, Any]:
        return {
            "normalizer": {"type": "Replace", "pattern": {"Regex": _WORD_END_PATTERN},
                           "content": END_OF_WORD},
            "pre_tokenizer": {"type": "WhitespaceSplit"},
            "model": {
                "type": "BPE", "dropout": None, "unk_token": self.roles.get("unk"),
                "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
                "byte_fallback": False, "ignore_merges": False,
                "vocab": dict(self.token_to_id), "merges": [list(m) for m in self.merges],
            },
            "decoder": {"type": "BPEDecoder", "suffix": END_OF_WORD},
        }

    @classmethod
    def _from_hf(cls, data: dict[str, Any], config: dict[str, Any]) -> CharBPETokenizer:
        model = data["model"]
        if model.get("type") != "BPE":
            raise LmlabError(f"tokenizer.json holds a {model.get('type')} model, not BPE",
                             "load it with the matching algorithm")
        norm = data.get("normalizer") or {}
        foreign = (model.get("end_of_word_suffix") or model.get("continuing_subword_prefix")
                   or norm.get("content") != END_OF_WORD
                   or (data.get("pre_tokenizer") or {}).get("type") != "WhitespaceSplit")
        if config.get("lmlab_algo") != "bpe" and foreign:
            raise LmlabError("this BPE tokenizer.json uses a word-boundary scheme lmlab's character BPE "
                             "does not read (end_of_word_suffix / continuing_subword_prefix / other "
                             "normalizer or pre-tokenizer)",
                             "use it with the Hugging Face tokenizers library, or train with lmlab")
        vocab, merges, specials, roles = parse_hf_bpe(data, config)
        return cls(vocab, merges, specials, roles=roles)


def parse_hf_bpe(data: dict[str, Any], config: dict[str, Any]):
    """Vocabulary (in id order), merges, special tokens and roles of a Hugging Face BPE tokenizer.json.

    Merges may be written as ``"a b"`` strings (older files) or ``["a", "b"]`` pairs. Added
    tokens missing from the model vocabulary are appended at their ids.
    """
    model = data["model"]
    by_id = dict(enumerate(hf_vocab_by_id(data, "BPE")))
    specials = hf_special_tokens(data, config)
    roles = roles_from_config(config)
    if model.get("unk_token") and "unk" not in roles:
        roles["unk"] = model["unk_token"]
    merges = []
    for m in model.get("merges", []):
        if isinstance(m, str):
            parts = m.split(" ")
            if len(parts) != 2:
                raise LmlabError(f"tokenizer.json merge {m!r} is not two tokens", "re-save the tokenizer")
            merges.append((parts[0], parts[1]))
        else:
            merges.append((m[0], m[1]))
    return list(by_id.values()), merges, specials, roles
