"""Run configuration: the sections of a recipe TOML file (``[model]``, ``[objective]``, ``[data]``,
``[train]``). Their home is :mod:`lmlab.config`; this module keeps the names it always offered::

    [model]      preset = "gpt2-tiny", plus any field of that preset's config (d_model, n_layers...)
    [objective]  name = "clm", plus the objective's own parameters
    [data]       train, val, tokenizer, ...            -> DataConfig
    [train]      max_steps, batch_size, seq_len, lr... -> TrainConfig

:func:`load_config` reads a file (or a dict), applies ``--set section.key=value`` overrides, checks
every key (an unknown one is a one-line error naming the closest valid key) and coerces every value
to its field's type; :func:`to_toml` writes the resolved config back (``RUN_DIR/config.toml``).
"""

from __future__ import annotations

from lmlab.config.data import DataConfig, DocSeparator
from lmlab.config.fields import base_type as _base_type
from lmlab.config.fields import coerce
from lmlab.config.fits import check_added_tokens as _check_added_tokens
from lmlab.config.fits import check_batch_fits as _check_batch_fits
from lmlab.config.model import ModelConfig
from lmlab.config.objective import ObjectiveConfig
from lmlab.config.objective import objective_parameters as _objective_parameters
from lmlab.config.overrides import Origin, override_items
from lmlab.config.overrides import suggest as _suggest
from lmlab.config.run import SECTIONS, RunConfig, load_config, to_toml, validate
from lmlab.config.toml import parse_value, read_toml
from lmlab.config.train import (
    ATTENTION,
    COMPILE_BACKENDS,
    DISTRIBUTED,
    PRECISIONS,
    PROGRESS,
    SCHEDULES,
    Attention,
    CompileBackend,
    Distributed,
    Precision,
    Progress,
    Schedule,
    TrainConfig,
)
from lmlab.data.options import DOC_SEPARATORS

__all__ = ["ATTENTION", "COMPILE_BACKENDS", "DISTRIBUTED", "DOC_SEPARATORS", "PRECISIONS", "PROGRESS",
           "SCHEDULES", "SECTIONS", "Attention", "CompileBackend", "DataConfig", "Distributed",
           "DocSeparator", "ModelConfig", "ObjectiveConfig", "Origin", "Precision", "Progress", "RunConfig",
           "Schedule", "TrainConfig", "coerce", "load_config", "override_items", "parse_value", "read_toml",
           "to_toml", "validate", "_base_type", "_check_added_tokens", "_check_batch_fits",
           "_objective_parameters", "_suggest"]
