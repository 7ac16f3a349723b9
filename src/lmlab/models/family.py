"""What a model family is: :class:`FamilySpec`, one per folder under ``lmlab/models/``.

A family folder (``models/decoder/``, ``models/encoder/`` ...) holds its config class, presets,
model, FLOP counting and Hugging Face conversion, and its ``__init__.py`` defines ``SPEC``, a
:class:`FamilySpec` that names them. :data:`lmlab.models.registry.FAMILIES` lists the folders;
everything that asks "which class, which presets, how many FLOPs, which converter" asks the spec
instead of testing config classes one by one. docs/extending.md adds a family on a worked example.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: ``count_parameters(config, heads) -> ParameterCount`` (lmlab.models.flops conventions)
ParameterCounter = Callable[[Any, tuple[str, ...]], Any]
#: ``forward_flops(config, seq_len, batch_size, decoder_len, logit_positions, attention, heads) -> int``
FlopCounter = Callable[..., int]


@dataclass(frozen=True)
class FamilySpec:
    """One model family: everything the rest of lmlab needs to know about it.

    * ``name``: the architecture, written as ``"architecture"`` into every checkpoint's config.json
      (never rename it: old checkpoints name it).
    * ``config_class``: its config dataclass; ``families``: the values of ``config.family`` it
      reads (``bert``, ``roberta`` ... for the encoder; default: ``name`` alone).
    * ``presets``: preset name -> function returning a fresh config (``gpt2-tiny``).
    * ``build(config, heads)``: a freshly initialised model (the model class itself will do);
      ``heads`` None = the family's pretraining heads, ``()`` the bare network.
    * ``heads``: the heads ``build`` accepts; ``pretraining_heads(config)`` the default ones
      (None: the first of ``heads``).
    * ``kind``: the interface objectives and tasks train (their ``architectures``; default
      ``name``): a family whose model takes a decoder's inputs trains with the decoder objectives.
    * ``count_parameters`` / ``forward_flops``: counted from the config alone (None: this family
      is not counted; sizes come from a built model).
    * ``plan``: :class:`PlanHooks` when ``lmlab scale plan`` can size the family.
    * ``hf``: module path of its Hugging Face converter (``MODEL_TYPES``, ``from_hf``, ``to_hf``),
      imported only when used; None when the family has no transformers counterpart.
    """

    name: str
    config_class: type
    presets: Mapping[str, Callable[[], Any]]
    build: Callable[..., Any]
    heads: tuple[str, ...] = ()
    families: tuple[str, ...] = ()
    kind: str = ""
    pretraining_heads: Callable[[Any], tuple[str, ...]] | None = None
    count_parameters: ParameterCounter | None = None
    forward_flops: FlopCounter | None = None
    plan: PlanHooks | None = None
    hf: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "families", self.families or (self.name,))
        object.__setattr__(self, "kind", self.kind or self.name)

    def default_heads(self, config: Any) -> tuple[str, ...]:
        """The heads ``build(config, None)`` gives: the family's pretraining heads."""
        return self.pretraining_heads(config) if self.pretraining_heads else self.heads[:1]


@dataclass(frozen=True)
class PlanHooks:
    """What :mod:`lmlab.scaling.plan` asks a family when it sizes one of its shapes.

    * ``families``: the ``config.family`` values it may size (ALBERT shares its layers: not sized).
    * ``resize(base, changes)``: the family's own extra changes when the planner sets the width,
      depth, vocabulary and context in ``changes`` (e.g. RoBERTa's position offset).
    * ``flops_per_token(config, seq_len, attention)``: exact training FLOPs per token of one
      ``seq_len`` row as the family's pretraining objective trains it.
    """

    families: tuple[str, ...]
    resize: Callable[[Any, dict[str, Any]], dict[str, Any]]
    flops_per_token: Callable[[Any, int, bool], float]
