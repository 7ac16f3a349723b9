"""Shared pieces of the masking and denoising objectives (MLM, SpanBERT, ELECTRA, T5, BART, UniLM).

* **Which positions may be corrupted** - never a special token (``[CLS]``, ``[SEP]``, ``</s>``...).
* **Words** - whole-word masking (Devlin et al. 2019, the WWM release) and SpanBERT (Joshi et al.
  2020) pick whole words, so they need to know where words start. Each tokenizer marks this
  differently; :func:`word_boundary_tables` reads it off the vocabulary once:

  ==========  =========================================================================
  wordpiece   a token starting with ``##`` continues a word; any other starts one
  unigram     a token starting with ``▁`` starts a word
  bytelevel   a token whose first byte is whitespace or ASCII punctuation starts a word,
              and so does the token after one whose last byte is (GPT-2's pre-tokenizer
              splits words there)
  bpe         a token ending with the end-of-word symbol ``_`` ends a word
  ==========  =========================================================================

  :func:`word_ids` turns that into a word index per token; a document start always starts a
  word, so a word never spans two documents of a packed row.
* **80/10/10** - of the selected positions, 80% become ``[MASK]``, 10% a random token, 10%
  stay unchanged (BERT §3.1), so the model cannot rely on seeing ``[MASK]`` and must keep a
  good representation of every token. :func:`replace_80_10_10` can decide per token (BERT) or
  per span (SpanBERT: a whole span is masked, replaced or kept together).
* **Span lengths** - geometric (SpanBERT, ``p = 0.2`` clipped at 10 words) and Poisson (BART,
  ``λ = 3``).
* **Static masks** - BERT masked each example once, during preprocessing, and reused that mask
  every epoch; RoBERTa (Liu et al. 2019) re-masks every time ("dynamic"). Static masks here are
  a function of ``seed`` and each token's place in the corpus (:func:`corpus_uniforms`), so a
  token is masked the same way in every epoch, wherever its window starts and wherever it falls
  in the batch order. A batch that does not come from a corpus (no ``offsets``) falls back to
  a generator seeded with ``hash(seed, the row's tokens)``.

All randomness comes from an explicit ``torch.Generator`` (drawn on the generator's device and
moved to the data's), so a batch is a pure function of its tokens and the generator state.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import Tensor

from lmlab import values
from lmlab.arguments import describe, number_argument, tensor_argument
from lmlab.data.batch import TokenBatch
from lmlab.errors import LmlabError
from lmlab.losses import IGNORE

#: the usual spelling of each special-token role, for error messages
ROLE_TOKENS = {"mask": "[MASK]", "cls": "[CLS]", "sep": "[SEP]", "eos": "</s>", "bos": "<s>", "pad": "[PAD]"}


# ----------------------------------------------------------------------------- random draws
def rand(shape, generator: torch.Generator, device=None) -> Tensor:
    """Uniform ``[0, 1)`` numbers drawn from ``generator`` (on its device), moved to ``device``."""
    _generator(generator, "rand")
    return torch.rand(shape, generator=generator, device=generator.device).to(device)


def randint(high: int, shape, generator: torch.Generator, device=None) -> Tensor:
    """Integers in ``[0, high)`` drawn from ``generator`` (on its device), moved to ``device``."""
    _generator(generator, "randint")
    return torch.randint(high, shape, generator=generator, device=generator.device).to(device)


def splitmix64(x: Tensor) -> Tensor:
    """The SplitMix64 finaliser of int64 ``x`` (its 64 bits read as unsigned; products wrap), elementwise
    on ``x``'s device: a counter-based hash, so draws keyed by it need no generator state."""
    def shift(z: Tensor, k: int) -> Tensor:  # logical right shift (int64's >> copies the sign bit)
        return (z >> k) & ((1 << (64 - k)) - 1)

    x = (x ^ shift(x, 30)) * _signed(0xBF58476D1CE4E5B9)
    x = (x ^ shift(x, 27)) * _signed(0x94D049BB133111EB)
    return x ^ shift(x, 31)


def _signed(u: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return u - (1 << 64) if u >= 1 << 63 else u


def hashed_uniforms(keys: Tensor, bits: int = 53) -> Tensor:
    """A uniform ``[0, 1)`` float64 per int64 key, a fixed function of the key (the top ``bits`` of
    :func:`splitmix64`), computed on the keys' device without reading them on the host."""
    z = splitmix64(keys)
    return ((z >> (64 - bits)) & ((1 << bits) - 1)).double() / float(1 << bits)


def corpus_uniforms(seed: int, offsets: Tensor, streams: int) -> Tensor:
    """``[streams, *offsets.shape]`` uniform ``[0, 1)`` numbers, each a fixed function of ``(seed,
    stream, offset)``: the same token position always draws the same numbers (SplitMix64 hash)."""
    salt = _signed((int(seed) * 0x9E3779B97F4A7C15) & ((1 << 64) - 1))
    x = offsets.to(torch.int64)
    return torch.stack([hashed_uniforms(x * streams + stream + salt) for stream in range(streams)]).float()


def seeded_uniforms(seed: Tensor, n: int) -> Tensor:
    """``n`` uniform ``[0, 1)`` float32 numbers keyed by a 0-d (or 1-element) int64 ``seed`` tensor and their
    index, on the seed's device: random draws after a forward pass (ELECTRA's sampling) that neither
    read the seed on the host nor keep a generator's state."""
    counter = torch.arange(1, n + 1, device=seed.device, dtype=torch.int64)
    keys = seed.reshape(()).to(torch.int64) + counter * _signed(0x9E3779B97F4A7C15)
    return hashed_uniforms(keys, bits=24).float()  # 24 bits: exact in float32, so always below 1


def _generator(generator: Any, fn: str) -> None:
    if not isinstance(generator, torch.Generator):
        raise LmlabError(f"{fn}'s generator must be a torch.Generator, got {describe(generator)}",
                         "pass the generator prepare() was given, or torch.Generator().manual_seed(0)")


def row_generator(seed: int, row: Tensor) -> torch.Generator:
    """A generator seeded by ``(seed, row contents)``: the static-masking key of one example."""
    h = hashlib.blake2b(row.detach().cpu().to(torch.int64).numpy().tobytes(), digest_size=8,
                        key=int(seed).to_bytes(8, "little", signed=True))
    return torch.Generator().manual_seed(int.from_bytes(h.digest(), "little") & (2**63 - 1))


# ----------------------------------------------------------------------------- vocabulary facts
def special_mask(ids: Tensor, special_ids: Tensor) -> Tensor:
    """Boolean mask of special-token positions."""
    tensor_argument(ids, "special_mask's ids", kind="integer")
    tensor_argument(special_ids, "special_mask's special_ids", kind="integer")
    return torch.isin(ids, special_ids.to(ids.device))


def replacement_pool(tokenizer) -> Tensor:
    """Ids a "random token" replacement may draw from: the whole vocabulary minus special tokens."""
    special = tokenizer.special_ids
    pool = torch.tensor([i for i in range(tokenizer.vocab_size) if i not in special], dtype=torch.long)
    if pool.numel() == 0:
        raise LmlabError("the tokenizer has only special tokens", "train a tokenizer with a real vocabulary")
    return pool


def require_role(tokenizer, role: str, objective: str) -> int:
    """Id of a special-token role (``mask``, ``cls``...) that ``objective`` needs, or a clear error."""
    i = tokenizer.role_id(role)
    if i is None:
        token = ROLE_TOKENS.get(role, role)
        raise LmlabError(f"the {objective} objective needs a {token} token but the tokenizer has none",
                         f"train the tokenizer with the default special tokens (which include {token})")
    return i


def word_boundary_tables(tokenizer) -> tuple[Tensor, Tensor]:
    """Per vocabulary id: ``(starts_word, ends_word)`` booleans (see the module docstring).

    Position ``i`` starts a word when ``starts_word[ids[i]]`` or ``ends_word[ids[i-1]]``.
    Special tokens are words of their own. An unknown algorithm makes every token a word.
    """
    algo = getattr(tokenizer, "algo", "")
    v = tokenizer.vocab_size
    starts = torch.zeros(v, dtype=torch.bool)
    ends = torch.zeros(v, dtype=torch.bool)
    if algo == "wordpiece":
        prefix = getattr(tokenizer, "continuing_subword_prefix", "##") or "##"
        for i, t in enumerate(tokenizer.vocab):
            starts[i] = not t.startswith(prefix)
    elif algo == "unigram":
        for i, t in enumerate(tokenizer.vocab):
            starts[i] = t.startswith("\u2581")
    elif algo == "bytelevel":
        from lmlab.tokenizers.pretokenize import BYTE_DECODER

        def breaks(ch: str) -> bool:  # whitespace or ASCII punctuation byte
            b = BYTE_DECODER.get(ch)
            return b is not None and b < 128 and not chr(b).isalnum()

        for i, t in enumerate(tokenizer.vocab):
            if t:
                starts[i], ends[i] = breaks(t[0]), breaks(t[-1])
    elif algo == "bpe":
        from lmlab.tokenizers.bpe import END_OF_WORD

        for i, t in enumerate(tokenizer.vocab):
            ends[i] = t.endswith(END_OF_WORD)
    else:
        starts[:] = True
    special = torch.tensor(sorted(tokenizer.special_ids), dtype=torch.long)
    starts[special] = True
    ends[special] = True
    return starts, ends


def word_ids(ids: Tensor, doc_ids: Tensor, starts: Tensor, ends: Tensor) -> Tensor:
    """Word index of every token, ``[B, T]`` (0, 1, 2... per row; a word never spans documents).

    Example (WordPiece): ``un ##aff ##able is [SEP] nice`` -> ``0 0 0 1 2 3``.
    """
    starts, ends = starts.to(ids.device), ends.to(ids.device)
    is_start = starts[ids].clone()
    is_start[:, 1:] |= ends[ids[:, :-1]] | (doc_ids[:, 1:] != doc_ids[:, :-1])
    is_start[:, 0] = True
    return torch.cumsum(is_start.long(), dim=1) - 1


def document_ids(batch: TokenBatch) -> Tensor | None:
    """``batch.doc_ids`` for the model, which then keeps attention inside each document
    (:mod:`lmlab.models.attention_masks`), or None when every row holds a single document
    (nothing to block: the fused kernel's fast path)."""
    if not isinstance(batch, TokenBatch):
        raise LmlabError(f"document_ids' batch must be a TokenBatch, got {describe(batch)}",
                         "pass the batch prepare() was given")
    if batch.is_single_document():
        return None
    return batch.doc_ids


# ----------------------------------------------------------------------------- selection
def select_tokens(candidates: Tensor, rate: float, generator: torch.Generator) -> Tensor:
    """Each candidate position independently with probability ``rate`` (BERT/RoBERTa)."""
    tensor_argument(candidates, "select_tokens' candidates")
    if candidates.dtype != torch.bool:
        raise LmlabError(f"select_tokens' candidates must be a bool mask, got {describe(candidates)}",
                         "pass e.g. ~special_mask(ids, special_ids)")
    number_argument(values.Probability, rate, "select_tokens' rate")
    return candidates & (rand(candidates.shape, generator, candidates.device) < rate)


def select_words(words: Tensor, candidates: Tensor, rate: float, generator: torch.Generator) -> Tensor:
    """Whole-word selection: each word independently with probability ``rate``, all its tokens at once.

    ``words`` comes from :func:`word_ids`. About ``rate`` of the tokens are selected (each token
    is chosen exactly when its word is), so the budget matches token-level masking on average.
    """
    b, t = words.shape
    per_word = rand((b, t), generator, words.device) < rate  # at most T words per row
    return candidates & torch.gather(per_word, 1, words)


def replace_80_10_10(
    ids: Tensor,
    selected: Tensor,
    mask_id: int,
    pool: Tensor,
    generator: torch.Generator,
    mask_prob: float = 0.8,
    random_prob: float = 0.1,
    units: Tensor | None = None,
) -> Tensor:
    """Corrupt the ``selected`` positions: ``[MASK]`` with ``mask_prob``, a random non-special
    token with ``random_prob``, unchanged otherwise.

    ``units`` (``[B, T]`` indices below T, e.g. span ids) makes the decision once per unit, so a
    whole span is masked, replaced or kept together (SpanBERT); None decides per token (BERT).
    """
    if mask_prob < 0 or random_prob < 0 or mask_prob + random_prob > 1:
        raise LmlabError(f"mask_prob {mask_prob} + random_prob {random_prob} must be within [0, 1]",
                         "BERT uses 0.8 and 0.1")
    b, t = ids.shape
    r = rand((b, t), generator, ids.device)
    if units is not None:
        r = torch.gather(r, 1, units)
    random_tok = pool.to(ids.device)[randint(len(pool), (b, t), generator, ids.device)]
    return apply_80_10_10(ids, selected, mask_id, r, random_tok, mask_prob, random_prob)


def apply_80_10_10(ids: Tensor, selected: Tensor, mask_id: int, draws: Tensor, random_tok: Tensor,
                   mask_prob: float, random_prob: float) -> Tensor:
    """The decision of :func:`replace_80_10_10` given its draws: a selected position becomes
    ``[MASK]`` where ``draws < mask_prob``, ``random_tok`` where the draw falls in the next
    ``random_prob``, and stays otherwise (``draws`` uniform ``[0, 1)``, shaped like ``ids``)."""
    use_mask = selected & (draws < mask_prob)
    use_random = selected & (draws >= mask_prob) & (draws < mask_prob + random_prob)
    # masks, not boolean indexing: no shape depends on the data, so a device batch is never read back
    return torch.where(use_random, random_tok, ids).masked_fill(use_mask, mask_id)


def mlm_labels(ids: Tensor, selected: Tensor) -> Tensor:
    """Original ids where selected, ``-100`` (ignored by the loss) elsewhere."""
    return ids.masked_fill(~selected, IGNORE)


def label_positions(labels: Tensor) -> Tensor:
    """Flat indices ``b * T + t`` of the labelled positions of ``[B, T]`` ``labels`` (not ``-100``),
    in row-major order: made with the labels, on the host, so that the MLM head gathers its rows
    on the device instead of finding them there (which would make the host wait for the device)."""
    return (labels.reshape(-1) != IGNORE).nonzero().squeeze(1)


# ----------------------------------------------------------------------------- span lengths
def geometric_lengths(n: int, p: float, max_len: int, generator: torch.Generator) -> Tensor:
    """``n`` span lengths from Geometric(p) on {1, 2, ...} clipped at ``max_len`` (SpanBERT: p=0.2, 10).

    Mean of the unclipped distribution is ``1/p``; SpanBERT's clipped mean is about 3.8 words.
    """
    if not 0 < p <= 1:
        raise LmlabError(f"geometric p must be in (0, 1], got {p}", "SpanBERT uses p=0.2")
    u = rand((n,), generator).clamp(min=1e-12)
    lengths = torch.floor(torch.log(u) / torch.log1p(torch.tensor(-p))).long() + 1 if p < 1 else torch.ones(
        n, dtype=torch.long)
    return lengths.clamp(1, max_len)


def poisson_lengths(n: int, lam: float, generator: torch.Generator) -> Tensor:
    """``n`` span lengths from Poisson(λ) (BART: λ=3; length 0 is possible)."""
    if lam <= 0:
        raise LmlabError(f"Poisson lambda must be positive, got {lam}", "BART uses 3")
    rates = torch.full((n,), float(lam), device=generator.device)
    return torch.poisson(rates, generator=generator).long().cpu()
