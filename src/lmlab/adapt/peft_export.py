"""LoRA results as a PEFT adapter folder that the ``peft`` library itself loads.

>>> export_peft_lora(model, "adapter/")       # a model with LoRA applied (lmlab finetune --method lora)
>>> # then, in any transformers + peft environment:
>>> # PeftModel.from_pretrained(AutoModelFor...from_pretrained(<the HF export of the base>), "adapter/")

lmlab's own adapter files (:mod:`lmlab.adapt.peft_io`) name weights after lmlab's modules. This
writes what ``peft`` writes:

* ``adapter_config.json``: ``peft_type`` LORA, ``r``, ``lora_alpha``, ``lora_dropout``, the
  ``target_modules`` (full Hugging Face module names) and ``modules_to_save`` (the trained task
  head);
* ``adapter_model.safetensors``: ``base_model.model.<HF module>.lora_A.weight`` /
  ``lora_B.weight``, and the trained head's weights under their HF names.

The HF names come from the family's converter (:mod:`lmlab.interop`): each lmlab weight is
found among the tensors ``to_hf`` hands over (the same storage). A family that stores a LoRA
target differently in transformers (GPT-2 fuses q, k and v in one ``Conv1D``) is refused with a
one-line error. ``tests/adapt/test_peft_export.py`` loads the folder with ``peft`` on top of
lmlab's HF export of the base and compares the logits with lmlab's.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from lmlab.adapt.peft_io import write_adapter

PEFT_NAMES = ("adapter_config.json", "adapter_model.safetensors")  # what peft reads
from lmlab.errors import LmlabError

TASK_TYPES = {"seq_cls": "SEQ_CLS", "lm": "CAUSAL_LM", "token_cls": "TOKEN_CLS", "span": "QUESTION_ANS"}


def export_peft_lora(model: nn.Module, directory: str | os.PathLike, with_base: bool = False) -> Path:
    """Write ``model``'s LoRA update and trained head as a ``peft`` LoRA folder (atomically).

    ``with_base``: also write ``base/``, the model without its LoRA update as a Hugging Face
    model directory with the task head (what ``PeftModel.from_pretrained`` goes on top of)."""
    from lmlab.adapt.lora import LoRALinear

    peft = getattr(model, "peft", None) or {}
    if peft.get("method") != "lora":
        raise LmlabError("PEFT export is for LoRA models (adapters, prefix and prompt tuning are not yet)",
                         "fine-tune with --method lora")
    layers = {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}
    if any(m.merged for m in layers.values()):
        raise LmlabError("the LoRA updates are merged into the weights", "unmerge them first (unmerge_lora)")
    plain, hf_name = _hf_names(model)
    state, targets, saved_modules = {}, [], set()
    for name, layer in layers.items():
        module = hf_name(f"{name}.weight").removesuffix(".weight")
        targets.append(module)
        state[f"base_model.model.{module}.lora_A.weight"] = layer.lora_A.detach().cpu().contiguous()
        state[f"base_model.model.{module}.lora_B.weight"] = layer.lora_B.detach().cpu().contiguous()
    for name, p in model.named_parameters():
        if p.requires_grad and not name.endswith(("lora_A", "lora_B")):
            key = hf_name(name)
            saved_modules.add(key.rsplit(".", 1)[0])
            state[f"base_model.model.{key}"] = p.detach().cpu().contiguous()
    options = peft["options"]
    heads = list(getattr(model, "head_names", ()))
    config = {
        "peft_type": "LORA",
        "task_type": ("SEQ_2_SEQ_LM" if model.architecture == "seq2seq" else TASK_TYPES.get(heads[0]))
        if heads else None,
        "r": options["rank"],
        "lora_alpha": options["alpha"],
        "lora_dropout": options.get("dropout", 0.0),
        "target_modules": sorted(targets),
        "modules_to_save": sorted(saved_modules) or None,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "base_model_name_or_path": None,
    }
    def base(tmp: Path) -> None:
        from lmlab.interop import hf_export

        hf_export(plain, tmp / "base", tokenizer=getattr(model, "tokenizer", None))

    return write_adapter(directory, state, config, also=base if with_base else None, names=PEFT_NAMES)


def _hf_names(model: nn.Module):
    """``(the model without LoRA, lmlab parameter name -> the Hugging Face name of the same
    weight)``, read off ``to_hf``."""
    from lmlab.adapt.lora import LoRALinear
    from lmlab.interop import converter
    from lmlab.models import build_model

    plain = build_model(model.config, heads=model.head_names, architecture=model.architecture)
    own = {k: v for k, v in model.state_dict().items() if not k.endswith(("lora_A", "lora_B"))}
    plain.load_state_dict(own)
    _, hf_state = converter(model.config.family).to_hf(plain)
    by_storage = {(t.data_ptr(), tuple(t.shape)): k for k, t in hf_state.items() if t.numel()}
    params = dict(plain.named_parameters(remove_duplicate=False))
    lora = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, LoRALinear)}

    def lookup(name: str) -> str:
        t = params.get(name)
        key = None if t is None else by_storage.get((t.data_ptr(), tuple(t.shape)))
        if key is None:
            what = "LoRA target" if name in lora else "trained weight"
            raise LmlabError(f"the {what} {name} of this {model.config.family} model has no weight of "
                             "its own in the Hugging Face layout (stored fused or transposed there)",
                             "PEFT export works for BERT-style encoders, Llama, T5 and BART targets")
        return key

    return plain, lookup

