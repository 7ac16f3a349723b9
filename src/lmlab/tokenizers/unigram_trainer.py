"""EM learner for the unigram LM tokenizer (Kudo 2018, arXiv:1804.10959, section 3.2).

It follows SentencePiece's unigram trainer step by step:

1. **Count** the distinct words of the corpus (streaming, :func:`~lmlab.tokenizers.counting.count_chunks`;
   memory grows with the number of distinct words, never with corpus size). A word is cut into
   *script runs* (``"▁don't"`` -> ``"▁don" "'" "t"``): like SentencePiece's ``split_by_unicode_script``
   no piece mixes letters of one script with another script, digits or punctuation, so each run
   has its own independent lattice. The distinct runs ("chunks") with their counts are the corpus.
2. **Seed** vocabulary: every character, plus the most frequent substrings of the chunks (count
   >= 2, length <= ``max_piece_length``), ranked by ``count * length`` as SentencePiece ranks the
   substrings of its suffix array; initial ``log p`` proportional to that score. The distinct
   substrings are numbered one length at a time (:func:`_distinct_substrings`), with integer
   arrays only: no Python object per substring.
3. **EM**: the E-step computes the expected count of every piece with the forward-backward algorithm
   on the lattice of each chunk (all pieces occurring in it), weighted by the chunk's count; the
   M-step re-estimates ``log p(x) = digamma(c(x)) - digamma(sum c)`` (SentencePiece's Bayesian
   update, a sparse prior) and drops pieces expected less than 0.5 times (characters are kept).
4. **Prune**: for each piece, its best alternative segmentation (Viterbi of the piece's own string
   without the piece) and the loss of corpus likelihood if every use of the piece in the Viterbi
   segmentation of the corpus were replaced by that alternative; keep the pieces with the largest
   loss, shrinking the vocabulary by ``shrinking_factor`` (0.75) per round, until it is within
   10% of the target; then keep all characters and the most probable pieces.

All lattices of all chunks are held in flat NumPy arrays (one row per edge ``chunk, start, end,
piece``, int32 while the numbers fit); the dynamic programs run layer by layer over end positions,
each layer one vectorised ``reduceat`` over every chunk at once. Memory: about 32 bytes per lattice
edge plus the E-step's float temporaries (the edges are the seed pieces occurring in each distinct
chunk, about ``distinct chunks x 20``). On the 14.6 MB benchmark corpus (82k distinct chunks, 3.0M
edges) the learner's peak RSS is about 350 MB, corpus lines included (SentencePiece: 373 MB).
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Iterable, Sequence
from functools import cache

import numpy as np

from lmlab.errors import LmlabError
from lmlab.tokenizers.counting import count_chunks
from lmlab.tokenizers.metaspace import SPACE, word_contents
from lmlab.values import Count, OpenFraction, Workers

# ----------------------------------------------------------------------------- pre-tokenization


@cache
def script_of(ch: str) -> str:
    """The Unicode script of a character, approximated from its name ("" joins any script).

    Letters and marks take the first word of their name (``LATIN``, ``GREEK``, ``CYRILLIC``,
    ``DEVANAGARI``...), CJK ideographs and kana are one script (as SentencePiece merges them),
    combining marks join their neighbour, and digits, punctuation and symbols are ``Common``.
    """
    if unicodedata.category(ch)[0] not in "LM":
        return "Common"
    name = unicodedata.name(ch, "UNKNOWN")
    if name.startswith("COMBINING"):
        return ""
    first = name.split(" ", 1)[0]
    return "Han" if first in ("CJK", "HIRAGANA", "KATAKANA", "KATAKANA-HIRAGANA") else first


def script_runs(word: str) -> list[str]:
    """Cut a ``▁``-word where the script changes; the leading ``▁`` stays on the first run."""
    runs, start, prev = [], 0, ""
    for pos, ch in enumerate(word):
        if pos == 0 and ch == SPACE:
            continue
        s = script_of(ch)
        if not s:
            continue
        if prev and s != prev:
            runs.append(word[start:pos])
            start = pos
        prev = s
    runs.append(word[start:])
    return runs


# ----------------------------------------------------------------------------- numerics


def digamma(x: np.ndarray) -> np.ndarray:
    """The digamma function (recurrence up to x >= 10, then the asymptotic series), for x > 0."""
    x = np.array(x, dtype=np.float64)
    out = np.zeros_like(x)
    small = x < 10
    while small.any():
        out[small] -= 1.0 / x[small]
        x[small] += 1.0
        small = x < 10
    r = 1.0 / (x * x)
    return out + np.log(x) - 0.5 / x - r * (1 / 12 - r * (1 / 120 - r * (1 / 252 - r * (1 / 240 - r / 132))))


def _logsumexp_groups(v: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``log(sum(exp(v)))`` over the groups starting at ``idx`` (contiguous, non-empty)."""
    m = np.maximum.reduceat(v, idx)
    sizes = np.diff(np.append(idx, len(v)))
    return m + np.log(np.add.reduceat(np.exp(v - np.repeat(m, sizes)), idx))


def substring_spans(lengths: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every ``(string, i, j)`` with ``0 <= i < j <= lengths[string]`` and ``j - i <= max_len``,
    ordered by string, then ``i``, then ``j``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    k0 = np.repeat(np.arange(len(lengths)), lengths)
    i0 = np.arange(len(k0)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    cnt = np.minimum(max_len, lengths[k0] - i0)
    k = np.repeat(k0, cnt)
    i = np.repeat(i0, cnt)
    j = i + 1 + np.arange(len(k)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    return k, i, j


# ----------------------------------------------------------------------------- lattices


class Lattices:
    """The lattices of many strings at once: edges ``(string k, start i, end j, piece)``.

    Node ``first[k] + t`` is position ``t`` of string ``k``. Edges are kept sorted by end
    position, then end node, then start node, so the edges entering one node are contiguous and
    one "layer" (all edges ending at position ``t`` in every string) is one slice; ``bperm``
    orders them by start position and start node for the backward pass.
    """

    def __init__(self, lengths: np.ndarray, weights: np.ndarray, k: np.ndarray, i: np.ndarray,
                 j: np.ndarray, piece: np.ndarray):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.weights = np.asarray(weights, dtype=np.float64)
        base = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths + 1, out=base[1:])
        self.first, self.last, self.n_nodes = base[:-1], base[:-1] + self.lengths, int(base[-1])
        self.max_len = int(self.lengths.max(initial=0))
        # int32 edge arrays while node and edge numbers fit (they are most of the learner's memory)
        idx = np.int32 if max(self.n_nodes, len(k)) < 2**31 else np.int64
        k, i, j = (np.asarray(a, dtype=idx) for a in (k, i, j))
        span = self.max_len + 1  # sort keys: (end position, end node, start) and (start, start node, end)
        order = np.argsort((j.astype(np.int64) * self.n_nodes + self.first[k] + j) * span + i)
        self.k, self.i, self.j = k[order], i[order], j[order]
        self.piece = np.asarray(piece, dtype=idx)[order]
        del order
        self.src = (self.first[self.k] + self.i).astype(idx)
        self.dst = (self.first[self.k] + self.j).astype(idx)
        self.bperm = np.argsort((self.i.astype(np.int64) * self.n_nodes + self.src) * span + self.j)
        self.bperm = self.bperm.astype(idx)
        self._index()

    def _index(self) -> None:
        """Group boundaries and layer boundaries for both passes."""
        n_edges, layers = len(self.dst), np.arange(self.max_len + 2)
        fs = np.flatnonzero(np.r_[True, self.dst[1:] != self.dst[:-1]]) if n_edges else np.zeros(0, np.int64)
        self.f_start, self.f_end, self.f_node = fs, np.append(fs[1:], n_edges), self.dst[fs]
        self.f_layer = np.searchsorted(self.j[fs], layers)
        bsrc = self.src[self.bperm]
        bs = np.flatnonzero(np.r_[True, bsrc[1:] != bsrc[:-1]]) if n_edges else np.zeros(0, np.int64)
        self.b_start, self.b_end, self.b_node = bs, np.append(bs[1:], n_edges), bsrc[bs]
        self.b_layer = np.searchsorted(self.i[self.bperm][bs], layers)
        self.b_dst = self.dst[self.bperm]

    def keep_edges(self, keep: np.ndarray, new_piece_id: np.ndarray) -> None:
        """Drop the edges where ``keep`` is False and renumber pieces with ``new_piece_id``."""
        idx = self.k.dtype
        newpos = (np.cumsum(keep) - 1).astype(idx)
        self.bperm = newpos[self.bperm[keep[self.bperm]]]
        del newpos
        for name in ("k", "i", "j", "src", "dst"):
            setattr(self, name, getattr(self, name)[keep])
        self.piece = new_piece_id[self.piece[keep]].astype(idx)
        self._index()

    def _forward_layers(self):
        for t in range(1, self.max_len + 1):
            ga, gb = self.f_layer[t], self.f_layer[t + 1]
            if ga < gb:
                a = self.f_start[ga]
                yield a, self.f_end[gb - 1], self.f_start[ga:gb] - a, self.f_node[ga:gb]

    def forward(self, w: np.ndarray) -> np.ndarray:
        """``alpha[node]``: log of the summed probability of all paths from the string start."""
        alpha = np.full(self.n_nodes, -np.inf)
        alpha[self.first] = 0.0
        for a, b, idx, nodes in self._forward_layers():
            alpha[nodes] = _logsumexp_groups(alpha[self.src[a:b]] + w[a:b], idx)
        return alpha

    def backward(self, w: np.ndarray) -> np.ndarray:
        """``beta[node]``: log of the summed probability of all paths to the string end."""
        beta = np.full(self.n_nodes, -np.inf)
        beta[self.last] = 0.0
        wb = w[self.bperm]
        for t in range(self.max_len - 1, -1, -1):
            ga, gb = self.b_layer[t], self.b_layer[t + 1]
            if ga < gb:
                a, b = self.b_start[ga], self.b_end[gb - 1]
                beta[self.b_node[ga:gb]] = _logsumexp_groups(beta[self.b_dst[a:b]] + wb[a:b],
                                                            self.b_start[ga:gb] - a)
        return beta

    def expected_counts(self, w: np.ndarray, n_pieces: int) -> tuple[np.ndarray, float]:
        """E-step: expected piece counts (weighted by string counts) and the corpus log-likelihood."""
        alpha, beta = self.forward(w), self.backward(w)
        log_z = alpha[self.last]
        post = np.exp(alpha[self.src] + w + beta[self.dst] - log_z[self.k]) * self.weights[self.k]
        return np.bincount(self.piece, weights=post, minlength=n_pieces), float(self.weights @ log_z)

    def viterbi(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Best path of every string: ``(best score per string, row string index, row edge)``.

        The rows list the edges of every best path. Ties go to the smallest start (the longest
        last piece), as in the segmenter.
        """
        score = np.full(self.n_nodes, -np.inf)
        score[self.first] = 0.0
        best = np.zeros(self.n_nodes, dtype=np.int64)
        for a, b, idx, nodes in self._forward_layers():
            v = score[self.src[a:b]] + w[a:b]
            m = np.maximum.reduceat(v, idx)
            sizes = np.diff(np.append(idx, len(v)))
            pos = np.where(v == np.repeat(m, sizes), np.arange(a, b), np.iinfo(np.int64).max)
            best[nodes] = np.minimum.reduceat(pos, idx)
            score[nodes] = m
        rows_k, rows_e = [], []
        strings = np.arange(len(self.lengths))
        cur = self.last.copy()
        while len(strings):
            e = best[cur]
            rows_k.append(strings)
            rows_e.append(e)
            cur = self.src[e]
            going = cur != self.first[strings]
            strings, cur = strings[going], cur[going]
        empty = np.zeros(0, np.int64)
        return (score[self.last], np.concatenate(rows_k) if rows_k else empty,
                np.concatenate(rows_e) if rows_e else empty)

    def sub_lattices(self, edges: np.ndarray) -> Lattices:
        """The lattice of each given edge's span (its string ``k``, from ``i`` to ``j``) without
        the edge itself: for a piece used at that edge, the lattice of the piece's own string."""
        by_src = np.lexsort((self.dst, self.src))
        src_sorted = self.src[by_src]
        lo, hi = self.src[edges], self.dst[edges]
        a, b = np.searchsorted(src_sorted, lo), np.searchsorted(src_sorted, hi)
        sizes = b - a
        owner = np.repeat(np.arange(len(edges)), sizes)
        offset = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        sel = by_src[np.repeat(a, sizes) + offset]
        inside = (self.dst[sel] <= hi[owner]) & ~((self.src[sel] == lo[owner]) & (self.dst[sel] == hi[owner]))
        owner, sel = owner[inside], sel[inside]
        return Lattices(hi - lo, np.ones(len(edges)), owner, self.src[sel] - lo[owner],
                        self.dst[sel] - lo[owner], self.piece[sel])


# ----------------------------------------------------------------------------- the learner


def _count_corpus(texts: Iterable[str], split_by_script: bool, workers: int) -> dict[str, int]:
    words = count_chunks(texts, word_contents, workers=workers)
    chunks: dict[str, int] = {}
    for content, n in words.items():
        word = SPACE + content
        for run in script_runs(word) if split_by_script else (word,):
            chunks[run] = chunks.get(run, 0) + n
    return chunks


def _distinct_substrings(text: str, lengths: np.ndarray, max_len: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Number the distinct substrings of the chunks, one length at a time, in compact arrays.

    ``text`` is the chunks joined, ``lengths`` their lengths. For ``L = 1..max_len`` the result
    holds ``(pos, sub)``: ``pos`` every position of ``text`` where a substring of length ``L``
    starts inside one chunk (ascending), ``sub`` the number of that substring among the distinct
    substrings of length ``L`` (``0..n_L - 1``). A substring of length ``L`` is numbered from the
    number of its first ``L - 1`` characters and its last character, so no step holds more than
    one integer per position: memory is a few bytes per (position, length), never a Python
    object per substring (SentencePiece gets the same counts from a suffix array).
    """
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    _, codes = np.unique(points, return_inverse=True)
    n_codes = int(codes.max(initial=0)) + 1
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    room = (starts + np.repeat(lengths, lengths) - np.arange(len(points))).astype(np.int32)  # chars left
    pos = np.arange(len(points), dtype=np.int64)
    prev = np.zeros(len(points), dtype=np.int64)
    out = []
    for length in range(1, max_len + 1):
        inside = room[pos] >= length
        if not inside.all():
            pos, prev = pos[inside], prev[inside]
        if not len(pos):
            break
        _, sub = np.unique(prev * n_codes + codes[pos + length - 1], return_inverse=True)
        prev = sub.astype(np.int64)
        out.append((pos.astype(np.int32 if len(points) < 2**31 else np.int64),
                    sub.astype(np.int32 if len(sub) < 2**31 else np.int64)))
    return out


def _seed(chunks: list[str], weights: np.ndarray, max_len: int, seed_size: int, specials: set[str],
          target: int):
    """Characters + the top substrings by count * length: (pieces, log p, is_char, chunk lattices).

    Ties in the ranking go to the substring that occurs first in the chunks (then the shorter).
    """
    text = "".join(chunks)
    lengths = np.fromiter((len(s) for s in chunks), dtype=np.int64, count=len(chunks))
    chunk_start = np.cumsum(lengths) - lengths
    chunk_of = np.repeat(np.arange(len(chunks), dtype=np.int32), lengths)
    by_length = _distinct_substrings(text, lengths, max_len)
    # per length: each distinct substring's count and first position; one row per substring
    count_l, first_l = [], []
    for pos, sub in by_length:
        n = int(sub.max()) + 1
        count_l.append(np.bincount(sub, weights=weights[chunk_of[pos]], minlength=n))
        first = np.full(n, len(text), dtype=np.int64)
        first[sub[::-1]] = pos[::-1]  # the last write wins: the smallest position
        first_l.append(first)
    sizes = np.array([len(c) for c in count_l], dtype=np.int64)
    sub_base = np.cumsum(sizes) - sizes  # row of the first substring of each length
    count, first = np.concatenate(count_l), np.concatenate(first_l)
    sub_len = np.repeat(np.arange(1, len(sizes) + 1), sizes)
    del count_l, first_l

    def piece_text(row: int, first=first, sub_len=sub_len) -> str:
        return text[first[row]:first[row] + sub_len[row]]

    chars = np.arange(sizes[0])
    for row in chars.tolist():
        if piece_text(row) in specials:
            raise LmlabError(f"special token {piece_text(row)!r} is a character of the training text",
                             "choose special tokens that do not occur as single characters")
    cand = np.flatnonzero(count[sizes[0]:] >= 2) + sizes[0]
    if len(cand) < 2 * target:  # tiny corpus: allow substrings seen once
        cand = np.arange(sizes[0], len(count))
    score = count * sub_len
    cand = cand[np.lexsort((first[cand] * (max_len + 1) + sub_len[cand], -score[cand]))][:seed_size]
    cand = np.array([c for c in cand.tolist() if piece_text(c) not in specials], dtype=np.int64)
    chars = chars[np.lexsort((first[chars], -count[chars]))]
    chosen = np.concatenate([chars, cand])
    pieces = [piece_text(c) for c in chosen.tolist()]
    s = score[chosen].astype(np.float64)
    logp = np.log(s) - np.log(s.sum())
    is_char = sub_len[chosen] == 1
    piece_of_row = np.full(len(count), -1, dtype=np.int32)
    piece_of_row[chosen] = np.arange(len(chosen), dtype=np.int32)
    del count, first, score, sub_len, chosen, piece_text
    edges = []  # per length: (chunk, start, end, piece) of every position holding a seed piece
    for length, (pos, sub) in enumerate(by_length, 1):
        piece = piece_of_row[sub_base[length - 1] + sub]
        hit = piece >= 0
        pos, piece = pos[hit], piece[hit]
        k = chunk_of[pos]
        i = (pos - chunk_start[k]).astype(pos.dtype)
        edges.append((k, i, i + length, piece))
    del by_length
    k, i, j, piece = (np.concatenate(col) for col in zip(*edges))
    del edges
    lat = Lattices(lengths, weights, k, i, j, piece)
    return pieces, logp, is_char, lat


def train_unigram(texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str], *,
                  max_piece_length: Count = 16, seed_size: Count = 1_000_000,
                  shrinking_factor: OpenFraction = 0.75, num_sub_iterations: Count = 2,
                  split_by_script: bool = True, workers: Workers = 1,
                  progress: bool = False) -> tuple[list[str], list[float]]:
    """Learn ``vocab_size - len(special_tokens)`` pieces and their log-probabilities.

    Options (SentencePiece's names and defaults): ``max_piece_length`` (16), ``seed_size``
    (1,000,000 seed substrings), ``shrinking_factor`` (0.75 kept per pruning round),
    ``num_sub_iterations`` (2 EM iterations per round), ``split_by_script`` (True: no piece mixes
    scripts, or letters with digits/punctuation), ``workers`` (processes for counting),
    ``progress`` (log each round to stderr). Returns pieces sorted by decreasing log-probability.
    Every character of the corpus is in the result (character coverage 1.0).
    """
    from lmlab.arguments import number_argument

    number_argument(Count, max_piece_length, "train_unigram's max_piece_length")  # its signature's types
    number_argument(OpenFraction, shrinking_factor, "train_unigram's shrinking_factor")
    specials = list(dict.fromkeys(special_tokens))
    counts = _count_corpus(texts, split_by_script, workers)
    chunks = list(counts)
    weights = np.fromiter(counts.values(), dtype=np.float64, count=len(chunks))
    n_chars = len({ch for c in chunks for ch in c})
    need = len(specials) + n_chars
    if vocab_size < need:
        raise LmlabError(f"vocab_size {vocab_size} is too small for this corpus: it needs at least {need} "
                         f"({len(specials)} special tokens + {n_chars} distinct characters)",
                         f"pass vocab_size >= {need}")
    target = vocab_size - len(specials)
    desired = max(target, int(target * 1.1))
    pieces, logp, is_char, lat = _seed(chunks, weights, max_piece_length, seed_size, set(specials), target)
    def log(msg: str) -> None:
        if progress:
            print(f"unigram: {msg}", file=sys.stderr, flush=True)

    log(f"{len(chunks)} distinct chunks, {n_chars} characters, {len(pieces)} seed pieces, "
        f"{len(lat.piece)} lattice edges")

    def shrink(keep: np.ndarray) -> None:
        nonlocal pieces, logp, is_char
        new_id = np.cumsum(keep) - 1
        lat.keep_edges(keep[lat.piece], new_id)
        pieces = [p for p, kept in zip(pieces, keep.tolist()) if kept]
        logp, is_char = logp[keep], is_char[keep]

    round_no = 0
    while True:
        for _ in range(num_sub_iterations):
            expected, loglik = lat.expected_counts(logp[lat.piece], len(pieces))
            keep = (expected >= 0.5) | is_char
            short = target - int(keep.sum())
            if short > 0:  # small corpus: keep the best of the rare pieces rather than fall short
                rest = np.flatnonzero(~keep)
                keep[rest[np.lexsort((rest, -expected[rest]))[:short]]] = True
            freq = np.maximum(expected, np.where(is_char, 0.5, 1e-2))[keep]
            shrink(keep)
            logp = digamma(freq) - digamma(freq.sum())
            log(f"round {round_no}: {len(pieces)} pieces, log-likelihood per chunk "
                f"{loglik / weights.sum():.4f}")
        if len(pieces) <= desired:
            break
        shrink(_prune(pieces, logp, is_char, lat, max_piece_length,
                      max(desired, int(shrinking_factor * len(pieces)))))
        round_no += 1
    if len(pieces) > target:  # final cut: every character, then the most probable pieces
        rank = np.lexsort((np.arange(len(pieces)), -logp))
        rank = rank[~is_char[rank]][: target - int(is_char.sum())]
        keep = is_char.copy()
        keep[rank] = True
        shrink(keep)
    order = sorted(range(len(pieces)), key=lambda p: (-logp[p], pieces[p]))
    return [pieces[p] for p in order], [float(logp[p]) for p in order]


def _prune(pieces: list[str], logp: np.ndarray, is_char: np.ndarray, lat: Lattices, max_len: int,
           size: int) -> np.ndarray:
    """Which pieces survive a pruning round (SentencePiece's ``PruneSentencePieces``).

    ``freq`` is each piece's count in the Viterbi segmentation of the corpus. A piece unused
    there, or whose own best segmentation is not itself, goes. For the others, removing piece
    ``x`` would move its ``freq(x)`` uses to its best alternative segmentation ``a1..an``; the
    loss is ``freq(x) * (log p(x) - sum log p'(ai))`` with ``p'`` the re-normalised frequencies
    after the move. Characters always stay; the pieces with the largest loss fill up ``size``.
    """
    _, rows_k, rows_e = lat.viterbi(logp[lat.piece])
    rows_p = lat.piece[rows_e]
    freq = np.bincount(rows_p, weights=lat.weights[rows_k], minlength=len(pieces))
    used, where = np.unique(rows_p, return_index=True)  # one occurrence of every used piece
    multi = ~is_char[used]
    cand, where = used[multi], rows_e[where[multi]]
    own = lat.sub_lattices(where)
    alt_score, alt_k, alt_e = own.viterbi(logp[own.piece])
    alt_p = own.piece[alt_e]
    self_best = alt_score <= logp[cand]
    total = freq.sum()
    f = freq[cand]
    n_alt = np.bincount(alt_k, minlength=len(cand))
    logsum_alt = np.log(total + f * (n_alt - 1))
    logprob_alt = np.bincount(alt_k, weights=np.log(freq[alt_p] + f[alt_k]) - logsum_alt[alt_k],
                              minlength=len(cand))
    loss = f * (np.log(f) - np.log(total) - logprob_alt)
    ok = cand[self_best]
    ranked = ok[np.lexsort((ok, -loss[self_best]))]
    keep = is_char.copy()
    budget = max(0, size - int(is_char.sum()))
    keep[ranked[:budget]] = True
    if len(ranked) < budget:  # small corpus: fill up with the most probable of the others
        rest = np.flatnonzero(~keep)
        keep[rest[np.lexsort((rest, -logp[rest]))[: budget - len(ranked)]]] = True
    return keep
