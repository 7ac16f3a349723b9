"""Dropout with a cheaper random mask on the CPU (the same distribution as ``torch.nn.Dropout``).

``torch.nn.functional.dropout`` on the CPU draws a float Bernoulli tensor (``bernoulli_``: one
random number per element written as a float, then divided by ``1 - p``) and multiplies by it;
in a T5 training step with the default ``dropout_rate=0.1`` those draws were 14% of the step.
Here each element gets 32 random bits from the default generator (one 64-bit draw serves two
elements); read as a signed integer ``u`` it is kept when ``u < (1 - p)·2³² - 2³¹``, a test done
as ``clamp(threshold - u, 0, 1)`` in float32 (exactly 0 or 1: ``u`` is an integer), because
float kernels are vectorised and comparisons into a bool tensor are not. The keep probability is
``1 - p`` to within 2⁻²⁴ (float32 rounding of ``u`` near the threshold). The mask is a float
tensor of ``0`` and ``1 / (1 - p)``, saved for the backward pass as PyTorch's own mask is.

Same seed, same masks (``torch.manual_seed`` drives the generator), but not the same masks as
``nn.Dropout`` draws: the stream is used differently. Off the CPU (CUDA has a fused dropout
kernel), for other dtypes than float32, in eval mode, at ``p = 0`` or ``p = 1`` it is exactly
``torch.nn.functional.dropout``. Under ``torch.compile`` the mask is an opaque operator
(``lmlab::scaled_keep_mask``: no graph break) that runs this same code, so compiled training
draws the masks eager training would.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_TWO_32 = 2**32


#: elements per slice of the fast path: random words + mask slice + output slice stay in L2
CHUNK = 1 << 17


def scaled_keep_mask(shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype = torch.float32,
                     device: torch.device | str = "cpu") -> Tensor:
    """A tensor of ``shape``: ``1 / (1 - p)`` with probability ``1 - p``, else 0, independently."""
    n = math.prod(shape)
    mask = torch.empty(n, dtype=torch.float32, device=device)
    _fill_masks(mask, None, None, None, p)
    return mask.view(shape).to(dtype)


def _fill_masks(
    mask: Tensor, x: Tensor | None, out: Tensor | None, residual: Tensor | None, p: float
) -> None:
    """Fill flat float32 ``mask`` slice by slice (:data:`CHUNK`) and, given ``x``, write
    ``[residual +] x · mask`` into ``out`` while the slice is still in the cache."""
    n = mask.numel()
    words = torch.empty((min(n, CHUNK) + 1) // 2, dtype=torch.int64, device=mask.device)
    threshold, scale = float(round((1.0 - p) * _TWO_32) - 2**31), 1.0 / (1.0 - p)
    for start in range(0, n, CHUNK):
        stop = min(start + CHUNK, n)
        bits = words[: (stop - start + 1) // 2].random_(-(2**63), None).view(torch.int32)[: stop - start]
        seg = mask[start:stop]
        seg.copy_(bits)  # uniform integers in [-2^31, 2^31), exact in float32 up to rounding
        seg.neg_().add_(threshold).clamp_(0.0, 1.0).mul_(scale)  # 1 where bits < threshold, else 0
        if x is None:
            continue
        if residual is None:
            torch.mul(x[start:stop], seg, out=out[start:stop])
        else:
            torch.addcmul(residual[start:stop], x[start:stop], seg, out=out[start:stop])


class _Dropout(torch.autograd.Function):
    """``[residual +] x · mask`` with the mask drawn in the forward pass and saved for the backward."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float, residual: Tensor | None) -> Tensor:
        flat = x.contiguous().view(-1)
        mask, out = torch.empty_like(flat), torch.empty_like(flat)
        res = None if residual is None else residual.contiguous().view(-1)
        _fill_masks(mask, flat, out, res, p)
        ctx.save_for_backward(mask)
        ctx.has_residual = residual is not None
        return out.view(x.shape)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (mask,) = ctx.saved_tensors
        return grad * mask.view(grad.shape), None, (grad if ctx.has_residual else None)


def _fast(x: Tensor, p: float) -> bool:
    keep = round((1.0 - p) * _TWO_32)
    return x.device.type == "cpu" and 0 < keep < _TWO_32 and x.dtype == torch.float32


@torch.library.custom_op("lmlab::scaled_keep_mask", mutates_args=())
def _mask_op(like: Tensor, p: float) -> Tensor:
    """:func:`scaled_keep_mask` as an opaque operator for torch.compile: no graph break, and the
    compiled step runs this very code, so it draws the masks eager training would."""
    return scaled_keep_mask(like.shape, p, like.dtype, like.device)


@_mask_op.register_fake
def _(like: Tensor, p: float) -> Tensor:
    return torch.empty(like.shape, dtype=like.dtype, device=like.device)


def _apply(x: Tensor, p: float, residual: Tensor | None) -> Tensor:
    if torch.compiler.is_compiling():
        mask = _mask_op(x.detach(), p)
        return x * mask if residual is None else residual + x * mask
    return _Dropout.apply(x, p, residual)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``torch.nn.functional.dropout(x, p, training)`` with the cheaper CPU mask of this module."""
    if not training or p <= 0.0:
        return x
    if not _fast(x, p):
        return F.dropout(x, p, training)
    return _apply(x, p, None)


def add_dropout(residual: Tensor, x: Tensor, p: float, training: bool = True) -> Tensor:
    """``residual + dropout(x, p, training)``, in one pass over the tensors on the fast path."""
    if not training or p <= 0.0:
        return residual + x
    if not _fast(x, p) or residual.shape != x.shape or residual.dtype != x.dtype:
        return residual + dropout(x, p, training)
    return _apply(x, p, residual)


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same ``p``, same place in ``model.modules()``) drawing its mask as
    :func:`dropout` does; code that finds dropout layers by ``isinstance(m, nn.Dropout)`` still
    does. :meth:`add_to` is ``residual + self(x)`` in one pass."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)

    def add_to(self, residual: Tensor, x: Tensor) -> Tensor:
        if self.inplace:
            return residual + super().forward(x)
        return add_dropout(residual, x, self.p, self.training)
