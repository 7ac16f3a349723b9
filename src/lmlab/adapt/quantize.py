"""int8 quantization of linear layers: 4x smaller weights, integer matmuls on the CPU.

Scheme (symmetric, per output channel; Jacob et al. 2018, "Quantization and Training of Neural
Networks for Efficient Integer-Arithmetic-Only Inference"; Dettmers et al. 2022, "LLM.int8()"
for the vector-wise scales). For each row ``i`` of a weight ``W`` (``d_out × d_in``)::

    s_i = max_j |W_ij| / 127          q_ij = round(W_ij / s_i)  in [-127, 127]  (int8)
    W_ij ≈ s_i · q_ij                 |W_ij - s_i·q_ij| <= s_i / 2

so a weight costs 1 byte plus one float32 scale per row, instead of 4 bytes (~4x smaller for
``d_in`` in the hundreds). A row of zeros (a pruned neuron) gets scale 1 and stays exactly zero.

Two ways to run the layer (:class:`Int8Linear`):

* ``activations="dynamic"`` (default): each input row (token) is quantized on the fly the same
  way, ``x_t ≈ a_t · p_t`` with ``a_t = max|x_t| / 127``; the product of the two int8 matrices is
  accumulated exactly in int32 (``torch._int_mm``, AVX-512 VNNI / AMX kernels on x86) and rescaled:
  ``y_ti = a_t · s_i · Σ_j p_tj q_ij + b_i``. Faster than float32 on CPUs with int8 dot products.
* ``activations="none"`` (weight-only): ``y = x · (s ⊙ q)ᵀ + b`` with the weight dequantized to
  the input's dtype at each call; saves memory and disk, not time, on a CPU.

Why not a library: ``torch.ao.quantization`` is deprecated; torchao 0.18.0 (checked with torch
2.13.0 on this CPU) runs ``Int8WeightOnlyConfig`` / ``Int8DynamicActivationInt8WeightConfig``, but
its tensor-subclass weights cannot be written with safetensors and both modes ran slower than
float32 here (0.22 s and 0.26 s vs 0.20 s for a 384->1536->384 MLP on 2048 tokens), while
``torch._int_mm`` ran the int8 product of that size ~7x faster than the float32 one.

Checkpoints (:func:`save_quantized`) are ordinary lmlab checkpoint directories whose
``model.safetensors`` holds ``<layer>.qweight`` (int8) and ``<layer>.scale`` (float32) for each
quantized layer and float tensors for the rest; ``config.json`` records which layers under
``"quantization"``. :func:`load_quantized` (and ``lmlab.loading.load_model``) reads them back.
Quantized layers are for inference: they have no trainable weight.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmlab.arguments import model_argument, path_argument, text_list_argument, tokenizer_argument
from lmlab.errors import LmlabError

ACTIVATION_MODES = ("dynamic", "none")
SCHEME = "int8-symmetric-per-channel"
QMAX = 127


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 quantization of each row of ``x`` (``[..., d]``): ``(q int8, scale float32 [...])``.

    ``x ≈ q * scale[..., None]`` with ``|x - q·scale| <= scale / 2`` element-wise; all-zero rows
    get scale 1 (and quantize to zeros).
    """
    x = x.float()
    amax = x.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    q = torch.round(x / scale.unsqueeze(-1)).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def dequantize_rows(q: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """``q * scale`` row by row, as ``dtype``."""
    return (q.to(torch.float32) * scale.unsqueeze(-1)).to(dtype)


def int8_matmul(q_x: Tensor, q_w: Tensor) -> Tensor:
    """Exact int32 product ``q_x @ q_wᵀ`` of int8 ``[M, K]`` and ``[N, K]`` matrices.

    ``torch._int_mm`` when the device supports the shapes (any shape on CPU); otherwise the same
    sums in float64, exact for the magnitudes int8 products reach (< 2^53).
    """
    try:
        return torch._int_mm(q_x, q_w.t())
    except (RuntimeError, AttributeError):
        return (q_x.double() @ q_w.double().t()).round().to(torch.int32)


class Int8Linear(nn.Module):
    """A linear layer with int8 weights (``qweight``) and one float32 scale per output (``scale``).

    ``bias`` stays float32. ``activations``: ``"dynamic"`` (int8 x int8 matmul with per-token
    activation scales) or ``"none"`` (dequantize the weight, float matmul); see the module doc.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activations: str = "dynamic"):
        super().__init__()
        check_activations(activations)
        self.in_features, self.out_features, self.activations = in_features, out_features, activations
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(out_features))
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, activations: str = "dynamic") -> Int8Linear:
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, activations)
        q, scale = quantize_rows(linear.weight.detach())
        layer.qweight.copy_(q)
        layer.scale.copy_(scale)
        if linear.bias is not None:
            layer.bias.data.copy_(linear.bias.detach().float())
        return layer.to(linear.weight.device)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return dequantize_rows(self.qweight, self.scale, dtype)

    def forward(self, x: Tensor) -> Tensor:
        if self.activations == "none":
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return F.linear(x, self.dequantized_weight(x.dtype), bias)
        shape = x.shape
        q_x, a = quantize_rows(x.reshape(-1, shape[-1]))
        acc = int8_matmul(q_x, self.qweight)
        y = acc.to(torch.float32) * a.unsqueeze(-1) * self.scale
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        return self.qweight.numel() + 4 * self.scale.numel()  # int8 values + float32 scales

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, bias={self.bias is not None}, "
                f"activations={self.activations!r}")


def check_activations(activations: str) -> None:
    if activations not in ACTIVATION_MODES:
        raise LmlabError(f"unknown activation quantization {activations!r}",
                         f"choose one of: {', '.join(ACTIVATION_MODES)}")


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def quantizable_linears(model: nn.Module, include=("*",), exclude=()) -> list[str]:
    """Names of the plain ``nn.Linear`` layers that :func:`quantize_model` would replace.

    Skipped: layers whose weight is shared with another module (a tied LM/MLM head, which stays
    with the float embedding table), subclasses such as an unmerged LoRA layer (merge it first),
    and names matching an ``exclude`` pattern (fnmatch, e.g. ``"heads.*"``).
    """
    owners: dict[int, int] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    names = []
    for name, m in model.named_modules():
        if type(m) is not nn.Linear or owners.get(id(m.weight), 0) > 1:
            continue
        if _matches(name, include) and not _matches(name, exclude):
            names.append(name)
    return names


def layer_patterns(names) -> str:
    """``layers.*.attn.q_proj, heads.cls.out``: linear layer names with their layer numbers as ``*``
    (each shape once, in model order): what a pattern can match, short enough for one line."""
    shown: list[str] = []
    for name in names:
        general = re.sub(r"(?<=\.)\d+(?=\.|$)", "*", name)
        if general not in shown:
            shown.append(general)
    return ", ".join(shown)


def linears_to_quantize(model: nn.Module, include=("*",), exclude=(),
                        flags=("include", "exclude")) -> list[str]:
    """The linear layers :func:`quantize_model` replaces (:func:`quantizable_linears`), the patterns
    checked first: an ``include`` or ``exclude`` pattern that matches no quantizable layer (a typo,
    silently quantizing everything) and patterns that leave nothing to quantize are refused in one
    line listing the layers there are (``flags``: how the caller names the two settings; the command
    line has only ``--exclude``). The one check of ``lmlab compress quantize`` (before it says what
    it does) and of the Python call. A bare string is refused, not read as one pattern per character
    (:func:`lmlab.arguments.text_list_argument`)."""
    include, exclude = text_list_argument(include, flags[0]), text_list_argument(exclude, flags[1])
    every = quantizable_linears(model)
    if not every:
        raise LmlabError("this model has no untied linear layer to quantize",
                         "quantize a model with linear layers of its own (a tied head stays float)")
    listed = layer_patterns(every)
    for patterns, flag in zip((include, exclude), flags):
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(name, pattern) for name in every):
                raise LmlabError(f"{flag} {pattern!r} matches no linear layer of this model",
                                 f"use a pattern over its linear layers: {listed}")
    names = quantizable_linears(model, include, exclude)
    if not names:
        given = [f"{flags[0]} {p!r}" for p in include if tuple(include) != ("*",)]  # not the default
        given += [f"{flags[1]} {p!r}" for p in exclude]
        raise LmlabError(f"{' '.join(given)} {'leaves' if len(given) == 1 else 'leave'} no linear layer to "
                         "quantize",
                         f"exclude fewer of its linear layers: {listed}")
    return names


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


@torch.no_grad()
def quantize_model(model: nn.Module, activations: str = "dynamic", include=("*",), exclude=()) -> list[str]:
    """Replace the linear layers of ``model`` by :class:`Int8Linear` in place; return their names.

    ``include``/``exclude``: fnmatch patterns over module names (default: every untied linear
    layer, task heads included). The model is put in eval mode; record of what was done is kept
    as ``model.quantization`` (saved by :func:`save_quantized`).
    """
    model = model_argument(model, "quantize_model's model")
    check_activations(activations)
    if getattr(model, "quantization", None):
        raise LmlabError("this model is already quantized", "quantize the float model once")
    names = linears_to_quantize(model, include, exclude, flags=("quantize_model's include",
                                                                "quantize_model's exclude"))
    for name in names:
        _set_module(model, name, Int8Linear.from_linear(model.get_submodule(name), activations))
    model.quantization = {"scheme": SCHEME, "activations": activations, "modules": names}
    model.eval()
    return list(names)


def linear_weight_bytes(model: nn.Module) -> int:
    """Bytes held by the weight matrices of the linear layers (float or int8 + scales); biases excluded."""
    model = model_argument(model, "linear_weight_bytes' model")
    total, seen = 0, set()
    for m in model.modules():
        if isinstance(m, Int8Linear):
            total += m.weight_bytes()
        elif isinstance(m, nn.Linear) and id(m.weight) not in seen:
            seen.add(id(m.weight))
            total += m.weight.numel() * m.weight.element_size()
    return total


# --------------------------------------------------------------------------- checkpoints


def save_quantized(model: nn.Module, directory: str | os.PathLike, tokenizer=None) -> Path:
    """Write a quantized lmlab model as a checkpoint directory (atomically; safetensors only)."""
    from safetensors.torch import save_file

    from lmlab.fileio import atomic_dir, write_json
    from lmlab.models.checkpoint import (
        CONFIG_NAME,
        FORMAT_VERSION,
        TOKENIZER_DIR,
        WEIGHTS_NAME,
        _unique_state,
        check_tokenizer,
    )

    model = model_argument(model, "save_quantized's model")
    directory = path_argument(directory, "save_quantized's directory")
    if tokenizer is not None:
        tokenizer_argument(tokenizer, "save_quantized's tokenizer")
    info = getattr(model, "quantization", None)
    if not info or not getattr(model, "architecture", ""):
        raise LmlabError(f"{type(model).__name__} is not a quantized lmlab model",
                         "run quantize_model(model) on a model built by lmlab.models first")
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    check_tokenizer(model.config, tokenizer)
    state, _ = _unique_state(model)
    meta = {"lmlab_format_version": FORMAT_VERSION, "architecture": model.architecture,
            "family": model.config.family, "heads": list(getattr(model, "head_names", ())),
            "config": model.config.to_dict(), "quantization": info}
    with atomic_dir(directory, marker=WEIGHTS_NAME, what="model") as tmp:
        save_file({k: v.cpu() for k, v in state.items()}, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        write_json(tmp / CONFIG_NAME, meta)
        if tokenizer is not None:
            tokenizer.save(tmp / TOKENIZER_DIR)
    return directory


def load_quantized(directory: str | os.PathLike, map_location="cpu") -> nn.Module:
    """Read a checkpoint written by :func:`save_quantized` (eval mode, tokenizer attached)."""
    from lmlab.fileio import read_json
    from lmlab.models import build_model
    from lmlab.models.checkpoint import CONFIG_NAME, TOKENIZER_DIR, WEIGHTS_NAME, load_state, read_safetensors
    from lmlab.models.config import config_from_dict

    directory = Path(directory)
    meta = read_json(directory / CONFIG_NAME, "model config")
    info = meta.get("quantization") if isinstance(meta, dict) else None
    ok = isinstance(info, dict) and info.get("scheme") == SCHEME and isinstance(info.get("modules"), list)
    if not ok:
        raise LmlabError(f"{directory} is not an int8 checkpoint written by lmlab (scheme {SCHEME})",
                         "quantize the model again with `lmlab compress quantize`")
    config_dict = dict(meta["config"])
    config_dict.setdefault("family", meta["family"])
    model = build_model(config_from_dict(config_dict), heads=meta.get("heads"),
                        architecture=meta["architecture"])
    missing = [n for n in info["modules"] if n not in quantizable_linears(model)]
    if missing:
        raise LmlabError(f"{directory}: quantized layers {missing[:3]} do not exist in the model",
                         "the config and weights come from different models; quantize again")
    quantize_model(model, info.get("activations", "dynamic"), include=info["modules"])
    load_state(model, read_safetensors(directory / WEIGHTS_NAME), str(directory))
    model.to(map_location)
    if (directory / TOKENIZER_DIR).is_dir():
        from lmlab.models.checkpoint import check_tokenizer
        from lmlab.tokenizers import load_tokenizer

        model.tokenizer = load_tokenizer(directory / TOKENIZER_DIR)
        check_tokenizer(model.config, model.tokenizer)
    return model.eval()
