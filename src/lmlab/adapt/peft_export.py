"""LoRA, prefix and prompt tuning results as an adapter folder that the ``peft`` library loads.

>>> export_peft(model, "adapter/")       # a model with a method applied (lmlab finetune --method ...)
>>> # then, in any transformers + peft environment:
>>> # PeftModel.from_pretrained(AutoModelFor...from_pretrained(<the HF export of the base>), "adapter/")

lmlab's own adapter files (:mod:`lmlab.adapt.peft_io`) name weights after lmlab's modules. This
writes what ``peft`` writes, ``adapter_config.json`` and ``adapter_model.safetensors``:

* LoRA: ``peft_type`` LORA, ``r``, ``lora_alpha``, the ``target_modules`` (full Hugging Face
  module names); weights ``base_model.model.<HF module>.lora_A.weight`` / ``lora_B.weight``.
  GPT-2 fuses q, k and v into one ``Conv1D`` (``c_attn``, stored transposed): the LoRA pairs of
  a layer's q, k, v become one LoRA of rank ``n·r`` on ``c_attn`` (``A`` stacked, ``B``
  block-diagonal into the fused rows; ``rank_pattern``/``alpha_pattern`` keep the scale
  ``alpha/r``) with ``fan_in_fan_out``: the same update, exactly.
* prefix tuning: ``peft_type`` PREFIX_TUNING without projection; ``prompt_embeddings``
  ``[P, layers·2·kv_heads·head_dim]``, per virtual token the keys and values of every layer in
  peft's order (the reparameterisation MLP, when trained, is evaluated: peft saves its output
  too). transformers numbers the input after a ``P``-token cache, so lmlab's prefix must have
  been trained with ``positions=after_prefix``, except with rotary positions, where a
  ``from_start`` prefix's keys are rotated by ``P`` positions (the same scores: rotary scores
  depend on position differences only). Refused: encoder-decoders (peft puts the prefix on the
  decoder's self- and cross-attention, lmlab on the encoder's and the decoder's self-attention),
  ALBERT (no past_key_values in transformers) and sequence classification with an encoder other
  than BERT (peft feeds the classifier the pooled output, which only BERT's reads). Encoders
  need transformers 4 on the reading side: with transformers 5, peft (0.21) does not find
  ``past_key_values`` in their forward (now ``cache``) and refuses.
* prompt tuning: ``peft_type`` PROMPT_TUNING, ``prompt_embeddings`` ``[P, embed_dim]``
  (scaled by BART's ``sqrt(d_model)`` where lmlab scales after the embedding and transformers
  before). peft puts the prompt in front of the input: encoders must have been trained with
  ``before_cls=true``. Encoder-decoders get it in front of the encoder input only.

Every trained weight besides the method's (the task head, BERT's pooler) and the task head's
weights go in ``modules_to_save``, under their HF names. The HF names come from the family's
converter (:mod:`lmlab.interop`): each lmlab weight is found among the tensors ``to_hf`` hands
over (the same storage); GPT-2's converter copies, so its few names are listed here.
``tests/adapt/test_peft_export.py`` loads the folders with ``peft`` on top of lmlab's HF export
of the base and compares the logits with lmlab's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from torch import nn

from lmlab.adapt import TASK_HEADS
from lmlab.adapt.peft_io import write_adapter
from lmlab.arguments import model_argument, path_argument
from lmlab.errors import LmlabError

PEFT_NAMES = ("adapter_config.json", "adapter_model.safetensors")  # what peft reads
TASK_TYPES = {"seq_cls": "SEQ_CLS", "cls": "SEQ_CLS", "lm": "CAUSAL_LM", "token_cls": "TOKEN_CLS",
              "span": "QUESTION_ANS"}
#: families whose transformers classes take no past_key_values: peft cannot prefix-tune them
NO_CACHE = ("albert",)


#: the methods peft has a counterpart of
EXPORTABLE = ("lora", "prefix", "prompt")


def check_exportable(method: str | None) -> None:
    """Refuse a fine-tune whose method (None: none, a full fine-tune) peft has no counterpart of:
    the one check of the model, made from an adapter's config alone (``lmlab export`` makes it before
    asking for --base) or from the model."""
    if method not in EXPORTABLE:
        raise LmlabError(
            f"PEFT export is for LoRA, prefix and prompt tuning, not {method or 'a model without a method'}"
            + (" (peft has no bottleneck adapters of this kind)" if method == "adapter" else ""),
            "fine-tune with --method lora, prefix or prompt",
        )


def export_peft(model: nn.Module, directory: str | os.PathLike, with_base: bool = False) -> Path:
    """Write ``model``'s method (LoRA, prefix or prompt tuning) and trained head as a ``peft``
    adapter folder (atomically).

    ``with_base``: also write ``base/``, the model without its method as a Hugging Face model
    directory with the task head (what ``PeftModel.from_pretrained`` goes on top of)."""
    model = model_argument(model, "export_peft's model")
    directory = path_argument(directory, "export_peft's directory")
    method = (getattr(model, "peft", None) or {}).get("method")
    check_exportable(method)
    writers = {"lora": _lora, "prefix": _prefix, "prompt": _prompt}
    names = HFNames(model)
    state, config = writers[method](model, names)
    prefix = "base_model.model." if method == "lora" else "base_model."
    saved = set()
    for name, p in model.named_parameters():
        own = name.endswith(("lora_A", "lora_B")) or name.startswith(("prefix_encoder.", "soft_prompt."))
        head = name.split(".")[:2] in [["heads", h] for h in TASK_HEADS]
        if not own and (p.requires_grad or head):
            key = names.name(name.replace(".inner.", "."))
            saved.add(key)
            state[prefix + key] = p.detach().cpu().contiguous()
    heads = list(getattr(model, "head_names", ()))
    config = {
        "task_type": ("SEQ_2_SEQ_LM" if model.architecture == "seq2seq" else TASK_TYPES.get(heads[0]))
        if heads else None,
        **config,
        "modules_to_save": names.modules(saved) or None,
        "inference_mode": True,
        "base_model_name_or_path": None,
    }

    def base(tmp: Path) -> None:
        from lmlab.interop import hf_export

        hf_export(names.plain, tmp / "base", tokenizer=getattr(model, "tokenizer", None))

    return write_adapter(directory, state, config, also=base if with_base else None, names=PEFT_NAMES)


# --------------------------------------------------------------------------- methods


def _lora(model: nn.Module, names: HFNames) -> tuple[dict, dict]:
    from lmlab.adapt.lora import LoRALinear

    layers = {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}
    if any(m.merged for m in layers.values()):
        raise LmlabError("the LoRA updates are merged into the weights", "unmerge them first (unmerge_lora)")
    options = model.peft["options"]
    r, alpha = options["rank"], options["alpha"]
    fused: dict[str, list] = {}  # HF module -> [(slot, layer)]
    state = {}
    for name, layer in layers.items():
        module, slot = names.target(f"{name}.weight")
        if slot is None:
            state[f"base_model.model.{module}.lora_A.weight"] = layer.lora_A.detach().cpu().contiguous()
            state[f"base_model.model.{module}.lora_B.weight"] = layer.lora_B.detach().cpu().contiguous()
        else:
            fused.setdefault(module, []).append((slot, layer))
    rank_pattern, alpha_pattern = {}, {}
    for module, parts in fused.items():  # GPT-2's c_attn: q, k, v rows of one matrix
        parts.sort(key=lambda x: x[0])
        width = parts[0][1].out_features
        a = torch.cat([layer.lora_A.detach().cpu() for _, layer in parts])
        b = torch.zeros(3 * width, len(parts) * r, dtype=a.dtype)
        for j, (slot, layer) in enumerate(parts):
            b[slot * width:(slot + 1) * width, j * r:(j + 1) * r] = layer.lora_B.detach().cpu()
        state[f"base_model.model.{module}.lora_A.weight"] = a.contiguous()
        state[f"base_model.model.{module}.lora_B.weight"] = b
        key = re.escape(module)  # peft reads the keys as regular expressions
        rank_pattern[key], alpha_pattern[key] = len(parts) * r, len(parts) * alpha  # scale alpha/r kept
    config = {
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": alpha,
        "lora_dropout": options.get("dropout", 0.0),
        "target_modules": sorted({names.target(f"{n}.weight")[0] for n in layers}),
        "rank_pattern": rank_pattern,
        "alpha_pattern": alpha_pattern,
        "bias": "none",
        "fan_in_fan_out": model.config.family == "gpt2",  # Conv1D: weights stored [in, out]
        "init_lora_weights": True,
    }
    return state, config


def _prefix(model: nn.Module, names: HFNames) -> tuple[dict, dict]:
    from lmlab.adapt import transformer_blocks

    family, p = model.config.family, model.prefix_encoder.num_virtual_tokens
    if model.architecture == "seq2seq":
        raise LmlabError(
            "peft puts an encoder-decoder's prefix on the decoder's self- and cross-attention, lmlab on "
            "the encoder's and the decoder's self-attention: the two cannot compute the same",
            "export prefix tuning of encoders and decoders, or use LoRA or prompt tuning",
        )
    if family in NO_CACHE:
        raise LmlabError(f"transformers' {family} models take no past_key_values, which peft's prefix tuning "
                         "needs", "use LoRA or prompt tuning for this family")
    if model.architecture == "encoder" and "seq_cls" in model.head_names and family != "bert":
        raise LmlabError(
            f"peft's prefix tuning for sequence classification hands the classifier the encoder's pooled "
            f"output, which transformers' {family} classifier does not read (it reads the first token)",
            "export a token-classification prefix fine-tune, or use LoRA or prompt tuning",
        )
    rotary = getattr(model.config, "positions", None) == "rotary"
    if model.peft["options"].get("positions", "from_start") != "after_prefix" and not rotary:
        raise LmlabError(
            "this prefix was trained with the input numbered from 0; transformers numbers it after the "
            f"prefix's {p} positions, which learned position embeddings cannot undo",
            "fine-tune with --method-option positions=after_prefix",
        )
    enc = model.prefix_encoder
    blocks = [b for _, b in transformer_blocks(model)]
    with torch.no_grad():
        kv = torch.stack([torch.stack(enc.layer_kv(i)) for i in range(len(blocks))]).float()  # [L,2,H,P,D]
        if rotary and model.peft["options"].get("positions", "from_start") != "after_prefix":
            from lmlab.models.blocks import apply_rotary

            cos, sin = model.rotary(torch.full((1, p), p, device=kv.device))  # keys as if P positions back
            kv[:, 0] = apply_rotary(kv[:, 0], cos.float(), sin.float())
    n_layers, _, heads, _, head_dim = kv.shape
    config = {
        "peft_type": "PREFIX_TUNING",
        "num_virtual_tokens": p,
        "token_dim": heads * head_dim,
        "num_attention_heads": heads,
        "num_layers": n_layers,
        "num_transformer_submodules": 1,
        "prefix_projection": False,
        "encoder_hidden_size": heads * head_dim,
    }
    # peft's order per virtual token: layer, key/value, head, head_dim
    return {"prompt_embeddings": kv.permute(3, 0, 1, 2, 4).reshape(p, -1).cpu().contiguous()}, config


def _prompt(model: nn.Module, names: HFNames) -> tuple[dict, dict]:
    if model.architecture == "encoder" and not model.peft["options"].get("before_cls", False):
        raise LmlabError(
            "this prompt sits after [CLS]; peft puts a prompt in front of the input, so its head reads the "
            "first prompt vector",
            "fine-tune with --method-option before_cls=true",
        )
    prompt = model.soft_prompt.embedding.detach().float().cpu()
    prompt = prompt * float(getattr(model, "embed_scale", 1.0))  # BART scales after the embedding
    config = {
        "peft_type": "PROMPT_TUNING",
        "num_virtual_tokens": prompt.shape[0],
        "token_dim": prompt.shape[1],
        "num_transformer_submodules": 1,  # encoder-decoders: the encoder input only
        "num_attention_heads": model.config.n_heads,
        "num_layers": model.config.n_layers,
        "prompt_tuning_init": "RANDOM",
    }
    return {"prompt_embeddings": prompt.contiguous()}, config


# --------------------------------------------------------------------------- names


class HFNames:
    """The adapted model without its method (``plain``) and the Hugging Face names of its
    weights, read off the family's ``to_hf``."""

    def __init__(self, model: nn.Module):
        from lmlab.adapt.peft_io import base_state_dict
        from lmlab.interop import converter
        from lmlab.models import build_model

        self.model = model
        self.family = model.config.family
        heads = tuple(model.head_names)
        if any(h in TASK_HEADS for h in heads):  # a frozen auxiliary head (GPT-style classification's LM
            heads = tuple(h for h in heads if h in TASK_HEADS)  # loss) is no part of the task's HF class
        plain = build_model(model.config, heads=heads, architecture=model.architecture)
        if getattr(model, "peft", {}).get("method") == "lora":  # the base *without* the update
            own = {k: v for k, v in model.state_dict().items() if not k.endswith(("lora_A", "lora_B"))}
        else:
            own = base_state_dict(model)
        own = {k: v for k, v in own.items() if not k.startswith("heads.") or k.split(".")[1] in heads}
        plain.load_state_dict(own)
        self.plain = plain
        _, hf_state = converter(self.family).to_hf(plain)
        self._by_storage = {(t.data_ptr(), tuple(t.shape)): k for k, t in hf_state.items() if t.numel()}
        self._params = dict(plain.named_parameters(remove_duplicate=False))
        self._bare = not plain.head_names
        self._hf_keys = set(hf_state)

    def modules(self, keys: set[str]) -> list[str]:
        """The HF modules that hold exactly the weights ``keys``, each as high up as it goes
        (RoBERTa's ``classifier``, not ``classifier.dense`` and ``classifier.out_proj``: peft
        wraps a module once)."""
        found = set()
        for key in keys:
            parts, best = key.split(".")[:-1], None
            for n in range(len(parts), 0, -1):
                scope = ".".join(parts[:n]) + "."
                if all(k in keys for k in self._hf_keys if k.startswith(scope)):
                    best = scope[:-1]
                else:
                    break
            found.add(best or key.rsplit(".", 1)[0])
        return sorted(found)

    def name(self, name: str) -> str:
        """The HF name of the lmlab weight ``name`` (a one-line error when it has none of its own)."""
        if self.family == "gpt2":
            return self._gpt2(name)[0]
        t = self._params.get(name)
        key = None if t is None else self._by_storage.get((t.data_ptr(), tuple(t.shape)))
        if key is None:
            raise LmlabError(f"the trained weight {name} of this {self.family} model has no weight of its "
                             "own in the Hugging Face layout", "train weights that transformers has")
        return key

    def target(self, name: str) -> tuple[str, int | None]:
        """``(HF module, slot)`` of a LoRA target weight: ``slot`` is q/k/v's index (0/1/2) in a
        fused matrix, else None."""
        key, slot = self._gpt2(name) if self.family == "gpt2" else (self.name(name), None)
        return key.removesuffix(".weight"), slot

    def _gpt2(self, name: str) -> tuple[str, int | None]:
        """GPT-2's converter builds new tensors (fused, transposed): its trainable names by rule."""
        if name in ("heads.lm.proj.weight", "heads.cls.score.weight"):
            return ("lm_head.weight" if ".lm." in name else "score.weight"), None
        m = re.fullmatch(r"layers\.(\d+)\.(attn\.[qkvo]_proj|ffn\.fc_in|ffn\.fc_out)\.(weight|bias)", name)
        if m is None:
            raise LmlabError(f"the trained weight {name} of this gpt2 model has no weight of its own in "
                             "the Hugging Face layout", "train LoRA on attention/FFN layers and the head")
        layer, module, leaf = m.groups()
        h = f"{'' if self._bare else 'transformer.'}h.{layer}."
        slots = {"attn.q_proj": 0, "attn.k_proj": 1, "attn.v_proj": 2}
        if module in slots:
            return f"{h}attn.c_attn.{leaf}", slots[module]
        hf = {"attn.o_proj": "attn.c_proj", "ffn.fc_in": "mlp.c_fc", "ffn.fc_out": "mlp.c_proj"}[module]
        return f"{h}{hf}.{leaf}", None
