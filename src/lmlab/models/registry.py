"""The one registry of model families: :data:`FAMILIES`, architecture -> family folder module.

Adding a family is one folder (whose ``__init__.py`` defines ``SPEC``, a
:class:`lmlab.models.family.FamilySpec`) and one line here. The folders are imported by name
when first asked for, so ``lmlab --help`` never loads a model.

>>> from lmlab.models.registry import family_spec, spec_of_config
>>> family_spec("decoder").presets["gpt2-tiny"]().d_model
64
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from lmlab.errors import LmlabError
from lmlab.models.family import FamilySpec

#: architecture (the name in every checkpoint's config.json) -> module that defines ``SPEC``
FAMILIES: dict[str, str] = {
    "encoder": "lmlab.models.encoder",
    "decoder": "lmlab.models.decoder",
    "seq2seq": "lmlab.models.seq2seq",
    "rnn": "lmlab.models.rnn",
    "xlnet": "lmlab.models.xlnet",
    "transfo-xl": "lmlab.models.transformer_xl",
}

__all__ = ["FAMILIES", "PRESETS", "config_from_dict", "family_configs", "family_spec", "family_specs",
           "get_preset", "spec_of_config", "spec_of_family"]


def family_spec(architecture: str) -> FamilySpec:
    """The spec of the family registered as ``architecture``."""
    if architecture not in FAMILIES:
        raise LmlabError(f"unknown model architecture {architecture!r}",
                         f"choose one of: {', '.join(FAMILIES)}")
    spec = importlib.import_module(FAMILIES[architecture]).SPEC
    if spec.name != architecture:
        raise LmlabError(f"{FAMILIES[architecture]}.SPEC is named {spec.name!r}, registered as "
                         f"{architecture!r}", "register the family under its SPEC.name")
    return spec


def family_specs() -> dict[str, FamilySpec]:
    """Every registered family's spec, in registry order."""
    return {name: family_spec(name) for name in FAMILIES}


def spec_of_config(config: Any) -> FamilySpec:
    """The spec whose config class ``config`` is (exactly: a subclass is another family)."""
    for spec in family_specs().values():
        if type(config) is spec.config_class:
            return spec
    raise LmlabError(f"no model family takes a {type(config).__name__}",
                     f"pass a config of a registered family ({', '.join(FAMILIES)}) or a preset name")


def family_configs() -> dict[str, type]:
    """``config.family`` value (bert, gpt2, t5, xlnet ...) -> its config class."""
    return {family: spec.config_class for spec in family_specs().values() for family in spec.families}


def spec_of_family(family: Any, where: str = "model config") -> FamilySpec:
    """The spec whose config reads ``family`` (the ``family`` field of a config dict)."""
    for spec in family_specs().values():
        if family in spec.families:
            return spec
    raise LmlabError(f"{where}: unknown model family {family!r}",
                     f"expected one of: {', '.join(family_configs())}")


class _Presets(Mapping):
    """Every preset name -> a function returning a fresh config, read from the registered families
    at each look-up (so a family registered later has its presets here too)."""

    def _all(self) -> dict[str, Callable[[], Any]]:
        return {name: make for spec in family_specs().values() for name, make in spec.presets.items()}

    def __getitem__(self, name: str) -> Callable[[], Any]:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __repr__(self) -> str:
        return f"PRESETS({', '.join(self)})"


#: every preset name, e.g. "bert-tiny", "llama-small", "gpt2-base", "xlnet-tiny"
PRESETS: Mapping[str, Callable[[], Any]] = _Presets()


def get_preset(name: str, **overrides):
    """A fresh, validated config for preset ``name`` (see :data:`PRESETS`), with ``overrides`` applied."""
    presets = dict(PRESETS)
    if name not in presets:
        raise LmlabError(f"unknown model preset {name!r}", f"choose one of: {', '.join(presets)}")
    cfg = presets[name]()
    fields = {f.name for f in dataclasses.fields(cfg)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise LmlabError(f"preset {name} has no settings {bad}", f"use fields of {type(cfg).__name__}")
    vocab = overrides.get("vocab_size", cfg.vocab_size)
    for special in ("pad_token_id", "bos_token_id", "eos_token_id"):
        # a smaller vocabulary (your own tokenizer) drops the preset's special ids that no longer fit
        v = getattr(cfg, special, None)
        if special not in overrides and isinstance(v, int) and isinstance(vocab, int) and v >= vocab:
            overrides[special] = None
    return dataclasses.replace(cfg, **overrides).validate()


def config_from_dict(data: dict[str, Any], where: str = "model config"):
    """Rebuild a config from its dict (read from the file ``where``); the ``family`` field picks
    the class."""
    return spec_of_family(data.get("family"), where).config_class.from_dict(data, where)
