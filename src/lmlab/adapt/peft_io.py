"""Saving and loading what a parameter-efficient method trained, and its fine-tuning method class.

A PEFT directory holds only the trained parameters - the method's own (LoRA ``A``/``B``, adapters,
prefixes, the soft prompt) and the task head - next to a small JSON config::

    lmlab_adapter.json         {"lmlab_peft_version": 1, "method": "lora", "options": {...},
                                "architecture": "encoder", "family": "bert", "heads": ["seq_cls"],
                                "model_config": {...}, "trainable_parameters": 1234, ...}
    lmlab_adapter.safetensors  every parameter with requires_grad, by its name in the adapted model

The names are lmlab's own, so that nothing mistakes the folder for one the ``peft`` library wrote
(:mod:`lmlab.adapt.peft_export` writes those). Folders saved before under ``peft``'s names
(``adapter_config.json`` / ``adapter_model.safetensors`` with lmlab content) still load.

:func:`save_peft` writes it, :func:`load_peft` applies the method to a base model and loads the
weights, :func:`load_peft_model` rebuilds the fine-tuned model from the *pretraining* checkpoint
plus this directory; predictions are identical to those of the model that was saved.

For ``lmlab finetune --method lora|adapter|prefix|prompt`` the method classes at the end plug
into :data:`lmlab.finetune.METHODS` (``apply / snapshot / restore / save / load``). The fine-tuned
directory then holds the PEFT files plus

* LoRA: the merged model (``W + (alpha/r)·B·A``) as an ordinary lmlab checkpoint at the top
  level, so ``load_model(out)`` serves it at the base model's speed;
* adapters, prefix, prompt (which cannot be merged): ``base/``, the frozen base with its task
  head and tokenizer, which ``load`` combines with the PEFT files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab.adapt import apply_method, resolve_options, trainable_parameters
from lmlab.arguments import model_argument, path_argument
from lmlab.errors import LmlabError, a_or_an
from lmlab.fileio import atomic_dir, read_json, write_json

PEFT_VERSION = 1
CONFIG_NAME = "lmlab_adapter.json"
WEIGHTS_NAME = "lmlab_adapter.safetensors"
#: the names lmlab used until the ``peft`` export existed (``peft``'s own); still read
OLD_NAMES = ("adapter_config.json", "adapter_model.safetensors")
BASE_DIR = "base"
#: config fields that may differ between the base model and the adapted one (no effect on shapes)
_FREE_FIELDS = ("dropout", "attn_dropout", "classifier_dropout", "num_labels")


# --------------------------------------------------------------------------- state


def peft_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trained parameters (``requires_grad``), by name, detached on the CPU."""
    return {n: p.detach().to("cpu").contiguous() for n, p in model.named_parameters() if p.requires_grad}


def save_peft(model: nn.Module, directory: str | os.PathLike, base_model: str | None = None) -> Path:
    """Write the method's parameters and the task head of ``model`` to ``directory`` (atomically).

    ``base_model``: where the base came from (recorded for the reader; optional).
    """
    model = model_argument(model, "save_peft's model")
    directory = path_argument(directory, "save_peft's directory")
    peft = getattr(model, "peft", None)
    if not peft:
        raise LmlabError(
            "the model has no parameter-efficient method applied",
            "apply one first: lmlab.adapt.apply_method(model, 'lora')",
        )
    state = peft_state(model)
    n, total, share = trainable_parameters(model)
    config = {
        "lmlab_peft_version": PEFT_VERSION,
        "method": peft["method"],
        "options": peft["options"],
        "architecture": model.architecture,
        "family": model.config.family,
        "heads": list(model.head_names),
        "model_config": model.config.to_dict(),
        "trainable_parameters": n,
        "total_parameters": total,
        "trainable_share": share,
        "base_model": base_model,
        "base_fingerprint": base_fingerprint(model),
    }
    return write_adapter(directory, state, config)


def base_fingerprint(model: nn.Module) -> str:
    """A short hash of the frozen weights no method changes - the token embeddings and the body's
    norms (a sample of each, rounded to bfloat16 so an fp32 and a bf16 copy agree) - so that
    adapters can be checked to share one base (:func:`check_same_base`)."""
    import hashlib

    h = hashlib.sha256()
    for name, w in _fingerprinted(model):
        flat = w.detach().flatten()
        sample = flat[:: max(1, flat.numel() // 4096)][:4096]
        h.update(f"{name}:{tuple(w.shape)}".encode())
        h.update(sample.to("cpu", torch.bfloat16).float().numpy().tobytes())
    return h.hexdigest()[:16]


def _fingerprinted(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(name, weight)`` of what :func:`base_fingerprint` hashes: ``embed``, then each norm by its
    module name (a method's wrapper, ``.inner.``, left out of the name)."""
    from lmlab.adapt.prompt import input_embedding
    from lmlab.models.blocks import RMSNorm

    weights = [("embed", input_embedding(model).weight)]
    for name, m in model.named_modules():
        if isinstance(m, (nn.LayerNorm, RMSNorm)) and not name.startswith(("heads.", "pooler.")):
            weights.append((name.replace(".inner.", "."), m.weight))
    return weights


def write_adapter(directory: str | os.PathLike, state: dict[str, torch.Tensor], config: dict[str, Any],
                  also=None, names: tuple[str, str] = (CONFIG_NAME, WEIGHTS_NAME)) -> Path:
    """``state`` and ``config`` into ``directory`` under ``names`` (config, weights), atomically;
    ``also(tmp)`` may add files before the directory appears."""
    from safetensors.torch import save_file

    directory = Path(directory)
    config_name, weights_name = names
    with atomic_dir(directory, marker=config_name, what="PEFT adapter") as tmp:
        save_file(state, str(tmp / weights_name), metadata={"format": "pt"})
        write_json(tmp / config_name, config)
        if also is not None:
            also(tmp)
    return directory


def adapter_files(directory: str | os.PathLike) -> tuple[Path, Path] | None:
    """``(config, weights)`` of the lmlab adapter in ``directory`` (today's names, else the old
    ones when their config is lmlab's), or None when it holds none."""
    d = Path(directory)
    if (d / CONFIG_NAME).is_file():
        return d / CONFIG_NAME, d / WEIGHTS_NAME
    old = d / OLD_NAMES[0]
    if old.is_file():
        try:
            cfg = read_json(old, "adapter config")
        except LmlabError:
            return None
        if isinstance(cfg, dict) and "lmlab_peft_version" in cfg:
            return old, d / OLD_NAMES[1]
    return None


def read_peft_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The JSON config of a PEFT directory, checked (one-line LmlabError when missing or wrong)."""
    d = Path(directory)
    files = adapter_files(d)
    if files is None:
        hint = f"; its {OLD_NAMES[0]} is not lmlab's (a folder for the peft library?)"
        raise LmlabError(
            f"{d} holds no lmlab adapter ({CONFIG_NAME}){hint if (d / OLD_NAMES[0]).is_file() else ''}",
            "pass a directory written by save_peft / lmlab finetune",
        )
    cfg = read_json(files[0], "adapter config")
    if not isinstance(cfg, dict) or cfg.get("lmlab_peft_version") != PEFT_VERSION:
        raise LmlabError(
            f"{files[0]} is not an lmlab PEFT config of version {PEFT_VERSION}",
            "save the adapter again with this lmlab",
        )
    for key in ("method", "options", "architecture", "heads", "model_config"):
        if key not in cfg:
            raise LmlabError(f"{files[0]} lacks {key!r}", "save the adapter again")
    return cfg


def check_base(model: nn.Module, cfg: dict[str, Any], where: str) -> None:
    """The base model must be the kind the adapter was trained on (same shapes)."""
    if getattr(model, "architecture", None) != cfg["architecture"]:
        raise LmlabError(
            f"the adapter in {where} is for {a_or_an(str(cfg['architecture']))} model, not "
            f"{a_or_an(str(getattr(model, 'architecture', type(model).__name__)))}",
            "load it on its own base model",
        )
    mine = model.config.to_dict()
    for key, value in cfg["model_config"].items():
        if key not in _FREE_FIELDS and mine.get(key) != value:
            raise LmlabError(
                f"the adapter in {where} was trained on a model with {key}={value!r}, this one has "
                f"{mine.get(key)!r}",
                "load it on the base model it was trained from",
            )


def load_peft(model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """Apply the saved method to ``model`` (a base model with the same task heads) and load the
    saved parameters into it; returns ``model`` (in place), in eval mode."""
    from lmlab.models.checkpoint import read_safetensors

    d = Path(directory)
    cfg = read_peft_config(d)
    check_base(model, cfg, str(d))
    if list(model.head_names) != list(cfg["heads"]):
        raise LmlabError(
            f"the adapter in {d} was trained with heads {cfg['heads']}, the model has "
            f"{list(model.head_names)}",
            "build the model with the same task head",
        )
    apply_method(model, cfg["method"], cfg["options"])
    state = read_safetensors(adapter_files(d)[1])
    own = dict(model.named_parameters())
    expected = {n for n, p in own.items() if p.requires_grad}
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise LmlabError(
            f"adapter weights in {d} do not match the model (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})",
            "the config and weights come from different runs",
        )
    with torch.no_grad():
        for name, t in state.items():
            if own[name].shape != t.shape:
                raise LmlabError(
                    f"adapter weight {name} in {d} has shape {tuple(t.shape)}, the model "
                    f"expects {tuple(own[name].shape)}",
                    "load it on the base it was trained from",
                )
            own[name].copy_(t)
    return model.eval()


def load_peft_model(
    base_checkpoint: str | os.PathLike | nn.Module,
    directory: str | os.PathLike,
    map_location: str | torch.device = "cpu",
) -> nn.Module:
    """The fine-tuned model from the pretrained ``base_checkpoint`` (directory or model) plus the
    PEFT ``directory``: the body comes from the base, the task head and method from the adapter."""
    from lmlab.interop import load_plain_model

    d = path_argument(directory, "load_peft_model's directory")
    if not isinstance(base_checkpoint, nn.Module):
        base_checkpoint = path_argument(base_checkpoint,
                                        "load_peft_model's base_checkpoint (a directory or a model)")
    cfg = read_peft_config(d)
    if isinstance(base_checkpoint, nn.Module):
        base = base_checkpoint
    else:
        base = load_plain_model(base_checkpoint, map_location)
        mark_merged_lora(base, base_checkpoint)
    model = model_for_adapter(base_for_adapter(base, cfg, d, map_location), cfg, d)
    return load_peft(model.to(map_location), d)


def mark_merged_lora(model: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Record on ``model``, loaded from ``path``, whether it is the merged top level of an ``lmlab
    finetune --method lora`` output (``path/adapter`` holds LoRA): no adapter may go on it."""
    files = adapter_files(Path(path) / "adapter")
    if files is not None and read_peft_config(Path(path) / "adapter").get("method") == "lora":
        model.merged_lora = str(path)
    return model


def grown_base_dir(directory: str | os.PathLike) -> Path | None:
    """The ``base/`` of the fine-tuned folder that holds the adapter ``directory`` (``OUT/adapter``
    or ``OUT`` itself), or None."""
    d = Path(directory)
    for out in ((d.parent, d) if d.name == "adapter" else (d,)):
        if (out / BASE_DIR).is_dir():
            return out / BASE_DIR
    return None


def base_for_adapter(base: nn.Module, cfg: dict[str, Any], directory: str | os.PathLike,
                     map_location: str | torch.device = "cpu") -> nn.Module:
    """The model the adapter in ``directory`` goes on, given the pretrained ``base`` it was
    fine-tuned from: ``base`` itself, or, when fine-tuning grew the vocabulary for new special
    tokens (GPT-style ``[START]``/``[DELIM]``/``[EXTRACT]``, :func:`lmlab.tasks.base.attach_head`),
    the grown base saved in the fine-tuned folder's ``base/`` (the new rows live only there), once
    its first rows are checked to be ``base`` 's; either way the base chosen must be the one the
    adapter was trained on (:func:`check_same_base`). The one place ``lmlab export --format peft
    --base``, :func:`load_peft_model` and ``--variant`` (:class:`lmlab.adapt.multi.MultiAdapterModel`)
    choose and check it."""
    from lmlab.adapt.prompt import input_embedding

    merged = getattr(base, "merged_lora", None)
    if merged:
        raise LmlabError(
            f"the base model {merged} is a LoRA fine-tune with its update merged in, not a pretrained "
            "model (the adapter would be applied twice)",
            "give the pretrained checkpoint (or run folder) it was fine-tuned from",
        )
    mine = getattr(base.config, "vocab_size", None)
    theirs = cfg["model_config"].get("vocab_size")
    if not (isinstance(mine, int) and isinstance(theirs, int) and theirs > mine):
        check_same_base(base, cfg, directory)
        return base
    where = grown_base_dir(directory)
    if where is None:
        return base  # check_base names the mismatch
    from lmlab.interop import load_plain_model

    grown = load_plain_model(where, map_location)
    check_base(grown, cfg, str(where))
    old, new = input_embedding(base).weight, input_embedding(grown).weight
    if not torch.equal(old.detach().to("cpu", torch.float32), new.detach()[:mine].to("cpu", torch.float32)):
        raise LmlabError(
            f"the adapter in {directory} was trained on another base model (the first {mine} token "
            f"embeddings of {where} differ from the base given)",
            "give the base model it was fine-tuned from",
        )
    check_same_base(grown, cfg, directory)
    return grown


def check_same_base(base: nn.Module, cfg: dict[str, Any], directory: str | os.PathLike,
                    what: str | None = None) -> None:
    """``base`` must be the model the adapter in ``directory`` (config ``cfg``; ``what`` names it in
    the message) was trained on: the same :func:`base_fingerprint` of the weights no method changes,
    when the adapter recorded one (adapters saved before fingerprints have none) and trained none of
    them. Called by :func:`base_for_adapter`, so ``lmlab export --format peft --base`` and
    ``--variant`` refuse the same bases."""
    what = what or f"the adapter in {directory}"
    saved = cfg.get("base_fingerprint")
    if saved is None or _trains_fingerprinted(directory, base):
        return
    now = base_fingerprint(base)
    if saved != now:
        raise LmlabError(f"{what} was trained on another base model (fingerprint {saved}, this base {now})",
                         "give the base model it was fine-tuned from (the --checkpoint of that "
                         "lmlab finetune)")


def _trains_fingerprinted(directory: str | os.PathLike, base: nn.Module) -> bool:
    """Whether the adapter in ``directory`` holds trained weights that :func:`base_fingerprint`
    hashes (the adapter method trains the layer norms, as Houlsby et al. do): its recorded
    fingerprint is then of the tuned model, not of its base, and says nothing about the base (the
    shapes are still checked, :func:`check_base`)."""
    from safetensors import SafetensorError, safe_open

    files = adapter_files(directory)
    if files is None or not files[1].is_file():
        return False
    hashed = {f"{name}.weight" for name, _ in _fingerprinted(base) if name != "embed"}
    try:
        with safe_open(str(files[1]), "pt") as f:
            names = list(f.keys())
    except (SafetensorError, OSError):
        return False  # unreadable: refused as corrupt when its weights are read
    return any(key.replace(".inner.", ".") in hashed for key in names)


def model_for_adapter(base: nn.Module, cfg: dict[str, Any], directory: Path) -> nn.Module:
    """A new model with the adapter's heads and config whose body is ``base`` 's (copied weights;
    heads ``base`` lacks keep their initialisation, for the adapter's weights to fill)."""
    from lmlab.models import build_model
    from lmlab.models.checkpoint import read_safetensors
    from lmlab.models.config import config_from_dict

    check_base(base, cfg, str(directory))
    model = build_model(
        config_from_dict(cfg["model_config"]), heads=cfg["heads"], architecture=cfg["architecture"]
    )
    saved = set(read_safetensors(adapter_files(directory)[1]))  # small: the method's weights and the head
    base_state = base.state_dict()
    keep = {}
    for name, t in model.state_dict().items():
        if name in base_state and base_state[name].shape == t.shape:
            keep[name] = base_state[name]
        elif not name.startswith(("heads.", "pooler.")) and name not in saved:
            raise LmlabError(
                f"weight {name} is neither in the base checkpoint nor in the adapter {directory}",
                "load the adapter on the base model it was trained from",
            )
    model.load_state_dict(keep, strict=False)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    model.tokenizer = getattr(base, "tokenizer", None)
    return model


# --------------------------------------------------------------------------- plain weights


def base_state_dict(model: nn.Module, merge: bool = True) -> dict[str, torch.Tensor]:
    """The adapted model's weights under the base model's names, without the method's own
    parameters (wrappers' ``.inner`` dropped); LoRA layers contribute their merged weight, or with
    ``merge=False`` their frozen base weight (the model without its method)."""
    from lmlab.adapt.lora import LoRALinear

    merged = {}
    for name, module in model.named_modules():
        if merge and isinstance(module, LoRALinear) and not module.merged:
            merged[f"{name}.weight"] = (module.weight + module.delta_weight()).detach()
    own = ("lora_A", "lora_B", ".adapter.", "prefix_encoder.", "soft_prompt.")
    state = {}
    for name, t in model.state_dict().items():
        if any(part in name for part in own):
            continue
        state[name.replace(".inner.", ".")] = merged.get(name, t)
    return state


def save_plain(model: nn.Module, directory: str | os.PathLike, tokenizer=None, merge: bool = True) -> Path:
    """Save ``model`` without its method as an ordinary lmlab checkpoint (LoRA merged in, or left
    out with ``merge=False``: the base the adapter goes on)."""
    from lmlab.models import build_model, save_checkpoint

    plain = build_model(model.config, heads=model.head_names, architecture=model.architecture)
    plain.load_state_dict(base_state_dict(model, merge))
    if hasattr(plain, "tie_weights"):
        plain.tie_weights()
    return save_checkpoint(plain, directory, tokenizer=tokenizer)


# --------------------------------------------------------------------------- lmlab finetune methods


class PeftFineTuning:
    """A parameter-efficient method for :func:`lmlab.finetune.finetune` (``--method NAME``);
    ``options`` are the method's keyword options (``--method-option rank=8``)."""

    name = ""

    def __init__(self, **options):
        self.options = resolve_options(self.name, options)  # bad options fail before any work

    def positions(self, config) -> int:
        """The positions the virtual tokens take in front of every input of a model of ``config``;
        refused, before any weight is read, when they leave the input no room."""
        from lmlab.adapt.options import check_positions

        return check_positions(self.name, self.options, config)

    def apply(self, model: nn.Module, task=None) -> nn.Module:
        apply_method(model, self.name, self.options)
        return model

    def snapshot(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in peft_state(model).items()}

    def restore(self, model: nn.Module, snap: dict[str, torch.Tensor]) -> None:
        own = dict(model.named_parameters())
        with torch.no_grad():
            for name, t in snap.items():
                own[name].copy_(t)

    def save(self, model: nn.Module, directory: Path, tokenizer) -> None:
        save_peft(model, directory / "adapter")
        save_plain(model, directory / BASE_DIR, tokenizer)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> nn.Module:
        from lmlab.interop import load_plain_model

        d = Path(directory)
        return load_peft(load_plain_model(d / BASE_DIR), d / "adapter")


class LoRAFineTuning(PeftFineTuning):
    """LoRA; the saved directory's top level is the merged model (``load_model``-able)."""

    name = "lora"

    def save(self, model: nn.Module, directory: Path, tokenizer) -> None:
        save_plain(model, directory, tokenizer)  # merged: W + (alpha/r)·B·A (replaces the directory: first)
        save_peft(model, directory / "adapter")
        if getattr(model, "vocab_grown_from", None):  # new token rows live only here: keep the base too
            save_plain(model, directory / BASE_DIR, tokenizer, merge=False)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> nn.Module:
        from lmlab.interop import load_plain_model

        return load_plain_model(directory)


class AdapterFineTuning(PeftFineTuning):
    name = "adapter"


class PrefixFineTuning(PeftFineTuning):
    name = "prefix"


class PromptFineTuning(PeftFineTuning):
    name = "prompt"


class AdaMixFineTuning(PeftFineTuning):
    """AdaMix (:mod:`lmlab.adapt.adamix`): trains a mixture of adapters with random routes and a
    consistency loss (:meth:`loss`); saves the experts' average as a plain adapter (``adapter/``,
    what ``load`` and ``load_model`` serve, at one adapter's cost) and, with ``keep_experts``,
    every expert (``experts/``, loadable with :func:`load_peft`)."""

    name = "adamix"

    def apply(self, model: nn.Module, task=None) -> nn.Module:
        from lmlab.adapt.adamix import consistency_supported

        if self.options["consistency"] and task is not None and not consistency_supported(task):
            raise LmlabError(f"AdaMix's consistency loss cannot compare the outputs of task {task.name!r}",
                             "use --method-option consistency=0 for this task")
        return super().apply(model, task)

    def loss(self, task, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """One training step's loss (called by the fine-tuning loop instead of ``task.loss``)."""
        from lmlab.adapt.adamix import two_pass_loss

        return two_pass_loss(task, model, batch, self.options["consistency"])

    def save(self, model: nn.Module, directory: Path, tokenizer) -> None:
        from lmlab.adapt.adamix import merge_experts

        super().save(merge_experts(model), directory, tokenizer)
        if self.options["keep_experts"]:
            save_peft(model, directory / "experts")
