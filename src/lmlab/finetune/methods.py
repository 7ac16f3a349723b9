"""Fine-tuning methods: ``METHODS`` maps ``--method NAME`` to the class that adapts the model.

A method is constructed as ``cls(**method_options)`` and then asked to

* ``apply(model, task) -> model``: wrap/freeze the model that already has its task head
  (trainable parameters are those with ``requires_grad``);
* ``snapshot(model)`` / ``restore(model, snap)``: keep and bring back the best weights;
* ``save(model, directory, tokenizer)``: write a directory that ``load(directory)`` (a
  classmethod) reads back; ``full`` uses the ordinary lmlab checkpoint and ``load_model``;
* optionally ``loss(task, model, batch)``: the training loss of one batch, used instead of
  ``task.loss(model, batch)`` (AdaMix: two stochastic passes and a consistency term).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab.errors import LmlabError
from lmlab.tasks import Task


class FullFineTuning:
    """Train every parameter of the model and its task head (the BERT/GPT recipe)."""

    name = "full"

    def __init__(self, **options):
        if options:  # the command line's --method-option is refused as text (method_options_from_text)
            raise LmlabError(f"method 'full' takes no options, got {sorted(options)}",
                             "pass no method_options (or choose a method that takes them: "
                             f"{', '.join(m for m in METHODS if m != 'full')})")

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        for p in model.parameters():
            p.requires_grad_(True)
        return model

    def snapshot(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    def restore(self, model: nn.Module, snap: dict[str, torch.Tensor]) -> None:
        model.load_state_dict(snap)

    def save(self, model: nn.Module, directory: Path, tokenizer) -> None:
        from lmlab.models import save_checkpoint

        save_checkpoint(model, directory, tokenizer=tokenizer)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> nn.Module:
        from lmlab.loading import load_model

        return load_model(directory)


#: method name -> class, or "module:Class" imported on first use; the parameter-efficient methods of
#: lmlab.adapt (see docs/peft.md) come after ``full``
METHODS: dict[str, Any] = {
    "full": FullFineTuning,
    "lora": "lmlab.adapt.peft_io:LoRAFineTuning",
    "adapter": "lmlab.adapt.peft_io:AdapterFineTuning",
    "prefix": "lmlab.adapt.peft_io:PrefixFineTuning",
    "prompt": "lmlab.adapt.peft_io:PromptFineTuning",
    "adamix": "lmlab.adapt.peft_io:AdaMixFineTuning",
}


def method_class(name: str):
    if name not in METHODS:
        raise LmlabError(f"unknown fine-tuning method {name!r}", f"choose one of: {', '.join(METHODS)}")
    target = METHODS[name]
    if isinstance(target, str):
        module, attr = target.split(":")
        target = getattr(importlib.import_module(module), attr)
    return target


def method_options_from_text(method: str, items: list[str]) -> dict[str, Any]:
    """The options of ``--method-option KEY=VALUE`` (repeatable) for ``method``, each read and checked
    against its type (:mod:`lmlab.adapt.options`, the one home of the options' types): only those
    given, converted (``rank=8`` -> ``{"rank": 8}``). An option given twice is refused."""
    from lmlab.adapt import check_options
    from lmlab.adapt.options import parse_option_items

    given = parse_option_items(items)
    if given and method_class(method) is FullFineTuning:
        raise LmlabError(f"method 'full' takes no options, got --method-option {' '.join(items)}",
                         "drop --method-option (or choose another --method)")
    if not given:
        return {}
    return check_options(method, given, "--method-option")
