"""Preference-tuning hyper-parameters: the ``[align]`` section, whose home is
:mod:`lmlab.config.align` (this module keeps the names it always offered)."""

from lmlab.config.align import (
    LOSSES,
    METHODS,
    TASKS,
    AlignConfig,
    DpoLoss,
    Length,
    Method,
    OnBadLine,
    Precision,
    check_dpo_options,
)

__all__ = ["LOSSES", "METHODS", "TASKS", "AlignConfig", "DpoLoss", "Length", "Method", "OnBadLine",
           "Precision", "check_dpo_options"]
