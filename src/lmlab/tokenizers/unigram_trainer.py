"""EM learner for the unigram LM tokenizer (Kudo 2018, arXiv:1804.10959, section 3.2).

It follows SentencePiece's unigram trainer step by step:

1. **Count** the distinct words of the corpus (streaming, :func:`~lmlab.tokenizers.counting.count_chunks`;
   memory grows with the number of distinct words, never with corpus size). A word is cut into
   *script runs* (``"▁don't"`` -> ``"▁don" "'" "t"``): like SentencePiece's ``split_by_unicode_script``
   no piece mixes letters of one script with another script, digits or punctuation, so each run
   has its own independent lattice. The distinct runs ("chunks") with their counts are the corpus.
2. **Seed** vocabulary: every character, plus the most frequent substrings of the chunks (count
   >= 2, length <= ``max_piece_length``), ranked by ``count * length`` as SentencePiece ranks the
   substrings of its suffix array; initial ``log p`` proportional to that score.
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
piece``); the dynamic programs run layer by layer over end positions, each layer one vectorised
``reduceat`` over every chunk at once. Memory: a few tens of bytes per lattice edge (the edges
are the seed pieces occurring in each distinct chunk, about ``distinct chunks x 20``).
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
        src, dst = self.first[k] + i, self.first[k] + j
        span = self.max_len + 1  # sort keys: (end position, end node, start) and (start, start node, end)
        order = np.argsort((j * self.n_nodes + dst) * span + i)
        self.k, self.i, self.j, self.piece = k[order], i[order], j[order], piece[order]
        self.src, self.dst = src[order], dst[order]
        self.bperm = np.argsort((self.i * self.n_nodes + self.src) * span + self.j)
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
        newpos = np.cumsum(keep) - 1
        self.bperm = newpos[self.bperm[keep[self.bperm]]]
        for name in ("k", "i", "j", "src", "dst"):
            setattr(self, name, getattr(self, name)[keep])
        self.piece = new_piece_id[self.piece[keep]]
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


def _substring_ids(chunks: list[str], k: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Number the distinct substrings ``chunks[k][i:j]`` 0, 1, 2... in order of first occurrence.

    Vectorised: characters become small integer codes, each substring (at most 16 of them, say)
    is packed exactly into a few 64-bit words, and equal substrings are found by sorting those.
    """
    text = "".join(chunks)
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    alphabet, codes = np.unique(points, return_inverse=True)
    bits = max(1, int(len(alphabet)).bit_length())  # codes 1..A, 0 = past the end
    per_word = 64 // bits
    longest = int((j - i).max(initial=1))
    codes = np.concatenate([codes.astype(np.uint64) + 1, np.zeros(longest, np.uint64)])
    offsets = np.concatenate([[0], np.cumsum([len(c) for c in chunks])])[k] + i
    length = j - i
    words = []
    for w0 in range(0, longest, per_word):
        key = np.zeros(len(k), dtype=np.uint64)
        for t in range(w0, min(w0 + per_word, longest)):
            c = np.where(t < length, codes[offsets + t], np.uint64(0))
            key |= c << np.uint64(bits * (t - w0))
        words.append(key)
    order = np.lexsort(words[::-1])
    new_group = np.zeros(len(order), dtype=bool)
    new_group[:1] = True
    for key in words:
        sk = key[order]
        new_group[1:] |= sk[1:] != sk[:-1]
    group = np.cumsum(new_group) - 1
    first = order[new_group]  # lexsort is stable: the first occurrence of every group
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    ids = np.empty(len(order), dtype=np.int64)
    ids[order] = rank[group]
    return ids


def _seed(chunks: list[str], weights: np.ndarray, max_len: int, seed_size: int, specials: set[str],
          target: int):
    """Characters + the top substrings by count * length: (pieces, log p, is_char, chunk lattices)."""
    lengths = np.fromiter((len(s) for s in chunks), dtype=np.int64, count=len(chunks))
    k, i, j = substring_spans(lengths, max_len)
    ids = _substring_ids(chunks, k, i, j)
    n_subs = int(ids.max(initial=-1)) + 1
    count = np.bincount(ids, weights=weights[k], minlength=n_subs)
    first = np.zeros(n_subs, dtype=np.int64)
    first[ids[::-1]] = np.arange(len(ids))[::-1]  # first occurrence (edge index) of each substring
    sub_len = (j - i)[first]

    fk, fi, fj = k[first].tolist(), i[first].tolist(), j[first].tolist()

    def text(sub: int) -> str:
        return chunks[fk[sub]][fi[sub]:fj[sub]]

    is_char = sub_len == 1
    for sub in np.flatnonzero(is_char).tolist():
        if text(sub) in specials:
            raise LmlabError(f"special token {text(sub)!r} is a character of the training text",
                             "choose special tokens that do not occur as single characters")
    candidate = ~is_char & (count >= 2)
    if candidate.sum() < 2 * target:  # tiny corpus: allow substrings seen once
        candidate = ~is_char
    score = count * sub_len
    cand = np.flatnonzero(candidate)
    if len(cand) > seed_size:
        cand = cand[np.argpartition(-score[cand], seed_size)[:seed_size]]
    cand = cand[np.lexsort((cand, -score[cand]))]
    cand = np.array([c for c in cand.tolist() if text(c) not in specials], dtype=np.int64)
    chars = np.flatnonzero(is_char)
    chars = chars[np.argsort(-count[chars], kind="stable")]
    chosen = np.concatenate([chars, cand])
    piece_of_sub = np.full(n_subs, -1, dtype=np.int64)
    piece_of_sub[chosen] = np.arange(len(chosen))
    pieces = [text(c) for c in chosen.tolist()]
    s = score[chosen].astype(np.float64)
    logp = np.log(s) - np.log(s.sum())
    edge_piece = piece_of_sub[ids]
    keep = edge_piece >= 0
    lat = Lattices(lengths, weights, k[keep], i[keep], j[keep], edge_piece[keep])
    return pieces, logp, sub_len[chosen] == 1, lat


def train_unigram(texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str], *,
                  max_piece_length: int = 16, seed_size: int = 1_000_000, shrinking_factor: float = 0.75,
                  num_sub_iterations: int = 2, split_by_script: bool = True, workers: int = 1,
                  progress: bool = False) -> tuple[list[str], list[float]]:
    """Learn ``vocab_size - len(special_tokens)`` pieces and their log-probabilities.

    Options (SentencePiece's names and defaults): ``max_piece_length`` (16), ``seed_size``
    (1,000,000 seed substrings), ``shrinking_factor`` (0.75 kept per pruning round),
    ``num_sub_iterations`` (2 EM iterations per round), ``split_by_script`` (True: no piece mixes
    scripts, or letters with digits/punctuation), ``workers`` (processes for counting),
    ``progress`` (log each round to stderr). Returns pieces sorted by decreasing log-probability.
    Every character of the corpus is in the result (character coverage 1.0).
    """
    if not (isinstance(max_piece_length, int) and max_piece_length >= 1):
        raise LmlabError(f"max_piece_length must be a positive integer, got {max_piece_length!r}",
                         "pass e.g. max_piece_length=16")
    if not 0 < shrinking_factor < 1:
        raise LmlabError(f"shrinking_factor must be between 0 and 1, got {shrinking_factor!r}",
                         "pass e.g. shrinking_factor=0.75")
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
