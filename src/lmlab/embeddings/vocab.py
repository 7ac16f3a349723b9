"""Words and vocabularies for the classic (word-level) embeddings.

Classic embeddings work on whole words, not subwords: :func:`words` lower-cases the text and
keeps runs of letters (with an inner apostrophe, ``don't``), which is what word2vec's demo
scripts do to their corpus. :class:`Vocabulary` counts them and keeps the words seen at least
``min_count`` times (at most ``max_size``, most frequent first).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from lmlab.arguments import describe
from lmlab.errors import LmlabError

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def words(text: str) -> list[str]:
    """Lower-cased words of ``text`` (letters and inner apostrophes; digits and punctuation dropped)."""
    return _WORD.findall(text.lower())


@dataclass
class Vocabulary:
    """Words by decreasing frequency: ``words[i]`` has id ``i`` and ``counts[i]`` occurrences."""

    words: list[str]
    counts: np.ndarray

    @classmethod
    def build(cls, tokens: Iterable[str], min_count: int = 5, max_size: int | None = None) -> Vocabulary:
        counter = Counter(tokens)
        kept = [(w, c) for w, c in counter.most_common(max_size) if c >= min_count]
        if not kept:
            raise LmlabError(
                f"no word occurs at least {min_count} times in the corpus",
                "give more text or lower min_count",
            )
        return cls([w for w, _ in kept], np.array([c for _, c in kept], dtype=np.int64))

    def __len__(self) -> int:
        return len(self.words)

    def index(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.words)}

    def encode(self, tokens: Iterable[str]) -> np.ndarray:
        """Ids of the in-vocabulary tokens, out-of-vocabulary ones dropped (as word2vec does)."""
        idx = self.index()
        return np.array([idx[t] for t in tokens if t in idx], dtype=np.int64)


def corpus_words(texts: str | Iterable[str]) -> list[str]:
    """All words of one text or of several texts, in order."""
    if isinstance(texts, str):
        return words(texts)
    if not isinstance(texts, Iterable):
        raise LmlabError(f"the texts must be a string or an iterable of strings, got {describe(texts)}",
                         'pass e.g. ["a first text", "a second one"]')
    out: list[str] = []
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise LmlabError(f"texts[{i}] must be a string, got {describe(t)}",
                             "pass strings (decode bytes first)")
        out.extend(words(t))
    return out
