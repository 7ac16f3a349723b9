"""Count-based embeddings: truncated SVD of a positive PMI co-occurrence matrix.

Lecture 1, "classic embeddings"; Levy, Goldberg & Dagan 2015 ("Improving distributional
similarity with lessons learned from word embeddings") for the choices below.

1. Count co-occurrences ``#(w, c)`` of words within ``window`` positions of each other
   (symmetric), weighting a pair at distance ``d`` by ``1/d`` when ``weighting="harmonic"``
   (GloVe's choice) or 1 (``"uniform"``). The matrix is sparse: only seen pairs are stored.
2. Positive PMI: ``PPMI(w, c) = max(0, log #(w,c)·Σ / (#(w)·#_α(c)))`` with context counts
   smoothed by ``α = 0.75`` (``#_α(c) = #(c)^α / Σ #(c')^α · Σ``), which stops rare contexts from
   getting huge PMIs, the count-based twin of word2vec's ``unigram^0.75`` noise.
3. Truncated SVD ``PPMI ≈ U Σ Vᵀ`` with ``dim`` components (randomized, Halko et al. 2011, via
   ``torch.svd_lowrank`` on the sparse matrix) and word vectors ``U Σ^p`` with ``p = 0.5``
   (symmetric weighting works better than the classical ``p = 1``).

Memory: the sparse matrix holds each distinct co-occurring pair once (a few million for a few
MB of text); the SVD needs ``vocab × (dim + oversampling)`` dense floats.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from lmlab import values
from lmlab.arguments import number_argument
from lmlab.embeddings.vectors import WordVectors
from lmlab.embeddings.vocab import Vocabulary, corpus_words
from lmlab.errors import LmlabError


def cooccurrence(ids: np.ndarray, vocab_size: int, window: int, weighting: str = "harmonic") -> torch.Tensor:
    """Sparse symmetric ``[V, V]`` co-occurrence counts (float64, coalesced)."""
    if weighting not in ("harmonic", "uniform"):
        raise LmlabError(f"unknown weighting {weighting!r}", "use 'harmonic' or 'uniform'")
    rows, cols, vals = [], [], []
    for d in range(1, window + 1):
        a, b = ids[:-d], ids[d:]
        w = np.full(len(a), 1.0 / d if weighting == "harmonic" else 1.0)
        rows += [a, b]
        cols += [b, a]
        vals += [w, w]
    index = torch.from_numpy(np.stack([np.concatenate(rows), np.concatenate(cols)]))
    return torch.sparse_coo_tensor(
        index, torch.from_numpy(np.concatenate(vals)), (vocab_size, vocab_size), check_invariants=True
    ).coalesce()


def ppmi(counts: torch.Tensor, alpha: float = 0.75) -> torch.Tensor:
    """Positive PMI of a sparse co-occurrence matrix, with context-distribution smoothing ``alpha``."""
    idx, val = counts.indices(), counts.values()
    row = torch.sparse.sum(counts, dim=1).to_dense()
    col = torch.sparse.sum(counts, dim=0).to_dense()
    col_a = col.pow(alpha)
    p_c = col_a / col_a.sum()
    pmi = torch.log(val / (row[idx[0]] * p_c[idx[1]]))  # log P(w,c) / (P(w) P_α(c))
    keep = pmi > 0
    return torch.sparse_coo_tensor(idx[:, keep], pmi[keep], counts.shape, check_invariants=True).coalesce()


def train_svd(
    texts: str | Iterable[str],
    dim: int = 100,
    window: int = 5,
    min_count: int = 5,
    max_vocab: int | None = 20000,
    alpha: float = 0.75,
    power: float = 0.5,
    weighting: str = "harmonic",
    seed: int = 0,
) -> WordVectors:
    """Word vectors from the truncated SVD of the PPMI matrix of ``texts``."""
    number_argument(values.Count, dim, "dim")
    number_argument(values.Count, window, "window")
    tokens = corpus_words(texts)
    vocab = Vocabulary.build(tokens, min_count, max_vocab)
    if dim >= len(vocab):
        raise LmlabError(
            f"dim {dim} is not smaller than the vocabulary of {len(vocab)} words",
            f"use dim < {len(vocab)} or more text",
        )
    ids = vocab.encode(tokens)
    m = ppmi(cooccurrence(ids, len(vocab), window, weighting), alpha).float()
    torch.manual_seed(seed)  # svd_lowrank draws its random projection from the global generator
    u, s, _ = torch.svd_lowrank(m, q=min(dim + 10, len(vocab)), niter=4)
    vectors = u[:, :dim] * s[:dim].pow(power)
    return WordVectors(vocab.words, vectors.numpy())
