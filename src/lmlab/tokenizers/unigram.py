"""Unigram language-model tokenizer, SentencePiece style (Kudo 2018, arXiv:1804.10959).

A text is first cut into *words* the way SentencePiece does it: every run of whitespace becomes
one ``▁`` (U+2581), leading and trailing whitespace is dropped, and a ``▁`` is prepended to the
text, so every word starts with ``▁``::

    "Hello  world\\n"  ->  "▁Hello▁world"  ->  words "▁Hello", "▁world"

Each word is then segmented by the unigram language model: every piece ``x`` of the vocabulary
has a log-probability ``log p(x)``, a segmentation ``x1..xk`` of a word has probability
``p(x1)...p(xk)``, and the tokenizer picks the most probable one with the Viterbi algorithm over
the word's lattice (all vocabulary pieces that occur in it). With ``sample=True`` it instead
*samples* a segmentation with probability proportional to ``P(x)^alpha`` (subword
regularization, Kudo 2018 section 2.2) by forward-filtering backward-sampling over the lattice.

Decoding concatenates the pieces, turns ``▁`` back into spaces and drops the first one, so
``decode(encode(s)) == s`` for any text whose whitespace is single spaces between words (the
whitespace normalisation above is the one lossy step: runs of spaces, tabs and newlines come
back as one space, leading/trailing whitespace is dropped). A character never seen in training
becomes the unknown token; consecutive unknown characters become one unknown token.

The word splitting lives in :mod:`lmlab.tokenizers.metaspace`, the learner (EM with pruning) in
:mod:`lmlab.tokenizers.unigram_trainer`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from typing import Any

from lmlab.errors import LmlabError
from lmlab.tokenizers.base import Tokenizer, hf_special_tokens, keyword_options, roles_from_config
from lmlab.tokenizers.ids_cache import IdsCache
from lmlab.tokenizers.metaspace import SPACE, WHITESPACE_RUN, split_words, word_contents

#: Penalty of the unknown piece below the lowest piece score (the value SentencePiece and HF use).
UNK_PENALTY = 10.0
#: The children of a trie node that has none (shared, never written).
_LEAF: dict = {}


def piece_trie(score_of: dict[str, float]) -> dict[str, list]:
    """The pieces as a character trie: ``trie[c]`` is ``[score, children]`` for the string ``c``
    (score None when it only starts longer pieces), ``children[c2]`` the same for ``c + c2``...
    Walking a word character by character finds every piece that starts at a position without
    slicing or hashing a new string per length, and stops where no piece continues."""
    root: dict[str, list] = {}
    for piece, score in score_of.items():
        children, entry = root, None
        for ch in piece:
            if entry is not None:
                if entry[1] is _LEAF:
                    entry[1] = {}
                children = entry[1]
            entry = children.get(ch)
            if entry is None:
                entry = children[ch] = [None, _LEAF]
        if entry is not None:
            entry[0] = score
    return root


class UnigramTokenizer(Tokenizer):
    """Unigram LM tokenizer: ``vocab`` (specials first) with one log-probability per entry.

    ``scores[i]`` is ``log p(vocab[i])`` (specials have 0.0 and are never produced by the
    segmenter: they are split off the text before segmentation).
    """

    algo = "unigram"
    #: ``str.split`` also cuts at U+001C..U+001F (no White_Space) and not at a literal ``▁``.
    _fast_split_unsafe = r"\x1c-\x1f" + SPACE

    def __init__(self, vocab: Sequence[str], scores: Sequence[float], special_tokens: Sequence[str] = (),
                 roles: dict | None = None):
        super().__init__(vocab, special_tokens, roles)
        if len(scores) != len(self.vocab):
            raise LmlabError(f"{len(self.vocab)} vocabulary entries but {len(scores)} scores",
                             "give one log-probability per entry")
        self.scores: list[float] = [float(s) for s in scores]
        self._build_index()

    def _build_index(self) -> None:
        self._score_of: dict[str, float] = dict(zip(self.vocab, self.scores))
        self._trie = piece_trie(self._score_of)
        self._max_len = max((len(p) for p in self.vocab), default=1)
        self._unk_score = min(self.scores, default=0.0) - UNK_PENALTY
        self._cache: dict[str, list[tuple[str, int, int]]] = {}
        self._ids_cache = IdsCache(self._word_ids)

    def add_special_tokens(self, tokens: Sequence[str]) -> list[int]:
        ids = super().add_special_tokens(tokens)
        self.scores += [0.0] * (len(self.vocab) - len(self.scores))
        self._build_index()
        return ids

    # ----------------------------------------------------------------- learner
    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int | None, special_tokens: Sequence[str],
              **options) -> UnigramTokenizer:
        """EM learner (see :func:`lmlab.tokenizers.unigram_trainer.train_unigram` for the options)."""
        from lmlab.tokenizers.unigram_trainer import train_unigram

        cls.check_train_options(vocab_size, special_tokens, options)
        pieces, scores = train_unigram(texts, vocab_size, special_tokens, **options)
        specials = list(dict.fromkeys(special_tokens))
        return cls(specials + pieces, [0.0] * len(specials) + scores, specials)

    @classmethod
    def train_options(cls) -> dict[str, tuple[Any, Any]]:
        """The options of :func:`lmlab.tokenizers.unigram_trainer.train_unigram`."""
        from lmlab.tokenizers.unigram_trainer import train_unigram

        return keyword_options(train_unigram)

    # ----------------------------------------------------------------- segmenter
    def _viterbi(self, word: str) -> list[tuple[str, int, int]]:
        """Best segmentation of one ``▁``-word: ``(piece, i, j)`` with positions in ``word``.

        Positions are visited left to right and, at each, pieces shortest first; a node keeps
        the first path that reaches it with the highest score (ties go to the earlier start,
        i.e. the longer last piece), which is exactly Hugging Face's Unigram model. A character
        with no single-character piece gets the unknown score ``min score - 10``.
        """
        n = len(word)
        best = [0.0] + [None] * n
        back = [0] * (n + 1)  # start of the last piece of the best path ending here
        unk = [False] * (n + 1)
        trie, pieces, max_len, unk_score = self._trie, self._score_of, self._max_len, self._unk_score
        for i in range(n):
            base = best[i]
            children, j = trie, i
            for ch in word[i:i + max_len]:  # the pieces starting at i, shortest first
                entry = children.get(ch)
                if entry is None:  # no piece starts with word[i:j + 1]
                    break
                j += 1
                s, children = entry
                if s is not None:
                    cand = base + s
                    if best[j] is None or cand > best[j]:
                        best[j], back[j], unk[j] = cand, i, False
            if word[i] not in pieces:
                cand = base + unk_score
                if best[i + 1] is None or cand > best[i + 1]:
                    best[i + 1], back[i + 1], unk[i + 1] = cand, i, True
        out: list[tuple[str, int, int]] = []
        j = n
        while j > 0:
            i = back[j]
            if unk[j] and out and out[-1][0] is None:  # fuse runs of unknown characters
                out[-1] = (None, i, out[-1][2])
            else:
                out.append((None if unk[j] else word[i:j], i, j))
            j = i
        out.reverse()
        return [(word[i:j] if p is None else p, i, j) for p, i, j in out]

    def _sample(self, word: str, alpha: float, rng: random.Random) -> list[tuple[str, int, int]]:
        """Sample a segmentation with probability proportional to ``P(x)^alpha``.

        Forward filtering: ``A[j] = logsumexp_i (A[i] + alpha * log p(word[i:j]))`` over the
        lattice; backward sampling: from the end, pick the last piece ``word[i:j]`` with
        probability ``exp(A[i] + alpha * log p - A[j])`` and continue from ``i``. Unknown
        characters take the unknown score, as in Viterbi.
        """
        n = len(word)
        score_of, max_len, unk_score = self._score_of, self._max_len, self._unk_score
        incoming: list[list[tuple[int, float, bool]]] = [[] for _ in range(n + 1)]
        for i in range(n):
            for j in range(i + 1, min(n, i + max_len) + 1):
                s = score_of.get(word[i:j])
                if s is not None:
                    incoming[j].append((i, alpha * s, False))
            if word[i] not in score_of:
                incoming[i + 1].append((i, alpha * unk_score, True))
        fwd = [0.0] * (n + 1)
        for j in range(1, n + 1):
            vals = [fwd[i] + w for i, w, _ in incoming[j]]
            m = max(vals)
            fwd[j] = m + math.log(sum(math.exp(v - m) for v in vals))
        out: list[tuple[str | None, int, int]] = []
        j = n
        while j > 0:
            r, acc = rng.random(), 0.0
            choice = incoming[j][-1]
            for edge in incoming[j]:
                acc += math.exp(fwd[edge[0]] + edge[1] - fwd[j])
                if r < acc:
                    choice = edge
                    break
            i, _, is_unk = choice
            if is_unk and out and out[-1][0] is None:
                out[-1] = (None, i, out[-1][2])
            else:
                out.append((None if is_unk else word[i:j], i, j))
            j = i
        out.reverse()
        return [(word[i:j] if p is None else p, i, j) for p, i, j in out]

    @staticmethod
    def _to_text_offsets(pieces: list[tuple[str, int, int]], origin: int,
                         literal: bool) -> list[tuple[str, int, int]]:
        """Word positions -> text offsets (see :func:`split_words` for what the ``▁`` covers)."""
        return [(p, origin + i - 1 if (i or literal) else origin,
                 origin + j - 1 if (j > 1 or literal) else origin) for p, i, j in pieces]

    def _segment(self, text: str) -> list[tuple[str, int, int]]:
        out: list[tuple[str, int, int]] = []
        cache = self._cache
        for word, origin, literal in split_words(text):
            pieces = cache.get(word)
            if pieces is None:
                pieces = self._viterbi(word)
                if len(cache) > 200_000:
                    cache.clear()
                cache[word] = pieces
            out.extend(self._to_text_offsets(pieces, origin, literal))
        return out

    def sample(self, text: str, alpha: float = 0.1, rng: random.Random | int | None = None) -> list[str]:
        """Sampled tokens of ``text`` (subword regularization); ``rng`` is a ``random.Random`` or a seed."""
        return [t for t, _, _ in self._sample_with_offsets(text, alpha, rng)]

    def _sample_with_offsets(self, text: str, alpha: float, rng) -> list[tuple[str, int, int]]:
        from lmlab import values
        from lmlab.arguments import number_argument

        number_argument(values.Positive, alpha, "sample's alpha")  # smaller = more varied segmentations
        if not isinstance(rng, random.Random):
            rng = random.Random(rng)
        out: list[tuple[str, int, int]] = []
        for piece, offset, special in self._split_specials(text):
            if special:
                out.append((piece, offset, offset + len(piece)))
                continue
            for word, origin, literal in split_words(piece):
                out.extend((t, s + offset, e + offset) for t, s, e in
                           self._to_text_offsets(self._sample(word, alpha, rng), origin, literal))
        return out

    def encode(self, text: str, add_special_tokens: bool = False, *, sample: bool = False, alpha: float = 0.1,
               seed: int | random.Random | None = None) -> list[int]:
        """Text -> ids. ``sample=True`` draws a segmentation with probability ~ ``P(x)^alpha``
        (subword regularization; ``seed`` makes it reproducible) instead of the Viterbi one."""
        if not sample:
            return super().encode(text, True) if add_special_tokens else self._encode_ids(text)
        ids = [self.id_of(t) for t, _, _ in self._sample_with_offsets(text, alpha, seed)]
        if add_special_tokens:
            layout, _ = self._template(len(ids), None)
            it = iter(ids)
            ids = [next(it) if slot is None else self.token_to_id[slot] for slot in layout]
        return ids

    def _encode_ids(self, text: str) -> list[int]:
        """Viterbi ids of ``text`` with no offsets: the words of :func:`word_contents` (those of
        :func:`split_words` without positions), each word's ids cached (bounded)."""
        return self._cached_ids(text, word_contents, str.split)

    def _word_ids(self, content: str) -> list[int]:
        """Ids of the word ``▁`` + ``content``."""
        return self._token_ids([t for t, _, _ in self._viterbi(SPACE + content)])

    def _decode_tokens(self, tokens: list[str]) -> str:
        text = "".join(tokens).replace(SPACE, " ")
        return text[1:] if text.startswith(" ") else text

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Ids -> text: pieces joined, ``▁`` -> space, and the space of the *first* token dropped
        (as the HF Metaspace decoder does, so ``[CLS] to be`` keeps its inner space)."""
        tokens = self.convert_ids_to_tokens(ids)
        if skip_special_tokens:
            tokens = [t for t in tokens if self.token_to_id[t] not in self._special_ids]
        text = "".join(tokens).replace(SPACE, " ")
        return text[1:] if tokens and tokens[0].startswith(SPACE) else text

    # ----------------------------------------------------------------- tokenizer.json
    def _hf_parts(self) -> dict[str, Any]:
        metaspace = {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "always", "split": True}
        return {
            "normalizer": self._hf_normalizer(),
            "pre_tokenizer": metaspace,
            "model": {"type": "Unigram", "unk_id": self.unk_id,
                      "vocab": [[p, s] for p, s in zip(self.vocab, self.scores)], "byte_fallback": False},
            "decoder": dict(metaspace),
        }

    @classmethod
    def _from_hf(cls, data: dict[str, Any], config: dict[str, Any]) -> UnigramTokenizer:
        model = data["model"]
        if model.get("type") != "Unigram" or not isinstance(model.get("vocab"), list):
            raise LmlabError("tokenizer.json does not hold a Unigram model", "load it with its own algorithm")
        pre = data.get("pre_tokenizer") or {}
        if pre.get("type") != "Metaspace" or data.get("normalizer") != cls._hf_normalizer():
            raise LmlabError("this Unigram tokenizer.json uses a normalizer or pre-tokenizer that lmlab "
                             "does not reproduce",
                             "use Hugging Face tokenizers for it, or retrain with lmlab")
        try:
            vocab = [str(p) for p, _ in model["vocab"]]
            scores = [float(s) for _, s in model["vocab"]]
        except (TypeError, ValueError):
            raise LmlabError("tokenizer.json Unigram vocab is corrupt (expected [[piece, score], ...])",
                             "re-save the tokenizer") from None
        specials = hf_special_tokens(data, config)
        roles = roles_from_config(config)
        unk_id = model.get("unk_id")
        if "unk" not in roles and isinstance(unk_id, int) and 0 <= unk_id < len(vocab):
            roles["unk"] = vocab[unk_id]
        return cls(vocab, scores, specials, roles)

    @staticmethod
    def _hf_normalizer() -> dict[str, Any]:
        """Whitespace runs -> one space, then strip: the HF equivalent of :func:`normalize`."""
        return {"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"Regex": WHITESPACE_RUN.pattern}, "content": " "},
            {"type": "Strip", "strip_left": True, "strip_right": True},
        ]}

    def _options(self) -> dict[str, Any]:
        return {"whitespace": "collapse", "word_mark": SPACE}
