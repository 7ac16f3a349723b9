"""One merge applied to the reference learner's words (lists of symbol ids), recording the
neighbours of every merged occurrence (see :mod:`lmlab.tokenizers.merge_trainer`)."""

from __future__ import annotations

from collections.abc import Iterable


def rewrite_words(words: list[list[int]], counts: list[int], word_ids: Iterable[int], a: int, b: int,
                  new: int) -> tuple[dict[int, list[int]], dict[int, list[int]], int]:
    """Merge ``a b`` into ``new`` in the words ``word_ids`` (of ``words``, seen ``counts`` times);
    return the words of the occurrences by left neighbour, by right neighbour, and the merges in
    words holding more than one ``a`` (weighted)."""
    left: dict[int, list[int]] = {}  # prev -> the words of the occurrences with that left neighbour
    right: dict[int, list[int]] = {}  # nxt -> likewise on the right
    merged = 0  # occurrences merged (weighted): the pair's count, unless runs a a a overlap
    for w in word_ids:
        word = words[w]
        todo = word.count(a)  # occurrences of a still to look at (0: the word lost the pair)
        if todo == 1:  # the common case, without the loop's bookkeeping
            i = word.index(a)
            if i + 1 < len(word) and word[i + 1] == b:
                if i:
                    ws = left.get(word[i - 1])
                    if ws is None:
                        left[word[i - 1]] = [w]
                    else:
                        ws.append(w)
                del word[i + 1]
                word[i] = new
                if i + 1 < len(word):
                    ws = right.get(word[i + 1])
                    if ws is None:
                        right[word[i + 1]] = [w]
                    else:
                        ws.append(w)
        elif todo:
            merged += counts[w] * merge_in_word(word, w, a, b, new, todo, left, right)
    return left, right, merged


def merge_in_word(word: list[int], w: int, a: int, b: int, new: int, todo: int,
                  left: dict[int, list[int]], right: dict[int, list[int]]) -> int:
    """``rewrite_words`` for a word with ``todo`` > 1 symbols ``a``: merge every ``a b`` left to right.

    Returns how many merges it made (with ``a == b``, fewer than the pairs that the count of
    ``a a`` holds: a run ``a a a`` holds two and merges once).
    """
    last = len(word) - 1
    i = done = 0
    while todo:
        i = word.index(a, i)  # the next a (a C-level scan, not one Python step per symbol)
        todo -= 1
        if i < last and word[i + 1] == b:
            for nbrs, j in ((left, i - 1), (right, i + 2)):
                if 0 <= j <= last:
                    ws = nbrs.get(word[j])
                    if ws is None:
                        nbrs[word[j]] = [w]
                    else:
                        ws.append(w)
            word[i:i + 2] = [new]
            last -= 1
            done += 1
            if a == b:  # the b just merged was an a too
                todo -= 1
        i += 1
    return done
