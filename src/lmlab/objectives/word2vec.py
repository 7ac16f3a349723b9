"""word2vec's training objectives: skip-gram and CBOW with negative sampling.

Mikolov et al. 2013a ("Efficient estimation of word representations in vector space") and
2013b ("Distributed representations of words and phrases and their compositionality");
lecture 1, "classic embeddings". Every word has an input vector ``v_w`` and an output vector
``u_w``.

* **skip-gram**: the centre word predicts each word of its context, one (centre, context) pair
  at a time: ``-log σ(u_c · v_w) - Σ_{n ~ P_noise} log σ(-u_n · v_w)``.
* **CBOW**: the *average* of the context words' input vectors predicts the centre word:
  ``h = mean_c v_c``, ``-log σ(u_w · h) - Σ_n log σ(-u_n · h)``.
* **negative sampling**: ``k`` noise words per positive example drawn from the unigram
  distribution raised to 3/4 (:func:`noise_distribution`), which flattens it towards rare words.
* **subsampling of frequent words**: each occurrence of word ``w`` with corpus frequency ``f``
  is kept with probability ``(sqrt(f/t) + 1) · t/f`` (the formula of the released C code;
  the paper's ``1 - sqrt(t/f)`` is its approximation), ``t`` about 1e-3 - 1e-5.
* **dynamic window**: for each centre a window size ``b`` is drawn uniformly from
  ``1..window``, so near words are used more often than far ones.

These are pure functions over numpy/torch arrays; ``lmlab.embeddings.word2vec`` runs them in
vectorised minibatches. They are not a Transformer objective (nothing to register for
``lmlab pretrain``): word2vec trains its own two embedding tables.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


def noise_distribution(counts: np.ndarray, power: float = 0.75) -> np.ndarray:
    """``P(w) ∝ count(w)^power`` as float64 probabilities."""
    p = np.asarray(counts, dtype=np.float64) ** power
    return p / p.sum()


def keep_probability(counts: np.ndarray, threshold: float = 1e-3) -> np.ndarray:
    """Per-word probability of keeping an occurrence when subsampling (1 for rare words)."""
    f = np.asarray(counts, dtype=np.float64) / max(1, int(np.sum(counts)))
    if threshold <= 0:
        return np.ones_like(f)
    with np.errstate(divide="ignore", invalid="ignore"):
        keep = (np.sqrt(f / threshold) + 1.0) * threshold / f
    return np.clip(np.nan_to_num(keep, nan=1.0, posinf=1.0), 0.0, 1.0)


def subsample(ids: np.ndarray, keep: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Drop occurrences of frequent words at random (``keep[w]`` = probability to keep w)."""
    return ids[rng.random(len(ids)) < keep[ids]]


def context_matrix(ids: np.ndarray, window: int, rng: np.random.Generator) -> np.ndarray:
    """``[N, 2*window]`` context ids of every position with a dynamic window; -1 = none.

    Column ``k < window`` holds the word ``window - k`` to the left, column ``window + k`` the word
    ``k + 1`` to the right; a slot is used when its distance is at most the position's sampled
    window ``b ~ U{1..window}`` and it lies inside the text.
    """
    n = len(ids)
    b = rng.integers(1, window + 1, size=n)
    out = np.full((n, 2 * window), -1, dtype=np.int64)
    pos = np.arange(n)
    for d in range(1, window + 1):
        use = b >= d
        left, right = pos - d, pos + d
        ok_l, ok_r = use & (left >= 0), use & (right < n)
        out[ok_l, window - d] = ids[left[ok_l]]
        out[ok_r, window + d - 1] = ids[right[ok_r]]
    return out


def skipgram_pairs(ids: np.ndarray, window: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """All (centre, context) pairs of the text under a dynamic window, as two id arrays."""
    ctx = context_matrix(ids, window, rng)
    rows, cols = np.nonzero(ctx >= 0)
    return ids[rows], ctx[rows, cols]


def negative_sampling_loss(h: Tensor, out_pos: Tensor, out_neg: Tensor) -> Tensor:
    """Summed ``-log σ(u_pos·h) - Σ log σ(-u_neg·h)``; ``h`` [N,D], ``out_pos`` [N,D], ``out_neg`` [N,k,D]."""
    pos = F.logsigmoid((h * out_pos).sum(-1))
    neg = F.logsigmoid(-torch.einsum("nd,nkd->nk", h, out_neg)).sum(-1)
    return -(pos + neg).sum()


def skipgram_loss(
    in_embed: Tensor, out_embed: Tensor, centres: Tensor, contexts: Tensor, negatives: Tensor
) -> Tensor:
    """Skip-gram negative-sampling loss of a batch of pairs (``negatives`` [N, k] ids)."""
    return negative_sampling_loss(
        _lookup(in_embed, centres), _lookup(out_embed, contexts), _lookup(out_embed, negatives)
    )


def cbow_loss(
    in_embed: Tensor, out_embed: Tensor, contexts: Tensor, centres: Tensor, negatives: Tensor
) -> Tensor:
    """CBOW negative-sampling loss: ``contexts`` [N, C] ids with -1 padding predict ``centres`` [N]."""
    valid = (contexts >= 0).to(in_embed.dtype)
    vecs = _lookup(in_embed, contexts.clamp(min=0)) * valid[..., None]
    h = vecs.sum(1) / valid.sum(1, keepdim=True).clamp(min=1)
    return negative_sampling_loss(h, _lookup(out_embed, centres), _lookup(out_embed, negatives))


def _lookup(table: Tensor, ids: Tensor) -> Tensor:
    """Rows of ``table``; the gradient is sparse (only the rows used), as word2vec's updates are."""
    return F.embedding(ids, table, sparse=True)
