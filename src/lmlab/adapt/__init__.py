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
    "check_options",
    "method_function",
    "resolve_options",
    "trainable_parameters",
    "transformer_blocks",
]


def option_defaults(method: str) -> dict[str, Any]:
    """Option name -> default of ``method``: its ``apply_*`` function's keyword parameters."""
    params = inspect.signature(method_function(method)).parameters
    return {k: p.default for k, p in params.items() if k != "model"}


def check_options(method: str, options: dict[str, Any], where: str = "") -> dict[str, Any]:
    """The options given, each name known and each value checked against its type and converted
    (:func:`lmlab.adapt.options.check_options`, the one home of the options' types); only those given."""
    from lmlab.adapt.options import check_options as check

    return check(method, dict(options), option_defaults(method), where)


def options_example(method: str) -> str:
    """A dict of options ``method`` takes, written out for a fix (``{"rank": 8}`` for LoRA): its
    first option at its default."""
    import json

    name, default = next(iter(option_defaults(method).items()))
    return "{" + f"{json.dumps(name)}: {json.dumps(default)}" + "}"


def resolve_options(method: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``options`` checked (:func:`check_options`) and completed with the method's defaults: the
    options a method is applied with, and that an adapter's config records."""
    given = check_options(method, dict(options or {}))
    resolved = {}
    for name, default in option_defaults(method).items():
        value = given.get(name, default)
        resolved[name] = list(value) if isinstance(value, tuple) else value
    return resolved


def method_function(method: str):
    """The function that applies ``method`` (see :data:`METHODS`)."""
    if method not in METHODS:
        raise LmlabError(f"unknown adaptation method {method!r}", f"choose one of: {', '.join(METHODS)}")
    module, attr = METHODS[method].split(":")
    return getattr(importlib.import_module(module), attr)


def apply_method(model: nn.Module, method: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Apply ``method`` to ``model`` in place; return the resolved options (recorded on the model
    as ``model.peft = {"method": ..., "options": ...}`` for :mod:`lmlab.adapt.peft_io`)."""
    model = model_argument(model, "apply_method's model")
    if options is not None and not isinstance(options, dict):
        raise LmlabError(f"apply_method's options must be a dict, got {describe(options)}",
                         f"pass a dict of option -> value, e.g. {options_example(method)}")
    if getattr(model, "peft", None):
        raise LmlabError(
            f"this model already has {model.peft['method']} applied", "apply one method to a fresh base model"
        )
    if not transformer_blocks(model):
        raise LmlabError(
            f"{type(model).__name__} has no Transformer blocks to adapt",
            "use an encoder, decoder or encoder-decoder Transformer (not an RNN)",
        )
    from lmlab.adapt.options import check_positions

    resolved = resolve_options(method, options)
    check_positions(method, resolved, model.config)  # virtual tokens that fit: before the model changes
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
