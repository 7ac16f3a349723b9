"""Parameter-efficient adaptation: train a few new parameters, keep the pretrained ones frozen.

Five methods (lecture "adapting pretrained models"), each applied to an lmlab Transformer *in
place* by :func:`apply_method`, without touching the model code (modules are wrapped or
replaced from outside, see each module):

* ``lora``    - :mod:`lmlab.adapt.lora`, low-rank updates ``W + (alpha/r)·B·A`` (Hu et al. 2021);
* ``adapter`` - :mod:`lmlab.adapt.adapters`, bottleneck adapters, ``kind="houlsby"`` (two per
  layer, Houlsby et al. 2019) or ``kind="pfeiffer"`` (one per layer, Pfeiffer et al. 2021);
* ``prefix``  - :mod:`lmlab.adapt.prefix`, trainable key/value prefixes in every self-attention
  (Li & Liang 2021);
* ``prompt``  - :mod:`lmlab.adapt.prompt`, trainable soft-prompt embeddings in the input
  (Lester et al. 2021);
* ``adamix``  - :mod:`lmlab.adapt.adamix`, a mixture of adapters per slot, one picked at random per
  training step, their weights averaged for inference (Wang et al. 2022).

After :func:`apply_method` only the method's parameters and the new task head (``seq_cls``,
``token_cls``, ``span``, ``cls`` and the pooler a ``seq_cls`` head reads) have
``requires_grad=True``; :func:`trainable_parameters` counts them. :mod:`lmlab.adapt.peft_io`
saves exactly those (safetensors + a JSON config) and puts them back on a base model.

>>> from lmlab.models import build_model, get_preset
>>> model = build_model(get_preset("bert-tiny", vocab_size=500), heads=("seq_cls",))
>>> opts = apply_method(model, "lora", {"rank": 4})
>>> n, total, share = trainable_parameters(model)
>>> n < total
True
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING, Any

from lmlab.arguments import describe, model_argument
from lmlab.errors import LmlabError
from lmlab.values import ListProblem, comma_list

if TYPE_CHECKING:  # torch is imported where a model is touched, so that METHODS costs nothing to read
    from torch import nn

#: method name -> "module:function"; the function is called as ``f(model, **options)``, changes
#: the model in place (freezing the base) and returns nothing. A new method is one module + one line.
METHODS: dict[str, str] = {
    "lora": "lmlab.adapt.lora:apply_lora",
    "adapter": "lmlab.adapt.adapters:apply_adapters",
    "prefix": "lmlab.adapt.prefix:apply_prefix",
    "prompt": "lmlab.adapt.prompt:apply_prompt",
    "adamix": "lmlab.adapt.adamix:apply_adamix",
}

#: heads a fine-tuning task adds (trained with the method); pretraining heads (mlm, lm, ...) stay frozen
TASK_HEADS = ("seq_cls", "token_cls", "span", "cls")

__all__ = [
    "METHODS",
    "TASK_HEADS",
    "apply_method",
    "method_function",
    "resolve_options",
    "trainable_parameters",
    "transformer_blocks",
]


def method_function(method: str):
    """The function that applies ``method`` (see :data:`METHODS`)."""
    if method not in METHODS:
        raise LmlabError(f"unknown adaptation method {method!r}", f"choose one of: {', '.join(METHODS)}")
    module, attr = METHODS[method].split(":")
    return getattr(importlib.import_module(module), attr)


def resolve_options(method: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``options`` completed with the method's defaults, strings (from the command line) converted
    to the default's type; an unknown option is a one-line LmlabError listing the known ones."""
    fn = method_function(method)
    params = {k: p for k, p in inspect.signature(fn).parameters.items() if k != "model"}
    options = dict(options or {})
    unknown = sorted(set(options) - set(params))
    if unknown:
        known = ", ".join(f"{k}={p.default!r}" for k, p in params.items())
        raise LmlabError(f"{method} has no options {unknown}", f"known options (defaults): {known}")
    resolved = {}
    for name, p in params.items():
        value = options.get(name, p.default)
        resolved[name] = _coerce(method, name, value, p.default)
    return resolved


def _coerce(method: str, name: str, value: Any, default: Any) -> Any:
    """Convert a command-line string to the type of ``default`` (int, float, bool, tuple of str)."""
    if isinstance(value, tuple):
        return list(value)  # JSON-friendly
    if not isinstance(value, str) or isinstance(default, str):
        return value
    if default is None:  # "auto" options: guess the type from the text
        return _guess(value)
    try:
        if isinstance(default, bool):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
        if isinstance(default, (tuple, list)):
            return comma_list(value)
    except ListProblem as e:
        raise LmlabError(f"{method} option {name}={value!r} {e}", f"give e.g. {name}=a,b") from None
    except ValueError:
        raise LmlabError(
            f"{method} option {name}={value!r} is not a {type(default).__name__}",
            f"give e.g. {name}={default!r}",
        ) from None
    return value


def _guess(text: str) -> Any:
    if text.lower() in ("true", "false", "yes", "no"):
        return text.lower() in ("true", "yes")
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def apply_method(model: nn.Module, method: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Apply ``method`` to ``model`` in place; return the resolved options (recorded on the model
    as ``model.peft = {"method": ..., "options": ...}`` for :mod:`lmlab.adapt.peft_io`)."""
    model = model_argument(model, "apply_method's model")
    if options is not None and not isinstance(options, dict):
        raise LmlabError(f"apply_method's options must be a dict, got {describe(options)}",
                         "pass e.g. {\"r\": 8}")
    if getattr(model, "peft", None):
        raise LmlabError(
            f"this model already has {model.peft['method']} applied", "apply one method to a fresh base model"
        )
    if not transformer_blocks(model):
        raise LmlabError(
            f"{type(model).__name__} has no Transformer blocks to adapt",
            "use an encoder, decoder or encoder-decoder Transformer (not an RNN)",
        )
    resolved = resolve_options(method, options)
    method_function(method)(model, **resolved)
    model.peft = {"method": method, "options": resolved}
    return resolved


def trainable_parameters(model: nn.Module) -> tuple[int, int, float]:
    """``(n_trainable, n_total, share)``: distinct parameters (tied ones once), method included."""
    model = model_argument(model, "trainable_parameters' model")
    params = list(model.parameters())  # de-duplicated by identity
    n_total = sum(p.numel() for p in params)
    n_trainable = sum(p.numel() for p in params if p.requires_grad)
    return n_trainable, n_total, (n_trainable / n_total if n_total else 0.0)


def transformer_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(qualified name, block)`` of every distinct :class:`TransformerBlock` in ``model``."""
    from lmlab.models.blocks import TransformerBlock

    return [(n, m) for n, m in model.named_modules() if isinstance(m, TransformerBlock)]


def freeze_base(model: nn.Module) -> None:
    """Turn off gradients for every parameter the model has now (the method adds its own later)."""
    for p in model.parameters():
        p.requires_grad_(False)


def unfreeze_task_heads(model: nn.Module, train_head: bool = True) -> list[str]:
    """Make the new task heads trainable (and BERT's pooler when a ``seq_cls`` head reads it).

    Parameters shared with the body (tied embeddings) stay frozen. Returns the module names.
    """
    from torch import nn

    if not train_head:
        return []
    heads = getattr(model, "heads", None)
    names = [n for n in TASK_HEADS if isinstance(heads, nn.ModuleDict) and n in heads]
    modules = [(f"heads.{n}", heads[n]) for n in names]
    if "seq_cls" in names and getattr(model, "pooler", None) is not None and heads["seq_cls"].dense is None:
        modules.append(("pooler", model.pooler))
    body = {id(p) for n, p in model.named_parameters() if not n.startswith(("heads.", "pooler."))}
    for _, module in modules:
        for p in module.parameters():
            if id(p) not in body:
                p.requires_grad_(True)
    return [n for n, _ in modules]
