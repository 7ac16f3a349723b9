"""Position encodings: :class:`SinusoidalPositions`, :class:`RelativePositionBias` (T5 buckets,
Raffel et al. 2020) and :class:`RotaryEmbedding` (RoPE, Su et al. 2021). Learned absolute
positions are a plain ``nn.Embedding``."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal positions (Vaswani et al. 2017): ``PE[p, 2i] = sin(p / 10000^(2i/d))``,
    ``PE[p, 2i+1] = cos(...)``. Not a parameter; ``forward(position_ids) -> [.., d]``."""

    def __init__(self, max_positions: int, dim: int, base: float = 10000.0):
        super().__init__()
        pos = torch.arange(max_positions, dtype=torch.float32)[:, None]
        inv = torch.exp(-math.log(base) * torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        table = torch.zeros(max_positions, dim)
        table[:, 0::2] = torch.sin(pos * inv)
        table[:, 1::2] = torch.cos(pos * inv)[:, : dim // 2]
        self.register_buffer("table", table, persistent=False)

    def forward(self, position_ids: Tensor) -> Tensor:
        return self.table[position_ids]


class RotaryEmbedding(nn.Module):
    """Rotary position embedding, RoPE (Su et al. 2021), in the "rotate half" layout of Llama.

    Pairs ``(x_i, x_{i+D/2})`` of each query and key are rotated by the angle ``p·θ_i`` with
    ``θ_i = base^(-2i/D)``, so ``q_p·k_r`` depends only on ``p - r``. ``forward(position_ids)``
    returns ``(cos, sin)`` of shape ``[B|1, T, D]``; :func:`apply_rotary` applies them.
    """

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        if position_ids.dim() == 1:
            position_ids = position_ids[None]
        freqs = position_ids[..., None].float() * self.inv_freq  # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` ``[B, H, T, D]`` by the angles in ``cos``/``sin`` ``[B|1, T, D]``."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    return x * cos + rotate_half(x) * sin


def relative_position_bucket(
    relative_position: Tensor, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """T5's bucketing of ``key_pos - query_pos`` (Raffel et al. 2020, appendix / mesh-tensorflow).

    Half the buckets (per direction when bidirectional) hold exact small distances; the rest
    cover distances up to ``max_distance`` logarithmically; longer distances share the last bucket.
    Decoders (``bidirectional=False``) only look back, so future offsets all map to bucket 0.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


class RelativePositionBias(nn.Module):
    """T5 relative attention bias: one learned scalar per (bucket, head), added to the logits.

    ``forward(q_len, k_len)`` returns ``[1, H, T, S]``; with a KV cache pass ``q_offset`` = number
    of past positions so the new queries get their true positions.
    """

    def __init__(
        self, n_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True
    ):
        super().__init__()
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.embedding = nn.Embedding(num_buckets, n_heads)

    def forward(self, q_len: int, k_len: int, q_offset: int = 0, device=None) -> Tensor:
        device = device or self.embedding.weight.device
        q = torch.arange(q_offset, q_offset + q_len, device=device)[:, None]
        k = torch.arange(k_len, device=device)[None, :]
        buckets = relative_position_bucket(k - q, self.bidirectional, self.num_buckets, self.max_distance)
        # contiguous: every layer adds it to its scores, and a broadcast add reading the strided
        # permuted view was three times slower than this one copy
        return self.embedding(buckets).permute(2, 0, 1).contiguous()[None]
