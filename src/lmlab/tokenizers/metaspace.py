"""SentencePiece-style word splitting ("Metaspace"), shared by the unigram tokenizer and its learner.

Every run of whitespace becomes one ``▁`` (U+2581), leading and trailing whitespace is dropped,
and a ``▁`` is prepended to the text, so every word starts with ``▁``::

    "Hello  world\\n"  ->  "▁Hello▁world"  ->  words "▁Hello", "▁world"
"""

from __future__ import annotations

import re

#: The word-boundary mark (U+2581 LOWER ONE EIGHTH BLOCK), as in SentencePiece.
SPACE = "\u2581"
#: Unicode White_Space characters (exactly Rust's ``char::is_whitespace``, which the Hugging Face
#: ``Strip`` normalizer uses), so that lmlab and ``tokenizer.json`` treat the same characters as space.
WHITESPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
              "\u200a\u2028\u2029\u202f\u205f\u3000")
_WS_CLASS = "[" + WHITESPACE + "]"
WHITESPACE_RUN = re.compile(_WS_CLASS + "+")
#: What starts a word: a whitespace run or a literal ``▁`` (as in the HF Metaspace pre-tokenizer).
_MARK = re.compile(_WS_CLASS + "+|" + SPACE)


def normalize(text: str) -> str:
    """Whitespace normalisation + ``▁`` marking: ``"  a  b "`` -> ``"▁a▁b"`` (``""`` for blank text)."""
    s = WHITESPACE_RUN.sub(SPACE, text.strip(WHITESPACE))
    if s and not s.startswith(SPACE):
        s = SPACE + s
    return s


def word_contents(text: str) -> list[str]:
    """The words of ``text`` without their leading ``▁`` (fast; used to count the training corpus)."""
    return normalize(text).split(SPACE)[1:]


def split_words(text: str) -> list[tuple[str, int, bool]]:
    """``(word, origin, literal)`` for each word of ``text``.

    ``word`` starts with ``▁``; ``text[origin]`` is the word's second character (its first
    after the ``▁``). ``literal`` says the ``▁`` is a literal U+2581 in the text (at
    ``origin - 1``), which starts a word as in the HF Metaspace pre-tokenizer; otherwise it stands
    for whitespace or the start of the text and covers no character.
    """
    lo, hi = 0, len(text)
    while lo < hi and text[lo] in WHITESPACE:
        lo += 1
    while hi > lo and text[hi - 1] in WHITESPACE:
        hi -= 1
    words: list[tuple[str, int, bool]] = []
    pos = lo
    if lo < hi and text[lo] != SPACE:  # the prepended ▁
        m = _MARK.search(text, lo, hi)
        pos = m.start() if m else hi
        words.append((SPACE + text[lo:pos], lo, False))
    while pos < hi:
        m = _MARK.match(text, pos, hi)
        start = m.end()
        nxt = _MARK.search(text, start, hi)
        end = nxt.start() if nxt else hi
        words.append((SPACE + text[start:end], start, m.group() == SPACE))
        pos = end
    return words
