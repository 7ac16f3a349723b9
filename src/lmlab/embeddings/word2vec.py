"""Training word2vec (skip-gram or CBOW with negative sampling) in vectorised minibatches.

The objective functions live in :mod:`lmlab.objectives.word2vec` (see there for the maths).
This module runs them the way the original C tool does, but in PyTorch minibatches instead of
one example at a time:

1. words -> vocabulary (``min_count``) -> ids; out-of-vocabulary words are dropped;
2. every epoch: subsample frequent words, draw a dynamic window per position, build all
   skip-gram pairs (or CBOW context rows), shuffle them;
3. minibatches of ``batch_size`` examples, ``negative`` noise words each from ``unigram^0.75``,
   summed loss, plain SGD on sparse gradients with the learning rate decaying linearly to ~0
   (word2vec's schedule; ``lr`` 0.025 for skip-gram and 0.05 for CBOW are its defaults).

Input vectors start uniform in ``±0.5/dim`` and output vectors at zero, as in word2vec; the
input vectors are the embeddings returned.

Cost: one epoch touches ``~2·window·N`` pairs for skip-gram (N tokens after subsampling) and N
rows for CBOW; two tables of ``vocab × dim`` float32. About 2 MB of text (400k words) trains a
skip-gram epoch in a few seconds on one core.
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
from lmlab.objectives.word2vec import (
    cbow_loss,
    context_matrix,
    keep_probability,
    noise_distribution,
    skipgram_loss,
    skipgram_pairs,
    subsample,
)

MODES = ("skipgram", "cbow")


def train_word2vec(
    texts: str | Iterable[str],
    mode: str = "skipgram",
    dim: int = 100,
    window: int = 5,
    negative: int = 5,
    min_count: int = 5,
    max_vocab: int | None = None,
    sample: float = 1e-3,
    epochs: int = 2,
    lr: float | None = None,
    batch_size: int = 1024,
    optimizer: str = "sgd",
    seed: int = 0,
) -> WordVectors:
    """Learn word vectors from ``texts`` (a string or several) with skip-gram or CBOW.

    ``optimizer``: ``"sgd"`` (word2vec's: summed loss, linearly decaying ``lr``) or ``"adam"``
    (``SparseAdam`` on the mean loss, ``lr`` default 0.01, also decayed): fewer epochs on small
    corpora, where SGD's rare words see too few updates.
    """
    _check_options(mode, optimizer, dim=dim, window=window, negative=negative, epochs=epochs,
                   batch_size=batch_size, min_count=min_count)
    tokens = corpus_words(texts)
    vocab = Vocabulary.build(tokens, min_count, max_vocab)
    if len(vocab) < 2:
        raise LmlabError("the vocabulary has fewer than 2 words", "give more text or lower min_count")
    ids = vocab.encode(tokens)
    default_lr = 0.01 if optimizer == "adam" else (0.025 if mode == "skipgram" else 0.05)
    lr0 = lr if lr is not None else default_lr
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    v = len(vocab)
    in_embed = torch.nn.Parameter((torch.rand(v, dim, generator=gen) - 0.5) / dim)
    out_embed = torch.nn.Parameter(torch.zeros(v, dim))
    if optimizer == "adam":
        opt = torch.optim.SparseAdam([in_embed, out_embed], lr=lr0)
    else:
        opt = torch.optim.SGD([in_embed, out_embed], lr=lr0)
    noise = torch.from_numpy(noise_distribution(vocab.counts)).float()
    keep = keep_probability(vocab.counts, sample)

    # the number of examples per epoch varies with subsampling: estimate it for the lr schedule
    est = len(ids) * float(keep[ids].mean()) * (window + 1 if mode == "skipgram" else 1)
    total_steps = max(1, int(epochs * est / batch_size))
    step = 0
    for _ in range(epochs):
        examples = _epoch_examples(ids, keep, mode, window, rng)
        n = len(examples[0])
        order = torch.from_numpy(rng.permutation(n))
        for start in range(0, n, batch_size):
            sel = order[start : start + batch_size]
            x, y = examples[0][sel], examples[1][sel]
            negs = torch.multinomial(noise, len(sel) * negative, replacement=True, generator=gen)
            negs = negs.view(len(sel), negative)
            loss_fn = skipgram_loss if mode == "skipgram" else cbow_loss
            loss = loss_fn(in_embed, out_embed, x, y, negs)
            if optimizer == "adam":
                loss = loss / len(sel)
            for group in opt.param_groups:
                group["lr"] = lr0 * max(1e-4, 1.0 - step / total_steps)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
    return WordVectors(vocab.words, in_embed.detach().numpy().copy())


def _check_options(mode: str, optimizer: str, **counts) -> None:
    """The mode, the optimizer and the positive integers (``dim``, ``window``...) of train_word2vec."""
    if mode not in MODES:
        raise LmlabError(f"unknown word2vec mode {mode!r}", "use 'skipgram' or 'cbow'")
    if optimizer not in ("sgd", "adam"):
        raise LmlabError(f"unknown optimizer {optimizer!r}", "use 'sgd' or 'adam'")
    for name, v in counts.items():
        number_argument(values.Count, v, name)


def _epoch_examples(ids: np.ndarray, keep: np.ndarray, mode: str, window: int,
                    rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One epoch's examples after subsampling: (centre, context) pairs for skip-gram, (context
    rows, centre) for CBOW (rows without any context word left out)."""
    kept = subsample(ids, keep, rng)
    if mode == "skipgram":
        a, b = skipgram_pairs(kept, window, rng)
        return torch.from_numpy(a), torch.from_numpy(b)
    ctx = context_matrix(kept, window, rng)
    has = (ctx >= 0).any(1)
    return torch.from_numpy(ctx[has]), torch.from_numpy(kept[has])
