"""Dropout with a cheaper random mask on the CPU (the distribution of ``torch.nn.Dropout``).

``torch.nn.functional.dropout`` on the CPU draws a float Bernoulli tensor (``bernoulli_``: one
Mersenne-Twister number per element, written as a float) and multiplies by it; in a T5 training
step with the default ``dropout_rate=0.1`` those draws were 14% of the step. Here each call takes
one 64-bit seed from PyTorch's default generator, then the SFC64 generator (several times faster
than the Mersenne Twister) gives 16 random bits per element; an element is kept when its bits are
below ``round((1 - p)·2¹⁶)``, so the keep probability is ``1 - p`` to within 2⁻¹⁷. The mask saved
for the backward pass is a ``bool`` tensor (a quarter of the memory of PyTorch's float mask).

The work runs in a C kernel (``lmlab/native/dropout.c``, built on first use by
:mod:`lmlab.native`): the bits, the mask, the rescale and the residual add in one pass over the
tensor, the gradient in one more; that halved the dropout's share of a T5 step again. Where no C
compiler is available (or ``LMLAB_NATIVE=0``) the same masks and the same float32 values come from
NumPy (NumPy's SFC64 and vectorised loops, one pass per operation): a seed gives the same training
run either way.

Same seed, same masks (``torch.manual_seed`` drives the seeds), but not the masks ``nn.Dropout``
draws. The kernels run on one thread: with more than :data:`MAX_THREADS` intra-op threads, torch's
own multi-threaded ``F.dropout`` is faster and is used. Off the CPU (CUDA has a fused dropout
kernel), for other dtypes than float32, in eval mode, at ``p = 0`` or ``p = 1`` (or a ``p`` so
close to them that it rounds there) it is exactly ``torch.nn.functional.dropout``. Under
``torch.compile`` the mask is an opaque operator (``lmlab::scaled_keep_mask``: no graph break)
that draws it the same way, so compiled training uses the masks eager training would.
"""

from __future__ import annotations

import ctypes
import math
from functools import cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmlab import native

#: random bits per element: the keep probability is a multiple of 2^-BITS
BITS = 16
_LEVELS = 1 << BITS
#: above this many intra-op threads the single-threaded kernels lose to torch's dropout
MAX_THREADS = 4


def _threshold(p: float) -> int:
    return round((1.0 - p) * _LEVELS)


def _seed() -> int:
    """One 64-bit seed from PyTorch's default generator: ``torch.manual_seed`` decides the draws."""
    # read through NumPy (the tensor is on the host already), not int(), which the host-sync
    # checks count as a device read
    return int(torch.randint(0, 2**62, (1,), dtype=torch.int64).numpy()[0])


def _keep(n: int, p: float, seed: int | None = None) -> np.ndarray:
    """``n`` independent booleans, each True with probability ``round((1-p)·2¹⁶) / 2¹⁶``."""
    words = np.random.SFC64(_seed() if seed is None else seed).random_raw((n * BITS + 63) // 64)
    return np.less(words.view(np.uint16)[:n], _threshold(p))


@cache
def _kernels() -> ctypes.CDLL | None:
    """The C kernels with their signatures, or None (then the NumPy twin below)."""
    library = native.load("dropout")
    if library is not None:
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        library.lmlab_dropout_forward.argtypes = [ptr, ptr, ptr, ptr, i64, ptr, ctypes.c_uint32,
                                                  ctypes.c_float, ctypes.c_int]
        library.lmlab_dropout_forward.restype = None
        library.lmlab_dropout_backward.argtypes = [ptr, ptr, ptr, i64, ctypes.c_float]
        library.lmlab_dropout_backward.restype = None
    return library


def _forward(x: Tensor, p: float, residual: Tensor | None, relu: bool) -> tuple[Tensor, Tensor]:
    """``([residual +] x · keep / (1 - p), keep)`` for a float32 CPU ``x``; ``keep`` drawn with
    :func:`_keep`'s rule (and ``x > 0`` with ``relu``), in the C kernel or its NumPy twin."""
    flat = x.detach().contiguous().view(-1)
    res = None if residual is None else residual.detach().contiguous().view(-1)
    seed, scale = _seed(), 1.0 / (1.0 - p)
    library = _kernels()
    if library is None:
        values = flat.numpy()
        keep = _keep(values.size, p, seed)
        if relu:
            keep &= values > 0
        out = _scaled(values, keep, p, None if res is None else res.numpy())
        return torch.from_numpy(out), torch.from_numpy(keep)
    # the generator state NumPy derives from the seed: the kernel continues NumPy's very stream
    state = np.array(np.random.SFC64(seed).state["state"]["state"], dtype=np.uint64)
    out, keep = torch.empty_like(flat), torch.empty(flat.shape, dtype=torch.bool)
    library.lmlab_dropout_forward(flat.data_ptr(), None if res is None else res.data_ptr(),
                                  out.data_ptr(), keep.data_ptr(), flat.numel(), state.ctypes.data,
                                  _threshold(p), scale, int(relu))
    return out, keep


def _backward(grad: Tensor, keep: Tensor, p: float) -> Tensor:
    """``grad · keep / (1 - p)`` for a float32 CPU ``grad``."""
    flat = grad.contiguous().view(-1)
    library = _kernels()
    if library is None:
        return torch.from_numpy(_scaled(flat.numpy(), keep.numpy(), p))
    out = torch.empty_like(flat)
    library.lmlab_dropout_backward(flat.data_ptr(), keep.data_ptr(), out.data_ptr(), flat.numel(),
                                   1.0 / (1.0 - p))
    return out


def scaled_keep_mask(shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype = torch.float32,
                     device: torch.device | str = "cpu") -> Tensor:
    """A tensor of ``shape``: ``1 / (1 - p)`` with probability ``1 - p``, else 0, independently."""
    keep = _keep(math.prod(shape), p)
    mask = np.multiply(keep, np.float32(1.0 / (1.0 - p)), dtype=np.float32)
    return torch.from_numpy(mask).view(shape).to(device=device, dtype=dtype)


def _scaled(values: np.ndarray, keep: np.ndarray, p: float, residual: np.ndarray | None = None) -> np.ndarray:
    """``[residual +] values · keep / (1 - p)`` as float32, one NumPy pass per operation."""
    # mask first, then scale: a value so large that scaling overflows must still become 0 where it
    # is dropped (inf · 0 would be NaN); the mask as uint8, since NumPy's bool-operand loop is slower
    out = np.multiply(values, keep.view(np.uint8), dtype=np.float32)
    out *= np.float32(1.0 / (1.0 - p))
    if residual is not None:
        out += residual
    return out


class _Dropout(torch.autograd.Function):
    """``[residual +] x · mask`` with the mask drawn in the forward pass and saved (as bool) for
    the backward; with ``relu`` the mask also drops the elements ``x <= 0``, which makes it
    ``dropout(relu(x))`` (the same values and gradient) without the ReLU's own passes."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float, residual: Tensor | None, relu: bool = False) -> Tensor:
        out, keep = _forward(x, p, residual, relu)
        ctx.save_for_backward(keep)
        ctx.p, ctx.has_residual = p, residual is not None
        return out.view(x.shape)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (keep,) = ctx.saved_tensors
        if grad.requires_grad or grad.dtype != torch.float32:  # double backward: stay in autograd
            scaled = grad * keep.view(grad.shape) / (1.0 - ctx.p)
        else:
            scaled = _backward(grad, keep, ctx.p).view(grad.shape)
        return scaled, None, (grad if ctx.has_residual else None), None


def _fast(x: Tensor, p: float) -> bool:
    if not (x.device.type == "cpu" and x.dtype == torch.float32 and 0 < _threshold(p) < _LEVELS):
        return False
    # (torch.compile cannot trace get_num_threads: compiled steps always take the mask operator)
    return torch.compiler.is_compiling() or torch.get_num_threads() <= MAX_THREADS


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


def relu_dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``dropout(relu(x), p, training)``; on the fast path one mask does both (T5's FFN)."""
    if not training or p <= 0.0 or not _fast(x, p) or torch.compiler.is_compiling():
        return dropout(F.relu(x), p, training)
    return _Dropout.apply(x, p, None, True)


def add_dropout(residual: Tensor, x: Tensor, p: float, training: bool = True) -> Tensor:
    """``residual + dropout(x, p, training)``; on the fast path the add is part of the dropout's own
    pass (no separate torch op, no intermediate tensor for autograd)."""
    if not training or p <= 0.0:
        return residual + x
    if not _fast(x, p) or residual.shape != x.shape or residual.dtype != x.dtype:
        return residual + dropout(x, p, training)
    return _apply(x, p, residual)


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same ``p``, same place in ``model.modules()``) drawing its mask as
    :func:`dropout` does; code that finds dropout layers by ``isinstance(m, nn.Dropout)`` still
    does. :meth:`add_to` is ``residual + self(x)`` done by the dropout itself."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)

    def after_relu(self, x: Tensor) -> Tensor:
        """``self(relu(x))``, with the ReLU folded into the dropout mask on the fast path."""
        if self.inplace:
            return super().forward(F.relu(x))
        return relu_dropout(x, self.p, self.training)

    def add_to(self, residual: Tensor, x: Tensor) -> Tensor:
        if self.inplace:
            return residual + super().forward(x)
        return add_dropout(residual, x, self.p, self.training)
