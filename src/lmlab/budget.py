"""One memory budget for every command: sizes are checked before anything is allocated.

A size a user gives (``--num-samples``, a config's ``max_position_embeddings``, a sentinel count,
a batch) or that a file gives (a line of a compressed file, a resume state's data position, a FLOPs
budget) decides how much a command allocates or how long a loop runs. Every command therefore
estimates, from those sizes alone, the memory its big allocations will take (elements x bytes per
element: samples x length x vocabulary for logits, positions x width for an embedding table) and
refuses, in one line, what cannot fit on this machine, before allocating anything:

    error: generating 1,000,000 sequence(s) of up to 1,000 new tokens would need about 1.04 TB,
    more than this machine's 25.3 GB of memory; generate fewer samples or beams at once ...

The estimates are coarse (the largest tensors, not every temporary): they catch the request that
can never fit, not the one that fits with little room left, which PyTorch still reports itself.

What "this machine" has is :func:`available_bytes`: the physical memory, or the cgroup memory
limit when the process runs in a smaller container, or a CUDA device's memory when the tensors
live there. Loops whose length comes from a file are bounded by the constants below, and
text lines are read with at most :data:`MAX_LINE_CHARS` characters each.

This module imports nothing from lmlab but :mod:`lmlab.errors` and :mod:`lmlab.runtime`, so every
layer may use it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from lmlab.errors import LmlabError

__all__ = [
    "FLOAT32",
    "MAX_EPOCHS",
    "MAX_LINE_CHARS",
    "MAX_SPECIAL_TOKENS",
    "MAX_STEPS",
    "TOKEN_TABLE_BYTES",
    "activation_bytes",
    "available_bytes",
    "cap_workers",
    "describe_bytes",
    "physical_memory_bytes",
    "require_fits",
    "require_special_tokens_fit",
    "require_weights_fit",
    "tensor_bytes",
]

#: bytes per float32 element
FLOAT32 = 4
#: the longest text line lmlab reads (characters): a file without line breaks, or a compressed
#: file that expands without end, is refused at this length instead of filling the memory
MAX_LINE_CHARS = 1 << 28
#: the most optimizer steps a planned run may take (years of training on any machine)
MAX_STEPS = 10**9
#: the most passes over its training data a run's data position may stand for
MAX_EPOCHS = 10**6
#: rough memory of one activation per token, per layer and width unit (the trainer's estimate)
ACTIVATION_FLOATS = 20
#: rough memory of one token in a tokenizer's tables (its text and two dictionary entries)
TOKEN_TABLE_BYTES = 200
#: the most special tokens a tokenizer lmlab builds may hold: it splits every text on all of them
#: with one pattern, whose building grows with their number (10,000: seconds; 1,000,000: hours)
MAX_SPECIAL_TOKENS = 10_000


#: where cgroup v2 and v1 say how much memory this process's container may use
CGROUP_MEMORY_FILES = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def _cgroup_memory_limit(files=CGROUP_MEMORY_FILES) -> int | None:
    """The memory limit of this process's cgroup (v2 ``memory.max``, v1 ``limit_in_bytes``)."""
    for path in files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # v1 writes a huge number for "no limit"
            return int(text)
    return None


def physical_memory_bytes() -> int | None:
    """This machine's memory, or the cgroup's limit when that is smaller; None when unknown."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = None
    limit = _cgroup_memory_limit()
    if total is None or (limit is not None and limit < total):
        return limit
    return total


def _device_memory_bytes(device) -> int | None:
    import torch

    try:
        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    except (RuntimeError, AssertionError, ValueError):
        return None


def _is_cuda(device) -> bool:
    return device is not None and str(device).startswith("cuda")


def available_bytes(device=None) -> int | None:
    """Memory the budget allows: the CUDA device's memory for a ``cuda`` device, else the machine's
    (:func:`physical_memory_bytes`). None when it cannot be known (then nothing is refused)."""
    if _is_cuda(device):
        return _device_memory_bytes(device)
    return physical_memory_bytes()


def describe_bytes(n: float) -> str:
    """``n`` bytes for a person: ``512 B``, ``51.2 GB``, ``2.5 TB``, ``3e+290 TB`` (powers of 1000)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            value = n / size
            return f"{value:.3g} {unit}" if value < 1e6 else f"{value:.2g} {unit}"
    return f"{int(n)} B"


def tensor_bytes(*shape: int, itemsize: int = FLOAT32) -> int:
    """Bytes of a tensor of ``shape`` with ``itemsize``-byte elements (Python integers: no overflow)."""
    return math.prod(int(n) for n in shape) * itemsize


def activation_bytes(tokens: int, vocab: int, width: int, layers: int) -> int:
    """Coarse memory of one training micro-batch of ``tokens`` tokens: the logits and their gradient
    (``2 x vocab`` floats per token) plus about :data:`ACTIVATION_FLOATS` floats per token, layer
    and width unit kept for the backward pass."""
    return tensor_bytes(tokens, 2 * vocab + ACTIVATION_FLOATS * width * layers)


def require_fits(nbytes: float, what: str, fix: str, device=None) -> None:
    """Refuse ``what`` (a phrase: "sampling 10 continuations of 50 tokens") when its estimated
    ``nbytes`` exceed :func:`available_bytes`: a one-line :class:`LmlabError` naming both sizes
    and ``fix``. Call it before allocating."""
    total = available_bytes(device)
    if total is None or nbytes <= total:
        return
    where = "this GPU's" if _is_cuda(device) else "this machine's"
    raise LmlabError(f"{what} would need about {describe_bytes(nbytes)}, more than {where} "
                     f"{describe_bytes(total)} of memory", fix)


def require_special_tokens_fit(n: int, what: str, fix: str, row_bytes: int = 0) -> None:
    """Refuse, before any token list is made, ``n`` special tokens to add (T5 sentinels, ``what``:
    "1,000 sentinel tokens") that cannot fit: each is a tokenizer entry (:data:`TOKEN_TABLE_BYTES`)
    plus, for a model, ``row_bytes`` of its embedding and output tables; and a tokenizer takes at
    most :data:`MAX_SPECIAL_TOKENS` of them."""
    require_fits(n * (TOKEN_TABLE_BYTES + row_bytes), what, fix)
    if n > MAX_SPECIAL_TOKENS:
        raise LmlabError(f"{what}: more than the {MAX_SPECIAL_TOKENS:,} special tokens a tokenizer takes "
                         "(it splits every text on one pattern of them all, slower to build the more "
                         "there are)", fix)


def require_weights_fit(n_parameters: int, family: str, fix: str, device=None) -> None:
    """Refuse a model whose float32 weights alone, ``n_parameters`` of them, exceed the memory."""
    require_fits(tensor_bytes(n_parameters), f"a {family} model of this config (about {n_parameters:.3g} "
                 "parameters in float32)", fix, device)


def cap_workers(requested: int, flag: str = "--workers") -> tuple[int, str | None]:
    """``(workers, note)``: ``requested`` worker processes, or the CPUs this process may run on
    (:func:`lmlab.runtime.available_cpus`) when those are fewer (more processes than CPUs only
    take memory: each holds its own copy of what it needs),
    with a note saying so; ``note`` is None when nothing was capped."""
    from lmlab.runtime import available_cpus

    cpus = available_cpus()
    if requested <= cpus:
        return requested, None
    return cpus, f"{flag} {requested:,} capped to this machine's {cpus} CPU{'s' if cpus != 1 else ''}"
