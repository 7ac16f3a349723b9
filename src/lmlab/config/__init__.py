"""One config system: typed sections read from TOML files and ``--set section.key=value``, checked
once by one validator (:mod:`lmlab.config.fields`, built on the value types of :mod:`lmlab.values`).

Sections (one small module each): ``[model]``, ``[objective]``, ``[data]``, ``[train]`` (a
pretraining recipe, :class:`RunConfig`), ``[finetune]`` (:class:`FinetuneConfig`), ``[align]``
(:class:`AlignConfig`); the grid (:mod:`lmlab.lab.grid`) is built from the same sections. Every
error is one line, ``error: <where> <problem>; <fix>``, where ``<where>`` is ``FILE:LINE: key`` or
``--set key`` or the flag.
"""

from lmlab.config.data import DataConfig
from lmlab.config.fields import build_section, coerce
from lmlab.config.model import ModelConfig
from lmlab.config.objective import ObjectiveConfig
from lmlab.config.overrides import Origin, apply_override, override_items, suggest
from lmlab.config.run import SECTIONS, RunConfig, load_config, to_toml, validate
from lmlab.config.toml import parse_value, read_toml
from lmlab.config.train import TrainConfig

__all__ = ["SECTIONS", "DataConfig", "ModelConfig", "ObjectiveConfig", "Origin", "RunConfig", "TrainConfig",
           "apply_override", "build_section", "coerce", "load_config", "override_items", "parse_value",
           "read_toml", "suggest", "to_toml", "validate"]
