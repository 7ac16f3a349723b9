"""Open any model directory lmlab reads or writes, with one call.

>>> from lmlab.loading import load_model
>>> model = load_model("runs/gpt/checkpoints/step_500")     # doctest: +SKIP

=====================================  ================================================
directory                              read by
=====================================  ================================================
lmlab checkpoint (float weights)       :func:`lmlab.models.load_checkpoint`
lmlab int8 checkpoint                  :func:`lmlab.adapt.quantize.load_quantized`
``lmlab finetune --method adapter``,   :func:`lmlab.adapt.peft_io.load_peft` on the
``prefix`` or ``prompt`` output        ``base/`` model
Hugging Face model directory           :func:`lmlab.interop.hf_import`
=====================================  ================================================

This module stands above ``models``, ``interop`` and ``adapt`` so that none of them needs to
know the others' formats; code inside those packages opens plain models with
:func:`lmlab.interop.load_plain_model`.
"""

from __future__ import annotations

import os

from lmlab.fileio import read_json
from lmlab.interop import check_model_dir, load_plain_model

__all__ = ["attach_tokenizer", "load_model"]


def load_model(path: str | os.PathLike, map_location="cpu", tokenizer=None):
    """The model saved in ``path`` (see the table above), in eval mode, with the directory's
    tokenizer attached when there is one lmlab can read, or with ``tokenizer`` (a tokenizer or its
    path, ``--tokenizer``) once it is checked to fit (:func:`attach_tokenizer`)."""
    model = _load(path, map_location)
    return model if tokenizer is None else attach_tokenizer(model, tokenizer)


def attach_tokenizer(model, tokenizer):
    """``model`` with ``tokenizer`` (a tokenizer, or the path of one) attached, once its ids are
    checked to mean the same to the model: the one place a tokenizer from elsewhere meets a model
    (:func:`lmlab.models.checkpoint.check_given_tokenizer`: no id without an embedding, the model's
    own tokenizer when it has one, no id the model can produce that the tokenizer cannot decode)."""
    from lmlab.models.checkpoint import check_given_tokenizer

    name = "the tokenizer"
    if isinstance(tokenizer, (str, os.PathLike)):
        from lmlab.tokenizers import load_tokenizer

        name = f"tokenizer {tokenizer}"
        tokenizer = load_tokenizer(tokenizer)
    check_given_tokenizer(model.config, tokenizer, getattr(model, "tokenizer", None), name)
    model.tokenizer = tokenizer
    return model


def _load(path: str | os.PathLike, map_location):
    from lmlab.models.checkpoint import CONFIG_NAME, is_lmlab_checkpoint

    p = check_model_dir(path)
    if is_lmlab_checkpoint(p) and read_json(p / CONFIG_NAME, "model config").get("quantization"):
        from lmlab.adapt.quantize import load_quantized

        return load_quantized(p, map_location)
    from lmlab.adapt.peft_io import adapter_files, load_peft

    if (p / "base").is_dir() and adapter_files(p / "adapter") is not None:
        model = load_peft(load_plain_model(p / "base", map_location), p / "adapter")
        return model.to(map_location).eval()
    return load_plain_model(p, map_location)
