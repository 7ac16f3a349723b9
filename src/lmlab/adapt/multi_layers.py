"""The per-row layers of :class:`lmlab.adapt.multi.MultiAdapterModel`: each row of a batch runs its
own variant's small weights on one shared frozen base.

* :class:`MultiLoRALinear` - ``y = W x + b + s_v · B_v A_v x`` with ``(A_v, B_v, s_v)`` gathered
  per row (batched matrix products, never merged into ``W``); ranks differ between variants, so
  ``A``/``B`` are zero-padded to the largest rank (the extra products are exact zeros);
* :class:`MultiPrefixAttention` - each row's prefix keys/values prepended through the attention's
  KV-cache path, as :class:`lmlab.adapt.prefix.PrefixAttention` does for one prefix; prefixes of
  different lengths are left-padded and the padding columns are masked for every query;
* :class:`RowwiseModule` - a task head (or BERT's pooler) per variant: the rows of each variant
  go through that variant's copy.

The rows' variant indices live in a :class:`RowState` shared by all these layers; the model sets
it around each forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmlab.errors import LmlabError
from lmlab.models.attention_masks import is_block_mask, prefix_keys_mask


class RowState:
    """What the per-row layers need to know about the batch being run."""

    def __init__(self):
        self.ids: Tensor | None = None  # [B] variant index of every row
        self.lora = False  # some row of the batch has a LoRA variant
        self.prefix_len: Tensor | None = None  # [B] prefix length of every row (0: none)
        self.prefix_max = 0  # the longest prefix of the batch

    def rows(self, batch: int, where: str) -> Tensor:
        if self.ids is None:
            raise LmlabError(f"{where} ran outside MultiAdapterModel.forward",
                             "call the MultiAdapterModel, not its base model")
        if self.ids.shape[0] != batch:
            raise LmlabError(f"{where} got {batch} rows for {self.ids.shape[0]} variant ids",
                             "pass one variant id per row (no packing or query subsets)")
        return self.ids


class MultiLoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus one LoRA update per variant, chosen per row.

    ``lora_A`` ``[V, R, d_in]``, ``lora_B`` ``[V, d_out, R]``, ``scaling`` ``[V]`` (zeros for
    variants that do not adapt this layer). The weight and bias are the base layer's parameters,
    under the same names.
    """

    def __init__(self, base: nn.Linear, lora_a: Tensor, lora_b: Tensor, scaling: Tensor, state: RowState):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.register_buffer("lora_A", lora_a)
        self.register_buffer("lora_B", lora_b)
        self.register_buffer("scaling", scaling)
        self._state = state

    def forward(self, x: Tensor) -> Tensor:
        out = F.linear(x, self.weight, self.bias)
        if not self._state.lora:
            return out
        if x.dim() != 3:
            raise LmlabError("per-row LoRA needs [batch, length, features] inputs", "do not pack the batch")
        ids = self._state.rows(x.shape[0], "a per-row LoRA layer")
        a, b = self.lora_A[ids].to(x.dtype), self.lora_B[ids].to(x.dtype)  # [B, R, in], [B, out, R]
        update = torch.bmm(torch.bmm(x, a.transpose(1, 2)), b.transpose(1, 2))
        return out + self.scaling[ids].to(x.dtype)[:, None, None] * update

    def extra_repr(self) -> str:
        v, r, _ = self.lora_A.shape
        return f"{self.in_features}, {self.out_features}, variants={v}, max_rank={r}"


class MultiPrefixAttention(nn.Module):
    """Self-attention with each row's prefix keys/values (``kv`` ``[V, 2, H_kv, P_max, D]``,
    right-aligned: variant ``v`` holds its ``P_v`` vectors in the last ``P_v`` slots, zeros before)."""

    def __init__(self, inner: nn.Module, kv: Tensor, state: RowState):
        super().__init__()
        self.inner = inner
        self.register_buffer("kv", kv)
        self._state = state

    def forward(self, x, context=None, mask=None, is_causal=False, position_bias=None, rope=None,
                past_kv=None, use_cache=False, queries=None, packing=None):
        st = self._state
        p = st.prefix_max
        args = dict(context=context, position_bias=position_bias, rope=rope, use_cache=use_cache,
                    queries=queries, packing=packing)
        if p == 0:
            return self.inner(x, mask=mask, is_causal=is_causal, past_kv=past_kv, **args)
        if packing is not None or position_bias is not None or is_block_mask(mask):
            raise LmlabError("per-row prefixes need the dense attention mask, unpacked and without position "
                             "bias", "use an encoder or decoder on the sdpa backend")
        b, t = x.shape[0], x.shape[1]
        ids = st.rows(b, "a per-row prefix attention")
        dtype = past_kv[0].dtype if past_kv is not None else self.inner.k_proj.weight.dtype
        kv = self.kv[ids, :, :, -p:].to(dtype)  # [B, 2, H, p, D]: the batch's longest prefix
        k, v = kv[:, 0], kv[:, 1]
        s = t  # keys of real tokens: the cached ones and the new ones
        if past_kv is not None:
            k, v = torch.cat((k, past_kv[0]), dim=2), torch.cat((v, past_kv[1]), dim=2)
            s += past_kv[0].shape[2]
        mask = prefix_keys_mask(mask, is_causal, st.prefix_len, p, t, s, x.device)
        out, present = self.inner(x, mask=mask, is_causal=False, past_kv=(k, v), **args)
        if present is not None:
            present = (present[0][:, :, p:], present[1][:, :, p:])
        return out, present


class RowwiseModule(nn.Module):
    """One copy of a module per variant (``copies[slot[v]]`` for variant ``v``); each variant's
    rows go through its own copy. Tensor arguments with the batch as first dimension are split by
    row, the others passed as they are; outputs (a tensor or a tuple of tensors/None) are put back
    in row order."""

    def __init__(self, copies: list[nn.Module], slot: list[int], state: RowState):
        super().__init__()
        self.copies = nn.ModuleList(copies)
        self.register_buffer("slot", torch.tensor(slot, dtype=torch.long), persistent=False)
        self._state = state

    def forward(self, *args):
        ref = next(a for a in args if isinstance(a, Tensor))
        b = ref.shape[0]
        which = self.slot[self._state.rows(b, "a per-variant head")]
        result = None
        for c in torch.unique(which).tolist():
            rows = (which == c).nonzero().squeeze(1)
            part = [a.index_select(0, rows) if isinstance(a, Tensor) and a.shape[0] == b else a for a in args]
            out = self.copies[c](*part)
            outs = out if isinstance(out, tuple) else (out,)
            if result is None:
                result = [None if o is None else o.new_zeros((b, *o.shape[1:])) for o in outs]
            for r, o in zip(result, outs):
                if o is not None:
                    r.index_copy_(0, rows, o)
        return tuple(result) if isinstance(out, tuple) else result[0]


__all__ = ["MultiLoRALinear", "MultiPrefixAttention", "RowState", "RowwiseModule"]
