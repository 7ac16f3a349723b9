"""Prefix tuning (Li & Liang 2021, "Prefix-Tuning: Optimizing Continuous Prompts for Generation").

Every self-attention layer ``i`` gets ``P`` trainable key/value vectors per key/value head that are
prepended to the keys and values computed from the input::

    attention_i(x) = softmax(q(x) · [K_i ; k(x)]ᵀ · scale) · [V_i ; v(x)]

The queries of all real tokens see the prefix (also under a causal mask: the prefix plays the role
of an already processed past, exactly what a KV cache holds), while the prefix itself is not a
token and produces no output. The frozen model is untouched; only ``K_i, V_i`` are trained.

* ``reparameterize=True``: the paper's stabilising reparameterisation, ``[K ; V] = MLP(E)`` with a
  small table ``E`` (``P × d_model``) and a two-layer tanh MLP of width ``hidden``; the MLP is
  trained and kept (each layer computes only its own rows of the last projection).
* ``init="vocab"`` (default without the MLP): start from the keys/values the frozen model itself
  computes for ``P`` real tokens (the paper's "initialise with activations of real words");
  ``"random"``: N(0, 0.02²).
* ``positions``: how the real tokens are numbered. ``"from_start"`` (default): ``0, 1, ...`` as
  without a prefix (the prefix has no position). ``"after_prefix"``: ``P, P+1, ...``, as after a
  ``P``-token context - what transformers does with a ``P``-token cache and so what the ``peft``
  library's prefix tuning computes (explicit ``position_ids`` are shifted by ``P`` too, as peft
  does; RoBERTa's padding keeps its position). Encoders and decoders; the export to ``peft``
  (:mod:`lmlab.adapt.peft_export`) needs it for learned positions (rotary ones export either way).

The model code is not edited: each block's ``attn`` is wrapped by :class:`PrefixAttention`, which
uses the attention's existing KV-cache path (``past_kv``): the prefix is passed as a cache to
which a real cache, when generating, is appended; masks and T5 position biases get ``P`` visible
columns; the cache handed back has the prefix removed again, so callers see their own cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmlab.adapt import freeze_base, transformer_blocks, unfreeze_task_heads
from lmlab.adapt.options import PREFIX_POSITIONS, typed_options
from lmlab.errors import LmlabError

POSITIONS = PREFIX_POSITIONS


class PrefixEncoder(nn.Module):
    """The trainable prefixes of all ``n_layers`` wrapped attentions: ``layer_kv(i) -> (K, V)``,
    each ``[n_kv_heads, P, head_dim]``."""

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        num_virtual_tokens: int,
        d_model: int,
        reparameterize: bool = False,
        hidden: int = 512,
    ):
        super().__init__()
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.num_virtual_tokens = p = num_virtual_tokens
        if reparameterize:
            self.embedding = nn.Parameter(torch.randn(p, d_model) * 0.02)
            self.mlp_in = nn.Linear(d_model, hidden)
            self.mlp_out = nn.Linear(hidden, n_layers * 2 * n_kv_heads * head_dim)
            self.prefix = None
        else:
            self.prefix = nn.Parameter(torch.randn(n_layers, 2, n_kv_heads, p, head_dim) * 0.02)

    def layer_kv(self, i: int) -> tuple[Tensor, Tensor]:
        if self.prefix is not None:
            return self.prefix[i, 0], self.prefix[i, 1]
        width = 2 * self.n_kv_heads * self.head_dim
        rows = slice(i * width, (i + 1) * width)  # only this layer's rows of the last projection
        h = torch.tanh(self.mlp_in(self.embedding))
        kv = F.linear(h, self.mlp_out.weight[rows], self.mlp_out.bias[rows])  # [P, 2·H·D]
        kv = kv.view(self.num_virtual_tokens, 2, self.n_kv_heads, self.head_dim).permute(1, 2, 0, 3)
        return kv[0], kv[1]


def _pad_left(t: Tensor, n: int, value) -> Tensor:
    """Prepend ``n`` columns of ``value`` on the last dimension (broadcast dims kept)."""
    pad = torch.full((*t.shape[:-1], n), value, dtype=t.dtype, device=t.device)
    return torch.cat((pad, t), dim=-1)


class PrefixAttention(nn.Module):
    """Self-attention with layer ``layer``'s prefix prepended through the KV-cache path."""

    def __init__(self, inner: nn.Module, prefixes: PrefixEncoder, layer: int):
        super().__init__()
        self.inner = inner
        self._prefixes = (prefixes,)  # a tuple: the encoder is registered once, on the model
        self.layer = layer

    def forward(
        self,
        x: Tensor,
        context=None,
        mask=None,
        is_causal=False,
        position_bias=None,
        rope=None,
        past_kv=None,
        use_cache=False,
        queries=None,
        packing=None,
    ):
        k_p, v_p = self._prefixes[0].layer_kv(self.layer)
        dtype = past_kv[0].dtype if past_kv is not None else self.inner.k_proj.weight.dtype
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
        b, p = (x.shape[0] if packing is None else packing.batch), k_p.shape[1]
        k = k_p.to(dtype)[None].expand(b, -1, -1, -1)
        v = v_p.to(dtype)[None].expand(b, -1, -1, -1)
        if past_kv is not None:
            k, v = torch.cat((k, past_kv[0]), dim=2), torch.cat((v, past_kv[1]), dim=2)
        if mask is not None:  # the prefix is visible to every query
            mask = _pad_left(mask, p, True if mask.dtype == torch.bool else 0.0)
        if position_bias is not None:  # T5: no relative-position bias towards the prefix
            position_bias = _pad_left(position_bias, p, 0.0)
        out, present = self.inner(
            x,
            context=context,
            mask=mask,
            is_causal=is_causal,
            position_bias=position_bias,
            rope=rope,
            past_kv=(k, v),
            use_cache=use_cache,
            queries=queries,
            packing=packing,
        )
        if present is not None:
            present = (present[0][:, :, p:], present[1][:, :, p:])
        return out, present


class _PositionsAfterPrefix:
    """A forward pre-hook numbering the real tokens after the prefix (``positions="after_prefix"``):
    it hands the model explicit ``position_ids`` shifted by ``P``."""

    def __init__(self, model: nn.Module, p: int):
        import inspect

        self.p = p
        self.signature = inspect.signature(model.forward)
        cfg = model.config
        self.limit = None  # learned/sinusoidal tables end at max_positions
        if getattr(cfg, "positions", None) in ("learned", "sinusoidal"):
            self.limit = cfg.max_positions - (
                cfg.pad_token_id + 1 if getattr(cfg, "positions_from_padding", False) else 0
            )

    def __call__(self, model: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        bound = self.signature.bind(*args, **kwargs)
        kw = dict(bound.arguments)
        kw.update(kw.pop("kwargs", {}))
        ids = kw["input_ids"]
        past = kw.get("past_key_values")
        past = 0 if past is None else past[0][0].shape[2]  # the caller's cache holds no prefix
        if self.limit is not None and past + ids.shape[1] + self.p > self.limit:
            raise LmlabError(
                f"{past + ids.shape[1]} tokens after a prefix of {self.p} exceed the model's "
                f"{self.limit} positions",
                f"truncate inputs to {self.limit - self.p} tokens (or use fewer virtual tokens)",
            )
        pos = kw.get("position_ids")
        if pos is None:
            if model.architecture == "encoder":
                pos = model.embeddings.position_ids(ids)
                if model.config.positions_from_padding:  # padding keeps its position
                    kw["position_ids"] = pos + self.p * (ids != model.config.pad_token_id).long()
                    return (), kw
            else:
                pos = torch.arange(past, past + ids.shape[1], device=ids.device)[None]
        kw["position_ids"] = pos + self.p
        return (), kw


@typed_options("prefix")
def apply_prefix(
    model: nn.Module,
    num_virtual_tokens: int = 20,
    reparameterize: bool = False,
    hidden: int = 512,
    init: str = "vocab",
    seed: int = 0,
    train_head: bool = True,
    positions: str = "from_start",
) -> None:
    """Freeze ``model`` and give every self-attention a trainable prefix of ``num_virtual_tokens``
    key/value vectors (in place); the :class:`PrefixEncoder` is ``model.prefix_encoder``."""
    # the arguments' kinds and ranges: @typed_options (lmlab.adapt.options), as apply_method's
    if positions == "after_prefix" and getattr(model, "architecture", "") not in ("encoder", "decoder"):
        raise LmlabError(
            "positions=after_prefix is for encoders and decoders",
            "use positions=from_start with an encoder-decoder",
        )
    blocks = [b for _, b in transformer_blocks(model)]
    attn = blocks[0].attn
    d_model = attn.q_proj.in_features
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG
        torch.manual_seed(seed)
        enc = PrefixEncoder(
            len(blocks), attn.n_kv_heads, attn.head_dim, num_virtual_tokens, d_model, reparameterize, hidden
        ).to(attn.k_proj.weight.device, attn.k_proj.weight.dtype)
    if init == "vocab" and not reparameterize:
        with torch.no_grad():
            enc.prefix.copy_(_real_token_kv(model, blocks, num_virtual_tokens, seed))
    freeze_base(model)
    model.prefix_encoder = enc
    for i, block in enumerate(blocks):
        block.attn = PrefixAttention(block.attn, enc, i)
    if positions == "after_prefix":  # a callable object, not a closure: copy.deepcopy(model) stays right
        model.register_forward_pre_hook(_PositionsAfterPrefix(model, num_virtual_tokens), with_kwargs=True)
    unfreeze_task_heads(model, train_head)


@torch.no_grad()
def _real_token_kv(model: nn.Module, blocks: list[nn.Module], n: int, seed: int) -> Tensor:
    """Keys/values ``[L, 2, H_kv, n, D]`` the frozen model computes in each block for ``n`` tokens
    drawn from the vocabulary (the ids above the first 1000, where specials live, when there are
    enough), run as one sequence."""
    vocab = model.config.vocab_size
    low = 1000 if vocab > 2000 else min(10, vocab - 1)
    g = torch.Generator().manual_seed(seed)
    device = blocks[0].attn.k_proj.weight.device
    ids = torch.randint(low, vocab, (1, n), generator=g).to(device)
    inputs: dict[int, Tensor] = {}
    hooks = [
        b.register_forward_pre_hook(lambda m, args, i=i: inputs.setdefault(i, args[0]))
        for i, b in enumerate(blocks)
    ]
    was_training = model.training
    model.eval()
    try:
        if getattr(model, "architecture", "") == "seq2seq":
            model(input_ids=ids, decoder_input_ids=ids)
        else:
            model(ids)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    out = []
    for i, b in enumerate(blocks):
        x = inputs[i]
        h = b.attn_norm(x) if b.prenorm else x
        a = b.attn
        out.append(
            torch.stack((a._heads(a.k_proj(h), a.n_kv_heads)[0], a._heads(a.v_proj(h), a.n_kv_heads)[0]))
        )
    return torch.stack(out)
