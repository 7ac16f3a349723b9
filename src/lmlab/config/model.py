"""``[model]``: a preset name plus overrides of any field of that preset's config (d_model,
n_layers...), each checked against the preset config's own field types."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from pydantic.dataclasses import dataclass

from lmlab.config.fields import build_named, section_fields
from lmlab.config.overrides import NOWHERE, Origin, suggest
from lmlab.errors import LmlabError


@dataclass
class ModelConfig:
    """``[model]``: a preset name plus overrides of any of its config fields."""

    preset: str = "gpt2-tiny"
    overrides: dict[str, Any] = field(default_factory=dict)


def build_model_section(table: dict[str, Any], origin: Origin = NOWHERE) -> ModelConfig:
    """``[model]`` of a recipe: the preset must exist; every other key is a field of its config;
    the rules between those fields (``n_heads`` divides ``d_model``...) hold (:func:`check_model_rules`)."""
    section = build_named(ModelConfig, table, "model", "preset", origin, _preset_fields)
    check_model_rules(section, origin)
    return section


def check_model_rules(section: ModelConfig, origin: Origin = NOWHERE) -> None:
    """The preset's config with the section's fields, validated (the config's own ``validate``, which
    building the model runs again) at config load, before a tokenizer is trained. An error names the
    field given that breaks the rule, where it was written (``--set model.d_model: n_heads 4 does
    not divide d_model 65``): the first given field without which the rule holds."""
    from lmlab.models import get_preset

    overrides = dict(section.overrides)
    if "vocab_size" not in overrides:
        # a run's vocabulary is its tokenizer's, not the preset's: the special ids are checked
        # against it once it is planned (lmlab.config.run.check_model_vocab), not here
        ids = [v for k, v in overrides.items() if k.endswith("_token_id") and isinstance(v, int)]
        overrides["vocab_size"] = max([get_preset(section.preset).vocab_size, *(i + 1 for i in ids)])
    try:
        get_preset(section.preset, **overrides)
    except LmlabError as e:
        given = list(section.overrides)
        for key in given:
            try:
                get_preset(section.preset, **{k: v for k, v in overrides.items() if k != key})
            except LmlabError:
                continue
            raise LmlabError(f"{origin.of(f'model.{key}')}: {e.problem}", e.fix, setting=key) from None
        raise LmlabError(f"{origin.section('model')}: {e.problem}", e.fix) from None


def _preset_fields(preset: Any, where: str) -> tuple[dict[str, Any], str]:
    from lmlab.models import PRESETS

    if not isinstance(preset, str) or preset not in PRESETS:
        raise LmlabError(f"unknown model preset {preset!r} ({where})",
                         suggest(str(preset), list(PRESETS), ""))
    return model_fields(type(PRESETS[preset]())), f"for preset {preset}"


def model_fields(config_class: type) -> dict[str, Any]:
    """Field name -> type of a model config class: the typed field of its file schema
    (:func:`lmlab.file_schemas.model_config_fields`: ``n_heads`` is a :data:`lmlab.values.Count`)
    where there is one, so a recipe, ``--set`` and a grid arm get the ranges a checkpoint's
    ``config.json`` gets; the dataclass's own hint otherwise."""
    import typing

    from lmlab.file_schemas import model_config_fields

    typed = typing.get_type_hints(model_config_fields(config_class), include_extras=True)
    return {name: typed.get(name, hint) for name, hint in section_fields(config_class).items()}
