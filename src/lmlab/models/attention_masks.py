"""Who may attend to whom: the one place lmlab builds attention masks.

A caller describes the mask it needs with one :class:`MaskSpec` (objective-neutral: causal or
not, padding, packed documents, a prefix, or an explicit pattern); :func:`kernel_mask` turns that
description into what the kernel takes, once per forward, and :func:`layer_mask` adapts it per
attention call (a KV cache, a subset of queries, T5's position bias). Nothing else in the
package builds masks. The pieces of a description:

* the **kind** is the model's: causal for decoders, bidirectional for encoders;
* ``doc_ids`` ``[B, T]``: packed documents (0, 1, 2... per row); a token attends only inside its
  own document (block-diagonal, within the kind);
* ``prefix_mask`` ``[B, T]`` (decoders): True at the keys that every query of the same document
  may see, the prefix of a prefix LM (bidirectional there, causal after it);
* ``pattern`` (boolean, True = may attend, ``[T, S]``/``[B, T, S]``/``[B, 1, T, S]``): anything
  else (UniLM's four masks); it replaces the kind and is combined with the rest;
* ``attention_mask`` ``[B, S]``: padding (1 = real token).

Two forms come out. **Dense** (every device): ``(mask, is_causal)`` for
``F.scaled_dot_product_attention``; a plain causal mask stays ``is_causal=True`` so the fused
kernel's fast path runs. **Block-sparse** (``backend="flex"``): a FlexAttention ``BlockMask``
(Dong et al. 2024, "Flex Attention"), which skips the blocks a document boundary rules out instead
of adding a dense ``[B, 1, T, T]`` bias; used for packed documents (causal, bidirectional or
prefix) without padding or a custom pattern. Models pick ``flex`` through their
``attention_backend`` attribute, which the trainer sets from ``train.attention`` (``auto`` = flex
on CUDA, dense on CPUs, where the dense kernels are faster).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from lmlab.arguments import describe, eager_checks, tensor_argument
from lmlab.errors import LmlabError

BACKENDS = ("sdpa", "flex")


@dataclass(frozen=True)
class MaskSpec:
    """Who may attend to whom in one forward pass, before any kernel is chosen.

    * ``causal``: each query sees only earlier keys (decoders);
    * ``padding``: ``[B, S]``, 1 at real tokens, 0 at padding keys (None: no padding);
    * ``doc_ids``: ``[B, T]`` packed documents, attention stays inside each one;
    * ``prefix``: ``[B, T]``, True at the keys every query of the same document sees (prefix LM);
    * ``pattern``: boolean ``[T, S]``/``[B, T, S]``/``[B, 1, T, S]`` (True = may attend), anything
      else (UniLM's four masks, XLNet's content stream); it replaces ``causal``;
    * ``query_stream``: boolean ``[B, P, T]``, XLNet's query stream (Yang et al. 2019): ``P`` more
      query rows, appended after the ``T`` content rows, each seeing the content keys marked here
      and no query-stream key (but its own when it sees nothing else, so its softmax never spreads
      over forbidden keys); ``pattern`` is then the content rows' ``[B, T, T]`` (None: all visible).

    With a memory of earlier positions (Transformer-XL, :func:`segment_pattern`), ``doc_ids`` has
    one entry per key, memory first, and the queries are the last ``T``.
    """

    causal: bool = False
    padding: Tensor | None = None
    doc_ids: Tensor | None = None
    prefix: Tensor | None = None
    pattern: Tensor | None = None
    query_stream: Tensor | None = None

    def __post_init__(self) -> None:
        """A one-line error for a field of the wrong kind (a list where a tensor goes); no value is read."""
        if not isinstance(self.causal, bool):
            raise LmlabError(f"MaskSpec's causal must be True or False, got {describe(self.causal)}",
                             "pass causal=True or causal=False")
        for name in ("padding", "doc_ids", "prefix", "pattern", "query_stream"):
            value = getattr(self, name)
            if value is not None:
                tensor_argument(value, f"MaskSpec's {name}")


def kernel_mask(spec: MaskSpec | None, q_len: int, kv_len: int | None = None, *,
                dtype: torch.dtype = torch.float32, device=None, backend: str = "sdpa"):
    """The kernel's mask for ``spec``: ``(mask, is_causal)`` where ``mask`` is None (the fused
    kernel's own ``is_causal`` path, or nothing masked), a dense additive/boolean tensor for SDPA,
    or (``backend="flex"``, packed documents without padding) a FlexAttention BlockMask."""
    if spec is not None and not isinstance(spec, MaskSpec):
        raise LmlabError(f"kernel_mask's spec must be a MaskSpec or None, got {describe(spec)}",
                         "pass e.g. MaskSpec(causal=True)")
    spec = spec or MaskSpec()
    if spec.query_stream is not None:
        spec = MaskSpec(padding=spec.padding, pattern=two_stream_pattern(spec.pattern, spec.query_stream))
    return self_attention_mask(causal=spec.causal, q_len=q_len, k_len=kv_len, doc_ids=spec.doc_ids,
                               prefix_mask=spec.prefix, pattern=spec.pattern, attention_mask=spec.padding,
                               dtype=dtype, device=device, backend=backend)


def two_stream_pattern(content: Tensor | None, query: Tensor) -> Tensor:
    """XLNet's boolean ``[B, T + P, T + P]`` over content rows then query rows (see
    :class:`MaskSpec`): ``content`` ``[B, T, T]`` (None: all visible), ``query`` ``[B, P, T]``."""
    b, p, t = query.shape
    allowed = torch.zeros(b, t + p, t + p, dtype=torch.bool, device=query.device)
    allowed[:, :t, :t] = True if content is None else content
    allowed[:, t:, :t] = query
    idx = torch.arange(p, device=query.device)
    allowed[:, t + idx, t + idx] = ~query.any(-1)  # a target that sees nothing sees its own query vector
    return allowed


def segment_pattern(spec: MaskSpec | None, q_len: int, kv_len: int, batch: int, device=None) -> Tensor:
    """Boolean ``[B, 1, T, S]`` for ``T`` queries over a memory of ``S - T`` earlier positions and
    the segment itself (Transformer-XL): causal aligned bottom-right, or the spec's ``pattern``
    (``[B, T, S]``); with ``doc_ids`` (``[B, S]``, one per key, memory first) only inside each
    query's own document."""
    spec = spec or MaskSpec(causal=True)
    if spec.pattern is not None:
        allowed = spec.pattern.to(torch.bool)
    else:
        allowed = causal_mask(q_len, kv_len, device)[None].expand(batch, q_len, kv_len)
    if spec.doc_ids is not None:
        keys = spec.doc_ids
        allowed = allowed & (keys[:, kv_len - q_len:, None] == keys[:, None, :])
    return allowed[:, None]


def layer_mask(mask: Tensor | None, is_causal: bool, q_len: int, k_len: int, *,
               queries: slice | None = None, position_bias: Tensor | None = None,
               dtype: torch.dtype, device=None) -> tuple[Tensor | None, bool]:
    """Adapt a dense :func:`kernel_mask` to one attention call of ``q_len`` queries over ``k_len``
    keys: ``(mask, is_causal)`` for ``F.scaled_dot_product_attention``.

    * cached decoding (``k_len != q_len``): SDPA's ``is_causal`` aligns top-left, so an explicit
      bottom-right causal mask replaces it (one new query sees the whole past: no mask);
    * ``queries`` (a slice of the positions): an explicit mask, cut to those rows;
    * ``position_bias`` (T5, additive ``[1|B, H, T, S]``) is summed with the mask, and causality is
      folded into it, since the kernel takes one or the other.
    """
    if is_causal and (k_len != q_len or queries is not None):
        mask = None if q_len == 1 else causal_mask(q_len, k_len, device)
        is_causal = False
    if position_bias is not None:
        if mask is not None and mask.dtype == torch.bool:
            mask = fold_into_bias(torch.zeros(mask.shape, dtype=dtype, device=device), mask)
        mask = position_bias if mask is None else position_bias + mask
        if is_causal:
            mask = fold_into_bias(mask, causal_mask(q_len, k_len, device), dtype)
            is_causal = False
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(dtype)
    if queries is not None and mask is not None and mask.shape[-2] != 1:
        mask = mask[..., queries, :]  # the rows of the queries kept
    return mask, is_causal


def prefix_keys_mask(mask: Tensor | None, is_causal: bool, prefix_len: Tensor, p: int, q_len: int,
                     k_len: int, device=None) -> Tensor:
    """A layer's mask with ``p`` key columns put in front (per-row prefix key/value vectors,
    right-aligned, as in multi-variant prefix tuning): row ``b``'s queries see the last
    ``prefix_len[b]`` of them; ``(mask, is_causal)`` is the layer's own over its ``k_len`` keys
    (:func:`layer_mask`). Boolean or additive like ``mask``, ``[B, H|1, T, p + S]``."""
    b = prefix_len.shape[0]
    visible = torch.arange(p, device=device)[None] >= (p - prefix_len.to(device))[:, None]  # [B, p]
    if mask is None:
        real = causal_mask(q_len, k_len, device) if is_causal else torch.ones(q_len, k_len, dtype=torch.bool,
                                                                              device=device)
        mask = real[None, None].expand(b, 1, q_len, k_len)
    while mask.dim() < 4:
        mask = mask[None]
    mask = mask.expand(b, *mask.shape[1:])
    pre = visible
    if mask.dtype != torch.bool:
        pre = fold_into_bias(torch.zeros(visible.shape, dtype=mask.dtype, device=device), visible)
    pre = pre[:, None, None, :].expand(b, mask.shape[1], mask.shape[2], p)
    return torch.cat((pre, mask), dim=-1)


def fold_into_bias(bias: Tensor, allowed: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """An additive ``bias`` with the most negative number of ``dtype`` (default the bias's) where
    ``allowed`` is False (not -inf: a fully masked row stays finite, as in transformers)."""
    return bias.masked_fill(~allowed, torch.finfo(dtype or bias.dtype).min)


def causal_mask(q_len: int, k_len: int, device=None) -> Tensor:
    """Boolean ``[T, S]``, True where query i may see key j: ``j <= i + (S - T)``.

    Aligned bottom-right, so with a KV cache (S = past + T) the new queries see all the past.
    """
    offset = k_len - q_len
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    return j <= i + offset


def prefix_lm_mask(seq_len: int, prefix_len: int | Tensor, device=None) -> Tensor:
    """Prefix-LM mask (Raffel et al. 2020; UniLM): bidirectional inside the prefix, causal after.

    ``prefix_len`` is an int or a ``[B]`` tensor. Returns boolean ``[T, T]`` or ``[B, 1, T, T]``,
    True = may attend: key j is visible to query i when ``j <= i`` or ``j < prefix_len``.
    """
    causal = causal_mask(seq_len, seq_len, device)
    j = torch.arange(seq_len, device=device)
    if isinstance(prefix_len, Tensor):
        in_prefix = j[None, :] < prefix_len.to(device)[:, None]  # [B, S]
        return causal[None, None] | in_prefix[:, None, None, :]
    return causal | (j[None, :] < prefix_len)


def attention_bias(
    attention_mask: Tensor | None = None,
    q_len: int = 1,
    k_len: int | None = None,
    causal: bool = False,
    mask: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    device=None,
) -> tuple[Tensor | None, bool]:
    """Combine the mask pieces into ``(additive_bias_or_None, use_is_causal)`` for :class:`Attention`.

    * ``attention_mask``: ``[B, S]`` with 1 for real tokens and 0 for padding (keys to ignore).
    * ``causal``: each query sees only earlier keys (bottom-right aligned for a KV cache).
    * ``mask``: any extra boolean mask broadcastable to ``[B, H, T, S]`` (True = may attend), for
      prefix-LM, UniLM or document-boundary masks.

    Returns ``(None, True)`` when a plain causal mask is all that is needed (the fused kernel's
    ``is_causal`` path), ``(None, False)`` when nothing is masked, otherwise a float bias
    ``[B|1, 1, T, S]`` with 0 where attention is allowed and the dtype's most negative number
    where it is not (not -inf: a fully masked row then stays finite, as in transformers).
    """
    k_len = q_len if k_len is None else k_len
    # all real tokens: drop the padding mask (a host read, so not while dynamo traces)
    if attention_mask is not None and eager_checks() and bool(attention_mask.all()):
        attention_mask = None  # no padding: keep the fast path
    if attention_mask is None and mask is None:
        if not causal or q_len == 1:
            return None, False
        if q_len == k_len:
            return None, True
    allowed = None
    if causal:
        allowed = causal_mask(q_len, k_len, device)[None, None]
    if mask is not None:
        m = mask.to(device=device, dtype=torch.bool)
        while m.dim() < 4:
            m = m.unsqueeze(0)
        allowed = m if allowed is None else allowed & m
    if attention_mask is not None:
        if attention_mask.shape[-1] != k_len:
            raise LmlabError(
                f"attention_mask has length {attention_mask.shape[-1]} but there are {k_len} keys",
                "pass one mask entry per token, cached past tokens included",
            )
        pad = attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :]
        allowed = pad if allowed is None else allowed & pad
    bias = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return bias.masked_fill_(~allowed, torch.finfo(dtype).min), False


def same_document(doc_ids: Tensor) -> Tensor:
    """Boolean ``[B, 1, T, T]``: query and key in the same document."""
    return (doc_ids[:, :, None] == doc_ids[:, None, :])[:, None]


def self_attention_mask(*, causal: bool, q_len: int, k_len: int | None = None, doc_ids: Tensor | None = None,
                        prefix_mask: Tensor | None = None, pattern: Tensor | None = None,
                        attention_mask: Tensor | None = None, dtype: torch.dtype = torch.float32,
                        device=None, backend: str = "sdpa"):
    """The mask of one forward pass (module docstring): ``(mask, is_causal)``, where ``mask`` is
    None, a dense additive/boolean tensor, or (``backend="flex"``) a FlexAttention BlockMask."""
    k_len = q_len if k_len is None else k_len
    packed = doc_ids is not None or prefix_mask is not None
    if packed and k_len != q_len:
        raise LmlabError("doc_ids and prefix_mask describe a whole sequence, not a cached continuation",
                         "pass them for training and scoring, not with past_key_values")
    if backend not in BACKENDS:
        raise LmlabError(f"unknown attention backend {backend!r}", f"use one of {', '.join(BACKENDS)}")
    no_padding = attention_mask is None or (eager_checks() and bool(attention_mask.all()))
    if backend == "flex" and packed and pattern is None and no_padding:
        return block_mask(causal, doc_ids, prefix_mask, q_len), False
    allowed = None
    if pattern is not None:
        allowed = pattern.to(torch.bool)
        allowed = allowed[:, None] if allowed.dim() == 3 else allowed  # [B, T, S] -> [B, 1, T, S]
    elif prefix_mask is not None:
        tri = torch.ones(q_len, q_len, dtype=torch.bool, device=prefix_mask.device).tril()
        allowed = (tri[None] | prefix_mask[:, None, :].bool())[:, None]
    elif causal and doc_ids is not None:
        allowed = torch.ones(q_len, q_len, dtype=torch.bool, device=doc_ids.device).tril()[None, None]
    if doc_ids is not None:
        docs = same_document(doc_ids)
        allowed = docs if allowed is None else allowed & docs
    use_causal = causal and allowed is None
    return attention_bias(attention_mask, q_len, k_len, causal=use_causal, mask=allowed, dtype=dtype,
                          device=device)


def block_mask(causal: bool, doc_ids: Tensor | None, prefix_mask: Tensor | None, length: int):
    """A FlexAttention BlockMask for packed documents of ``[B, length]`` tokens."""
    ref = doc_ids if doc_ids is not None else prefix_mask
    b = ref.shape[0]
    docs = doc_ids if doc_ids is not None else torch.zeros_like(ref, dtype=torch.long)
    prefix = prefix_mask.bool() if prefix_mask is not None else None

    def allowed(bi, hi, qi, ki):
        ok = docs[bi, qi] == docs[bi, ki]
        if prefix is not None:
            return ok & ((ki <= qi) | prefix[bi, ki])
        return ok & (ki <= qi) if causal else ok

    return _block_mask_builder(ref.device.type)(allowed, b, None, length, length, device=ref.device)


@functools.cache
def _block_mask_builder(device_type: str):
    """``create_block_mask``, compiled once per process on CUDA so the mask is built block by block,
    never as a dense ``[B, 1, T, T]`` tensor (what the deprecated ``_compile=True`` flag did by
    wrapping it in ``torch.compile`` at every call); eager elsewhere."""
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask) if device_type == "cuda" else create_block_mask


@functools.cache
def flex_attention_for(device: torch.device):
    """FlexAttention for ``device``: compiled once per process on CUDA (the fast kernel); elsewhere
    its eager reference implementation, which computes the same numbers (what the CPU tests use)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device.type == "cuda":
        return torch.compile(flex_attention, dynamic=False)

    def eager(*args, **kwargs):
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention.*")
            return flex_attention(*args, **kwargs)

    return eager


def is_block_mask(mask) -> bool:
    if mask is None or isinstance(mask, Tensor):
        return False
    from torch.nn.attention.flex_attention import BlockMask

    return isinstance(mask, BlockMask)
